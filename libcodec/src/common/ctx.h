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
// Whether such a pass leaves a processor free, for its output's write(2) to run behind it.
// With none free, writing behind took longer than writing in turn: a 512 MiB bf16 dump
// encoded on two threads of two processors in 0.17 to 0.19 s against 0.14 to 0.16 s.
bool spare_processor(const giftCtx* ctx);

}  // namespace gift
