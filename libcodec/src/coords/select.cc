#include "coords/select.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/ctx.h"
#include "common/error.h"
#include "numerics/codec.h"
#include "numerics/metrics.h"

namespace gift::coords {
namespace {

double round_trip_error(const float* x, uint64_t rows, uint64_t cols, const giftQuantParams& p,
                        const Whitener* t, int threads) {
  giftCtx ctx;
  ctx.threads = threads;
  std::vector<float> v(x, x + rows * cols);
  if (t) whiten(*t, v.data(), rows, threads);
  uint64_t sb = 0;
  giftScaleBytes(&p, rows, cols, &sb);
  std::vector<uint8_t> codes(v.size()), scales(sb);
  giftQuantParams q = p;
  q.nonfinite = GIFT_NONFINITE_KEEP;
  if (encode_tensor(&ctx, q, v.data(), GIFT_DTYPE_F32, rows, cols, codes.data(), scales.data(),
                    nullptr)) {
    return INFINITY;
  }
  decode_tensor(&ctx, q, codes.data(), scales.data(), rows, cols, v.data(), GIFT_DTYPE_F32);
  if (t) unwhiten(*t, v.data(), rows, threads);
  giftErrorMetrics m;
  if (compute_metrics(x, v.data(), rows, cols, nullptr, &m)) return INFINITY;
  return m.rel_l2;
}

}  // namespace

uint64_t sample_rows(uint64_t rows, const SelectOptions& o) {
  return std::min<uint64_t>(rows, o.sample_rows);
}

Selection choose_coords(const float* w, uint64_t rows, uint64_t cols, const Whitener* t,
                        const giftQuantParams& p, const SelectOptions& o) {
  bool all_finite = true;
  for (uint64_t i = 0; i < rows * cols && all_finite; ++i) all_finite = std::isfinite(w[i]);
  // Deterministic, evenly spaced rows.
  const uint64_t k = sample_rows(rows, o);
  std::vector<float> sample(k * cols);
  for (uint64_t i = 0; i < k; ++i)
    std::memcpy(&sample[i * cols], w + sample_row(i, rows, o) * cols, cols * 4);
  return choose_from_sample(sample.data(), all_finite, rows, cols, t, p, o);
}

Selection choose_from_sample(const float* sample, bool all_finite, uint64_t rows, uint64_t cols,
                             const Whitener* t, const giftQuantParams& p, const SelectOptions& o) {
  Selection c;
  if (o.mode == CoordsMode::kEuclidean) return c;
  c.made = true;
  if (!t) {
    c.reason = "no whitener in the basis";
    return c;
  }
  if (t->dim != cols || rows < o.min_dim || cols < o.min_dim) {
    c.reason = t->dim != cols ? "basis dimension differs" : "too small";
    return c;
  }
  // Whitening mixes each row's values, so one NaN or Inf (kept by request) would spread
  // over its whole row; such tensors stay Euclidean, where it stays one element.
  if (!all_finite) {
    c.reason = "non-finite values";
    return c;
  }
  c.transform_flops = 8.0 * double(rows) * double(cols) * double(t->rank);
  const uint64_t k = sample_rows(rows, o);
  c.euclidean_error = float(round_trip_error(sample, k, cols, p, nullptr, o.threads));
  c.gift_error = float(round_trip_error(sample, k, cols, p, t, o.threads));
  if (o.mode == CoordsMode::kGift) {
    c.gift = true;
    c.reason = "forced (--coords gift)";
  } else if (o.flops_budget > 0 && c.transform_flops > o.flops_budget) {
    c.reason = "transform over the cost budget";
  } else if (c.gift_error < (1.0 - o.margin) * c.euclidean_error) {
    c.gift = true;
    c.reason = "lower estimated error";
  } else {
    c.reason = "no gain over the margin";
  }
  return c;
}

}  // namespace gift::coords
