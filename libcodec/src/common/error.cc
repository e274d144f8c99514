#include "common/error.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace gift {
namespace {
thread_local char g_message[512];
}

giftResult_t fail(giftResult_t code, const char* fmt, ...) {
  // Formatted aside first: callers may pass the current message as an argument to prefix it.
  char buf[sizeof g_message];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::memcpy(g_message, buf, sizeof buf);
  return code;
}

void clear_error() { g_message[0] = '\0'; }

const char* last_message() { return g_message; }

}  // namespace gift
