// Reading the caller's sized config struct, shared by plans and communicators.
#pragma once

#include "gift/gift_transport.h"

namespace gift::transport {

// Copies at most config->size bytes of the caller's struct over the defaults (NULL gives the
// defaults), so that callers built against an older or newer header are read safely.
giftResult_t read_config(const giftAllReduceConfig* config, giftAllReduceConfig* out);

}  // namespace gift::transport
