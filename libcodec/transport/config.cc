#include "transport/config.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace gift::transport {

giftResult_t read_config(const giftAllReduceConfig* config, giftAllReduceConfig* out) {
  *out = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  if (!config) return GIFT_OK;
  constexpr size_t kPrefix = offsetof(giftAllReduceConfig, version) + sizeof(unsigned int);
  if (config->size < kPrefix) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "giftAllReduceConfig.size is %zu: initialize the struct with "
                "GIFT_ALLREDUCE_CONFIG_INITIALIZER",
                config->size);
  }
  if (config->magic != GIFT_STRUCT_MAGIC) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "giftAllReduceConfig.magic is 0x%08x, not GIFT_STRUCT_MAGIC: initialize the "
                "struct with GIFT_ALLREDUCE_CONFIG_INITIALIZER",
                config->magic);
  }
  const size_t size = out->size;
  memcpy(out, config, std::min(config->size, sizeof *out));
  out->size = size;
  if (out->op != GIFT_REDUCE_SUM && out->op != GIFT_REDUCE_AVG) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown reduce op %d", int(out->op));
  }
  return GIFT_OK;
}

}  // namespace gift::transport
