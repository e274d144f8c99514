#include "container/writer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "common/error.h"
#include "common/id_hex.h"
#include "common/map_ahead.h"
#include "common/utf8.h"
#include "container/census.h"
#include "container/layout.h"
#include "gift_generated.h"
#include "numerics/codec.h"

namespace gift::container {

namespace {
// A tensor's scales held in memory while it is encoded in bands, at most (4 MiB: fp32 scales
// of blocks of 16 over 4096 x 4096, of blocks of 128 over 128M elements); more are spilled
// (ScalesBuffer), read twice more: 16 MiB of them (blocks of 16 over 2 x 2^25 fp32 values,
// mostly zeros) took 0.111 s where held 0.096 (one thread, medians of 5); with a bound of
// 1 MiB, eight 4096 x 4096 tensors with blocks of 16 took 25% longer.
uint64_t held_scale_bytes = uint64_t(4) << 20;
}  // namespace

uint64_t set_held_scale_bytes_for_test(uint64_t bytes) {
  return std::exchange(held_scale_bytes, bytes);
}

giftResult_t make_shape(const uint64_t* dims, uint32_t ndim, TensorShape* out) {
  if (ndim > kMaxDims) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%u dimensions, at most %u supported", ndim, kMaxDims);
  }
  if (ndim && !dims) return fail(GIFT_ERROR_INVALID_ARGUMENT, "shape is NULL");
  if (!matrix_view(dims, ndim, out)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s", kTooManyElements);
  }
  out->dims.assign(dims, dims + ndim);
  return GIFT_OK;
}

namespace {

// Drops what a tensor that failed (or was refused) left in the sink, so that the next
// section lands where the frame will put it.
class SinkMark {
 public:
  explicit SinkMark(SectionFile* file) : file_(file), at_(file ? file->size() : 0) {}
  SinkMark(const SinkMark&) = delete;
  SinkMark& operator=(const SinkMark&) = delete;
  ~SinkMark() {
    if (!file_ || kept_ || file_->size() == at_) return;
    // The failure being reported keeps its message (copied without allocating: this may
    // run while bad_alloc unwinds); a failure here shows on the next write.
    char message[512];
    std::snprintf(message, sizeof message, "%s", last_message());
    if (file_->truncate(at_) != GIFT_OK) fail(GIFT_ERROR_IO, "%s", message);
  }
  void keep() { kept_ = true; }

 private:
  SectionFile* file_;
  uint64_t at_;
  bool kept_ = false;
};

// The buffers of a tensor's codes: one, or two used in turn (one written behind while the
// next is made), those kept from the tensors before where they are large enough. Every kept
// buffer holds codes_bytes bytes, the second one too when it is made later.
class CodesInTurn {
 public:
  CodesInTurn(BandBuffers* kept, uint64_t bytes, bool two) : kept_(kept), two_(two) {
    bytes = std::max<uint64_t>(bytes, 1);
    if (kept->codes_bytes < bytes) kept->release_codes();  // the smaller ones go first
    const uint64_t size = std::max(kept->codes_bytes, bytes);
    for (int k = 0; k < (two ? 2 : 1); ++k) {
      if (!kept->codes[k]) kept->codes[k].reset(new uint8_t[size]);
    }
    kept->codes_bytes = size;  // once they are all there (new may throw)
  }
  uint8_t* next() {
    turn_ = two_ ? turn_ ^ 1 : 0;
    return kept_->codes[turn_].get();
  }

 private:
  BandBuffers* kept_;
  bool two_;
  size_t turn_ = 0;
};

// A tensor's scales as its bands are encoded, each piece's written at its place: held whole,
// or once spilled (spill_to) only those of the band or span being made (next), the ones
// before it in a scratch file, so that memory does not grow with the tensor.
class ScalesBuffer {
 public:
  // `bytes`: where the held scales go, kept for the next tensor.
  ScalesBuffer(std::vector<uint8_t>* bytes, uint64_t total) : total_(total), bytes_(*bytes) {}
  giftResult_t spill_to(const std::string& dir) {
    spilled_ = true;
    return file_.open(dir);
  }
  // A walk over the tensor starts (again).
  giftResult_t restart() {
    base_ = 0;
    if (spilled_) {
      bytes_.clear();
      return file_.truncate(0);
    }
    if (bytes_.capacity() < total_) std::vector<uint8_t>().swap(bytes_);  // not both at once
    bytes_.assign(total_, 0);
    return GIFT_OK;
  }
  // The next scales made are bytes [from, from + n), right after those before: the ones
  // held are written out first where the n would take them past kChunk.
  giftResult_t next(uint64_t from, uint64_t n) {
    if (!spilled_) return GIFT_OK;
    if (bytes_.size() + n > kChunk) {
      if (const giftResult_t r = flush()) return r;
      base_ = from;
    }
    bytes_.resize(from - base_ + n);
    return GIFT_OK;
  }
  uint8_t* at(uint64_t offset) { return bytes_.data() + (offset - base_); }
  // Once the walk is over: all the scales, in order, to put (held: at once; spilled: the last
  // ones written out after the others, then read back in pieces).
  giftResult_t put_all(const std::function<giftResult_t(const void*, uint64_t)>& put) {
    if (!spilled_) return put(bytes_.data(), bytes_.size());
    if (const giftResult_t r = flush()) return r;
    std::vector<uint8_t> piece(std::min<uint64_t>(total_, uint64_t(256) << 10));
    for (uint64_t at = 0; at < total_; at += piece.size()) {
      const uint64_t n = std::min<uint64_t>(piece.size(), total_ - at);
      if (const giftResult_t r = file_.read(at, piece.data(), n)) return r;
      if (const giftResult_t r = put(piece.data(), n)) return r;
    }
    return GIFT_OK;
  }

 private:
  giftResult_t flush() {
    const giftResult_t r = file_.write(bytes_.data(), bytes_.size());
    base_ += bytes_.size();
    bytes_.clear();
    return r;
  }
  static constexpr uint64_t kChunk = uint64_t(1) << 20;
  uint64_t total_;
  std::vector<uint8_t>& bytes_;  // scales [base_, base_ + bytes_.size())
  uint64_t base_ = 0;
  bool spilled_ = false;
  ScratchFile file_;
};

// n zero bytes: padding between sections, or the room left for a header.
giftResult_t write_zeros(SectionFile* file, uint64_t n) {
  static const uint8_t zeros[4096] = {};
  if (n > kMaxHeaderBytes + kSectionAlign) {  // a layout gone wrong, not bytes to write
    return fail(GIFT_ERROR_INTERNAL, "frame layout: %" PRIu64 " bytes of padding", n);
  }
  for (uint64_t left = n; left;) {
    const uint64_t k = std::min<uint64_t>(left, sizeof zeros);
    if (const giftResult_t r = file->write(zeros, k)) return r;
    left -= k;
  }
  return GIFT_OK;
}

// Closes a descriptor on every way out.
struct ClosingFd {
  int fd = -1;
  ClosingFd() = default;
  ClosingFd(const ClosingFd&) = delete;
  ClosingFd& operator=(const ClosingFd&) = delete;
  ~ClosingFd() {
    if (fd >= 0) ::close(fd);
  }
};

// Bands of about this many elements: the codes written at once.
constexpr uint64_t kBandElems = uint64_t(1) << 20;
// A row of tiles up to this many elements is one band, the tiles' scales from the band itself;
// a larger one is taken in bands inside it after a first pass for the tiles' amax, which cost
// tiles of 128 x 128 over rows of 16384 fp32 (2M elements a row of tiles) 10 to 15%: 512 MiB on
// one thread, median of 6, 0.17 s as one band, 0.195 s in bands of 1M elements.
constexpr uint64_t kMostTileRowElems = 8 * kBandElems;
// Codes of fewer bytes a band are written on the encoding thread: handing a write of a few
// bytes to the other one cost more than the write (a futex wake and wait per tensor: giftc
// encode of 200,000 tensors of 4 x 4).
constexpr uint64_t kLeastBehindBytes = uint64_t(64) << 10;
// Elements per thread of the pieces a band of blocks is encoded in, each piece's census
// taken right after, while it is in the cores' own caches (a whole band is not: 1 MiB fp32
// per core measured 10% slower for one thread). The encoder, which reads its runs in four
// interleaved parts, is the faster reader from memory: census first, giftc encode of a
// 512 MiB fp32 dump took 0.133 to 0.139 s on one thread, census second 0.117 to 0.122 s.
// Still one encoder task (codec.cc, kChunkElems) per thread.
constexpr uint64_t kPieceElems = uint64_t(1) << 16;
// Where a piece starts at a multiple of Census::kChunk elements, the encoder may take the
// census of its whole chunks with their codes (BandOrigin::census), whose chains of FMAs
// then overlap the codes' arithmetic. giftc encode --threads 1 of a 512 MiB bf16 dump (Zen 4,
// a busy hour), two runs of 21 interleaved rounds, each binary as two copies: medians summed
// after 152.2 and 143.8 ms (the copies) in the first run, 169.5 and 165.8 in the second;
// taken with the codes 141.6 and 138.3, then 159.0 and 157.0 (cp 171.5, then 198.5 ms).
// A piece of blocks is at most a band: at most this many chunks (larger pieces, of tiles, are
// left to the census after).
constexpr uint64_t kBandChunks = kBandElems / Census::kChunk;
static_assert(kBandElems % Census::kChunk == 0, "whole chunks a band");

// Once a tensor is encoded: what is larger than a common band's buffers (a row of tiles'
// codes, another encoder's whole rows, scales past those held) goes with it.
void keep_band_sized(BandBuffers* b) {
  if (b->codes_bytes > kBandElems) b->release_codes();
  if (b->scales.capacity() > held_scale_bytes) std::vector<uint8_t>().swap(b->scales);
}

// How encode_in_bands cuts a tensor of rows x cols encoded under p (on the CPU encoder or
// another).
struct BandCut {
  uint64_t unit;      // rows of a group: a tile's, else 1
  bool inside_tiles;  // bands of rows inside a row of tiles
  uint64_t band;      // rows per band
  uint64_t width;     // columns of a group
  bool parts;         // rows taken in parts of `part` columns
  uint64_t part;
  bool reach;     // groups reach past a piece: a first pass over each span takes their amax
  uint64_t span;  // rows per span
};

BandCut cut_in_bands(const giftQuantParams& p, uint64_t rows, uint64_t cols, bool cpu) {
  BandCut c;
  c.unit = p.layout == GIFT_SCALE_TILE ? p.tile_rows : 1;
  // A row of tiles larger than kMostTileRowElems (unit * cols, without the product), or of
  // rows longer than a band (taken in parts below), is taken on the CPU in bands of whole rows
  // inside it; another encoder takes whole rows of tiles.
  c.inside_tiles = cpu && c.unit > 1 &&
                   (cols > kBandElems || c.unit > kMostTileRowElems / std::max<uint64_t>(cols, 1));
  // A tensor without elements is one band, however many rows it claims (2^58 rows of 0
  // columns were 2^38 bands of nothing).
  c.band = cols == 0 ? std::max<uint64_t>(rows, 1)
                     : band_rows(c.inside_tiles ? 1 : c.unit, cols, kBandElems);
  // A row longer than a band goes to the CPU encoder in parts: memory for a part of it, not
  // the row (a vector stored as one row of 2^30 elements, say). Parts are whole groups of the
  // row (blocks, tiles), or lie within one group wider than a part (a row of its own scale, the
  // tensor's, a wide tile): runs of that group's width that no part crosses. Another encoder
  // takes whole rows.
  c.width = p.layout == GIFT_SCALE_BLOCK  ? p.block
            : p.layout == GIFT_SCALE_TILE ? p.tile_cols
                                          : std::max<uint64_t>(cols, 1);
  c.parts = cpu && cols > kBandElems;
  c.part = c.parts ? row_part(cols, c.width, kBandElems) : cols;
  // Where groups reach past a piece (the tensor's one scale, a row's own in parts, a wide
  // tile's, the tiles of bands inside a tile row), the rows they cover are a span: a first pass
  // over its bands takes the groups' amax (BandOrigin), and each piece writes its groups' scales
  // in the span's place.
  c.reach = p.layout == GIFT_SCALE_TENSOR || c.inside_tiles || (c.parts && c.width > c.part);
  c.span = !c.reach || p.layout == GIFT_SCALE_TENSOR ? std::max<uint64_t>(rows, 1) : c.unit;
  return c;
}

void merge_stats(giftEncodeStats* total, const giftEncodeStats& band, uint64_t base) {
  total->amax = std::max(total->amax, band.amax);
  if (band.nonfinite_count && total->nonfinite_count == 0)
    total->first_nonfinite = base + band.first_nonfinite;
  total->nonfinite_count += band.nonfinite_count;
}

}  // namespace

giftResult_t FrameWriter::add_metadata(std::string key, std::string value) {
  if (!valid_utf8_c_string(key) || !valid_utf8_c_string(value)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "metadata '%s': key and value must be UTF-8",
                ascii_escaped(key).c_str());
  }
  // A key given twice would read two ways (first or last value, as the reader chooses).
  for (const auto& [k, v] : metadata_) {
    if (k == key) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "metadata '%s' is already set",
                  ascii_escaped(key).c_str());
    }
  }
  const uint64_t bytes = key.size() + value.size();
  if (const giftResult_t r = check_header_room(("metadata '" + ascii_escaped(key) + "'"), bytes))
    return r;
  header_strings_ += bytes;
  metadata_.emplace_back(std::move(key), std::move(value));
  return GIFT_OK;
}

giftResult_t FrameWriter::use_scratch(const std::string& dir) {
  if (scratch_.is_open()) return fail(GIFT_ERROR_INVALID_ARGUMENT, "the scratch folder is set");
  if (const giftResult_t r = scratch_.open(dir)) return r;
  if (!stream_) sink_ = &scratch_;
  return GIFT_OK;
}

FrameWriter::~FrameWriter() {
  // An output that outlives its unfinished frame still refuses to commit it.
  if (stream_state_ == Stream::kOpen) stream_->set_streaming(true, nullptr);
}

giftResult_t FrameWriter::check_stream_open(const char* what) const {
  if (stream_state_ == Stream::kFinished) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: the frame was finished into its output", what);
  }
  if (stream_state_ == Stream::kLost) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: the output the frame streams to was freed", what);
  }
  return GIFT_OK;
}

giftResult_t FrameWriter::stream_to(OutputFile* out, const std::vector<Declared>& tensors) {
  if (!tensors_.empty() || stream_state_ != Stream::kNone) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "a frame streams to its output from before its first tensor, once");
  }
  if (!out->is_file() || out->written() != 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: a frame streams only to a new file",
                out->name().c_str());
  }
  PendingList declared(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    declared[i].name = tensors[i].name;
    declared[i].shape.dims.assign(tensors[i].ndim, 0);
    declared[i].raw = tensors[i].lossless;
  }
  Layout l;
  if (layout(declared, &l) != GIFT_OK) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "declared tensors: %s", giftGetLastErrorMessage());
  }
  // Zeros where the header will be, so that sections are appended from their first place.
  if (const giftResult_t r = write_zeros(out, l.data_start)) return r;
  stream_ = out;
  stream_base_ = l.data_start;
  sink_ = out;
  stream_state_ = Stream::kOpen;
  out->set_streaming(true, [this] {
    stream_state_ = Stream::kLost;
    stream_ = nullptr;
    sink_ = nullptr;
  });
  return GIFT_OK;
}

giftResult_t FrameWriter::embed_basis(std::vector<uint8_t> bytes, uint64_t lo, uint64_t hi) {
  for (const Pending& t : tensors_) {
    if (const giftResult_t r = check_basis(t.name, t.coords, lo, hi)) return r;
  }
  embedded_ = store_section(std::move(bytes), zstd_level_);
  // Never streamed: the basis is the frame's last section, written at the end.
  if (const giftResult_t r = keep(&embedded_, scratch_.is_open() ? &scratch_ : nullptr)) return r;
  has_embedded_ = true;
  basis_lo_ = lo;
  basis_hi_ = hi;
  return GIFT_OK;
}

giftResult_t FrameWriter::begin_section(StoredSection* s, SectionFile* file) {
  if (const giftResult_t r = write_zeros(file, align_up(file->size()) - file->size())) return r;
  s->spilled = true;
  s->streamed = file == stream_;
  s->scratch_offset = file->size();
  file->hold_writeback_from(UINT64_MAX);  // what came before is final, even after a failure
  return GIFT_OK;
}

giftResult_t FrameWriter::keep(StoredSection* s, SectionFile* file) {
  if (!file) return GIFT_OK;
  if (const giftResult_t r = begin_section(s, file)) return r;
  file->allocate_ahead(s->bytes.size());
  if (const giftResult_t r = file->write(s->bytes.data(), s->bytes.size())) return r;
  std::vector<uint8_t>().swap(s->bytes);
  return GIFT_OK;
}

bool FrameWriter::bands_apply(const giftQuantParams& p) const {
  // A band is encoded as a tensor of its own. That gives the whole tensor's bytes where no
  // group spans bands (one scale for the whole tensor does) and no random word depends on
  // the element's place in the tensor (stochastic rounding's do); the CPU codec takes that
  // place (BandOrigin), other encoders (giftc --device cuda) do not.
  return sink_ && (encoder_ == &giftEncode ||
                   (p.layout != GIFT_SCALE_TENSOR && p.rounding == GIFT_ROUND_NEAREST));
}

giftResult_t FrameWriter::spill_section(StoredSection* s, uint64_t raw_length, const Pieces& pieces,
                                        bool behind) {
  if (const giftResult_t r = begin_section(s, sink_)) return r;
  s->raw_length = raw_length;
  if (zstd_level_ > 0 && raw_length) {
    // Compressed as it comes; kept only where that pays (compression_pays). Until then
    // its bytes may be dropped: not worth sending to the disk yet.
    sink_->hold_writeback_from(s->scratch_offset);
    SectionCompressor z(zstd_level_, raw_length);
    Checksum64 sum;
    uint64_t stored = 0;
    const SectionCompressor::Out out = [&](const uint8_t* p, uint64_t n) {
      sum.update(p, n);
      stored += n;
      return sink_->write(p, n);
    };
    if (const giftResult_t r = pieces([&](const void* p, uint64_t n) { return z.add(p, n, out); }))
      return r;
    if (const giftResult_t r = z.end(out)) return r;
    if (compression_pays(stored, raw_length)) {
      s->zstd = true;
      s->stored_length = stored;
      s->checksum = sum.digest();
      sink_->hold_writeback_from(UINT64_MAX);
      return GIFT_OK;
    }
    if (const giftResult_t r = sink_->truncate(s->scratch_offset)) return r;
    sink_->hold_writeback_from(UINT64_MAX);
  }
  Checksum64 sum;
  sink_->allocate_ahead(raw_length);
  s->zstd = false;
  s->stored_length = raw_length;
  // With `behind`, each piece is written behind (the next one made meanwhile), as Put allows,
  // its checksum taken there too; all of them are written before the pieces' buffers and the
  // checksum go, whatever ends the walk (a failure of that last write changing neither the
  // result nor the message of the one that ended it).
  struct Settled {
    SectionFile* file;
    ~Settled() {
      const std::string message = last_message();
      if (file->settle()) fail(GIFT_ERROR_IO, "%s", message.c_str());
    }
  } settled{sink_};
  if (const giftResult_t r = pieces([&](const void* p, uint64_t n) {
        if (behind) return sink_->write_behind(p, n, [&sum, p, n] { sum.update(p, n); });
        sum.update(p, n);
        return sink_->write(p, n);
      }))
    return r;
  if (const giftResult_t r = sink_->settle()) return r;
  s->checksum = sum.digest();
  return GIFT_OK;
}

giftResult_t FrameWriter::encode_in_bands(Pending* t, const BandAt& band_at, giftDType_t data_dtype,
                                          bool* refused) {
  const giftQuantParams& p = t->params;
  const uint64_t rows = t->shape.rows, cols = t->shape.cols;
  const bool cpu = encoder_ == &giftEncode;
  const BandCut cut = cut_in_bands(p, rows, cols, cpu);
  const uint64_t scale_width = scale_size(p.scale_dtype);
  uint64_t scale_bytes = 0;
  giftScaleBytes(&p, rows, cols, &scale_bytes);
  // Where a processor is free, two buffers for the codes, in turn: one is written behind while
  // the next is made (Put); not for another encoder's bands, which may be whole tile rows.
  const uint64_t codes_bytes = cut.parts ? cut.part : std::min(rows, cut.band) * cols;
  const bool behind = codes_bytes >= kLeastBehindBytes && codes_bytes <= kMostTileRowElems &&
                      spare_processor(&ctx_);
  struct Kept {
    BandBuffers* buffers;
    ~Kept() { keep_band_sized(buffers); }
  } kept_buffers{&buffers_};
  CodesInTurn codes_in_turn(&buffers_, codes_bytes, behind);
  // A tensor's scales are held up to held_scale_bytes; more go to a scratch file beside the
  // scratch data or the output (bands have a sink: the one or the other) as they are made,
  // and into the sink after the codes.
  ScalesBuffer scales(&buffers_.scales, scale_bytes);
  if (scale_bytes > held_scale_bytes) {
    const std::string dir = scratch_.is_open() ? scratch_.dir() : stream_->folder();
    if (const giftResult_t r = scales.spill_to(dir)) return r;
  }
  // Non-finite input fails after the census of every band, so the message counts them all.
  giftQuantParams kept = p;
  kept.nonfinite = GIFT_NONFINITE_KEEP;
  Census census;  // each piece's statistics, taken just after it is encoded
  // The bands of rows [first, end) in turn; a refused band ends the walk with *refused set.
  const auto for_each_band = [&](uint64_t first, uint64_t end, const auto& f) {
    for (uint64_t r0 = first; r0 < end; r0 += cut.band) {
      const uint64_t n = std::min(cut.band, end - r0);
      const void* src = band_at(r0, n);
      if (!src) {
        *refused = true;
        return GIFT_OK;
      }
      if (cpu) map_ahead(src, n * cols * dtype_size(data_dtype));
      if (const giftResult_t r = f(r0, n, src)) return r;
    }
    return GIFT_OK;
  };
  // The codes as pieces, one band at a time (twice where zstd does not make them smaller).
  const Pieces encoded = [&](const Put& put) {
    BandOrigin origin;
    std::vector<float> span_amax, band_amax;
    // The census of a piece's whole chunks, where the encoder takes it with their codes.
    std::unique_ptr<double[][8]> taken_lanes;
    std::vector<uint8_t> taken_done;
    census = Census{};
    t->stats = giftEncodeStats{0.0f, 0, UINT64_MAX};
    uint64_t scales_at = 0;
    if (const giftResult_t r = scales.restart()) return r;
    // The CPU encoder takes a band of blocks in pieces (kPieceElems); other layouts, whose
    // groups may need a whole band to be shared out among the threads (a row or the tensor
    // split across them), and another encoder take whole bands.
    const uint64_t piece =
        cpu && p.layout == GIFT_SCALE_BLOCK && cols
            ? band_rows(cut.unit, cols, kPieceElems * uint64_t(thread_count(&ctx_)))
            : cut.band;
    // m rows of w columns from element `first` of the tensor (column c0), at `at`, into
    // piece_codes.
    const auto encode_piece = [&](uint64_t first, uint64_t c0, const void* at, uint64_t m,
                                  uint64_t w, uint8_t* piece_codes) {
      uint64_t piece_scales = 0;
      giftScaleBytes(&kept, m, w, &piece_scales);
      if (!cut.reach) {  // else the span's, as one
        if (const giftResult_t r = scales.next(scales_at, piece_scales)) return r;
      }
      giftEncodeStats st;
      origin.first_element = first;
      const uint64_t chunks = m * w / Census::kChunk;
      const bool take = cpu && chunks && chunks <= kBandChunks && first % Census::kChunk == 0;
      if (take && !taken_lanes) taken_lanes.reset(new double[kBandChunks][8]);
      if (take) taken_done.assign(chunks, 0);
      origin.census = take ? taken_lanes.get() : nullptr;
      origin.census_done = take ? taken_done.data() : nullptr;
      // The piece's first group in the span's row.
      const uint64_t g0 = cut.reach ? c0 / cut.width : 0;
      origin.group_amax = cut.reach ? span_amax.data() + g0 : nullptr;
      uint8_t* piece_scale = scales.at(scales_at + g0 * scale_width);
      const giftResult_t r = cpu ? encode_tensor(&ctx_, kept, at, data_dtype, m, w, piece_codes,
                                                 piece_scale, &st, origin)
                                 : encoder_(&ctx_, &kept, at, data_dtype, m, w, piece_codes,
                                            piece_scale, piece_scales, &st);
      if (r) return fail(r, "tensor '%s': %s", t->name.c_str(), giftGetLastErrorMessage());
      // The CPU encoder's statistics are of these same elements.
      const bool seen = cpu && st.nonfinite_count == 0;
      const Census::Taken taken{origin.census, origin.census_done};
      census.add(at, data_dtype, first, m * w, seen ? &st.amax : nullptr, take ? &taken : nullptr);
      merge_stats(&t->stats, st, first);
      if (!cut.reach) scales_at += piece_scales;
      return GIFT_OK;
    };
    const uint64_t size = dtype_size(data_dtype);
    const auto encode_band = [&](uint64_t r0, uint64_t n, const void* src) {
      const uint8_t* bytes = static_cast<const uint8_t*>(src);
      if (cut.parts) {  // n is 1: the row's parts in turn, each put as it is made
        return for_each_row_part(cols, cut.width, kBandElems, [&](uint64_t c0, uint64_t w) {
          uint8_t* codes = codes_in_turn.next();
          if (const giftResult_t r =
                  encode_piece(r0 * cols + c0, c0, bytes + c0 * size, 1, w, codes))
            return r;
          return put(codes, w);
        });
      }
      uint8_t* codes = codes_in_turn.next();
      for (uint64_t k0 = 0; k0 < n; k0 += piece) {
        const uint64_t m = std::min(piece, n - k0);
        if (const giftResult_t r = encode_piece((r0 + k0) * cols, 0, bytes + k0 * cols * size, m,
                                                cols, codes + k0 * cols))
          return r;
      }
      return put(codes, n * cols);
    };
    for (uint64_t s0 = 0; s0 < std::max<uint64_t>(rows, 1); s0 += cut.span) {
      const uint64_t s1 = std::min(rows, s0 + cut.span);
      if (cut.reach) {  // the span's groups, as one band of it has them (one row of tiles at most)
        uint64_t groups = 0;
        giftScaleCount(&kept, std::min(cut.band, s1 - s0), cols, &groups);
        span_amax.assign(groups, 0.0f);
        band_amax.resize(groups);
        const giftResult_t r = for_each_band(s0, s1, [&](uint64_t, uint64_t n, const void* src) {
          group_amax(&ctx_, kept, src, data_dtype, n, cols, band_amax.data());
          for (uint64_t g = 0; g < groups; ++g) span_amax[g] = std::max(span_amax[g], band_amax[g]);
          return GIFT_OK;
        });
        if (r || *refused) return r;
        if (const giftResult_t r2 = scales.next(scales_at, groups * scale_width)) return r2;
      }
      if (const giftResult_t r = for_each_band(s0, s1, encode_band)) return r;
      if (*refused) return GIFT_OK;
      if (cut.reach) scales_at += span_amax.size() * scale_width;
    }
    return GIFT_OK;
  };
  const giftResult_t spilled = spill_section(&t->codes, t->shape.elements, encoded, behind);
  if (spilled) return spilled;
  if (*refused) return GIFT_OK;  // the caller's SinkMark drops what the tensor wrote
  t->rms = census.rms();
  if (const giftResult_t r = nonfinite_result(p, t->stats, cols))
    return fail(r, "tensor '%s': %s", t->name.c_str(), giftGetLastErrorMessage());
  // As the codes: compressed as they are stored, not in one call (which would hold them
  // twice more).
  return spill_section(
      &t->scales, scale_bytes, [&](const Put& put) { return scales.put_all(put); }, false);
}

giftResult_t FrameWriter::check_header_room(const std::string& what, uint64_t bytes) const {
  if (bytes <= kMaxHeaderBytes && header_strings_ <= kMaxHeaderBytes - bytes) return GIFT_OK;
  return fail(GIFT_ERROR_INVALID_ARGUMENT,
              "%s: %" PRIu64 " bytes, after %" PRIu64
              " of names and metadata, pass the frame header's limit of %" PRIu64 " bytes",
              what.c_str(), bytes, header_strings_, kMaxHeaderBytes);
}

giftResult_t FrameWriter::check_basis(const std::string& name, const CoordsChoice& c, uint64_t lo,
                                      uint64_t hi) {
  if (!c.gift || (c.basis_lo == lo && c.basis_hi == hi)) return GIFT_OK;
  return fail(GIFT_ERROR_INVALID_ARGUMENT,
              "tensor '%s' is in basis %s, and the basis embedded is %s: the frame would not "
              "decode on its own",
              name.c_str(), id_hex(c.basis_lo, c.basis_hi).c_str(), id_hex(lo, hi).c_str());
}

giftResult_t FrameWriter::check_new_tensor(const std::string& name, giftDType_t dtype,
                                           const CoordsChoice* coords) const {
  if (coords && has_embedded_) {
    if (const giftResult_t r = check_basis(name, *coords, basis_lo_, basis_hi_)) return r;
  }
  if (const giftResult_t r = check_stream_open(("tensor '" + name + "'").c_str())) return r;
  if (name.empty()) return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor name is empty");
  if (!valid_utf8_c_string(name)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor name '%s' is not UTF-8 without NUL",
                ascii_escaped(name).c_str());
  }
  if (names_.count(name)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor '%s' added twice", name.c_str());
  }
  if (const giftResult_t r = check_header_room("tensor name", name.size())) return r;
  if (!known_dtype(dtype)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor '%s': unknown dtype %d", name.c_str(),
                enum_int(dtype));
  }
  return GIFT_OK;
}

giftResult_t FrameWriter::add_tensor(const std::string& name, const TensorShape& shape,
                                     giftDType_t dtype, const void* data,
                                     const giftQuantParams* params, const CoordsChoice* coords,
                                     int data_dtype_arg) {
  const giftDType_t data_dtype =
      data_dtype_arg < 0 ? dtype : static_cast<giftDType_t>(data_dtype_arg);
  if (const giftResult_t r = check_new_tensor(name, dtype, coords)) return r;
  if (shape.elements && !data) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor '%s': data is NULL", name.c_str());
  }
  if (coords && coords->gift && (params == nullptr || data_dtype != GIFT_DTYPE_F32)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "tensor '%s': data in GIFT coordinates must be FP8-encoded fp32", name.c_str());
  }
  SinkMark mark(sink_);
  Pending t{name,  shape,
            dtype, params == nullptr,
            {},    {},
            0.0f,  {},
            {},    coords ? *coords : CoordsChoice{}};
  giftQuantParamsInit(&t.params);
  // The encoder reports FP8 tensors' statistics; lossless ones are counted here, so that a
  // NaN stored as it is still shows in the frame. Banded encodes count band by band.
  if (params == nullptr || !bands_apply(*params)) {
    Census c;
    c.add(data, data_dtype, 0, shape.elements);
    t.stats = c.stats;
    t.rms = c.rms();
  }
  const uint64_t in_bytes = shape.elements * dtype_size(data_dtype);
  if (t.raw) {
    if (sink_) {
      // Stored as given: straight from the caller's buffer, no copy.
      const Pieces whole = [&](const Put& put) { return put(data, in_bytes); };
      if (const giftResult_t r = spill_section(&t.codes, in_bytes, whole, spare_processor(&ctx_)))
        return r;
    } else {
      const uint8_t* p = static_cast<const uint8_t*>(data);
      t.codes = store_section(std::vector<uint8_t>(p, p + in_bytes), zstd_level_);
      if (const giftResult_t r = keep(&t.codes, sink_)) return r;
    }
  } else if (t.params = *params; bands_apply(t.params)) {
    const uint64_t row_bytes = shape.cols * dtype_size(data_dtype);
    bool refused = false;  // never: the data is all there
    const BandAt at = [&](uint64_t r0, uint64_t) {
      return static_cast<const uint8_t*>(data) + r0 * row_bytes;
    };
    if (const giftResult_t r = encode_in_bands(&t, at, data_dtype, &refused)) return r;
  } else {
    uint64_t scale_bytes = 0;
    if (const giftResult_t r = giftScaleBytes(params, shape.rows, shape.cols, &scale_bytes)) {
      return fail(r, "tensor '%s': %s", name.c_str(), giftGetLastErrorMessage());
    }
    std::vector<uint8_t> codes(shape.elements), scales(scale_bytes);
    if (const giftResult_t r = encoder_(&ctx_, params, data, data_dtype, shape.rows, shape.cols,
                                        codes.data(), scales.data(), scale_bytes, &t.stats)) {
      return fail(r, "tensor '%s': %s", name.c_str(), giftGetLastErrorMessage());
    }
    t.codes = store_section(std::move(codes), zstd_level_);
    t.scales = store_section(std::move(scales), zstd_level_);
    if (const giftResult_t r = keep(&t.codes, sink_)) return r;
    if (const giftResult_t r = keep(&t.scales, sink_)) return r;
  }
  tensors_.push_back(std::move(t));
  names_.insert(tensors_.back().name);
  header_strings_ += tensors_.back().name.size();
  mark.keep();
  return GIFT_OK;
}

giftResult_t FrameWriter::add_tensor_rows(const std::string& name, const TensorShape& shape,
                                          giftDType_t dtype, const giftQuantParams& params,
                                          const CoordsChoice& coords, const RowSource& fill,
                                          bool* refused) {
  *refused = false;
  if (!bands_apply(params)) {
    std::vector<float> values(shape.elements);
    if (!fill(0, shape.rows, values.data())) {
      *refused = true;
      return GIFT_OK;
    }
    return add_tensor(name, shape, dtype, values.data(), &params, &coords, GIFT_DTYPE_F32);
  }
  if (const giftResult_t r = check_new_tensor(name, dtype, &coords)) return r;
  SinkMark mark(sink_);
  Pending t{name, shape, dtype, false, params, {}, 0.0f, {}, {}, coords};
  std::vector<float> band;
  const BandAt at = [&](uint64_t r0, uint64_t n) -> const void* {
    band.resize(n * shape.cols);
    return fill(r0, n, band.data()) ? band.data() : nullptr;
  };
  if (const giftResult_t r = encode_in_bands(&t, at, GIFT_DTYPE_F32, refused)) return r;
  if (!*refused) {
    tensors_.push_back(std::move(t));
    names_.insert(tensors_.back().name);
    header_strings_ += tensors_.back().name.size();
    mark.keep();
  }
  return GIFT_OK;
}

namespace {

flatbuffers::Offset<fb::Section> section_ref(flatbuffers::FlatBufferBuilder& b,
                                             const StoredSection& s, uint64_t offset) {
  return fb::CreateSection(b, offset, s.stored_length, s.raw_length,
                           s.zstd ? fb::Compression::Zstd : fb::Compression::None, s.checksum);
}

}  // namespace

giftResult_t FrameWriter::layout(const PendingList& tensors, Layout* out) const {
  // Sections in header order, each at the next multiple of 64.
  auto place = [&](uint64_t data_start) {
    std::vector<Placed> placed;
    uint64_t at = data_start;
    auto put = [&](const StoredSection& s) {
      placed.push_back({&s, at});
      at = align_up(at + s.stored_length);
    };
    for (const Pending& t : tensors) {
      put(t.codes);
      if (!t.raw) put(t.scales);
    }
    if (has_embedded_) put(embedded_);
    return placed;
  };
  // The header holds the sections' offsets, which depend on the header's length. With every
  // scalar written (force_defaults) the length does not depend on the values, so a first
  // build with zero offsets measures it and a second writes the real ones.
  auto build = [&](const std::vector<Placed>& placed, flatbuffers::FlatBufferBuilder& b) {
    b.ForceDefaults(true);
    size_t next = 0;
    auto ref = [&](const StoredSection& s) { return section_ref(b, s, placed[next++].offset); };
    std::vector<flatbuffers::Offset<fb::Tensor>> refs;
    for (const Pending& t : tensors) {
      const auto name = b.CreateString(t.name);
      const auto shape = b.CreateVector(t.shape.dims);
      const auto codes = ref(t.codes);
      flatbuffers::Offset<fb::Section> scales;
      if (!t.raw) scales = ref(t.scales);
      const auto stats = fb::CreateStats(b, t.stats.amax, t.rms, t.stats.nonfinite_count);
      flatbuffers::Offset<fb::Selection> selection;
      if (t.coords.has_selection) {
        selection = fb::CreateSelection(b, t.coords.gift ? fb::Coords::Gift : fb::Coords::Euclidean,
                                        t.coords.euclidean_error, t.coords.gift_error,
                                        t.coords.transform_flops, b.CreateString(t.coords.reason));
      }
      fb::TensorBuilder tb(b);
      tb.add_name(name);
      tb.add_shape(shape);
      tb.add_dtype(static_cast<fb::DType>(t.dtype));
      tb.add_encoding(t.raw ? fb::Encoding::Raw : fb::Encoding::Fp8);
      tb.add_fp8(static_cast<fb::Fp8Kind>(t.params.kind));
      tb.add_scale_layout(static_cast<fb::ScaleLayout>(t.params.layout));
      tb.add_block(t.params.block);
      tb.add_tile_rows(t.params.tile_rows);
      tb.add_tile_cols(t.params.tile_cols);
      tb.add_scale_dtype(static_cast<fb::ScaleDType>(t.params.scale_dtype));
      tb.add_rounding(static_cast<fb::Rounding>(t.params.rounding));
      tb.add_seed(t.params.seed);
      tb.add_tensor_index(t.params.tensor_index);
      tb.add_coords(t.coords.gift ? fb::Coords::Gift : fb::Coords::Euclidean);
      if (t.coords.gift) {
        const fb::BasisId id(t.coords.basis_lo, t.coords.basis_hi);
        tb.add_basis_id(&id);
      }
      if (t.coords.has_selection) tb.add_selection(selection);
      tb.add_stats(stats);
      tb.add_codes(codes);
      if (!t.raw) tb.add_scales(scales);
      refs.push_back(tb.Finish());
    }
    // One builder call per statement from here on: the calls' order is the bytes' order, and
    // C++ leaves the order of a call's arguments to the compiler (Clang and GCC on Arm64 wrote
    // other bytes than GCC on x86-64). This is the order GCC on x86-64 gave.
    std::vector<flatbuffers::Offset<fb::KeyValue>> kv;
    for (const auto& [k, v] : metadata_) {
      const auto value = b.CreateString(v);
      const auto key = b.CreateString(k);
      kv.push_back(fb::CreateKeyValue(b, key, value));
    }
    const auto producer = b.CreateString("libgift " + std::to_string(GIFT_VERSION_MAJOR) + "." +
                                         std::to_string(GIFT_VERSION_MINOR) + "." +
                                         std::to_string(GIFT_VERSION_PATCH));
    flatbuffers::Offset<fb::Section> basis;
    if (has_embedded_) basis = ref(embedded_);
    const fb::BasisId id(basis_lo_, basis_hi_);
    const auto tensor_refs = b.CreateVector(refs);
    const auto metadata = b.CreateVector(kv);
    const auto frame =
        fb::CreateFrame(b, basis_kind_ ? fb::FrameKind::Basis : fb::FrameKind::Tensors, producer,
                        metadata, tensor_refs, basis, basis_kind_ || has_embedded_ ? &id : nullptr);
    b.Finish(frame, fb::FrameIdentifier());
  };

  // The header's size first, with the sections placed anywhere (offsets are fixed-size), then
  // the header at their places in a builder of that size: the first builder is freed before,
  // and the second does not regrow (a doubling holds two copies). A frame of 200k tensors
  // (a 40 MiB header): giftc encode's peak RSS went from 398 to 356 MB.
  // The first builder starts at more than the header should take (a tensor's record, its
  // tables and vtables included, is under 512 bytes past its strings and shape): untouched,
  // the excess costs no memory, where its doublings held 1.5 headers at once.
  uint64_t estimate = 4096;
  for (const Pending& t : tensors)
    estimate += 512 + t.name.size() + t.coords.reason.size() + 8 * t.shape.dims.size();
  for (const auto& [k, v] : metadata_) estimate += 64 + k.size() + v.size();
  uint32_t header_bytes = 0;
  {
    flatbuffers::FlatBufferBuilder probe(std::min<uint64_t>(estimate, kMaxHeaderBytes + 4096));
    build(place(0), probe);
    header_bytes = probe.GetSize();
  }
  out->data_start = align_up(kPreambleBytes + header_bytes);
  out->sections = place(out->data_start);
  flatbuffers::FlatBufferBuilder b(header_bytes + 64);
  build(out->sections, b);
  if (b.GetSize() > kMaxHeaderBytes) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "the frame header would take %u bytes, past its limit of %" PRIu64
                " (its tensors' names and records, and the metadata)",
                unsigned(b.GetSize()), kMaxHeaderBytes);
  }
  if (b.GetSize() != header_bytes) {
    return fail(GIFT_ERROR_INTERNAL, "frame header of %u bytes could not be laid out",
                unsigned(b.GetSize()));
  }
  // The frame ends with its last section (no padding after it), or with the header's.
  out->end = out->data_start;
  if (!out->sections.empty()) {
    const Placed& last = out->sections.back();
    out->end = last.offset + last.section->stored_length;
  }
  Preamble pre;
  pre.header_length = b.GetSize();
  pre.header_checksum = checksum64(b.GetBufferPointer(), b.GetSize());
  pre.frame_length = out->end;
  write_preamble(pre, out->preamble.data());
  out->header = b.Release();
  return GIFT_OK;
}

giftResult_t FrameWriter::finish(std::vector<uint8_t>* out) const {
  if (stream_state_ != Stream::kNone) {
    return fail(
        GIFT_ERROR_INVALID_ARGUMENT,
        "the frame streams to an output: it is finished there (giftFrameWriterWriteOutput)");
  }
  Layout l;
  if (const giftResult_t r = layout(tensors_, &l)) return r;
  out->assign(l.end, 0);
  std::memcpy(out->data(), l.preamble.data(), kPreambleBytes);
  std::memcpy(out->data() + kPreambleBytes, l.header.data(), l.header.size());
  for (const Placed& p : l.sections) {
    const StoredSection& s = *p.section;
    if (!s.spilled) {
      if (s.stored_length) std::memcpy(out->data() + p.offset, s.bytes.data(), s.stored_length);
      continue;
    }
    for (uint64_t done = 0; done < s.stored_length;) {
      const ssize_t n = ::pread(scratch_.fd(), out->data() + p.offset + done,
                                s.stored_length - done, off_t(s.scratch_offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return fail(GIFT_ERROR_IO, "cannot read back the writer's scratch file");
      done += uint64_t(n);
    }
  }
  return GIFT_OK;
}

giftResult_t FrameWriter::write_to(OutputFile* out) {
  if (const giftResult_t r = check_stream_open("finishing the frame")) return r;
  if (stream_state_ == Stream::kOpen && out != stream_) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "the frame streams to %s, not %s",
                stream_->name().c_str(), out->name().c_str());
  }
  if (stream_state_ == Stream::kNone && out->check_not_streaming() != GIFT_OK) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: another frame streams into it",
                out->name().c_str());
  }
  Layout l;
  if (const giftResult_t r = layout(tensors_, &l)) return r;
  if (stream_state_ == Stream::kNone) return copy_out(out, l, -1);
  // Once, whatever comes of it: a failure leaves the output refusing to commit.
  stream_state_ = Stream::kFinished;
  stream_ = nullptr;
  sink_ = nullptr;
  out->set_streaming(true, nullptr);
  giftResult_t r;
  if (streamed_in_place(out, l)) {
    r = finish_in_place(out, l);
  } else {
    // The header came out longer or shorter than declared: the streamed sections, moved.
    ClosingFd streamed;
    r = out->restart(&streamed.fd);
    if (r == GIFT_OK) r = copy_out(out, l, streamed.fd);
  }
  if (r == GIFT_OK) out->set_streaming(false, nullptr);
  return r;
}

bool FrameWriter::streamed_in_place(const OutputFile* out, const Layout& l) const {
  // Streamed sections first, each where the layout puts it; the others (appended) after.
  if (l.data_start != stream_base_) return false;
  uint64_t end = stream_base_;
  bool appending = false;
  for (const Placed& p : l.sections) {
    if (!p.section->streamed) {
      appending = true;
      continue;
    }
    if (appending || p.offset != p.section->scratch_offset) return false;
    end = p.offset + p.section->stored_length;
  }
  return end == out->size();
}

giftResult_t FrameWriter::finish_in_place(OutputFile* out, const Layout& l) const {
  for (const Placed& p : l.sections) {
    const StoredSection& s = *p.section;
    if (s.streamed) continue;
    if (const giftResult_t r = write_zeros(out, p.offset - out->size())) return r;
    const giftResult_t r = s.spilled
                               ? out->append_from(scratch_.fd(), s.scratch_offset, s.stored_length)
                               : out->write(s.bytes.data(), s.stored_length);
    if (r) return r;
  }
  if (out->size() != l.end) {
    return fail(GIFT_ERROR_INTERNAL, "streamed frame of %llu bytes, laid out as %llu",
                (unsigned long long)out->size(), (unsigned long long)l.end);
  }
  if (const giftResult_t r = out->write_at(0, l.preamble.data(), kPreambleBytes)) return r;
  return out->write_at(kPreambleBytes, l.header.data(), l.header.size());
}

giftResult_t FrameWriter::copy_out(OutputFile* out, const Layout& l, int streamed_fd) const {
  if (const giftResult_t r = out->reserve(l.end)) return r;
  if (const giftResult_t r = out->write(l.preamble.data(), kPreambleBytes)) return r;
  if (const giftResult_t r = out->write(l.header.data(), l.header.size())) return r;
  uint64_t at = kPreambleBytes + l.header.size();
  for (const Placed& p : l.sections) {
    if (const giftResult_t r = write_zeros(out, p.offset - at)) return r;
    const StoredSection& s = *p.section;
    const int from = s.streamed ? streamed_fd : scratch_.fd();
    const giftResult_t r = s.spilled ? out->append_from(from, s.scratch_offset, s.stored_length)
                                     : out->write(s.bytes.data(), s.stored_length);
    if (r) return r;
    at = p.offset + s.stored_length;
  }
  return write_zeros(out, l.end - at);
}

}  // namespace gift::container
