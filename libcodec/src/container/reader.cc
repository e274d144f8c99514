#include "container/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

#include "common/error.h"
#include "common/map_ahead.h"
#include "common/utf8.h"
#include "container/layout.h"
#include "container/sections.h"
#include "gift_generated.h"
#include "numerics/codec.h"
#include "numerics/elementwise.h"
#include "numerics/groups.h"
#include "numerics/shapes.h"

namespace gift::container {
namespace {

class BorrowedBytes : public ByteSource {
 public:
  BorrowedBytes(const void* d, uint64_t n) : d_(static_cast<const uint8_t*>(d)), n_(n) {}
  const uint8_t* data() const override { return d_; }
  uint64_t size() const override { return n_; }

 private:
  const uint8_t* d_;
  uint64_t n_;
};

class MappedFile : public ByteSource {
 public:
  MappedFile(void* p, uint64_t n) : p_(p), n_(n) {}
  ~MappedFile() override {
    if (p_) ::munmap(p_, n_);
  }
  const uint8_t* data() const override { return static_cast<const uint8_t*>(p_); }
  uint64_t size() const override { return n_; }

 private:
  void* p_;
  uint64_t n_;
};

}  // namespace

std::unique_ptr<ByteSource> borrow_bytes(const void* data, uint64_t size) {
  return std::make_unique<BorrowedBytes>(data, size);
}

giftResult_t map_file(const std::string& path, std::unique_ptr<ByteSource>* out) {
  // Without waiting: a FIFO's open(2) waits for a writer, and it is refused below anyway.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fail(GIFT_ERROR_IO, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(GIFT_ERROR_IO, "%s: not a regular file", path.c_str());
  }
  void* p = nullptr;
  if (st.st_size > 0) {
    p = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return fail(GIFT_ERROR_IO, "%s: cannot map: %s", path.c_str(), std::strerror(e));
    }
  }
  ::close(fd);
  *out = std::make_unique<MappedFile>(p, uint64_t(st.st_size));
  return GIFT_OK;
}

namespace {

struct Span {
  uint64_t offset, length;
};

// Names a section in messages: "tensor 'w': codes section".
std::string section_name(const std::string& tensor, const char* which) {
  return "tensor '" + tensor + "': " + which + " section";
}

}  // namespace

giftResult_t FrameReader::open(std::unique_ptr<ByteSource> bytes, const std::string& name,
                               std::unique_ptr<FrameReader>* out) {
  std::unique_ptr<FrameReader> r(new FrameReader());
  r->bytes_ = std::move(bytes);
  r->name_ = name;
  if (const giftResult_t e = r->verify_structure()) return e;
  *out = std::move(r);
  return GIFT_OK;
}

// Every other string of the header reaches callers as a C string and JSON output, so it is
// held to the rule for names too.
giftResult_t FrameReader::verify_strings() const {
  const char* n = name_.c_str();
  auto check = [&](const flatbuffers::String* s, const std::string& what) {
    if (!s || valid_utf8_c_string(s->str())) return GIFT_OK;
    return fail(GIFT_ERROR_FIELD_INVALID, "%s: %s is not UTF-8 without NUL", n, what.c_str());
  };
  if (const giftResult_t r = check(header_->producer(), "producer")) return r;
  if (const auto* md = header_->metadata()) {
    for (uint32_t i = 0; i < md->size(); ++i) {
      if (const giftResult_t r = check(md->Get(i)->key(), "metadata key " + std::to_string(i)))
        return r;
      if (const giftResult_t r =
              check(md->Get(i)->value(), "metadata value of '" + md->Get(i)->key()->str() + "'"))
        return r;
    }
  }
  for (const TensorEntry& e : tensors_) {
    const fb::Selection* sel = e.fb->selection();
    if (const giftResult_t r =
            check(sel ? sel->reason() : nullptr, "tensor '" + e.name + "': selection reason"))
      return r;
  }
  return GIFT_OK;
}

giftResult_t FrameReader::verify_structure() {
  const uint8_t* b = bytes_->data();
  const uint64_t size = bytes_->size();
  const char* n = name_.c_str();
  const uint64_t probe = std::min<uint64_t>(size, 8);
  if (size == 0 || std::memcmp(b, kMagic, probe) != 0) {
    if (probe >= 4 && std::memcmp(b, kMagic, 4) == 0) {
      return fail(GIFT_ERROR_FRAME_MAGIC,
                  "%s: damaged GIFT magic (line endings changed by a text-mode transfer?)", n);
    }
    return fail(GIFT_ERROR_FRAME_MAGIC, "%s: not a GIFT frame (no GIFT magic)", n);
  }
  if (size < kPreambleBytes) {
    return fail(GIFT_ERROR_FRAME_TRUNCATED,
                "%s: truncated: %" PRIu64 " bytes, a frame has at least %" PRIu64, n, size,
                kPreambleBytes);
  }
  const Preamble pre = read_preamble(b);
  if (pre.major != kMajor) {
    return fail(GIFT_ERROR_FRAME_VERSION,
                "%s: unsupported GIFT format major version %u (this build reads %u)", n,
                unsigned(pre.major), unsigned(kMajor));
  }
  minor_ = pre.minor;
  if (pre.frame_length != size) {
    return fail(GIFT_ERROR_FRAME_TRUNCATED,
                "%s: %s: the frame is %" PRIu64 " bytes, its preamble says %" PRIu64, n,
                size < pre.frame_length ? "truncated" : "trailing bytes", size, pre.frame_length);
  }
  if (pre.header_length > kMaxHeaderBytes || pre.header_length > size - kPreambleBytes) {
    return fail(GIFT_ERROR_FRAME_TRUNCATED,
                "%s: header length %u does not fit in the frame's %" PRIu64 " bytes", n,
                unsigned(pre.header_length), size);
  }
  // The header is copied out of the caller's buffer or the mapped file, so what was verified
  // is what is used even if those bytes change afterwards.
  header_bytes_.assign(b + kPreambleBytes, b + kPreambleBytes + pre.header_length);
  const uint8_t* h = header_bytes_.data();
  if (checksum64(h, pre.header_length) != pre.header_checksum) {
    return fail(GIFT_ERROR_HEADER_CHECKSUM, "%s: header checksum mismatch (the header is damaged)",
                n);
  }
  flatbuffers::Verifier::Options opts;
  opts.max_depth = kMaxDepth;
  opts.max_tables = kMaxTables;
  flatbuffers::Verifier v(h, pre.header_length, opts);
  if (!fb::VerifyFrameBuffer(v)) {
    return fail(GIFT_ERROR_HEADER_INVALID, "%s: the header is not a valid gift.fbs Frame", n);
  }
  header_ = fb::GetFrame(h);
  frame_length_ = size;
  data_start_ = kPreambleBytes + pre.header_length;

  // Fields first (FORMAT.md 3.2 step 6), for every tensor.
  if (uint8_t(header_->kind()) > uint8_t(fb::FrameKind::MAX)) {
    return fail(GIFT_ERROR_FIELD_INVALID, "%s: unknown frame kind %u", n,
                unsigned(header_->kind()));
  }
  const auto* list = header_->tensors();
  const uint32_t count = list ? list->size() : 0;
  tensors_.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    const fb::Tensor* t = list->Get(i);
    TensorEntry e{t, t->name()->str(), {}, 1, 1, 1, GIFT_DTYPE_F32, false, {}, 0, 0};
    const char* tn = e.name.c_str();
    if (e.name.empty())
      return fail(GIFT_ERROR_FIELD_INVALID, "%s: tensor %u has an empty name", n, i);
    if (!valid_utf8_c_string(e.name)) {
      return fail(GIFT_ERROR_FIELD_INVALID, "%s: tensor %u: name is not UTF-8 without NUL", n, i);
    }
    const auto* shape = t->shape();
    const uint32_t ndim = shape ? shape->size() : 0;
    // FlatBuffers verifies a vector's length word, not the alignment of its 8-byte elements.
    // An empty shape (a 0-d tensor) has none to read, and builders do not align it: its data
    // pointer is wherever its length word ends.
    if (ndim > 0 && reinterpret_cast<uintptr_t>(shape->Data()) % alignof(uint64_t) != 0) {
      return fail(GIFT_ERROR_FIELD_INVALID, "%s: tensor '%s': shape vector is misaligned", n, tn);
    }
    if (ndim > kMaxDims) {
      return fail(GIFT_ERROR_FIELD_INVALID, "%s: tensor '%s': %u dimensions (at most %u)", n, tn,
                  ndim, kMaxDims);
    }
    for (uint32_t d = 0; d < ndim; ++d) e.shape.push_back(shape->Get(d));
    MatrixView view;
    if (!matrix_view(e.shape.data(), ndim, &view)) {
      return fail(GIFT_ERROR_FIELD_INVALID, "%s: tensor '%s': %s", n, tn, kTooManyElements);
    }
    e.rows = view.rows;
    e.cols = view.cols;
    e.elements = view.elements;
    if (uint8_t(t->dtype()) > uint8_t(fb::DType::MAX) ||
        uint8_t(t->encoding()) > uint8_t(fb::Encoding::MAX) ||
        uint8_t(t->coords()) > uint8_t(fb::Coords::MAX)) {
      return fail(GIFT_ERROR_FIELD_INVALID,
                  "%s: tensor '%s': unknown dtype, encoding or coordinates", n, tn);
    }
    e.dtype = static_cast<giftDType_t>(t->dtype());
    e.raw = t->encoding() == fb::Encoding::Raw;
    giftQuantParamsInit(&e.params);
    if (e.raw) {
      if (t->scales()) {
        return fail(GIFT_ERROR_FIELD_INVALID, "%s: tensor '%s': a raw tensor has no scales section",
                    n, tn);
      }
      e.codes_bytes = e.elements * dtype_size(e.dtype);
    } else {
      // Range checks on the header's bytes before they become C enums.
      const struct {
        const char* what;
        unsigned value, max;
      } enums[] = {{"FP8 kind", unsigned(t->fp8()), unsigned(fb::Fp8Kind::MAX)},
                   {"scale layout", unsigned(t->scale_layout()), unsigned(fb::ScaleLayout::MAX)},
                   {"scale dtype", unsigned(t->scale_dtype()), unsigned(fb::ScaleDType::MAX)},
                   {"rounding mode", unsigned(t->rounding()), unsigned(fb::Rounding::MAX)}};
      for (const auto& en : enums) {
        if (en.value > en.max) {
          return fail(GIFT_ERROR_FIELD_INVALID, "%s: tensor '%s': unknown %s %u", n, tn, en.what,
                      en.value);
        }
      }
      e.params.kind = static_cast<giftFp8Kind_t>(t->fp8());
      e.params.layout = static_cast<giftScaleLayout_t>(t->scale_layout());
      e.params.block = t->block();
      e.params.tile_rows = t->tile_rows();
      e.params.tile_cols = t->tile_cols();
      e.params.scale_dtype = static_cast<giftScaleDType_t>(t->scale_dtype());
      e.params.rounding = static_cast<giftRounding_t>(t->rounding());
      e.params.seed = t->seed();
      e.params.tensor_index = t->tensor_index();
      if (giftScaleBytes(&e.params, e.rows, e.cols, &e.scale_bytes) != GIFT_OK) {
        return fail(GIFT_ERROR_FIELD_INVALID, "%s: tensor '%s': %s", n, tn,
                    giftGetLastErrorMessage());
      }
      e.codes_bytes = e.elements;
    }
    for (const fb::Section* sec : {t->codes(), t->scales()}) {
      if (sec && uint8_t(sec->compression()) > uint8_t(fb::Compression::MAX)) {
        return fail(GIFT_ERROR_FIELD_INVALID, "%s: tensor '%s': unknown compression %u", n, tn,
                    unsigned(sec->compression()));
      }
    }
    tensors_.push_back(std::move(e));
  }
  {
    std::vector<const std::string*> names;
    for (const TensorEntry& e : tensors_) names.push_back(&e.name);
    std::sort(names.begin(), names.end(), [](auto* a, auto* c) { return *a < *c; });
    for (size_t i = 1; i < names.size(); ++i) {
      if (*names[i] == *names[i - 1]) {
        return fail(GIFT_ERROR_FIELD_INVALID, "%s: tensor name '%s' appears twice", n,
                    names[i]->c_str());
      }
    }
  }
  if (const giftResult_t r = verify_strings()) return r;
  if (header_->basis() &&
      uint8_t(header_->basis()->compression()) > uint8_t(fb::Compression::MAX)) {
    return fail(GIFT_ERROR_FIELD_INVALID, "%s: embedded basis: unknown compression", n);
  }

  // Then sections (step 7): alignment, bounds, lengths, overlap.
  std::vector<Span> spans;
  auto check_section = [&](const fb::Section* s, const std::string& what, uint64_t need) {
    if (!s) {
      if (need == 0) return GIFT_OK;
      return fail(GIFT_ERROR_FIELD_INVALID, "%s: %s is missing", n, what.c_str());
    }
    if (s->offset() % kSectionAlign) {
      return fail(GIFT_ERROR_SECTION_ALIGNMENT,
                  "%s: %s: offset %" PRIu64 " is not a multiple of %" PRIu64, n, what.c_str(),
                  s->offset(), kSectionAlign);
    }
    if (s->offset() < data_start_ || s->offset() > frame_length_ ||
        s->stored_length() > frame_length_ - s->offset()) {
      return fail(GIFT_ERROR_SECTION_BOUNDS,
                  "%s: %s: bytes [%" PRIu64 ", +%" PRIu64 ") lie outside the data area [%" PRIu64
                  ", %" PRIu64 ")",
                  n, what.c_str(), s->offset(), s->stored_length(), data_start_, frame_length_);
    }
    if (s->raw_length() != need) {
      return fail(GIFT_ERROR_SECTION_LENGTH,
                  "%s: %s: holds %" PRIu64 " bytes, the tensor needs %" PRIu64, n, what.c_str(),
                  s->raw_length(), need);
    }
    const bool zstd = s->compression() == fb::Compression::Zstd;
    if (!zstd && s->stored_length() != s->raw_length()) {
      return fail(GIFT_ERROR_SECTION_LENGTH,
                  "%s: %s: uncompressed but stored length %" PRIu64 " differs from %" PRIu64, n,
                  what.c_str(), s->stored_length(), s->raw_length());
    }
    if (zstd && s->stored_length() < UINT64_MAX / kMaxZstdRatio &&
        s->raw_length() > s->stored_length() * kMaxZstdRatio) {
      return fail(GIFT_ERROR_SECTION_LENGTH,
                  "%s: %s: %" PRIu64 " compressed bytes cannot expand to %" PRIu64, n, what.c_str(),
                  s->stored_length(), s->raw_length());
    }
    spans.push_back({s->offset(), s->stored_length()});
    return GIFT_OK;
  };
  for (const TensorEntry& e : tensors_) {
    if (const giftResult_t r = check_section(e.fb->codes(), codes_name(e), e.codes_bytes)) {
      return r;
    }
    if (!e.raw) {
      if (const giftResult_t r =
              check_section(e.fb->scales(), section_name(e.name, "scales"), e.scale_bytes)) {
        return r;
      }
    }
  }
  if (header_->basis()) {
    // An embedded basis is itself a frame; its own open verifies its inside.
    if (const giftResult_t r = check_section(header_->basis(), "embedded basis section",
                                             header_->basis()->raw_length())) {
      return r;
    }
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& c) { return a.offset < c.offset; });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].offset < spans[i - 1].offset + spans[i - 1].length) {
      return fail(GIFT_ERROR_SECTION_BOUNDS, "%s: sections at %" PRIu64 " and %" PRIu64 " overlap",
                  n, spans[i - 1].offset, spans[i].offset);
    }
  }
  return GIFT_OK;
}

giftResult_t FrameReader::checksum_is(uint64_t sum, const fb::Section* s,
                                      const std::string& what) const {
  if (sum != s->checksum()) {
    return fail(GIFT_ERROR_SECTION_CHECKSUM, "%s: %s: checksum mismatch (the data is damaged)",
                name_.c_str(), what.c_str());
  }
  return GIFT_OK;
}

giftResult_t FrameReader::checksum_ok(const fb::Section* s, const std::string& what) const {
  return checksum_is(checksum64_mapped(bytes_->data() + s->offset(), s->stored_length()), s, what);
}

giftResult_t FrameReader::section_bytes(const fb::Section* s, const std::string& what,
                                        std::vector<uint8_t>* scratch,
                                        const uint8_t** bytes) const {
  if (!s) {  // only for empty data, as verified
    *bytes = nullptr;
    return GIFT_OK;
  }
  if (const giftResult_t r = checksum_ok(s, what)) return r;
  const uint8_t* stored = bytes_->data() + s->offset();
  if (s->compression() == fb::Compression::None) {
    *bytes = stored;
    return GIFT_OK;
  }
  const std::string where = name_ + ": " + what;
  if (const giftResult_t r =
          decompress_section(stored, s->stored_length(), s->raw_length(), scratch, where.c_str())) {
    return r;
  }
  *bytes = scratch->data();
  return GIFT_OK;
}

namespace {

// Lossless data converted element by element (fp32 is the common exact form).
void convert_raw(const uint8_t* src, giftDType_t from, uint64_t n, void* dst, giftDType_t to) {
  for (uint64_t i = 0; i < n; ++i) {
    float v;
    if (from == GIFT_DTYPE_F32) {
      std::memcpy(&v, src + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      v = from == GIFT_DTYPE_BF16 ? num::bf16_to_float(h) : num::f16_to_float(h);
    }
    if (to == GIFT_DTYPE_F32) {
      static_cast<float*>(dst)[i] = v;
    } else {
      static_cast<uint16_t*>(dst)[i] =
          to == GIFT_DTYPE_BF16 ? num::bf16_from_float(v) : num::f16_from_float(v);
    }
  }
}

}  // namespace

// fp32 scales are read as floats: a caller's buffer that is not 4-byte aligned gets a copy.
const uint8_t* FrameReader::aligned_scales(const TensorEntry& e, const uint8_t* scales,
                                           std::vector<uint8_t>* scratch) {
  if (!scales || reinterpret_cast<uintptr_t>(scales) % alignof(float) == 0) return scales;
  scratch->assign(scales, scales + e.scale_bytes);
  return scratch->data();
}

giftResult_t FrameReader::embedded_basis(std::vector<uint8_t>* scratch, const uint8_t** bytes,
                                         uint64_t* size) const {
  const fb::Section* s = header_->basis();
  *size = s ? s->raw_length() : 0;
  *bytes = nullptr;
  if (!s) return GIFT_OK;
  return section_bytes(s, "embedded basis section", scratch, bytes);
}

giftResult_t FrameReader::check_output(size_t index, const void* dst, uint64_t dst_bytes,
                                       giftDType_t dst_dtype, uint64_t elements) const {
  if (index >= tensors_.size()) {
    return fail(GIFT_ERROR_NOT_FOUND, "%s: no tensor %zu (the frame has %zu)", name_.c_str(), index,
                tensors_.size());
  }
  const TensorEntry& e = tensors_[index];
  if (!known_dtype(dst_dtype)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown output dtype %d", int(dst_dtype));
  }
  const uint64_t need = std::min(elements, e.elements) * dtype_size(dst_dtype);
  if (need && !dst) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameDecodeTensor: dst is NULL");
  // As giftDecode's rule, for every tensor alike (raw ones are copied, whitened ones go
  // through a buffer, but one rule is what a caller can rely on).
  if (need && reinterpret_cast<uintptr_t>(dst) % dtype_size(dst_dtype) != 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "%s: tensor '%s': dst is not aligned to its %zu-byte elements", name_.c_str(),
                e.name.c_str(), dtype_size(dst_dtype));
  }
  if (dst_bytes < need) {
    return fail(GIFT_ERROR_BUFFER_TOO_SMALL,
                "%s: tensor '%s' needs %" PRIu64 " bytes, %" PRIu64 " given", name_.c_str(),
                e.name.c_str(), need, dst_bytes);
  }
  return GIFT_OK;
}

uint64_t FrameReader::row_unit(const TensorEntry& e) {
  return !e.raw && e.params.layout == GIFT_SCALE_TILE ? e.params.tile_rows : 1;
}

namespace {

// The columns a scale group spans where a row may be cut: a block's or a tile's width.
uint64_t group_cols(const TensorEntry& e) {
  if (e.raw) return 1;
  return e.params.layout == GIFT_SCALE_BLOCK  ? e.params.block
         : e.params.layout == GIFT_SCALE_TILE ? e.params.tile_cols
                                              : 1;
}

// Where a band or a part may lie: from an edge of the groups (units) it cuts, or within one
// group, whose scale it then has alone; n items from `first`.
bool crosses_an_edge(uint64_t first, uint64_t n, uint64_t unit) {
  return first % unit && n && first / unit != (first + n - 1) / unit;
}

}  // namespace

uint64_t FrameReader::col_unit(const TensorEntry& e) {
  return e.fb->coords() == fb::Coords::Gift ? 0 : group_cols(e);
}

giftResult_t FrameReader::fetch(size_t index, SectionCache* cache) const {
  if (cache->index == index) return GIFT_OK;
  const TensorEntry& e = tensors_[index];
  cache->index = SIZE_MAX;
  const fb::Section* codes = e.fb->codes();
  const std::string what = codes_name(e);
  cache->hash.reset();
  const bool late =
      cache->late_checksums && codes && codes->stored_length() > 0 &&
      std::find(cache->damaged.begin(), cache->damaged.end(), index) == cache->damaged.end();
  if (codes && codes->compression() != fb::Compression::None) {
    cache->codes = nullptr;
    if (const giftResult_t r = checksum_ok(codes, what)) return r;
    if (const giftResult_t r =
            cache->codes_window.open(bytes_->data() + codes->offset(), codes->stored_length(),
                                     codes->raw_length(), name_ + ": " + what)) {
      return r;
    }
  } else if (late) {
    cache->codes = bytes_->data() + codes->offset();
    cache->hash.emplace();
    cache->hashed = 0;
  } else if (const giftResult_t r = section_bytes(codes, what, nullptr, &cache->codes)) {
    return r;
  }
  cache->scales = nullptr;
  cache->scales_windowed = false;
  const fb::Section* scales = e.raw ? nullptr : e.fb->scales();
  const std::string scales_what = section_name(e.name, "scales");
  if (scales && scales->compression() != fb::Compression::None) {
    if (const giftResult_t r = checksum_ok(scales, scales_what)) return r;
    if (const giftResult_t r =
            cache->scales_window.open(bytes_->data() + scales->offset(), scales->stored_length(),
                                      scales->raw_length(), name_ + ": " + scales_what)) {
      return r;
    }
    cache->scales_windowed = true;
  } else if (scales) {
    if (const giftResult_t r =
            section_bytes(scales, scales_what, &cache->scales_scratch, &cache->scales)) {
      return r;
    }
    cache->scales = aligned_scales(e, cache->scales, &cache->scales_scratch);
  }
  cache->index = index;
  return GIFT_OK;
}

std::string FrameReader::codes_name(const TensorEntry& e) {
  return section_name(e.name, e.raw ? "raw data" : "codes");
}

giftResult_t FrameReader::decode_codes(const TensorEntry& e, SectionCache& c, const Band& b,
                                       void* dst, giftDType_t dst_dtype,
                                       decltype(&giftDecode) decoder) const {
  const uint64_t width = e.raw ? dtype_size(e.dtype) : 1, n = b.rows * b.cols;
  const uint8_t* codes = nullptr;
  if (const giftResult_t r = c.codes_at((b.row * e.cols + b.col) * width, n * width, &codes))
    return r;
  if (e.raw) {
    const uint8_t* src = codes;
    if (dst_dtype == e.dtype) {
      std::memcpy(dst, src, n * dtype_size(e.dtype));
    } else {
      convert_raw(src, e.dtype, n, dst, dst_dtype);
    }
    return GIFT_OK;
  }
  // The band as a tensor of its own: its groups are the tensor's (it starts a row and a
  // column of groups, or lies within one row of groups), a last group cut short by the band
  // keeps its scale.
  const GroupGrid grid = group_grid(e.params, e.rows, e.cols);
  const uint64_t first_group = e.params.layout == GIFT_SCALE_TENSOR
                                   ? 0
                                   : (b.row / grid.height) * grid.grid_cols + b.col / grid.width;
  uint64_t band_scale_bytes = 0;
  giftScaleBytes(&e.params, b.rows, b.cols, &band_scale_bytes);
  // A compressed section's window is asked from the start of the band's row of tiles (up to
  // 256 KiB of its scales), so that the rows of a tile taken in parts, each from the row's
  // first part, find its scales there and do not decompress the section again from its
  // start each time (tiles of 2 x 16 over 1024 x 131088 bf16 values: 5.7 s that way, 0.4 s
  // this way).
  const uint64_t scale_width = scale_size(e.params.scale_dtype);
  const uint64_t row_start = (b.row / grid.height) * grid.grid_cols;
  const bool from_row = e.params.layout == GIFT_SCALE_TILE && grid.height > 1 &&
                        (first_group - row_start) * scale_width + band_scale_bytes <= (256 << 10);
  const uint64_t from = from_row ? row_start : first_group;
  const uint8_t* scales = nullptr;
  if (const giftResult_t r = c.scales_at(
          from * scale_width, (first_group - from) * scale_width + band_scale_bytes, &scales)) {
    return r;
  }
  return decoder(&ctx_, &e.params, codes, scales + (first_group - from) * scale_width,
                 band_scale_bytes, b.rows, b.cols, dst, dst_dtype);
}

// With late checksums pending, a band that continues the bands hashed so far is decoded,
// then hashed while its codes are still in the cache (hashing them first, from memory, cost
// as much as reading them twice), and the last one compares the sum; any other band checks
// the whole section first. A tensor found damaged is remembered, so that no later run of it
// decodes a band unchecked. Pages are mapped ahead for bands up to kMapAheadBytes; larger
// ones fault theirs in, so that a file larger than memory is not read twice.
giftResult_t FrameReader::decode_band(const TensorEntry& e, SectionCache& c, const Band& b,
                                      void* dst, giftDType_t dst_dtype,
                                      decltype(&giftDecode) decoder) const {
  if (b.rows == 0 || b.cols == 0) return GIFT_OK;
  if (!c.hash) return decode_codes(e, c, b, dst, dst_dtype, decoder);
  const fb::Section* s = e.fb->codes();
  const uint64_t width = e.raw ? dtype_size(e.dtype) : 1;
  const uint64_t at = (b.row * e.cols + b.col) * width, bytes = b.rows * b.cols * width;
  giftResult_t r = GIFT_OK;
  if (at != c.hashed) {
    c.hash.reset();
    r = checksum_ok(s, codes_name(e));
    if (!r) r = decode_codes(e, c, b, dst, dst_dtype, decoder);
  } else {
    if (bytes <= kMapAheadBytes) map_ahead(c.codes + at, bytes);
    r = decode_codes(e, c, b, dst, dst_dtype, decoder);
    if (r) return r;
    c.hash->update(c.codes + at, bytes);
    c.hashed += bytes;
    if (c.hashed < s->stored_length()) return GIFT_OK;
    const uint64_t sum = c.hash->digest();
    c.hash.reset();
    r = checksum_is(sum, s, codes_name(e));
  }
  if (r == GIFT_ERROR_SECTION_CHECKSUM) {
    c.damaged.push_back(c.index);
    c.index = SIZE_MAX;
  }
  return r;
}

giftResult_t FrameReader::check_rows(size_t index, uint64_t first_row, uint64_t rows) const {
  const TensorEntry& e = tensors_[index];
  if (first_row > e.rows || rows > e.rows - first_row) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "%s: tensor '%s' has %" PRIu64 " rows; %" PRIu64 " rows from row %" PRIu64 " asked",
                name_.c_str(), e.name.c_str(), e.rows, rows, first_row);
  }
  const uint64_t unit = row_unit(e);
  if (crosses_an_edge(first_row, rows, unit)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "%s: tensor '%s': rows %" PRIu64 " to %" PRIu64
                " cross a tile's edge without starting at one (tiles of %" PRIu64 " rows)",
                name_.c_str(), e.name.c_str(), first_row, first_row + rows - 1, unit);
  }
  return GIFT_OK;
}

giftResult_t FrameReader::decode_rows(size_t index, uint64_t first_row, uint64_t rows, void* dst,
                                      uint64_t dst_bytes, giftDType_t dst_dtype, bool coded_values,
                                      SectionCache* cache) const {
  if (index >= tensors_.size()) return check_output(index, dst, dst_bytes, dst_dtype);
  const TensorEntry& e = tensors_[index];
  if (const giftResult_t r = check_rows(index, first_row, rows)) return r;
  if (const giftResult_t r = check_output(index, dst, dst_bytes, dst_dtype, rows * e.cols))
    return r;
  if (e.fb->coords() == fb::Coords::Gift && !coded_values) {
    return fail(GIFT_ERROR_BASIS_MISSING,
                "%s: tensor '%s' is encoded in a GIFT basis; it decodes only with that basis",
                name_.c_str(), e.name.c_str());
  }
  if (const giftResult_t r = fetch(index, cache)) return r;
  return decode_band(e, *cache, Band{first_row, rows, 0, e.cols}, dst, dst_dtype, decoder_);
}

giftResult_t FrameReader::decode_row_part(size_t index, uint64_t row, uint64_t first_col,
                                          uint64_t cols, void* dst, uint64_t dst_bytes,
                                          giftDType_t dst_dtype, SectionCache* cache) const {
  if (index >= tensors_.size()) return check_output(index, dst, dst_bytes, dst_dtype);
  const TensorEntry& e = tensors_[index];
  if (row >= e.rows || first_col > e.cols || cols > e.cols - first_col) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "%s: tensor '%s' has %" PRIu64 " rows of %" PRIu64 " columns; %" PRIu64
                " columns from column %" PRIu64 " of row %" PRIu64 " asked",
                name_.c_str(), e.name.c_str(), e.rows, e.cols, cols, first_col, row);
  }
  const uint64_t unit = col_unit(e);
  if (unit == 0) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "%s: tensor '%s' is encoded in GIFT coordinates: it decodes in whole rows "
                "(giftFrameDecodeRowsWithBasis)",
                name_.c_str(), e.name.c_str());
  }
  if (crosses_an_edge(first_col, cols, unit)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "%s: tensor '%s': columns %" PRIu64 " to %" PRIu64
                " cross the edge of a scale group of %" PRIu64 " columns without starting at one",
                name_.c_str(), e.name.c_str(), first_col, first_col + cols - 1, unit);
  }
  if (const giftResult_t r = check_output(index, dst, dst_bytes, dst_dtype, cols)) return r;
  if (const giftResult_t r = fetch(index, cache)) return r;
  return decode_band(e, *cache, Band{row, 1, first_col, cols}, dst, dst_dtype, decoder_);
}

giftResult_t FrameReader::decode(size_t index, void* dst, uint64_t dst_bytes, giftDType_t dst_dtype,
                                 bool coded_values) const {
  if (const giftResult_t r = check_output(index, dst, dst_bytes, dst_dtype)) return r;
  SectionCache fresh;  // every whole decode checks the sections again
  return decode_rows(index, 0, tensors_[index].rows, dst, dst_bytes, dst_dtype, coded_values,
                     &fresh);
}

giftResult_t FrameReader::verify_all() const {
  // Every section is read (checksum, decompression) and every code decoded, in bands of rows
  // whose output stays small however many elements a frame claims.
  constexpr uint64_t kBandElems = uint64_t(1) << 18;
  std::vector<float> out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorEntry& e = tensors_[i];
    SectionCache c;
    if (const giftResult_t r = fetch(i, &c)) return r;
    // Raw data is checked by its checksum and, compressed, read through once; tensors in GIFT
    // coordinates: their codes, as coded.
    if (e.raw || e.elements == 0) {
      const uint64_t raw_length = e.fb->codes() ? e.fb->codes()->raw_length() : 0;
      for (uint64_t at = 0; !c.codes && e.fb->codes(); at += kBandElems) {
        const uint8_t* bytes;
        const uint64_t n = std::min(kBandElems, raw_length - at);
        if (const giftResult_t r = c.codes_at(at, n, &bytes)) return r;
        if (at + n == raw_length) break;
      }
      continue;
    }
    // Bands of whole rows (within a tile's rows where those exceed the budget: a divisor
    // of its height); a row longer than the budget in parts, which start at a group's edge
    // or lie within one group (tensors in GIFT coordinates too: their codes are decoded as
    // coded). Bands the decode rules allow, as giftc's Pieces (cli/common.h) cuts its own.
    const uint64_t width = std::max<uint64_t>(e.cols, 1), unit = row_unit(e), g = group_cols(e);
    const bool parts = unit > kBandElems / width && e.cols > kBandElems;
    uint64_t band = 1;
    if (unit <= kBandElems / width) {
      band = band_rows(unit, e.cols, kBandElems);
    } else if (!parts) {
      band = kBandElems / width;
      while (unit % band) --band;
    }
    out.resize(parts ? row_part(e.cols, g, kBandElems) : band * e.cols);
    for (uint64_t r0 = 0; r0 < e.rows; r0 += band) {
      const giftResult_t r =
          parts ? for_each_row_part(e.cols, g, kBandElems,
                                    [&](uint64_t c0, uint64_t w) {
                                      return decode_band(e, c, Band{r0, 1, c0, w}, out.data(),
                                                         GIFT_DTYPE_F32, &giftDecode);
                                    })
                : decode_band(e, c, Band{r0, std::min(band, e.rows - r0), 0, e.cols}, out.data(),
                              GIFT_DTYPE_F32, &giftDecode);
      if (r) return r;
    }
  }
  if (const fb::Section* s = header_->basis()) {
    std::vector<uint8_t> scratch;
    const uint8_t* bytes;
    if (const giftResult_t r = section_bytes(s, "embedded basis section", &scratch, &bytes))
      return r;
  }
  return GIFT_OK;
}

}  // namespace gift::container
