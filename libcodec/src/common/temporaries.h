// The temporary names this process's outputs are being written under (where the file system
// has no unnamed files), so that a signal handler can remove them: giftRemoveTemporaryFiles.
#pragma once

#include <string>

namespace gift {

// Records `path`; returns its slot, or -1 when it cannot be recorded (more outputs at once
// than the registry holds, or a name too long), which only loses the clean-up on a signal.
int temporary_add(const std::string& path);
// Forgets a slot from temporary_add (-1: nothing).
void temporary_remove(int slot);
// Unlinks every recorded name. Async-signal-safe.
void temporaries_unlink_all();

}  // namespace gift
