#include "common/temporaries.h"

#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>

#include "gift/gift.h"

namespace gift {
namespace {

// Fixed storage, so that a signal handler reads it without locks or allocation. A slot is
// free, being filled (a handler skips it), or holds a name. Untouched slots cost no memory.
enum : int { kFree, kFilling, kNamed };
struct Slot {
  std::atomic<int> state{kFree};
  char path[PATH_MAX];
};
constexpr int kSlots = 64;
Slot slots[kSlots];
static_assert(std::atomic<int>::is_always_lock_free, "used from signal handlers");

}  // namespace

int temporary_add(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!slots[i].state.compare_exchange_strong(expected, kFilling)) continue;
    std::memcpy(slots[i].path, path.c_str(), path.size() + 1);
    slots[i].state.store(kNamed, std::memory_order_release);
    return i;
  }
  return -1;
}

void temporary_remove(int slot) {
  if (slot >= 0 && slot < kSlots) slots[slot].state.store(kFree, std::memory_order_release);
}

void temporaries_unlink_all() {
  for (Slot& s : slots) {
    if (s.state.load(std::memory_order_acquire) == kNamed) (void)::unlink(s.path);
  }
}

}  // namespace gift

extern "C" void giftRemoveTemporaryFiles(void) { gift::temporaries_unlink_all(); }
