// The statistics a frame's header holds for each tensor (rms, amax, non-finite count), taken
// as the writer encodes. In its own header so that tests check its sums bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "gift/gift.h"
#include "numerics/convert.h"
#include "numerics/elementwise.h"
#include "numerics/fp_env.h"
#include "numerics/shapes.h"
#include "numerics/simd.h"

namespace gift::container {

// What a tensor's statistics say (FORMAT.md 2.2, Tensor.stats), over its values as given,
// taken in pieces in element order. The squares are summed in eight lanes (element i into
// lane i mod 8) folded into the total at every multiple of 4096 elements: vector code, and
// the same sum on every machine however the tensor is cut into pieces.
struct Census {
  static constexpr uint64_t kChunk = simd::kCensusChunk;
  // Whole chunks whose lanes the encoder took with their codes (BandOrigin::census): chunk c
  // of a piece that starts at a multiple of kChunk, counted from its start, where done[c].
  struct Taken {
    const double (*lanes)[8];
    const uint8_t* done;
  };
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  double sum = 0;
  uint64_t finite = 0;
  giftEncodeStats stats{0.0f, 0, UINT64_MAX};

  // Elements [base, base + n) of the tensor, after those before base. With finite_amax, the
  // caller has seen them all finite, with that largest magnitude (the encoder's statistics of
  // the same elements): whole chunks then skip taking their own, and those in taken (base a
  // multiple of kChunk) take its lanes (a group of chunks that taken holds only in part is
  // summed whole, the rest of it not used).
  void add(const void* data, giftDType_t dtype, uint64_t base, uint64_t n,
           const float* finite_amax = nullptr, const Taken* taken = nullptr) {
    const num::FpEnvGuard fp_env;  // the same sums whatever the caller's rounding mode
    if (finite_amax) stats.amax = std::max(stats.amax, *finite_amax);
    const uint8_t* bytes = static_cast<const uint8_t*>(data);
    for (uint64_t i0 = 0; i0 < n;) {
      const uint64_t at = base + i0;
      const uint8_t* src = bytes + i0 * dtype_size(dtype);
      if (at % kChunk == 0 && n - i0 >= kChunk) {  // whole chunks, summed side by side
        constexpr uint64_t kMost = 16;
        double chunk_lanes[kMost][8];
        uint32_t bits[kMost];
        const uint64_t whole = std::min(kMost, (n - i0) / kChunk);
        const uint8_t* done = taken && finite_amax ? taken->done + i0 / kChunk : nullptr;
        if (!done || !std::all_of(done, done + whole, [](uint8_t d) { return d != 0; })) {
          simd::add_squares_chunks(src, dtype, kChunk, whole, chunk_lanes,
                                   finite_amax ? nullptr : bits);
        }
        for (uint64_t c = 0; c < whole; ++c) {
          if (finite_amax || bits[c] < 0x7F800000u) {
            const double* from = done && done[c] ? taken->lanes[i0 / kChunk + c] : chunk_lanes[c];
            std::copy(from, from + 8, lanes);
            finite += kChunk;
            if (!finite_amax) stats.amax = std::max(stats.amax, num::float_of(bits[c]));
          } else {
            add_finite_alone(src + c * kChunk * dtype_size(dtype), dtype, at + c * kChunk, kChunk);
          }
          end_chunk();
        }
        i0 += whole * kChunk;
        continue;
      }
      const uint64_t m = std::min(kChunk - at % kChunk, n - i0);
      double before[8];
      std::copy(lanes, lanes + 8, before);
      const uint32_t bits = simd::abs_max_add_squares(src, dtype, m, at % 8, lanes);
      if (bits < 0x7F800000u) {
        finite += m;
        stats.amax = std::max(stats.amax, num::float_of(bits));
      } else {
        std::copy(before, before + 8, lanes);
        add_finite_alone(src, dtype, at, m);
      }
      if ((at + m) % kChunk == 0) end_chunk();
      i0 += m;
    }
  }
  // Rare: m elements from `at` that hold NaN or Inf, added again element by element, the
  // finite ones alone.
  void add_finite_alone(const void* src, giftDType_t dtype, uint64_t at, uint64_t m) {
    float chunk[kChunk];
    convert_elements(src, dtype, chunk, GIFT_DTYPE_F32, m);
    for (uint64_t k = 0; k < m; ++k) {
      if (std::isfinite(chunk[k])) {
        lanes[(at + k) % 8] += double(chunk[k]) * double(chunk[k]);
        ++finite;
        stats.amax = std::max(stats.amax, std::fabs(chunk[k]));
      } else if (stats.nonfinite_count++ == 0) {
        stats.first_nonfinite = at + k;
      }
    }
  }
  void end_chunk() {
    sum += folded();
    for (double& l : lanes) l = 0;
  }
  double folded() const {
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
           ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
  float rms() const {
    const num::FpEnvGuard fp_env;
    return finite ? float(std::sqrt((sum + folded()) / double(finite))) : 0.0f;
  }
};

}  // namespace gift::container
