#include "common/error.h"

#include <cstdarg>
#include <cstdio>

namespace gift {
namespace {
thread_local char g_message[512];
}

giftResult_t fail(giftResult_t code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(g_message, sizeof g_message, fmt, ap);
  va_end(ap);
  return code;
}

void clear_error() { g_message[0] = '\0'; }

}  // namespace gift

extern "C" const char* giftGetLastErrorMessage(void) { return gift::g_message; }

extern "C" const char* giftGetErrorString(giftResult_t result) {
  switch (result) {
    case GIFT_OK:
      return "no error";
    case GIFT_ERROR_INVALID_ARGUMENT:
      return "invalid argument";
    case GIFT_ERROR_NONFINITE_INPUT:
      return "non-finite input";
    case GIFT_ERROR_BUFFER_TOO_SMALL:
      return "buffer too small";
    case GIFT_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    case GIFT_ERROR_INTERNAL:
      return "internal error";
    case GIFT_ERROR_IO:
      return "I/O error";
    case GIFT_ERROR_CORRUPT_INPUT:
      return "corrupt or unsupported input";
  }
  return "unknown error code";
}
