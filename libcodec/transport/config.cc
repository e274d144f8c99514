#include "transport/config.h"

#include "common/error.h"
#include "common/sized.h"

namespace gift::transport {

giftResult_t read_config(const giftAllReduceConfig* config, giftAllReduceConfig* out) {
  const giftAllReduceConfig defaults = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  *out = defaults;
  if (!config) return GIFT_OK;
  if (const giftResult_t r = read_sized(config, defaults, out, "giftAllReduceConfig")) return r;
  const int coords = enum_value(out->coords), op = enum_value(out->op);
  if (coords != GIFT_COORDS_MODE_EUCLIDEAN && coords != GIFT_COORDS_MODE_GIFT &&
      coords != GIFT_COORDS_MODE_AUTO) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown coordinates mode %d", coords);
  }
  if (out->threads < 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "threads is negative (%d)", out->threads);
  }
  if (op != GIFT_REDUCE_SUM && op != GIFT_REDUCE_AVG) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown reduce op %d", op);
  }
  return GIFT_OK;
}

}  // namespace gift::transport
