// libFuzzer harness over giftc's tensor-file readers (cli/io): every input is parsed as a
// safetensors file, a .npy file and an .npz archive (ZIP directory, stored and deflated
// members, CRC-32, the .npy inside). A reader either accepts the bytes or throws giftc's
// Failure with kBadInput and a message naming the file; any other exception, crash, leak or
// UBSan report is a bug, and so is an accepted file that breaks one of the contracts below.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "failure.h"
#include "io/tensor_file.h"

namespace {

const char* const kName = "fuzz";

void check(bool ok, const char* what, const std::string& detail = "") {
  if (!ok) {
    std::fprintf(stderr, "tensor_file_fuzzer: contract broken: %s %s\n", what, detail.c_str());
    std::abort();
  }
}

void check_bad_input(const giftc::Failure& e) {
  const std::string m = e.what();
  check(e.code == giftc::kBadInput, "a malformed file is bad input:", m);
  // Past the file's name, the message must say what is wrong.
  check(m.rfind(kName, 0) == 0 && m.size() > std::string(kName).size() + 2,
        "the message names the file and the problem:", m);
}

void exercise(gift::io::FileKind kind, const uint8_t* data, size_t size) {
  gift::io::TensorFile f;
  try {
    gift::io::parse_tensor_file(kind, data, size, kName, "tensor", &f);
  } catch (const giftc::Failure& e) {
    return check_bad_input(e);
  }
  for (const gift::io::TensorRef& t : f.tensors) {
    check(!t.name.empty(), "a tensor has a name");
    check(t.dtype == GIFT_DTYPE_F32 || t.dtype == GIFT_DTYPE_BF16 || t.dtype == GIFT_DTYPE_F16,
          "a supported dtype:", t.name);
    check(t.bytes == t.elements() * giftDTypeSize(t.dtype), "bytes match shape and dtype:", t.name);
    // Reads every byte the tensor claims: ASan reports any that lies outside the input or
    // the reader's own storage. A deflated .npz member's data and CRC-32 are checked as it is
    // read (where larger than its .npy header), so it alone may still be found damaged here,
    // as bad input.
    try {
      check(gift::io::widen_to_float(t).size() == t.elements(), "every element widens:", t.name);
    } catch (const giftc::Failure& e) {
      check(kind == gift::io::FileKind::kNpz && t.checked,
            "only a deflated member fails late:", e.what());
      check_bad_input(e);
    }
  }
}

}  // namespace

// Every UBSan report is fatal (see frame_fuzzer.cc), so libFuzzer keeps the input as a crash.
extern "C" const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (const gift::io::FileKind kind :
       {gift::io::FileKind::kSafetensors, gift::io::FileKind::kNpy, gift::io::FileKind::kNpz}) {
    exercise(kind, data, size);
  }
  return 0;
}
