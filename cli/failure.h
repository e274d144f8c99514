// How giftc fails: an exit code and a message. Its own header so that the tensor-file
// library (io/) throws what giftc's main() catches without seeing the rest of common.h.
#pragma once

#include <stdexcept>
#include <string>

namespace giftc {

// Documented in man/giftc.1.
enum Exit : int { kOk = 0, kUsage = 1, kBadInput = 2, kIoError = 3, kBasis = 4 };

// Thrown inside giftc only; main() prints it and exits with its code.
struct Failure : std::runtime_error {
  Failure(int code, const std::string& message) : std::runtime_error(message), code(code) {}
  int code;
};

}  // namespace giftc
