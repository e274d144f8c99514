// Applying GIFT coordinates to tensors: the measured choice between Euclidean and GIFT
// coordinates (docs/ARCHITECTURE.md, "Selective application"), and decoding with a basis.
#pragma once

#include <cstdint>
#include <string>

#include "container/reader.h"
#include "container/writer.h"
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
};

// Decides for one rows x cols fp32 tensor. The estimates encode and decode a deterministic,
// evenly spaced sample of rows with the encoder's settings; the sample's error estimates the
// whole tensor's (exactly for all rows, else within its sampling error: see FORMAT.md).
container::CoordsChoice choose_coords(const float* w, uint64_t rows, uint64_t cols,
                                      const Whitener* t, const BasisId& id,
                                      const giftQuantParams& p, const SelectOptions& o);

// The basis a frame carries, parsed into *out and checked to be the one Frame.basis_id
// names; *found is false (and *out untouched) when the frame carries none.
giftResult_t read_embedded_basis(const container::FrameReader& r, Basis* out, bool* found);

// The whitener tensor in GIFT coordinates `index` needs, from `basis` (null: none available).
// GIFT_ERROR_BASIS_MISSING with both ids when it is missing or different.
giftResult_t resolve_whitener(const container::FrameReader& r, size_t index, const Basis* basis,
                              const Whitener** out);

// Decodes tensor `index` of a frame, applying `basis` to tensors in GIFT coordinates; errors as
// resolve_whitener's.
giftResult_t decode_tensor(const container::FrameReader& r, size_t index, const Basis* basis,
                           void* dst, uint64_t dst_bytes, giftDType_t dst_dtype);

}  // namespace gift::coords
