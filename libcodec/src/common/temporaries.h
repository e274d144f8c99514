// The temporary names this process's outputs are being written under (where the file system
// has no unnamed files), so that a signal handler can remove them: giftRemoveTemporaryFiles.
#pragma once

#include <signal.h>

#include <string>

namespace gift {

// Held while a temporary file is created and recorded (or created and unlinked): signals
// are blocked on this thread, and giftRemoveTemporaryFiles on another waits for it to end,
// so that no signal falls between a file's creation and its record.
class TemporaryCreation {
 public:
  TemporaryCreation();
  ~TemporaryCreation();
  TemporaryCreation(const TemporaryCreation&) = delete;
  TemporaryCreation& operator=(const TemporaryCreation&) = delete;

 private:
  sigset_t old_;
};

// Records `path`, a file this process created (while a TemporaryCreation is held); returns
// its slot, or -1 when it cannot be recorded (more outputs at once than the registry holds,
// or a name too long), which only loses the clean-up on a signal.
int temporary_add(const std::string& path);
// Forgets a slot from temporary_add (-1: nothing).
void temporary_remove(int slot);
// Unlinks every name this process recorded. Async-signal-safe.
void temporaries_unlink_all();

}  // namespace gift
