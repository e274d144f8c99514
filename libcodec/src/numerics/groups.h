// Geometry of scale groups: which rectangle of the rows x cols view each scale covers.
// Every layout is a grid of equal rectangles (edge ones cut short), so one description
// serves all of them.
#pragma once

#include <cstdint>

#include "gift/gift.h"
#include "numerics/hd.h"

namespace gift {

struct Rect {
  uint64_t r0, r1, c0, c1;  // rows [r0, r1), cols [c0, c1)
  GIFT_HD uint64_t count() const { return (r1 - r0) * (c1 - c0); }
};

struct GroupGrid {
  uint64_t rows, cols;     // tensor
  uint64_t height, width;  // one group
  uint64_t grid_rows, grid_cols;

  GIFT_HD uint64_t count() const { return grid_rows * grid_cols; }

  GIFT_HD Rect rect(uint64_t g) const {
    const uint64_t gr = g / grid_cols, gc = g % grid_cols;
    const uint64_t r0 = gr * height, c0 = gc * width;
    return {r0, r0 + height < rows ? r0 + height : rows, c0, c0 + width < cols ? c0 + width : cols};
  }
};

GIFT_HD uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

// Assumes validated params. A tensor layout is one group even when the tensor is empty,
// so every tensor has at least one scale under it.
GIFT_HD GroupGrid group_grid(const giftQuantParams& p, uint64_t rows, uint64_t cols) {
  switch (p.layout) {
    case GIFT_SCALE_ROW:
      return {rows, cols, 1, cols, rows, 1};
    case GIFT_SCALE_BLOCK:
      return {rows, cols, 1, p.block, rows, ceil_div(cols, p.block)};
    case GIFT_SCALE_TILE:
      return {rows,
              cols,
              p.tile_rows,
              p.tile_cols,
              ceil_div(rows, p.tile_rows),
              ceil_div(cols, p.tile_cols)};
    case GIFT_SCALE_TENSOR:
    default:
      return {rows, cols, rows, cols, 1, 1};
  }
}

}  // namespace gift
