// Data sections: checksums and optional zstd compression of their bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gift/gift.h"

namespace gift::container {

uint64_t checksum64(const void* data, uint64_t size);
// The same hash, read a few MiB at a time, each piece's pages mapped first (map_ahead): for
// sections of a memory-mapped frame, 2% off a 512 MiB giftc decode. Allocates nothing.
uint64_t checksum64_mapped(const void* data, uint64_t size);

// checksum64 of bytes given in pieces.
class Checksum64 {
 public:
  Checksum64();
  ~Checksum64();
  void update(const void* data, uint64_t size);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A section as the writer stores it: its bytes in memory, or in the writer's scratch file.
struct StoredSection {
  std::vector<uint8_t> bytes;  // as stored (compressed or not), unless spilled
  bool spilled = false;
  bool streamed = false;        // spilled into the output the writer streams to, not the scratch
  uint64_t scratch_offset = 0;  // where the stored bytes lie in the file spilled to
  uint64_t stored_length = 0;
  uint64_t raw_length = 0;
  bool zstd = false;
  uint64_t checksum = 0;
};

// zstd's streaming compressor at `level`, told the section's raw length up front. Its output
// does not depend on how the input is cut into pieces (zstd's one-shot compressor may differ
// from it), so a section compressed whole and one compressed band by band are the same bytes.
class SectionCompressor {
 public:
  using Out = std::function<giftResult_t(const uint8_t* data, uint64_t size)>;
  SectionCompressor(int level, uint64_t raw_length);
  ~SectionCompressor();
  SectionCompressor(const SectionCompressor&) = delete;
  SectionCompressor& operator=(const SectionCompressor&) = delete;
  // Compresses the next piece, handing what output is ready to `out`.
  giftResult_t add(const void* data, uint64_t size, const Out& out);
  // After the last piece (raw_length bytes in all): the rest of the output.
  giftResult_t end(const Out& out);

 private:
  giftResult_t run(const void* data, uint64_t size, bool last, const Out& out);
  struct State;
  std::unique_ptr<State> state_;
};

// Whether a section of raw_length bytes is stored as the `compressed` bytes zstd made of it:
// only where they are fewer. At equal sizes the raw bytes win, since they can be used where
// they lie (a memory-mapped frame, FORMAT.md 2.3).
inline bool compression_pays(uint64_t compressed, uint64_t raw_length) {
  return compressed < raw_length;
}

// Compresses with zstd at `level` (SectionCompressor) when level > 0 and that pays.
StoredSection store_section(std::vector<uint8_t> raw, int level);

// A compressed section's raw bytes read forward, a window at a time: holds what the last
// get() asked for, and decompresses from the start again only for bytes before that.
class SectionWindow {
 public:
  SectionWindow();
  ~SectionWindow();
  SectionWindow(SectionWindow&&) noexcept;
  SectionWindow& operator=(SectionWindow&&) noexcept;
  // The checks of decompress_section that need no decompression; `what` names the section.
  giftResult_t open(const uint8_t* stored, uint64_t stored_length, uint64_t raw_length,
                    std::string what);
  // Raw bytes [at, at + n), valid until the next call.
  giftResult_t get(uint64_t at, uint64_t n, const uint8_t** bytes);

 private:
  giftResult_t restart();
  struct State;
  std::unique_ptr<State> state_;
};

// Decompresses exactly raw_length bytes into out; `what` names the section in messages.
giftResult_t decompress_section(const uint8_t* stored, uint64_t stored_length, uint64_t raw_length,
                                std::vector<uint8_t>* out, const char* what);

}  // namespace gift::container
