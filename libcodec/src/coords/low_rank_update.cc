#include "coords/low_rank_update.h"

#include <omp.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "numerics/hwy_targets.h"  // before Highway's headers
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "coords/low_rank_update.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "common/ctx.h"
#include "numerics/fp_env.h"

HWY_BEFORE_NAMESPACE();
namespace gift::coords {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

struct Operands {
  const float* vp;    // dim x rp: V, its rows padded with zeros to whole vectors
  const float* vt;    // rank x dim: V^T
  const float* c;     // rank
  const float* pre;   // dim, or null
  const float* post;  // dim, or null
  size_t dim, rank, rp;
};

// P[r, k .. k + kVecs n) = X[r, :] V[:, k .. k + kVecs n) for the kRows rows at x: each
// output one chain of MulAdd (fused on FMA targets) in i order, whatever kVecs, so the values
// do not depend on how many columns a step takes.
template <size_t kRows, size_t kVecs>
HWY_INLINE void Project(const Operands& o, const float* x, float* p, size_t k) {
  const DF d;
  const size_t n = hn::Lanes(d);
  hn::Vec<DF> acc[kRows][kVecs];
  for (size_t r = 0; r < kRows; ++r)
    for (size_t c = 0; c < kVecs; ++c) acc[r][c] = hn::Zero(d);
  for (size_t i = 0; i < o.dim; ++i) {
    hn::Vec<DF> vk[kVecs];
    for (size_t c = 0; c < kVecs; ++c) vk[c] = hn::LoadU(d, o.vp + i * o.rp + k + c * n);
    for (size_t r = 0; r < kRows; ++r) {
      const hn::Vec<DF> xr = hn::Set(d, x[r * o.dim + i]);
      for (size_t c = 0; c < kVecs; ++c) acc[r][c] = hn::MulAdd(xr, vk[c], acc[r][c]);
    }
  }
  for (size_t r = 0; r < kRows; ++r)
    for (size_t c = 0; c < kVecs; ++c) hn::StoreU(acc[r][c], d, p + r * o.rp + k + c * n);
}

// X[r, i .. i + kVecs n) += P[r, :] diag(c) V^T (P already scaled by c), then the post
// scaling: each output one chain of MulAdd in j order, whatever kVecs.
template <size_t kRows, size_t kVecs>
HWY_INLINE void Update(const Operands& o, float* x, const float* p, size_t i) {
  const DF d;
  const size_t n = hn::Lanes(d), dim = o.dim;
  hn::Vec<DF> out[kRows][kVecs];
  for (size_t r = 0; r < kRows; ++r)
    for (size_t c = 0; c < kVecs; ++c) out[r][c] = hn::LoadU(d, x + r * dim + i + c * n);
  for (size_t j = 0; j < o.rank; ++j) {
    hn::Vec<DF> vt[kVecs];
    for (size_t c = 0; c < kVecs; ++c) vt[c] = hn::LoadU(d, o.vt + j * dim + i + c * n);
    for (size_t r = 0; r < kRows; ++r) {
      const hn::Vec<DF> pr = hn::Set(d, p[r * o.rp + j]);
      for (size_t c = 0; c < kVecs; ++c) out[r][c] = hn::MulAdd(pr, vt[c], out[r][c]);
    }
  }
  if (o.post) {
    for (size_t c = 0; c < kVecs; ++c) {
      const hn::Vec<DF> s = hn::LoadU(d, o.post + i + c * n);
      for (size_t r = 0; r < kRows; ++r) out[r][c] = hn::Mul(out[r][c], s);
    }
  }
  for (size_t r = 0; r < kRows; ++r)
    for (size_t c = 0; c < kVecs; ++c) hn::StoreU(out[r][c], d, x + r * dim + i + c * n);
}

// Vectors of columns per step. With one, each multiply-add loads a vector of V and a
// broadcast element (nine loads per eight FMAs of a band), more than two load ports feed at two
// FMAs per cycle; with two, a broadcast serves both (ten loads per sixteen FMAs), and a band's
// 16 accumulators fit AVX-512's 32 registers (not AVX2's 16). One thread, AVX-512, whiten and
// unwhiten of 1280 x 3456 at rank 32 (bench_whitener): 14.3-15.7 -> 10.6-10.8 ms, about 100
// GFLOP/s; three vectors measured no faster, nor did AVX2 with two vectors in passes of four
// rows (its loads keep up with one).
#undef GIFT_LOW_RANK_VECS
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define GIFT_LOW_RANK_VECS 2
#else
#define GIFT_LOW_RANK_VECS 1
#endif

// kRows consecutive rows at x; p is kRows x rp scratch. The accumulators of kRows rows are
// independent, so a band keeps the FMA units busy and reads each vector of V once per band.
template <size_t kRows>
void Rows(const Operands& o, float* x, float* p) {
  const DF d;
  const size_t n = hn::Lanes(d), dim = o.dim;
  constexpr size_t kVecs = GIFT_LOW_RANK_VECS;
  if (o.pre) {
    for (size_t r = 0; r < kRows; ++r) {
      float* xr = x + r * dim;
      size_t i = 0;
      for (; i + n <= dim; i += n)
        hn::StoreU(hn::Mul(hn::LoadU(d, xr + i), hn::LoadU(d, o.pre + i)), d, xr + i);
      for (; i < dim; ++i) xr[i] *= o.pre[i];
    }
  }
  // P = X V, then P diag(c).
  size_t k = 0;
  for (; k + kVecs * n <= o.rp; k += kVecs * n) Project<kRows, kVecs>(o, x, p, k);
  for (; k < o.rp; k += n) Project<kRows, 1>(o, x, p, k);
  for (size_t r = 0; r < kRows; ++r)
    for (size_t j = 0; j < o.rank; ++j) p[r * o.rp + j] *= o.c[j];
  // X += P diag(c) V^T, then the post scaling.
  size_t i = 0;
  for (; i + kVecs * n <= dim; i += kVecs * n) Update<kRows, kVecs>(o, x, p, i);
  for (; i + n <= dim; i += n) Update<kRows, 1>(o, x, p, i);
  for (; i < dim; ++i) {
    for (size_t r = 0; r < kRows; ++r) {
      float s = x[r * dim + i];
      // Fused like the vector columns' MulAdd, so that which columns fall in this tail (it
      // depends on the vector width) does not change the values on FMA machines.
      for (size_t j = 0; j < o.rank; ++j) s = std::fma(p[r * o.rp + j], o.vt[j * dim + i], s);
      x[r * dim + i] = o.post ? s * o.post[i] : s;
    }
  }
}

void LowRankUpdate(const float* v, const float* c, uint32_t dim, uint32_t rank, const float* pre,
                   const float* post, float* x, uint64_t rows, int threads) {
  const DF d;
  const size_t n = hn::Lanes(d);
  const size_t rp = (rank + n - 1) / n * n;
  std::vector<float> vp(size_t(dim) * rp, 0.0f), vt(size_t(rank) * dim);
  for (size_t i = 0; i < dim; ++i) {
    for (size_t j = 0; j < rank; ++j) {
      vp[i * rp + j] = v[i * rank + j];
      vt[j * dim + i] = v[i * rank + j];
    }
  }
  const Operands o{vp.data(), vt.data(), c, pre, post, dim, rank, rp};
  constexpr size_t kBand = 8;
  const int64_t bands = int64_t(rows / kBand), total = int64_t(rows);
  const int team = threads > 0 ? threads : thread_count(nullptr);
  // Each thread's rows of products, made here: a std::bad_alloc thrown inside the parallel
  // region would end the process (std::terminate) instead of reaching the caller.
  std::vector<float> products(size_t(team) * kBand * rp);
#pragma omp parallel if (rows * dim >= (uint64_t(1) << 16)) num_threads(team)
  {
    // Whitened values reach FP8 codes, and the device plan's whitener must give these bits:
    // IEEE arithmetic (subnormals kept) whatever the caller's environment, on every thread.
    const num::FpEnvGuard fp_env;
    float* p = products.data() + size_t(omp_get_thread_num()) * kBand * rp;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < bands; ++b) Rows<kBand>(o, x + uint64_t(b) * kBand * dim, p);
#pragma omp for schedule(static)
    for (int64_t r = bands * int64_t(kBand); r < total; ++r) Rows<1>(o, x + uint64_t(r) * dim, p);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace gift::coords
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gift::coords {

HWY_EXPORT(LowRankUpdate);

void low_rank_update(const float* v, const float* c, uint32_t dim, uint32_t rank, const float* pre,
                     const float* post, float* x, uint64_t rows, int threads) {
  HWY_DYNAMIC_DISPATCH(LowRankUpdate)(v, c, dim, rank, pre, post, x, rows, threads);
}

}  // namespace gift::coords
#endif
