// The runtime settings behind giftCtx (gift.h): what a computation may use, never what it
// computes, so no setting here can change a byte of output.
#pragma once

#include "gift/gift.h"

struct giftCtx {
  int threads = 0;  // 0: the default
};

namespace gift {

// Threads a streaming pass uses under `ctx` (null: the defaults).
int thread_count(const giftCtx* ctx);

}  // namespace gift
