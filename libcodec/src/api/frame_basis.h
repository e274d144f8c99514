// What the frame and basis halves of the C API share.
#pragma once

#include "api/handles.h"

namespace gift {

// The basis `frame` carries (parsed once, kept), or null in *out when it carries none.
giftResult_t frame_basis(giftFrame* frame, const giftBasis** out);

// Decodes tensor `index`, with `basis` for tensors in GIFT coordinates (null: the embedded
// one).
giftResult_t decode_with_basis(giftFrame* frame, uint64_t index, const giftBasis* basis, void* dst,
                               uint64_t dst_bytes, giftDType_t dst_dtype);
// Rows [first_row, first_row + rows) of it, through the frame's section cache.
giftResult_t decode_rows_with_basis(giftFrame* frame, uint64_t index, uint64_t first_row,
                                    uint64_t rows, const giftBasis* basis, void* dst,
                                    uint64_t dst_bytes, giftDType_t dst_dtype);

}  // namespace gift
