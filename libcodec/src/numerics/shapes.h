// Sizes and the rows x cols view of FORMAT.md 1.6, stated once for the codec, the frame
// writer and reader, and the kernels (so a frame the writer accepts is one the reader
// accepts, and both agree with the encoder on every byte count).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gift/gift.h"
#include "numerics/hd.h"

namespace gift {

// Rows per band when a rows x cols tensor is worked through in pieces: a multiple of `unit`
// (the rows that share their scales) holding about `budget` elements, at least one unit.
inline uint64_t band_rows(uint64_t unit, uint64_t cols, uint64_t budget) {
  // budget / cols / unit: budget / (unit * cols) without the product, which may wrap.
  const uint64_t units = budget / (cols ? cols : 1) / unit;
  return unit * (units ? units : 1);
}

// Columns per part when a row longer than `budget` elements is worked through in parts:
// whole groups of `group` columns (blocks, tiles; 1 where any cut will do), or `budget` where
// a group is wider, each part then within one group (for_each_row_part).
inline uint64_t row_part(uint64_t cols, uint64_t group, uint64_t budget) {
  const uint64_t part = group <= budget ? budget / group * group : budget;
  return part < cols ? part : cols;
}

// f(c0, w) for the parts of a row of `cols` columns in order (row_part's, in runs of a
// group's width that no part crosses where a group is wider than a part); the first nonzero
// result ends the walk and is returned.
template <class F>
auto for_each_row_part(uint64_t cols, uint64_t group, uint64_t budget, F&& f) -> decltype(f(0, 0)) {
  const uint64_t part = row_part(cols, group, budget);
  const uint64_t run = group > part ? group : cols;
  for (uint64_t s0 = 0; s0 < cols; s0 += run) {
    const uint64_t end = cols - s0 > run ? s0 + run : cols;
    for (uint64_t c0 = s0; c0 < end; c0 += part) {
      if (const auto r = f(c0, end - c0 < part ? end - c0 : part)) return r;
    }
  }
  return {};
}

// A C caller can pass any integer as an enum, and reading a value outside the enumerators'
// range as the C++ enum type is undefined, so the bytes are read as the int they are.
template <class E>
GIFT_HD int enum_int(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "C enums are int-sized here");
  int v;
  memcpy(&v, &e, sizeof v);
  return v;
}

GIFT_HD bool known_dtype(const giftDType_t& dtype) {
  const int d = enum_int(dtype);
  return d == GIFT_DTYPE_F32 || d == GIFT_DTYPE_BF16 || d == GIFT_DTYPE_F16;
}

// Assumes a known dtype.
GIFT_HD constexpr size_t dtype_size(giftDType_t dtype) { return dtype == GIFT_DTYPE_F32 ? 4 : 2; }

// Assumes a known scale dtype.
GIFT_HD constexpr size_t scale_size(giftScaleDType_t scale_dtype) {
  return scale_dtype == GIFT_SCALE_DTYPE_F32 ? 4 : 1;
}

// The most elements a tensor may have: any per-element byte count the library forms (at
// most 8 bytes, a double, per element) then fits in 64 bits without further checks.
constexpr uint64_t kMaxElements = UINT64_MAX / 8;
// What a shape past it is told, writing or reading (FORMAT.md's "below 2^61").
constexpr const char* kTooManyElements =
    "shape's element count is 2^61 or more (the format's limit)";

struct MatrixView {
  uint64_t rows = 1, cols = 1;  // cols: the last dimension; rows: the product of the others
  uint64_t elements = 1;
};

// The view of a tensor of `ndim` dimensions (a 0-d tensor is 1 x 1, a 1-d one 1 x d_0);
// false when its element count exceeds kMaxElements. rows stays exact when cols is 0.
inline bool matrix_view(const uint64_t* dims, uint32_t ndim, MatrixView* view) {
  *view = MatrixView{};
  for (uint32_t i = 0; i < ndim; ++i) {
    if (dims[i] && view->elements > kMaxElements / dims[i]) return false;
    if (i + 1 == ndim) view->rows = view->elements;
    view->elements *= dims[i];
  }
  if (ndim) view->cols = dims[ndim - 1];
  return true;
}

}  // namespace gift
