// Vectorized span kernels of the CPU codec (Google Highway, dispatched at run time to the
// best instruction set of the machine). Each produces exactly the bytes of the scalar rules
// in elementwise.h; tests check that for every target on dense samples and, for the
// machine's best target, on all 2^32 fp32 bit patterns.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gift/gift.h"

namespace gift::simd {

// Largest |x| over n elements as an fp32 bit pattern (integer max of the sign-cleared bits,
// so a NaN or Inf shows as a value >= 0x7F800000).
uint32_t abs_max_bits(const void* src, giftDType_t dtype, size_t n);

// In one pass, lanes[(phase + k) % 8] += x[k] * x[k] in double for k = 0, 1, ... n - 1 in
// that order (the same sums on every target), and the largest magnitude: abs_max_bits(src,
// dtype, n) for finite x; >= 0x7F800000 exactly when a NaN or Inf is among the x (a NaN's
// bits may then differ from abs_max_bits', which keeps fp16 NaNs signalling), and then the
// lanes' values are unspecified.
uint32_t abs_max_add_squares(const void* src, giftDType_t dtype, size_t n, size_t phase,
                             double lanes[8]);

// The frame statistics' census folds its lanes at every multiple of this many elements
// (container/census.h); the encoder can take whole chunks of it (BlockRun::census).
constexpr uint64_t kCensusChunk = 4096;

// abs_max_add_squares of `chunks` consecutive spans of `chunk` elements, each from phase 0
// and lanes of zero: lanes[c] and amax_bits[c] are what that call on span c gives, the same
// doubles. Faster than one call per span (several spans summed side by side). With
// amax_bits null, for spans the caller knows to be finite, only the lanes (faster still).
void add_squares_chunks(const void* src, giftDType_t dtype, size_t chunk, size_t chunks,
                        double (*lanes)[8], uint32_t* amax_bits);

// codes[i] = fp8_from_float_rn(x[i] / factor) when `divide`, else fp8_from_float_rn(x[i] *
// factor), for any input.
void quantize_rn(const void* src, giftDType_t dtype, size_t n, float factor, bool divide,
                 giftFp8Kind_t kind, uint8_t* codes);

// The same for inputs whose scaled magnitude is below 2^17 (no NaN, no Inf), as every
// finite value over its group's scale is, and a positive factor, as every scale is; a shorter
// instruction sequence. Outside that domain the result is unspecified.
void quantize_rn_bounded(const void* src, giftDType_t dtype, size_t n, float factor, bool divide,
                         giftFp8Kind_t kind, uint8_t* codes);

// The n elements at src as blocks of `block` (the last may be short), in one call (a row's share
// of a row of tiles): bits[k] = max(bits[k], abs_max_bits of block k).
void blocks_abs_max_bits(const void* src, giftDType_t dtype, size_t n, uint32_t block,
                         uint32_t* bits);

// quantize_rn_bounded of each block k of those with its own factor[k], or +0 codes where
// factor[k] is not above 0 (an all-zero group).
void quantize_blocks_rn_bounded(const void* src, giftDType_t dtype, size_t n, uint32_t block,
                                const float* factor, bool divide, giftFp8Kind_t kind,
                                uint8_t* codes);

// dst[i] = fp8_to_float(codes[i]) * scale, stored as `dtype` (bf16/fp16 round to nearest even).
// With stream, through non-temporal stores where dst is 16-byte aligned (fp16 too where the
// instruction set converts it), as BlockRun::stream says.
void dequantize(const uint8_t* codes, size_t n, float scale, giftFp8Kind_t kind, void* dst,
                giftDType_t dtype, bool stream = false);

// out[i] = src[i] (of `dtype`, widened exactly) + plus[i] in fp32: a conversion and a sum in
// one pass (out may be plus).
void widen_add(const void* src, giftDType_t dtype, const float* plus, float* out, size_t n);

// out[i] = a[i] - b[i] in fp32 (out may be a). With stream, through non-temporal stores, for
// an output that is not read again soon: out is then 16-byte aligned, and other threads read
// it only after this thread's stream_fence().
void subtract(const float* a, const float* b, float* out, size_t n, bool stream);

// A run of whole 1-D blocks, consecutive in memory as their scales are (within one row, or
// across rows that are whole blocks; the last block may be short): the encoder's hot path,
// done in one call so that nothing per block leaves vector code.
struct BlockRun {
  const void* src;  // first element of the run
  giftDType_t dtype;
  uint64_t n;      // elements in the run
  uint32_t block;  // elements per block
  giftFp8Kind_t kind;
  giftScaleDType_t scale_dtype;
  uint8_t* codes;  // first code of the run
  void* scales;    // scale of the run's first block
  // decode_blocks only: non-temporal stores of the decoded values where the output is
  // 16-byte aligned, which leave them out of the caches: for outputs too large to stay there
  // (codec.cc, kStreamBytes). Other threads may read them only after this thread's
  // stream_fence().
  bool stream = false;
  // encode_blocks_rn: where set, the run starts at a multiple of kCensusChunk elements of its
  // tensor, and the encoder may take the census (add_squares_chunks's lanes, kMax off) of
  // whole chunks of the run with their codes: chunk c's lanes into census[c] and census_done[c]
  // set to 1, counting from the run's start. Only the chunks of finite elements it reached;
  // some targets and block sizes take none.
  double (*census)[8] = nullptr;
  uint8_t* census_done = nullptr;
  // encode_blocks_rn: bytes of the same buffer that follow the run, which it may fetch ahead
  // into, so that a run read in order has the next run's first lines coming as it ends.
  uint64_t readable_after = 0;
};

// Round-to-nearest encode of a run: amax, scale (FORMAT.md's rule) and codes per block,
// the blocks taken in an order of their own (simd.cc, kReadStreams). Returns the run's
// abs_max_bits; a value >= 0x7F800000 means a block held NaN/Inf: the run was left
// unfinished, some blocks written and some not, for the caller to redo.
uint32_t encode_blocks_rn(const BlockRun& run);

// Decode of a run of blocks (`src` unused) into `dst` of `dst_dtype`.
void decode_blocks(const BlockRun& run, void* dst, giftDType_t dst_dtype);

// Orders this thread's non-temporal stores before its later stores (BlockRun::stream): once
// per batch of runs, before another thread (or the caller) reads the output.
void stream_fence();

// Name of the instruction set the dispatcher picked, for benchmarks and --version.
const char* target_name();

// Dispatch from the next call on, process-wide, to instruction sets no wider than the one
// named (as target_name spells it, in any case), or again to every set where `name` is null.
// False, changing nothing, where this build has no code for that name.
bool limit_targets(const char* name);

// The names limit_targets takes, widest first, separated by spaces.
const char* target_names();

// How the AVX-512 encoder divides by fp32 scales: 1 through their reciprocals and one
// correction (a quotient within an ulp, whose codes are those of the division), 0 with a
// vector division, -1 (the default) as measured faster for the CPU's vendor. The bytes are
// the same; tests set it to reach both. Returns the previous setting.
int set_reciprocal_division_for_test(int mode);

// Whether the AVX-512 encoder reads runs of 64 blocks or more as four parts side by side (1)
// or in order (0); -1 (the default): by the CPU's vendor, in order on AMD (measured faster on
// Zen 4), as parts elsewhere (measured faster on a Xeon before whole batches). The bytes are
// the same; tests set it to reach both. Returns the previous setting.
int set_read_in_parts_for_test(int mode);

}  // namespace gift::simd
