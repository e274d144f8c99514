// The GIFT frame's fixed layout and limits (FORMAT.md section 2): the one place that states
// them for the writer, the reader and the tests.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/bytes.h"
#include "gift/gift_version.h"

namespace gift::container {

// PNG-style: a non-ASCII first byte, then CR LF, Ctrl-Z and LF to catch text-mode damage.
constexpr uint8_t kMagic[8] = {0x89, 'G', 'F', 'T', 0x0D, 0x0A, 0x1A, 0x0A};
// The version this build writes; it reads every minor of kMajor (FORMAT.md 3.1).
constexpr uint16_t kMajor = GIFT_FORMAT_MAJOR;
constexpr uint16_t kMinor = GIFT_FORMAT_MINOR;
constexpr uint64_t kPreambleBytes = 32;
constexpr uint64_t kSectionAlign = 64;

// Limits a reader enforces before it trusts anything.
constexpr uint64_t kMaxHeaderBytes = uint64_t(64) << 20;
constexpr uint32_t kMaxDims = 32;
constexpr uint32_t kMaxDepth = 16;            // FlatBuffers nesting
constexpr uint32_t kMaxTables = 1u << 22;     // FlatBuffers tables
constexpr uint64_t kMaxZstdRatio = 1u << 16;  // raw_length <= stored_length * this

// Preamble, all little-endian:
//   0  magic[8]   8  major u16   10 minor u16   12 header_length u32
//   16 header_checksum u64 (XXH3-64 of the header)   24 frame_length u64
struct Preamble {
  uint16_t major = kMajor;
  uint16_t minor = kMinor;
  uint32_t header_length = 0;
  uint64_t header_checksum = 0;
  uint64_t frame_length = 0;
};

inline void write_preamble(const Preamble& pre, uint8_t* out) {
  std::memcpy(out, kMagic, 8);
  store_le(out + 8, pre.major, 2);
  store_le(out + 10, pre.minor, 2);
  store_le(out + 12, pre.header_length, 4);
  store_le(out + 16, pre.header_checksum, 8);
  store_le(out + 24, pre.frame_length, 8);
}

inline Preamble read_preamble(const uint8_t* in) {
  Preamble p;
  p.major = uint16_t(load_le(in + 8, 2));
  p.minor = uint16_t(load_le(in + 10, 2));
  p.header_length = uint32_t(load_le(in + 12, 4));
  p.header_checksum = load_le(in + 16, 8);
  p.frame_length = load_le(in + 24, 8);
  return p;
}

inline uint64_t align_up(uint64_t v) {
  return (v + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
}

}  // namespace gift::container
