// The C API of error metrics: sized-struct checks around numerics/metrics.h.
#include "numerics/metrics.h"

#include "common/error.h"
#include "common/sized.h"
#include "gift/gift.h"

namespace {

const giftErrorMetrics kEmpty = GIFT_ERROR_METRICS_INIT;

}  // namespace

extern "C" {

void giftErrorMetricsInit(giftErrorMetrics* m) {
  if (m) *m = kEmpty;
}

giftResult_t giftComputeErrorMetrics(const float* ref, const float* approx, uint64_t rows,
                                     uint64_t cols, const float* a, giftErrorMetrics* out) {
  gift::clear_error();
  if (const giftResult_t r = gift::check_sized(out, "giftErrorMetrics")) return r;
  giftErrorMetrics m = kEmpty;
  if (const giftResult_t r = gift::compute_metrics(ref, approx, rows, cols, a, &m)) return r;
  return gift::write_sized(m, out, "giftErrorMetrics");
}

giftResult_t giftErrorMetricsMerge(giftErrorMetrics* total, const giftErrorMetrics* part) {
  gift::clear_error();
  giftErrorMetrics t, p;
  if (const giftResult_t r = gift::read_sized(total, kEmpty, &t, "giftErrorMetrics (total)"))
    return r;
  if (const giftResult_t r = gift::read_sized(part, kEmpty, &p, "giftErrorMetrics (part)"))
    return r;
  gift::merge_metrics(&t, &p);
  return gift::write_sized(t, total, "giftErrorMetrics (total)");
}

}  // extern "C"
