#include "container/sections.h"

#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <cinttypes>
#include <cstddef>
#include <new>

#include "common/error.h"
#include "common/map_ahead.h"
// XXH3_state_t complete, for a state on the stack.
#define XXH_STATIC_LINKING_ONLY
#include "common/xxh3.h"

namespace gift::container {

uint64_t checksum64(const void* data, uint64_t size) {
  return XXH3_64bits(data, static_cast<size_t>(size));
}

uint64_t checksum64_mapped(const void* data, uint64_t size) {
  constexpr uint64_t kPiece = kMapAheadBytes;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (size <= kPiece) {
    map_ahead(p, size);
    return checksum64(p, size);
  }
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (uint64_t done = 0, n = 0; done < size; done += n) {
    n = std::min(kPiece, size - done);
    map_ahead(p + done, n);
    XXH3_64bits_update(&state, p + done, static_cast<size_t>(n));
  }
  return XXH3_64bits_digest(&state);
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

namespace {

// What a zstd error code means for the caller: memory ran out, or `otherwise` (the data is
// bad, or zstd failed).
giftResult_t zstd_code(size_t r, giftResult_t otherwise) {
  return ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation ? GIFT_ERROR_OUT_OF_MEMORY
                                                              : otherwise;
}

}  // namespace

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
      return fail(zstd_code(left, GIFT_ERROR_INTERNAL), "zstd compression failed: %s",
                  ZSTD_getErrorName(left));
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
        compression_pays(z.size(), raw.size())) {
      s.bytes = std::move(z);
      s.zstd = true;
    }
  }
  if (!s.zstd) s.bytes = std::move(raw);
  s.stored_length = s.bytes.size();
  s.checksum = checksum64(s.bytes.data(), s.bytes.size());
  return s;
}

namespace {

// That the section is one zstd stream declaring raw_length bytes.
giftResult_t check_zstd_stream(const uint8_t* stored, uint64_t stored_length, uint64_t raw_length,
                               const char* what) {
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
  return GIFT_OK;
}

}  // namespace

giftResult_t decompress_section(const uint8_t* stored, uint64_t stored_length, uint64_t raw_length,
                                std::vector<uint8_t>* out, const char* what) {
  if (const giftResult_t r = check_zstd_stream(stored, stored_length, raw_length, what)) return r;
  out->resize(raw_length);
  const size_t n = ZSTD_decompress(out->data(), out->size(), stored, stored_length);
  if (ZSTD_isError(n) || n != raw_length) {
    return fail(ZSTD_isError(n) ? zstd_code(n, GIFT_ERROR_DECOMPRESSION) : GIFT_ERROR_DECOMPRESSION,
                "%s: zstd: %s", what, ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short output");
  }
  return GIFT_OK;
}

struct SectionWindow::State {
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  ~State() { ZSTD_freeDCtx(dctx); }
  const uint8_t* stored = nullptr;
  uint64_t stored_length = 0, raw_length = 0;
  std::string what;
  size_t in_pos = 0;             // stored bytes consumed
  bool ended = false;            // zstd saw the stream end
  uint64_t start = 0;            // raw offset of window[0]
  std::vector<uint8_t> window;   // raw bytes [start, start + window.size())
  std::vector<uint8_t> skipped;  // output before a window, thrown away
};

SectionWindow::SectionWindow() = default;
SectionWindow::~SectionWindow() = default;
SectionWindow::SectionWindow(SectionWindow&&) noexcept = default;
SectionWindow& SectionWindow::operator=(SectionWindow&&) noexcept = default;

giftResult_t SectionWindow::open(const uint8_t* stored, uint64_t stored_length, uint64_t raw_length,
                                 std::string what) {
  if (const giftResult_t r = check_zstd_stream(stored, stored_length, raw_length, what.c_str()))
    return r;
  if (!state_) state_.reset(new State);
  if (!state_->dctx) return fail(GIFT_ERROR_OUT_OF_MEMORY, "%s: no memory for zstd", what.c_str());
  state_->stored = stored;
  state_->stored_length = stored_length;
  state_->raw_length = raw_length;
  state_->what = std::move(what);
  return restart();
}

giftResult_t SectionWindow::restart() {
  State& s = *state_;
  ZSTD_DCtx_reset(s.dctx, ZSTD_reset_session_only);
  s.in_pos = 0;
  s.ended = false;
  s.start = 0;
  s.window.clear();
  return GIFT_OK;
}

giftResult_t SectionWindow::get(uint64_t at, uint64_t n, const uint8_t** bytes) {
  State& s = *state_;
  if (at > s.raw_length || n > s.raw_length - at) {
    return fail(GIFT_ERROR_INTERNAL, "%s: bytes past the section asked", s.what.c_str());
  }
  if (at < s.start) restart();
  // Keep what the window already holds from `at` on; decompress the rest, up to at + n.
  const uint64_t have_end = s.start + s.window.size();
  if (at >= have_end) {
    s.window.clear();
  } else {
    s.window.erase(s.window.begin(), s.window.begin() + static_cast<ptrdiff_t>(at - s.start));
  }
  uint64_t produced = std::max(have_end, s.start);
  s.start = at;
  if (s.skipped.empty()) s.skipped.resize(ZSTD_DStreamOutSize());
  while (produced < at + n) {
    // Output before `at` goes to the throwaway buffer; from `at` on, into the window.
    const bool skipping = produced < at;
    const uint64_t want =
        skipping ? std::min<uint64_t>(s.skipped.size(), at - produced) : at + n - produced;
    uint8_t* dst = skipping ? s.skipped.data() : nullptr;
    if (!skipping) {
      s.window.resize(produced - at + want);
      dst = s.window.data() + (produced - at);
    }
    ZSTD_outBuffer out{dst, static_cast<size_t>(want), 0};
    ZSTD_inBuffer in{s.stored, static_cast<size_t>(s.stored_length), s.in_pos};
    const size_t r = ZSTD_decompressStream(s.dctx, &out, &in);
    s.in_pos = in.pos;
    s.ended = r == 0;
    if (ZSTD_isError(r)) {
      restart();
      return fail(zstd_code(r, GIFT_ERROR_DECOMPRESSION), "%s: zstd: %s", s.what.c_str(),
                  ZSTD_getErrorName(r));
    }
    produced += out.pos;
    if (out.pos == 0 && (r == 0 || in.pos == in.size)) {
      restart();
      return fail(GIFT_ERROR_DECOMPRESSION, "%s: zstd: short output", s.what.c_str());
    }
  }
  // The window keeps what it holds past at + n: the stream is past it, and a later call for
  // those bytes (a part of what an earlier call asked) finds them there.
  *bytes = s.window.data();
  // The last bytes: the stream must end there, as zstd's one-shot decoder checks.
  while (at + n == s.raw_length && !s.ended) {
    ZSTD_outBuffer out{s.skipped.data(), s.skipped.size(), 0};
    ZSTD_inBuffer in{s.stored, static_cast<size_t>(s.stored_length), s.in_pos};
    const size_t r = ZSTD_decompressStream(s.dctx, &out, &in);
    s.in_pos = in.pos;
    if (ZSTD_isError(r) || out.pos || (r != 0 && in.pos == in.size)) {
      restart();
      return fail(
          ZSTD_isError(r) ? zstd_code(r, GIFT_ERROR_DECOMPRESSION) : GIFT_ERROR_DECOMPRESSION,
          "%s: zstd: %s", s.what.c_str(),
          ZSTD_isError(r) ? ZSTD_getErrorName(r)
          : out.pos       ? "more data than declared"
                          : "truncated stream");
    }
    s.ended = r == 0;
  }
  return GIFT_OK;
}

}  // namespace gift::container
