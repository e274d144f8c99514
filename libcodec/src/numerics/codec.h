// The CPU encoder and decoder of one tensor: scale groups, scales, codes. Thin C API
// wrappers in api/codec.cc validate arguments and call these.
#pragma once

#include <cstdint>

#include "gift/gift.h"

namespace gift {

// The caller's params checked (header and fields) and copied over the defaults.
giftResult_t load_params(const giftQuantParams* in, giftQuantParams* out);

// Where the rows given to encode_tensor lie in a larger tensor they are part of, so that a
// tensor encoded in bands of rows gets the codes of its encode whole: stochastic rounding's
// random words count elements from first_element, and where the groups reach past the rows
// given (the tensor's one scale, a row's under GIFT_SCALE_ROW taken in parts, the tiles of a
// band inside a tile row), their scales come from group_amax: each group's finite amax over
// all its elements (group_amax below), in the order of the scales of the rows given.
struct BandOrigin {
  uint64_t first_element = 0;
  const float* group_amax = nullptr;  // null: each group's own, from the rows given
  // Where set (first_element a multiple of simd::kCensusChunk), the encoder may take the
  // census of whole chunks of these rows with their codes, as simd::BlockRun::census says,
  // chunk c counted from first_element; the caller zeroes census_done.
  double (*census)[8] = nullptr;
  uint8_t* census_done = nullptr;
};

// Assumes validated params and buffers of the right sizes; ctx may be null. Statistics and
// the index of the first non-finite value are those of the rows given.
giftResult_t encode_tensor(const giftCtx* ctx, const giftQuantParams& p, const void* src,
                           giftDType_t src_dtype, uint64_t rows, uint64_t cols, uint8_t* codes,
                           void* scales, giftEncodeStats* stats, const BandOrigin& origin = {});

// Each group's finite amax (NaN and Inf left out; 0 where none) over rows x cols, in the
// order of its scales: what encode_tensor takes each group's scale from. Where groups reach
// past these rows, the maxima over several calls are the groups' own (BandOrigin).
void group_amax(const giftCtx* ctx, const giftQuantParams& p, const void* src,
                giftDType_t src_dtype, uint64_t rows, uint64_t cols, float* amax);

// What an encode that saw `s` returns under p's non-finite policy: GIFT_OK, or
// GIFT_ERROR_NONFINITE_INPUT naming the count and the first element (for every encoder).
giftResult_t nonfinite_result(const giftQuantParams& p, const giftEncodeStats& s, uint64_t cols);
// That error for an input of `cols` columns holding s.nonfinite_count NaN or Inf (any input:
// giftGradientSecondMoment's gradients too).
giftResult_t nonfinite_error(const giftEncodeStats& s, uint64_t cols);

void decode_tensor(const giftCtx* ctx, const giftQuantParams& p, const uint8_t* codes,
                   const void* scales, uint64_t rows, uint64_t cols, void* dst,
                   giftDType_t dst_dtype);

// The argument checks of giftEncode/giftDecode and their device forms, after load_params:
// known, pointers present, the scales buffer large enough (data and codes are `data` and
// `codes` whichever way the call goes).
giftResult_t check_codec_buffers(const giftQuantParams& p, const void* data, giftDType_t dtype,
                                 uint64_t rows, uint64_t cols, const void* codes,
                                 const void* scales, uint64_t scales_bytes);

}  // namespace gift
