// What the all-reduce tests share: deterministic per-rank buckets (every rank can rebuild
// every other rank's input from the seed), the exact reduction in double, and the
// per-element error bound of the two FP8 roundings.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gift/gift_transport.h"
#include "numerics/elementwise.h"

namespace gift::test {

struct TensorSpec {
  std::string name;
  giftDType_t dtype;
  std::vector<uint64_t> shape;
  uint64_t elements() const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return n;
  }
};

inline size_t dtype_bytes(giftDType_t t) { return t == GIFT_DTYPE_F32 ? 4 : 2; }

// Mixed shapes and dtypes, an empty tensor and a scalar; 1 + 999 + ... elements so that
// neither the block nor any world size divides the bucket.
inline std::vector<TensorSpec> mixed_bucket() {
  return {{"w.fp32", GIFT_DTYPE_F32, {33, 7}},    {"b.bf16", GIFT_DTYPE_BF16, {130}},
          {"empty", GIFT_DTYPE_F32, {0, 5}},      {"w.fp16", GIFT_DTYPE_F16, {3, 3, 5}},
          {"scalar", GIFT_DTYPE_F32, {}},         {"big.fp32", GIFT_DTYPE_F32, {999}},
          {"tail.bf16", GIFT_DTYPE_BF16, {2, 61}}};
}

// Smaller than one block of 128.
inline std::vector<TensorSpec> tiny_bucket() {
  return {{"a", GIFT_DTYPE_F32, {5}}, {"b", GIFT_DTYPE_F16, {2, 3}}};
}

inline std::vector<giftBucketTensor> describe(const std::vector<TensorSpec>& specs) {
  std::vector<giftBucketTensor> d;
  for (const TensorSpec& s : specs) {
    d.push_back({s.name.c_str(), s.dtype, uint32_t(s.shape.size()), s.shape.data()});
  }
  return d;
}

// One rank's tensors, as bytes in their dtypes.
using Bucket = std::vector<std::vector<uint8_t>>;

inline float to_float(giftDType_t t, const uint8_t* p) {
  if (t == GIFT_DTYPE_F32) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  return t == GIFT_DTYPE_BF16 ? num::bf16_to_float(h) : num::f16_to_float(h);
}

inline void store(giftDType_t t, float v, uint8_t* p) {
  if (t == GIFT_DTYPE_F32) {
    memcpy(p, &v, 4);
    return;
  }
  const uint16_t h = t == GIFT_DTYPE_BF16 ? num::bf16_from_float(v) : num::f16_from_float(v);
  memcpy(p, &h, 2);
}

// Gradient-like values: heavy-tailed, with magnitudes varying by tensor and by rank.
inline Bucket make_input(const std::vector<TensorSpec>& specs, uint64_t seed, int rank) {
  Bucket b;
  for (size_t i = 0; i < specs.size(); ++i) {
    std::mt19937_64 gen(seed * 1000003u + uint64_t(rank) * 7919u + i);
    std::normal_distribution<float> n(0.0f, 1.0f);
    const float scale = std::exp2(float(int(gen() % 12)) - 6.0f);
    std::vector<uint8_t> bytes(specs[i].elements() * dtype_bytes(specs[i].dtype));
    for (uint64_t e = 0; e < specs[i].elements(); ++e) {
      const float t = n(gen);
      store(specs[i].dtype, scale * t * t * t, bytes.data() + e * dtype_bytes(specs[i].dtype));
    }
    b.push_back(std::move(bytes));
  }
  return b;
}

// The bucket's flat view in fp32 (exact for every dtype).
inline std::vector<double> flat(const std::vector<TensorSpec>& specs, const Bucket& b) {
  std::vector<double> v;
  for (size_t i = 0; i < specs.size(); ++i) {
    for (uint64_t e = 0; e < specs[i].elements(); ++e) {
      v.push_back(to_float(specs[i].dtype, b[i].data() + e * dtype_bytes(specs[i].dtype)));
    }
  }
  return v;
}

// The exact all-reduce of every rank's input, in double.
inline std::vector<double> exact_reduce(const std::vector<std::vector<double>>& inputs,
                                        giftReduceOp_t op) {
  std::vector<double> r(inputs[0].size(), 0.0);
  for (const auto& x : inputs) {
    for (size_t i = 0; i < r.size(); ++i) r[i] += x[i];
  }
  if (op == GIFT_REDUCE_AVG) {
    for (double& v : r) v /= double(inputs.size());
  }
  return r;
}

struct Fp8Limits {
  double max;  // largest finite
  int mbits;   // mantissa bits
  int emin;    // smallest normal exponent
  int emax;    // exponent of the largest binade
};

inline Fp8Limits limits(giftFp8Kind_t k) {
  return k == GIFT_FP8_E4M3 ? Fp8Limits{448.0, 3, -6, 8} : Fp8Limits{57344.0, 2, -14, 15};
}

constexpr double kU = 0x1p-24;  // fp32 unit roundoff

// Worst error of one encode/decode of |x| <= ax in a block whose amax is at most `amax`
// (FORMAT.md 1.7 and 1.8). The code rounds q = fl(x / s) to nearest: half a spacing, which
// is |q| 2^-(m+1) for normal codes and 2^(emin-m-1) for subnormal ones, i.e. in x units
// |x| 2^-(m+1) + s 2^(emin-m-1). fp32 scales: s = fl(amax / max) (at most amax/max(1+u)),
// so |q| <= max(1+2u) and saturation costs at most 2u amax. E8M0: s = 2^(floor(log2 amax)
// - emax), so |q| < 2^(emax+1) may exceed max and saturate: |x| - max s more. The fp32
// division and the decode's multiplication add u |x| each. Both terms grow with ax and
// amax, so upper bounds of either give an upper bound.
inline double encode_bound(double ax, double amax, giftFp8Kind_t kind, giftScaleDType_t sd) {
  if (amax == 0.0) return 0.0;
  const Fp8Limits l = limits(kind);
  const double s = sd == GIFT_SCALE_DTYPE_F32
                       ? amax / l.max * (1.0 + 2 * kU)
                       : std::exp2(std::floor(std::log2(amax * (1.0 + 2 * kU))) - l.emax);
  return ax * std::exp2(-(l.mbits + 1)) + s * std::exp2(l.emin - l.mbits - 1) +
         std::max(0.0, ax - l.max * s) + 4 * kU * amax;
}

// Per-element bound of the all-reduce against the exact result, for the first call (no
// error feedback yet). With y_r the decoded shard of rank r (error e1_r by encode_bound,
// with its block's amax over x_r), the owner sums in fp32 in rank order: recursive
// summation adds at most (w-1) u sum |y_r| (+ u |z| for avg's division); the sum z is
// encoded once more, in a block whose amax is at most the largest |exact| + e1 + slack
// over the block; bf16/fp16 outputs round once more (half an ulp, relative 2^-8 / 2^-11,
// plus fp16's subnormal half-step 2^-25).
inline std::vector<double> error_bound(const std::vector<std::vector<double>>& inputs,
                                       const std::vector<TensorSpec>& specs,
                                       const giftAllReduceConfig& c) {
  const size_t n = inputs[0].size(), w = inputs.size();
  const double div = c.op == GIFT_REDUCE_AVG ? double(w) : 1.0;
  std::vector<double> stage1(n, 0.0), sum_abs(n, 0.0), zmax(n), exact(n, 0.0);
  for (const auto& x : inputs) {
    for (size_t b = 0; b < n; b += c.block) {
      const size_t e = std::min(n, b + c.block);
      double amax = 0.0;
      for (size_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(x[i]));
      for (size_t i = b; i < e; ++i) {
        const double e1 = encode_bound(std::fabs(x[i]), amax, c.kind, c.scale_dtype);
        stage1[i] += e1;
        sum_abs[i] += std::fabs(x[i]) + e1;
        exact[i] += x[i];
      }
    }
  }
  std::vector<double> bound(n);
  for (size_t i = 0; i < n; ++i) {
    const double slack = double(w) * kU * sum_abs[i] / div + kU * sum_abs[i] / div;
    bound[i] = (stage1[i] / div + slack) * (1.0 + 1e-9);
    zmax[i] = std::fabs(exact[i]) / div + bound[i];
  }
  for (size_t b = 0; b < n; b += c.block) {
    const size_t e = std::min(n, b + c.block);
    const double amax = *std::max_element(zmax.begin() + b, zmax.begin() + e);
    for (size_t i = b; i < e; ++i) {
      bound[i] += encode_bound(zmax[i], amax, c.kind, c.scale_dtype);
    }
  }
  size_t i = 0;
  for (const TensorSpec& s : specs) {
    const double rel = s.dtype == GIFT_DTYPE_BF16  ? 0x1p-8
                       : s.dtype == GIFT_DTYPE_F16 ? 0x1p-11
                                                   : 0;
    const double abs = s.dtype == GIFT_DTYPE_F16 ? 0x1p-25 : 0;
    for (uint64_t e = 0; e < s.elements(); ++e, ++i) {
      bound[i] += rel * (std::fabs(exact[i]) / div + bound[i]) + abs;
    }
  }
  return bound;
}

}  // namespace gift::test
