#include "common/temporaries.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>

#include "gift/gift.h"

namespace gift {
namespace {

// Fixed storage, so that a signal handler reads it without locks or allocation. A slot is
// free, being filled, named, or claimed by a handler that is unlinking it (then it stays
// so: the process is ending). Untouched slots cost no memory.
enum : int { kFree, kFilling, kNamed, kUnlinking };
// Every member initialized, so that the array is zeros from the start (constant
// initialization), not written slot by slot as giftc starts: 64 page faults and 256 KiB.
struct Slot {
  std::atomic<int> state{kFree};
  pid_t pid = 0;  // a forked child does not remove its parent's files
  char path[PATH_MAX] = {};
};
constexpr int kSlots = 64;
Slot slots[kSlots];
std::atomic<int> creating{0};  // TemporaryCreation sections under way, on any thread
static_assert(std::atomic<int>::is_always_lock_free, "used from signal handlers");

}  // namespace

TemporaryCreation::TemporaryCreation() {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old_);
  creating.fetch_add(1);
}

TemporaryCreation::~TemporaryCreation() {
  creating.fetch_sub(1);
  pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

int temporary_add(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!slots[i].state.compare_exchange_strong(expected, kFilling)) continue;
    slots[i].pid = ::getpid();
    std::memcpy(slots[i].path, path.c_str(), path.size() + 1);
    slots[i].state.store(kNamed);
    return i;
  }
  return -1;
}

void temporary_remove(int slot) {
  if (slot < 0 || slot >= kSlots) return;
  int expected = kNamed;  // a handler that claimed the slot keeps it
  slots[slot].state.compare_exchange_strong(expected, kFree);
}

void temporaries_unlink_all() {
  // A creation on another thread finishes first (microseconds; signals are blocked on the
  // creating thread, so this never runs inside one on its own thread).
  while (creating.load() > 0) {
  }
  const pid_t self = ::getpid();
  for (Slot& s : slots) {
    int expected = kNamed;
    if (!s.state.compare_exchange_strong(expected, kUnlinking)) continue;
    if (s.pid != self) {
      s.state.store(kNamed);
      continue;
    }
    (void)::unlink(s.path);
  }
}

}  // namespace gift

extern "C" void giftRemoveTemporaryFiles(void) { gift::temporaries_unlink_all(); }
