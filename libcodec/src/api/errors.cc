// The C API of errors: names of the result codes and the calling thread's last message.
#include "common/error.h"
#include "gift/gift.h"
#include "gift/gift_transport.h"

extern "C" const char* giftGetLastErrorMessage(void) { return gift::last_message(); }

extern "C" giftResult_t giftBackendFail(giftResult_t code, const char* message) {
  return gift::fail(code, "%s", message ? message : "(no message)");
}

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
    case GIFT_ERROR_FRAME_MAGIC:
      return "not a GIFT frame";
    case GIFT_ERROR_FRAME_VERSION:
      return "unsupported GIFT format version";
    case GIFT_ERROR_FRAME_TRUNCATED:
      return "truncated frame";
    case GIFT_ERROR_HEADER_CHECKSUM:
      return "header checksum mismatch";
    case GIFT_ERROR_HEADER_INVALID:
      return "invalid frame header";
    case GIFT_ERROR_FIELD_INVALID:
      return "invalid header field";
    case GIFT_ERROR_SECTION_BOUNDS:
      return "section out of bounds";
    case GIFT_ERROR_SECTION_ALIGNMENT:
      return "misaligned section";
    case GIFT_ERROR_SECTION_LENGTH:
      return "wrong section length";
    case GIFT_ERROR_SECTION_CHECKSUM:
      return "section checksum mismatch";
    case GIFT_ERROR_DECOMPRESSION:
      return "decompression failed";
    case GIFT_ERROR_NOT_FOUND:
      return "not found";
    case GIFT_ERROR_BASIS_MISSING:
      return "basis missing";
    case GIFT_ERROR_DEVICE:
      return "device error";
    case GIFT_ERROR_REMOTE:
      return "another rank failed";
  }
  return "unknown error code";
}
