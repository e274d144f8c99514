// The library's error channel: a result code plus a thread-local message, so the C API can
// report "which tensor, which element, why" without exceptions or allocation by callers.
#pragma once

#include "gift/gift.h"

namespace gift {

// Records a printf-style message for giftGetLastErrorMessage() and returns `code`.
giftResult_t fail(giftResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Clears the message at the start of an API call.
void clear_error();

// The calling thread's message (giftGetLastErrorMessage).
const char* last_message();

}  // namespace gift
