// The library's error channel: a result code plus a thread-local message, so the C API can
// report "which tensor, which element, why" without exceptions or allocation by callers.
#pragma once

#include <new>

#include "gift/gift.h"

namespace gift {

// Records a printf-style message for giftGetLastErrorMessage() and returns `code`.
giftResult_t fail(giftResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Clears the message at the start of an API call.
void clear_error();

// The calling thread's message (giftGetLastErrorMessage).
const char* last_message();

// run() for the C API, which no exception crosses: memory that runs out fails the call with
// GIFT_ERROR_OUT_OF_MEMORY, "no memory for <what>".
template <typename Run>
giftResult_t without_exceptions(const char* what, Run&& run) {
  try {
    return run();
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for %s", what);
  }
}

}  // namespace gift
