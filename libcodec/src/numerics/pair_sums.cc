#include "numerics/pair_sums.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/ctx.h"
#include "numerics/fp_env.h"
#include "numerics/hwy_targets.h"  // before Highway's headers

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "numerics/pair_sums.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace gift::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A chunk's eight lanes of each sum, as arrays.
struct ChunkLanes {
  double err_sq[8] = {}, ref_sq[8] = {}, approx_sq[8] = {}, dot[8] = {}, err[8] = {};
};

HWY_INLINE double Folded(const double* l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// Pairs [from, to) of a chunk added to its lanes one at a time, NaN and Inf pairs left out
// and counted: the rule that the vector loop follows.
HWY_INLINE void AddPairs(const float* ref, const float* approx, size_t from, size_t to,
                         ChunkLanes& c, PairSums& s) {
  for (size_t k = from; k < to; ++k) {
    if (!std::isfinite(ref[k]) || !std::isfinite(approx[k])) {
      ++s.left_out;
      continue;
    }
    const double r = ref[k], x = approx[k], e = x - r;
    const size_t l = k % 8;
    c.err_sq[l] += e * e;
    c.ref_sq[l] += r * r;
    c.approx_sq[l] += x * x;
    c.dot[l] += r * x;
    c.err[l] += e;
    s.max_abs = std::max(s.max_abs, std::fabs(e));
  }
}

#if HWY_HAVE_FLOAT64
// The whole steps of eight pairs of a chunk of n, summed into its lanes (zero before), and
// their largest |e|; returns where they end. Each step is kAcc vectors of Lanes(DD) doubles
// (kAcc * Lanes(DD) = 8), vector j of a step holding lanes [j Lanes(DD), (j + 1) Lanes(DD)),
// so that every lane adds its pairs in order. r^2, x^2 and r x of fp32 values are exact in
// double, so a fused multiply-add rounds as the rule's product and sum do; e^2 is rounded,
// then added. No test of finiteness: a NaN or Inf in a pair makes its e NaN or Inf, and then
// that lane of e^2's sum NaN or +Inf for good (every e^2 is >= 0, so no Inf - Inf brings it
// back), which the caller checks once per chunk; finite pairs cannot overflow it.
HWY_INLINE size_t AddSteps(const float* ref, const float* approx, size_t n, ChunkLanes& c,
                           double& max_abs) {
  using DD = hn::ScalableTag<double>;
  const DD dd;
  const hn::Rebind<float, DD> df;
  constexpr size_t kLanes = hn::MaxLanes(DD()), kAcc = 8 / kLanes;
  static_assert(kAcc * kLanes == 8, "eight lanes in whole vectors");
  hn::Vec<DD> ee[kAcc], rr[kAcc], aa[kAcc], ra[kAcc], se[kAcc];
  for (size_t j = 0; j < kAcc; ++j) ee[j] = rr[j] = aa[j] = ra[j] = se[j] = hn::Zero(dd);
  auto vmax = hn::Zero(dd);
  size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    for (size_t j = 0; j < kAcc; ++j) {
      const auto r = hn::PromoteTo(dd, hn::LoadU(df, ref + k + j * kLanes));
      const auto x = hn::PromoteTo(dd, hn::LoadU(df, approx + k + j * kLanes));
      const auto e = hn::Sub(x, r);
      ee[j] = hn::Add(ee[j], hn::Mul(e, e));
      rr[j] = hn::MulAdd(r, r, rr[j]);
      aa[j] = hn::MulAdd(x, x, aa[j]);
      ra[j] = hn::MulAdd(r, x, ra[j]);
      se[j] = hn::Add(se[j], e);
      vmax = hn::Max(vmax, hn::Abs(e));
    }
  }
  for (size_t j = 0; j < kAcc; ++j) {
    hn::StoreU(ee[j], dd, c.err_sq + j * kLanes);
    hn::StoreU(rr[j], dd, c.ref_sq + j * kLanes);
    hn::StoreU(aa[j], dd, c.approx_sq + j * kLanes);
    hn::StoreU(ra[j], dd, c.dot + j * kLanes);
    hn::StoreU(se[j], dd, c.err + j * kLanes);
  }
  max_abs = hn::GetLane(hn::MaxOfLanes(dd, vmax));
  return k;
}
#endif

PairSums PairSumsOf(const float* ref, const float* approx, size_t n) {
  PairSums s;
  for (size_t at = 0; at < n; at += kPairChunk) {
    const size_t m = std::min(kPairChunk, n - at);
    const float* r = ref + at;
    const float* x = approx + at;
    ChunkLanes c;
    size_t k = 0;
#if HWY_HAVE_FLOAT64
    double chunk_max = 0;
    k = AddSteps(r, x, m, c, chunk_max);
    if (std::isfinite(Folded(c.err_sq))) {
      s.max_abs = std::max(s.max_abs, chunk_max);
    } else {  // a NaN or Inf among the pairs: the chunk again, pair by pair
      c = ChunkLanes();
      k = 0;
    }
#endif
    AddPairs(r, x, k, m, c, s);
    s.err_sq += Folded(c.err_sq);
    s.ref_sq += Folded(c.ref_sq);
    s.approx_sq += Folded(c.approx_sq);
    s.dot += Folded(c.dot);
    s.err += Folded(c.err);
  }
  return s;
}

}  // namespace HWY_NAMESPACE
}  // namespace gift::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gift::simd {

HWY_EXPORT(PairSumsOf);

namespace {

// Chunks a thread takes at least (64K pairs: a parallel region costs microseconds, a chunk
// about one), and at most in one round (their sums kept for the ordered total: 56 KiB).
constexpr size_t kChunksPerThread = 16, kChunksPerRound = 1024;

// The totals of parts in order: what one call over them all adds, since a part of whole
// chunks returns its chunks' folded sums added to zero.
void add_part(PairSums& s, const PairSums& part) {
  s.err_sq += part.err_sq;
  s.ref_sq += part.ref_sq;
  s.approx_sq += part.approx_sq;
  s.dot += part.dot;
  s.err += part.err;
  s.max_abs = std::max(s.max_abs, part.max_abs);
  s.left_out += part.left_out;
}

}  // namespace

PairSums pair_sums(const float* ref, const float* approx, size_t n) {
  const size_t chunks = (n + kPairChunk - 1) / kPairChunk;
  const int threads =
      int(std::min<size_t>(size_t(thread_count(nullptr)), chunks / kChunksPerThread));
  if (threads < 2) return HWY_DYNAMIC_DISPATCH(PairSumsOf)(ref, approx, n);
  // Each chunk's sums on some thread, then added here in chunk order: the same doubles
  // whatever the threads.
  PairSums s;
  std::vector<PairSums> part(std::min(chunks, kChunksPerRound));
  for (size_t c0 = 0; c0 < chunks; c0 += part.size()) {
    const int64_t m = int64_t(std::min(part.size(), chunks - c0));
#pragma omp parallel num_threads(threads)
    {
      const num::FpEnvGuard fp_env;
#pragma omp for schedule(static)
      for (int64_t k = 0; k < m; ++k) {
        const size_t at = (c0 + size_t(k)) * kPairChunk;
        part[size_t(k)] =
            HWY_DYNAMIC_DISPATCH(PairSumsOf)(ref + at, approx + at, std::min(kPairChunk, n - at));
      }
    }
    for (int64_t k = 0; k < m; ++k) add_part(s, part[size_t(k)]);
  }
  return s;
}

}  // namespace gift::simd
#endif
