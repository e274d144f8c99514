// Error metrics (FORMAT.md 1.11) over fp32 spans; the C API's giftComputeErrorMetrics and
// giftErrorMetricsMerge check their structs and call these.
#pragma once

#include <cstdint>

#include "gift/gift.h"

namespace gift {

// *out's sums and ratios (its header untouched); `a` may be null.
giftResult_t compute_metrics(const float* ref, const float* approx, uint64_t rows, uint64_t cols,
                             const float* a, giftErrorMetrics* out);
void merge_metrics(giftErrorMetrics* total, const giftErrorMetrics* part);

}  // namespace gift
