// Applying GIFT coordinates to tensors: the measured choice between Euclidean and GIFT
// coordinates (docs/ARCHITECTURE.md, "Selective application"), and decoding with a basis.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "coords/basis.h"
#include "gift/gift.h"

namespace gift::coords {

enum class CoordsMode { kEuclidean, kGift, kAuto };

struct SelectOptions {
  CoordsMode mode = CoordsMode::kAuto;
  double margin = 0.05;        // GIFT must lower the estimate by this fraction
  uint32_t sample_rows = 256;  // rows the estimate encodes (all rows of smaller tensors)
  uint32_t min_dim = 16;       // both dimensions at least this to be eligible
  double flops_budget = 0;     // per tensor, 0 for no limit
  int threads = 0;             // the trial encodes' and whitenings' (0: the default)
};

// Decides for one rows x cols fp32 tensor. The estimates encode and decode a deterministic,
// evenly spaced sample of rows with the encoder's settings; the sample's error estimates the
// whole tensor's (exactly for all rows, else within its sampling error: see FORMAT.md).
// The decision and both estimates (NaN where not made; Inf where a trial encode failed).
struct Selection {
  bool made = false;  // false: Euclidean asked, nothing measured
  bool gift = false;
  float euclidean_error = NAN, gift_error = NAN;
  double transform_flops = 0;
  std::string reason;
};

Selection choose_coords(const float* w, uint64_t rows, uint64_t cols, const Whitener* t,
                        const giftQuantParams& p, const SelectOptions& o);

// The same decision from what it reads of the tensor: whether every value is finite, and the
// sample, sample_rows(rows, o) rows of cols values whose i-th is the tensor's row
// sample_row(i, rows, o). For callers that do not hold the tensor as fp32.
uint64_t sample_rows(uint64_t rows, const SelectOptions& o);
inline uint64_t sample_row(uint64_t i, uint64_t rows, const SelectOptions& o) {
  return i * rows / sample_rows(rows, o);
}
Selection choose_from_sample(const float* sample, bool all_finite, uint64_t rows, uint64_t cols,
                             const Whitener* t, const giftQuantParams& p, const SelectOptions& o);

}  // namespace gift::coords
