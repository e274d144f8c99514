// Test hooks of the communicator driver: not part of the public API (the symbols are hidden
// in libgift.so); tests reach them by linking the static gift_core.
#pragma once

namespace gift::transport::testing {

// From now on, the driver flips one byte of the message that `receiver` gets from `sender`
// in exchange `step` (0: all-to-all, 1: all-gather), as a faulty link would. step -1 stops.
void corrupt_message(int step, int sender, int receiver);

}  // namespace gift::transport::testing
