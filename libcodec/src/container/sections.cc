#include "container/sections.h"

#include <xxhash.h>
#include <zstd.h>

#include <cinttypes>
#include <new>

#include "common/error.h"

namespace gift::container {

uint64_t checksum64(const void* data, uint64_t size) {
  return XXH3_64bits(data, static_cast<size_t>(size));
}

struct Checksum64::State {
  XXH3_state_t* s = XXH3_createState();
  ~State() { XXH3_freeState(s); }
};

Checksum64::Checksum64() : state_(new State) {
  if (!state_->s) throw std::bad_alloc();
  XXH3_64bits_reset(state_->s);
}

Checksum64::~Checksum64() = default;

void Checksum64::update(const void* data, uint64_t size) {
  XXH3_64bits_update(state_->s, data, static_cast<size_t>(size));
}

uint64_t Checksum64::digest() const { return XXH3_64bits_digest(state_->s); }

StoredSection store_section(std::vector<uint8_t> raw, int level) {
  StoredSection s;
  s.raw_length = raw.size();
  if (level > 0 && !raw.empty()) {
    std::vector<uint8_t> z(ZSTD_compressBound(raw.size()));
    const size_t n = ZSTD_compress(z.data(), z.size(), raw.data(), raw.size(), level);
    if (!ZSTD_isError(n) && n < raw.size()) {
      z.resize(n);
      s.bytes = std::move(z);
      s.zstd = true;
    }
  }
  if (!s.zstd) s.bytes = std::move(raw);
  s.stored_length = s.bytes.size();
  s.checksum = checksum64(s.bytes.data(), s.bytes.size());
  return s;
}

giftResult_t decompress_section(const uint8_t* stored, uint64_t stored_length, uint64_t raw_length,
                                std::vector<uint8_t>* out, const char* what) {
  // Exactly one zstd stream, filling the section: nothing appended, skippable or not.
  const size_t frame_size = ZSTD_findFrameCompressedSize(stored, stored_length);
  if (ZSTD_isError(frame_size) || frame_size != stored_length) {
    return fail(GIFT_ERROR_DECOMPRESSION, "%s: the section is not exactly one zstd stream", what);
  }
  const unsigned long long declared = ZSTD_getFrameContentSize(stored, stored_length);
  if (declared != raw_length) {
    return fail(
        GIFT_ERROR_DECOMPRESSION, "%s: zstd data declares %llu bytes, the header %" PRIu64, what,
        declared == ZSTD_CONTENTSIZE_UNKNOWN || declared == ZSTD_CONTENTSIZE_ERROR ? 0ull
                                                                                   : declared,
        raw_length);
  }
  out->resize(raw_length);
  const size_t n = ZSTD_decompress(out->data(), out->size(), stored, stored_length);
  if (ZSTD_isError(n) || n != raw_length) {
    return fail(GIFT_ERROR_DECOMPRESSION, "%s: zstd: %s", what,
                ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short output");
  }
  return GIFT_OK;
}

}  // namespace gift::container
