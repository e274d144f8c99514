// Data sections: checksums and optional zstd compression of their bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "gift/gift.h"

namespace gift::container {

uint64_t checksum64(const void* data, uint64_t size);

// A section as the writer stores it.
struct StoredSection {
  std::vector<uint8_t> bytes;  // as stored (compressed or not)
  uint64_t raw_length = 0;
  bool zstd = false;
  uint64_t checksum = 0;
};

// Compresses with zstd at `level` when level > 0 and that makes it smaller.
StoredSection store_section(std::vector<uint8_t> raw, int level);

// Decompresses exactly raw_length bytes into out; `what` names the section in messages.
giftResult_t decompress_section(const uint8_t* stored, uint64_t stored_length, uint64_t raw_length,
                                std::vector<uint8_t>* out, const char* what);

}  // namespace gift::container
