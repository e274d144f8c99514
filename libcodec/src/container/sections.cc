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

struct SectionCompressor::State {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  std::vector<uint8_t> out = std::vector<uint8_t>(ZSTD_CStreamOutSize());
  ~State() { ZSTD_freeCCtx(cctx); }
};

SectionCompressor::SectionCompressor(int level, uint64_t raw_length) : state_(new State) {
  if (!state_->cctx) throw std::bad_alloc();
  ZSTD_CCtx_setParameter(state_->cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setPledgedSrcSize(state_->cctx, raw_length);
}

SectionCompressor::~SectionCompressor() = default;

giftResult_t SectionCompressor::add(const void* data, uint64_t size, const Out& out) {
  return run(data, size, false, out);
}

giftResult_t SectionCompressor::end(const Out& out) { return run(nullptr, 0, true, out); }

giftResult_t SectionCompressor::run(const void* data, uint64_t size, bool last, const Out& out) {
  ZSTD_inBuffer in{data, static_cast<size_t>(size), 0};
  for (;;) {
    ZSTD_outBuffer o{state_->out.data(), state_->out.size(), 0};
    const size_t left =
        ZSTD_compressStream2(state_->cctx, &o, &in, last ? ZSTD_e_end : ZSTD_e_continue);
    if (ZSTD_isError(left)) {
      return fail(GIFT_ERROR_INTERNAL, "zstd compression failed: %s", ZSTD_getErrorName(left));
    }
    if (o.pos) {
      if (const giftResult_t r = out(state_->out.data(), o.pos)) return r;
    }
    if (last ? left == 0 : in.pos == in.size) return GIFT_OK;
  }
}

StoredSection store_section(std::vector<uint8_t> raw, int level) {
  StoredSection s;
  s.raw_length = raw.size();
  if (level > 0 && !raw.empty()) {
    std::vector<uint8_t> z;
    z.reserve(raw.size());
    const SectionCompressor::Out keep = [&](const uint8_t* p, uint64_t n) {
      z.insert(z.end(), p, p + n);
      return GIFT_OK;
    };
    SectionCompressor c(level, raw.size());
    if (c.add(raw.data(), raw.size(), keep) == GIFT_OK && c.end(keep) == GIFT_OK &&
        z.size() < raw.size()) {
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
