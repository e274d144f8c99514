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

// The threads of a parallel loop of `tasks` tasks on at most `threads`: no more than it has
// tasks, so that a small tensor runs on the calling thread alone. A team wakes every thread
// and waits for each at its barrier, busy or not: with another process busy on the second of
// 2 processors, a .npz of 2,000 small tensors took 0.06 to 0.25 s to encode (0.06 on one
// thread) and 0.13 to 0.18 s to decode (0.04), and up to 100 times longer where the VM's
// other processor was descheduled.
inline int team_size(int threads, long long tasks) {
  return int(tasks < 1 ? 1 : tasks < threads ? tasks : threads);
}

}  // namespace gift
