// libFuzzer harness over the GIFT frame reader (and the basis reader, which reads a frame of
// kind Basis): giftFrameOpen on arbitrary bytes, then every
// read the C API offers (tensor info, lookup by name, decode to each output dtype, verify).
// Nothing may crash, leak, read out of bounds or trip UBSan; a few API contracts are checked
// too, and a broken one aborts, so libFuzzer reports it like a crash.
//
// Checksums would stop a fuzzer at the door: a mutated header almost never matches its
// XXH3-64. So each input is tried twice: as it is, and "repaired" (frame length set to the
// input's size, every in-bounds section's checksum and then the header checksum recomputed),
// which lets mutations reach the FlatBuffers verifier, the field checks, zstd and the decoder.
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "container/layout.h"
#include "gift/gift.h"
#include "gift/gift_basis.h"
#include "gift_generated.h"

namespace {

// Neither the harness nor the reader on its behalf allocates more than this for one tensor
// or section. The reader bounds sizes by the frame's bytes, but a zstd section may claim up
// to 2^16 times its stored bytes (FORMAT.md 2.3), so a 64 KiB input could ask for 4 GiB.
constexpr uint64_t kMaxDecodeBytes = uint64_t(64) << 20;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "frame_fuzzer: contract broken: %s (%s)\n", what,
                 giftGetLastErrorMessage());
    std::abort();
  }
}

// FORMAT.md 2.2: names are UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(const char* s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s);
  while (*p) {
    const uint8_t c = *p;
    int n = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) {
      ++p;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    for (int i = 1; i <= n; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;  // also stops at the terminating NUL
      cp = cp << 6 | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    p += n + 1;
  }
  return true;
}

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_le(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = uint8_t(v >> (8 * i));
}

// The basis reader on the same bytes: whatever it accepts is a basis whose id its contents
// hash to, that round-trips through its own bytes under that id.
void exercise_basis(const uint8_t* data, size_t size) {
  giftBasis* b = nullptr;
  if (giftBasisFromBytes(data, size, &b) != GIFT_OK) {
    check(b == nullptr, "a failed basis load returns no basis");
    return;
  }
  const giftBasisId id = giftBasisGetId(b);
  for (uint64_t i = 0; i < giftBasisEntryCount(b); ++i) {
    giftBasisEntryInfo e = GIFT_BASIS_ENTRY_INFO_INIT;
    check(giftBasisGetEntry(b, i, &e) == GIFT_OK && e.rank <= e.dim, "entries are readable");
  }
  void* bytes = nullptr;
  uint64_t n = 0;
  if (giftBasisSerialize(b, 0, &bytes, &n) == GIFT_OK) {
    giftBasis* again = nullptr;
    check(giftBasisFromBytes(bytes, n, &again) == GIFT_OK, "a written basis loads");
    const giftBasisId id2 = giftBasisGetId(again);
    check(id2.lo == id.lo && id2.hi == id.hi, "a basis keeps its id through its bytes");
    giftBasisFree(again);
    giftFree(bytes);
  }
  giftBasisFree(b);
}

void exercise(const uint8_t* data, size_t size) {
  exercise_basis(data, size);
  giftFrame* frame = nullptr;
  const giftResult_t opened = giftFrameOpen(data, size, &frame);
  if (opened != GIFT_OK) {
    check(frame == nullptr, "a failed open returns no frame");
    check(giftGetErrorString(opened) != nullptr, "every error has a name");
    return;
  }
  check(frame != nullptr, "a successful open returns a frame");

  const uint64_t count = giftFrameTensorCount(frame);
  bool decode_failed = false;  // a decode to f32 failed, other than for a missing basis
  bool verifiable = true;      // every section small enough for giftFrameVerify within the cap
  std::vector<uint8_t> out;
  for (uint64_t i = 0; i < count; ++i) {
    giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
    check(giftFrameTensorInfo(frame, i, &info) == GIFT_OK, "info of every listed tensor");
    check(info.name != nullptr && info.name[0] != '\0', "a tensor has a non-empty name");
    check(valid_utf8(info.name), "a tensor name is UTF-8");
    check(info.ndim <= gift::container::kMaxDims, "ndim within the limit");
    uint64_t product = 1;
    for (uint32_t d = 0; d < info.ndim; ++d) product *= info.shape[d];
    check(product == info.elements, "elements is the product of the shape");
    check(info.dtype == GIFT_DTYPE_F32 || info.dtype == GIFT_DTYPE_BF16 ||
              info.dtype == GIFT_DTYPE_F16,
          "a known tensor dtype");
    uint64_t found = UINT64_MAX;
    check(giftFrameFindTensor(frame, info.name, &found) == GIFT_OK && found == i,
          "names are unique and found");

    if (info.elements > kMaxDecodeBytes / 4 || info.raw_bytes > kMaxDecodeBytes) {
      verifiable = false;
      continue;
    }
    for (giftDType_t to : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16}) {
      const uint64_t need = info.elements * giftDTypeSize(to);
      out.assign(need, 0);
      // One byte short must be refused before anything is written.
      if (need > 0) {
        check(giftFrameDecodeTensor(frame, i, out.data(), need - 1, to) ==
                  GIFT_ERROR_BUFFER_TOO_SMALL,
              "a short output buffer is refused");
      }
      const giftResult_t r = giftFrameDecodeTensor(frame, i, out.data(), need, to);
      if (to == GIFT_DTYPE_F32 && r != GIFT_OK) {
        decode_failed = true;
      }
    }
  }
  giftTensorInfo none = GIFT_TENSOR_INFO_INIT;
  check(giftFrameTensorInfo(frame, count, &none) == GIFT_ERROR_NOT_FOUND, "no tensor past the end");
  check(giftFrameDecodeTensor(frame, count, nullptr, 0, GIFT_DTYPE_F32) == GIFT_ERROR_NOT_FOUND,
        "no decode past the end");

  // giftFrameVerify decompresses every section, the embedded basis included, without a cap.
  const gift::fb::Section* basis =
      gift::fb::GetFrame(data + gift::container::kPreambleBytes)->basis();
  if (basis && basis->raw_length() > kMaxDecodeBytes) verifiable = false;
  if (verifiable) {
    const giftResult_t v = giftFrameVerify(frame);
    // Verify fails exactly when a decode fails (a tensor in GIFT coordinates without its basis
    // included), except that it also reads an embedded basis section no tensor may use, and
    // that a frame of kind Basis must also be the basis it says (as giftBasisFromBytes reads it).
    const bool basis_kind = gift::fb::GetFrame(data + gift::container::kPreambleBytes)->kind() ==
                            gift::fb::FrameKind::Basis;
    if (decode_failed) {
      check(v != GIFT_OK, "verify fails when a decode failed");
    } else if (basis_kind) {
      giftBasis* b = nullptr;
      const giftResult_t loaded = giftBasisFromBytes(data, size, &b);
      giftBasisFree(b);
      check((v == GIFT_OK) == (loaded == GIFT_OK), "verify agrees with loading the basis");
    } else if (!basis) {
      check(v == GIFT_OK, "verify agrees with the decodes");
    }
  }
  giftFrameClose(frame);
}

// Repairs what a mutation breaks before the reader looks further: the frame length, the
// section checksums and the header checksum. Returns false when there is nothing to repair.
bool repair(std::vector<uint8_t>& f) {
  using namespace gift::container;
  if (f.size() < kPreambleBytes || std::memcmp(f.data(), kMagic, 8) != 0) return false;
  put_le(f.data() + 24, f.size(), 8);
  const uint64_t header_length = get_le(f.data() + 12, 4);
  if (header_length > f.size() - kPreambleBytes) return true;
  uint8_t* h = f.data() + kPreambleBytes;
  flatbuffers::Verifier::Options opts;
  opts.max_depth = kMaxDepth;
  opts.max_tables = kMaxTables;
  flatbuffers::Verifier v(h, header_length, opts);
  if (gift::fb::VerifyFrameBuffer(v)) {
    // The verifier allows tables to overlap, so a checksum written into the header could
    // change fields still to be read: every read comes first, then the writes.
    std::vector<std::pair<uint8_t*, uint64_t>> writes;
    const uint64_t data_start = kPreambleBytes + header_length;
    auto fix = [&](const gift::fb::Section* s) {
      if (!s || s->offset() < data_start || s->offset() > f.size() ||
          s->stored_length() > f.size() - s->offset()) {
        return;
      }
      // Section privately derives from Table (same address); the verifier has checked that
      // the field, when present, lies inside the header.
      const auto* t = reinterpret_cast<const flatbuffers::Table*>(s);
      if (const uint8_t* at = t->GetAddressOf(gift::fb::Section::VT_CHECKSUM)) {
        writes.emplace_back(const_cast<uint8_t*>(at),
                            XXH3_64bits(f.data() + s->offset(), s->stored_length()));
      }
    };
    const auto* frame = gift::fb::GetFrame(h);
    if (const auto* list = frame->tensors()) {
      for (const gift::fb::Tensor* t : *list) {
        fix(t->codes());
        fix(t->scales());
      }
    }
    fix(frame->basis());
    for (const auto& [at, sum] : writes) put_le(at, sum, 8);
  }
  put_le(f.data() + 16, XXH3_64bits(h, header_length), 8);
  return true;
}

}  // namespace

// Every UBSan report is fatal, so that libFuzzer keeps the input as a crash: the sanitized
// tree compiles the checks so already, and a build with recoverable ones halts here too.
extern "C" const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  exercise(data, size);
  std::vector<uint8_t> fixed(data, data + size);
  if (repair(fixed) && std::memcmp(fixed.data(), data, size) != 0) {
    exercise(fixed.data(), fixed.size());
  }
  return 0;
}
