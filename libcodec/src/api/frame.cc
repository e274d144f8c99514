// The C API of frames: opaque handles over FrameReader and FrameWriter.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

#include "api/coords_frames.h"
#include "api/frame_basis.h"
#include "api/handles.h"
#include "common/error.h"
#include "common/sized.h"
#include "container/layout.h"
#include "gift_generated.h"
#include "numerics/codec.h"

using gift::fail;

namespace {

giftResult_t open_source(std::unique_ptr<gift::container::ByteSource> src, const std::string& name,
                         giftFrame** frame) {
  std::unique_ptr<gift::container::FrameReader> r;
  if (const giftResult_t e = gift::container::FrameReader::open(std::move(src), name, &r)) return e;
  *frame = new (std::nothrow) giftFrame();
  if (*frame) (*frame)->reader = std::move(r);
  return *frame ? GIFT_OK : fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory");
}

bool in_gift_coords(const giftFrame* frame, uint64_t index) {
  const auto& ts = frame->reader->tensors();
  return index < ts.size() && ts[index].fb->coords() == gift::fb::Coords::Gift;
}

giftBasisId id_of(const gift::fb::BasisId* id) {
  return id ? giftBasisId{id->lo(), id->hi()} : giftBasisId{0, 0};
}

}  // namespace

giftResult_t gift::frame_basis(giftFrame* frame, const giftBasis** out) {
  const std::lock_guard<std::mutex> lock(frame->basis_mutex);
  if (!frame->basis_read) {
    if (const giftResult_t r = gift::coords::read_embedded_basis(
            *frame->reader, &frame->basis.basis, &frame->has_basis))
      return r;
    frame->basis_read = true;
  }
  *out = frame->has_basis ? &frame->basis : nullptr;
  return GIFT_OK;
}

namespace {

// The decode shared by whole tensors and bands: the caller's buffer is checked first, as for
// every tensor, then the basis (the frame's own when none is given).
template <typename Decode>
giftResult_t decode_guarded(giftFrame* frame, uint64_t index, const giftBasis* given,
                            const void* dst, uint64_t dst_bytes, giftDType_t dst_dtype,
                            uint64_t elements, Decode&& decode) {
  if (!frame) return fail(GIFT_ERROR_INVALID_ARGUMENT, "frame is NULL");
  try {
    const giftBasis* basis = given;
    if (in_gift_coords(frame, index)) {
      if (const giftResult_t r =
              frame->reader->check_output(index, dst, dst_bytes, dst_dtype, elements))
        return r;
      if (!basis) {
        if (const giftResult_t r = gift::frame_basis(frame, &basis)) return r;
      }
    }
    return decode(basis ? &basis->basis : nullptr);
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory while decoding");
  }
}

}  // namespace

giftResult_t gift::decode_with_basis(giftFrame* frame, uint64_t index, const giftBasis* given,
                                     void* dst, uint64_t dst_bytes, giftDType_t dst_dtype) {
  return decode_guarded(frame, index, given, dst, dst_bytes, dst_dtype, UINT64_MAX,
                        [&](const gift::coords::Basis* b) {
                          return gift::coords::decode_in_basis(*frame->reader, size_t(index), b,
                                                               dst, dst_bytes, dst_dtype);
                        });
}

giftResult_t gift::decode_rows_with_basis(giftFrame* frame, uint64_t index, uint64_t first_row,
                                          uint64_t rows, const giftBasis* given, void* dst,
                                          uint64_t dst_bytes, giftDType_t dst_dtype) {
  const auto& ts = frame ? frame->reader->tensors() : decltype(frame->reader->tensors()){};
  const uint64_t cols = index < ts.size() ? ts[index].cols : 0;
  // The rows first: rows * cols of rows past the tensor may wrap.
  if (index < ts.size()) {
    if (const giftResult_t r = frame->reader->check_rows(size_t(index), first_row, rows)) return r;
  }
  return decode_guarded(frame, index, given, dst, dst_bytes, dst_dtype, rows * cols,
                        [&](const gift::coords::Basis* b) {
                          return gift::coords::decode_rows_in_basis(
                              *frame->reader, size_t(index), b, first_row, rows, dst, dst_bytes,
                              dst_dtype, &frame->rows_cache);
                        });
}

namespace {

// giftFrameVerify's work, with `given` for tensors in GIFT coordinates (null: the embedded
// basis, which is verified either way).
giftResult_t verify(giftFrame* frame, const giftBasis* given) {
  if (!frame) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameVerify: null frame");
  try {
    if (const giftResult_t r = frame->reader->verify_all()) return r;
    // A basis frame is read as the basis it is, which checks its id against its contents.
    if (frame->reader->header()->kind() == gift::fb::FrameKind::Basis) {
      gift::coords::Basis b;
      return gift::coords::parse_basis(frame->reader->bytes(), frame->reader->frame_length(),
                                       frame->reader->name(), &b);
    }
    // The embedded basis is verified too, and tensors in GIFT coordinates need it, as
    // decoding does.
    const giftBasis* basis = nullptr;
    if (const giftResult_t r = gift::frame_basis(frame, &basis)) return r;
    if (given) basis = given;
    for (size_t i = 0; i < frame->reader->tensors().size(); ++i) {
      const gift::coords::Whitener* t = nullptr;
      if (!in_gift_coords(frame, i)) continue;
      const gift::coords::Basis* b = basis ? &basis->basis : nullptr;
      if (const giftResult_t r = gift::coords::resolve_whitener(*frame->reader, i, b, &t)) return r;
      // Mapped back, a tensor whose input was finite must stay finite: a writer that let
      // whitening overflow fp32 made a frame that decodes to Inf.
      const gift::container::TensorEntry& e = frame->reader->tensors()[i];
      const gift::fb::Stats* stats = e.fb->stats();
      if (stats && stats->nonfinite_count() > 0) continue;
      // In bands of rows, as decoding does, so memory stays bounded.
      const uint64_t band =
          gift::band_rows(gift::container::FrameReader::row_unit(e), e.cols, uint64_t(1) << 22);
      gift::container::FrameReader::SectionCache cache;
      std::vector<float> v;
      for (uint64_t r0 = 0; r0 < e.rows; r0 += band) {
        const uint64_t n = std::min(band, e.rows - r0);
        v.resize(n * e.cols);
        if (const giftResult_t r = gift::coords::decode_rows_in_basis(
                *frame->reader, i, b, r0, n, v.data(), v.size() * 4, GIFT_DTYPE_F32, &cache))
          return r;
        for (const float x : v) {
          if (!std::isfinite(x)) {
            return fail(GIFT_ERROR_CORRUPT_INPUT,
                        "%s: tensor '%s' decodes to NaN or Inf in GIFT coordinates, though its "
                        "input was finite",
                        frame->reader->name().c_str(), e.name.c_str());
          }
        }
      }
    }
    return GIFT_OK;
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory while verifying");
  }
}

}  // namespace

extern "C" {

giftResult_t giftFrameOpen(const void* data, uint64_t size, giftFrame** frame) {
  gift::clear_error();
  if (!frame || (size && !data))
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameOpen: null pointer");
  *frame = nullptr;
  try {
    return open_source(gift::container::borrow_bytes(data, size), "frame", frame);
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory while opening a frame");
  }
}

giftResult_t giftFrameOpenFile(const char* path, giftFrame** frame) {
  gift::clear_error();
  if (!frame || !path) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameOpenFile: null pointer");
  *frame = nullptr;
  try {
    std::unique_ptr<gift::container::ByteSource> src;
    if (const giftResult_t e = gift::container::map_file(path, &src)) return e;
    return open_source(std::move(src), path, frame);
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "%s: out of memory while opening", path);
  }
}

void giftFrameClose(giftFrame* frame) { delete frame; }

giftResult_t giftFrameSetThreads(giftFrame* frame, int threads) {
  gift::clear_error();
  if (!frame) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameSetThreads: null frame");
  if (threads < 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "threads is negative (%d)", threads);
  frame->reader->set_threads(threads);
  return GIFT_OK;
}

giftResult_t giftFrameSetLateChecksums(giftFrame* frame, int late) {
  gift::clear_error();
  if (!frame) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameSetLateChecksums: null frame");
  // Takes effect from the next tensor a call fetches; one already fetched stays checked as it
  // was (whole, or band by band to its last band).
  frame->rows_cache.late_checksums = late != 0;
  return GIFT_OK;
}

giftResult_t giftFrameGetInfo(const giftFrame* frame, giftFrameInfo* info) {
  gift::clear_error();
  if (!frame) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameGetInfo: null frame");
  const gift::container::FrameReader& r = *frame->reader;
  const gift::fb::Frame* h = r.header();
  giftFrameInfo f = GIFT_FRAME_INFO_INIT;
  f.format_major = GIFT_FORMAT_MAJOR;
  f.format_minor = r.minor_version();
  f.kind = h->kind() == gift::fb::FrameKind::Basis ? GIFT_FRAME_BASIS : GIFT_FRAME_TENSORS;
  f.producer = h->producer() ? h->producer()->c_str() : "";
  f.tensor_count = r.tensors().size();
  f.metadata_count = h->metadata() ? h->metadata()->size() : 0;
  f.has_basis = h->basis() != nullptr;
  f.basis_id = id_of(h->basis_id());
  f.bytes = r.frame_length();
  return gift::write_sized(f, info, "giftFrameInfo");
}

uint64_t giftFrameTensorCount(const giftFrame* frame) {
  return frame ? frame->reader->tensors().size() : 0;
}

giftResult_t giftFrameMetadata(const giftFrame* frame, uint64_t index, const char** key,
                               const char** value) {
  gift::clear_error();
  if (!frame || !key || !value)
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameMetadata: null pointer");
  const auto* md = frame->reader->header()->metadata();
  if (!md || index >= md->size())
    return fail(GIFT_ERROR_NOT_FOUND, "no metadata entry %llu", (unsigned long long)index);
  const gift::fb::KeyValue* kv = md->Get(uint32_t(index));
  *key = kv->key()->c_str();
  *value = kv->value() ? kv->value()->c_str() : "";
  return GIFT_OK;
}

// giftTensorInfo holds a giftQuantParams and a giftSelection by value, and write_sized copies
// the caller's size of it: were either to grow, the fields after it would move, and a program
// built against the older gift.h would read them from the wrong places. Growing one needs a
// new version of giftTensorInfo, with the older layouts written field by field here.
static_assert(sizeof(void*) != 8 ||
                  (sizeof(giftQuantParams) == 64 && sizeof(giftSelection) == 48 &&
                   offsetof(giftTensorInfo, selection) == 168 && sizeof(giftTensorInfo) == 272),
              "giftTensorInfo's layout changed on 64-bit targets: see above");

giftResult_t giftFrameTensorInfo(const giftFrame* frame, uint64_t index, giftTensorInfo* info) {
  gift::clear_error();
  if (!frame) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameTensorInfo: null frame");
  if (const giftResult_t r = gift::check_sized(info, "giftTensorInfo")) return r;
  const auto& ts = frame->reader->tensors();
  if (index >= ts.size())
    return fail(GIFT_ERROR_NOT_FOUND, "no tensor %llu", (unsigned long long)index);
  const gift::container::TensorEntry& e = ts[index];
  const gift::fb::Tensor* t = e.fb;
  giftTensorInfo i = GIFT_TENSOR_INFO_INIT;
  i.name = t->name()->c_str();
  i.ndim = uint32_t(e.shape.size());
  i.shape = e.shape.data();
  i.elements = e.elements;
  i.dtype = e.dtype;
  i.raw = e.raw;
  const bool gift = t->coords() == gift::fb::Coords::Gift;
  i.coords = gift ? GIFT_COORDS_GIFT : GIFT_COORDS_EUCLIDEAN;
  if (gift) i.basis_id = id_of(t->basis_id());
  if (!e.raw) i.params = e.params;
  for (const gift::fb::Section* s : {t->codes(), t->scales()}) {
    if (!s) continue;
    i.stored_bytes += s->stored_length();
    i.raw_bytes += s->raw_length();
    i.compressed |= s->compression() != gift::fb::Compression::None;
  }
  i.selection.euclidean_error = i.selection.gift_error = NAN;
  if (const gift::fb::Selection* s = t->selection()) {
    i.selection.made = 1;
    i.selection.chosen =
        s->chosen() == gift::fb::Coords::Gift ? GIFT_COORDS_GIFT : GIFT_COORDS_EUCLIDEAN;
    i.selection.euclidean_error = s->euclidean_error();
    i.selection.gift_error = s->gift_error();
    i.selection.transform_flops = s->transform_flops();
    i.selection.reason = s->reason() ? s->reason()->c_str() : "";
  }
  if (const gift::fb::Stats* s = t->stats()) {
    i.has_stats = 1;
    i.amax = s->amax();
    i.rms = s->rms();
    i.nonfinite_count = s->nonfinite_count();
  }
  i.rows = e.rows;
  i.cols = e.cols;
  i.row_align = gift::container::FrameReader::row_unit(e);
  i.col_align = gift::container::FrameReader::col_unit(e);
  return gift::write_sized(i, info, "giftTensorInfo");
}

giftResult_t giftFrameFindTensor(const giftFrame* frame, const char* name, uint64_t* index) {
  gift::clear_error();
  if (!frame || !name || !index)
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameFindTensor: null pointer");
  const auto& ts = frame->reader->tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].name == name) {
      *index = i;
      return GIFT_OK;
    }
  }
  return fail(GIFT_ERROR_NOT_FOUND, "no tensor named '%s'", name);
}

giftResult_t giftFrameDecodeTensor(giftFrame* frame, uint64_t index, void* dst, uint64_t dst_bytes,
                                   giftDType_t dst_dtype) {
  gift::clear_error();
  return gift::decode_with_basis(frame, index, nullptr, dst, dst_bytes, dst_dtype);
}

giftResult_t giftFrameDecodeRows(giftFrame* frame, uint64_t index, uint64_t first_row,
                                 uint64_t rows, void* dst, uint64_t dst_bytes,
                                 giftDType_t dst_dtype) {
  gift::clear_error();
  return gift::decode_rows_with_basis(frame, index, first_row, rows, nullptr, dst, dst_bytes,
                                      dst_dtype);
}

giftResult_t giftFrameDecodeRowPart(giftFrame* frame, uint64_t index, uint64_t row,
                                    uint64_t first_col, uint64_t cols, void* dst,
                                    uint64_t dst_bytes, giftDType_t dst_dtype) {
  gift::clear_error();
  if (!frame) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameDecodeRowPart: null frame");
  try {
    return frame->reader->decode_row_part(size_t(index), row, first_col, cols, dst, dst_bytes,
                                          dst_dtype, &frame->rows_cache);
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory while decoding");
  }
}

giftResult_t giftFrameTensorData(giftFrame* frame, uint64_t index, const uint8_t** codes,
                                 const void** scales, uint64_t* scale_bytes) {
  gift::clear_error();
  if (!frame || !codes || !scales || !scale_bytes) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameTensorData: null pointer");
  }
  const auto& ts = frame->reader->tensors();
  if (index >= ts.size())
    return fail(GIFT_ERROR_NOT_FOUND, "no tensor %llu", (unsigned long long)index);
  const gift::container::TensorEntry& e = ts[index];
  if (e.raw)
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor '%s' is raw, not FP8", e.name.c_str());
  const gift::fb::Section* cs = e.fb->codes();
  const gift::fb::Section* ss = e.fb->scales();
  for (const gift::fb::Section* s : {cs, ss}) {
    if (s && s->compression() != gift::fb::Compression::None) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT,
                  "tensor '%s' is compressed; decode it instead of using it in place",
                  e.name.c_str());
    }
  }
  std::vector<uint8_t> unused;
  const uint8_t *c = nullptr, *s = nullptr;
  if (const giftResult_t r =
          frame->reader->section_bytes(cs, "tensor '" + e.name + "': codes section", &unused, &c)) {
    return r;
  }
  if (const giftResult_t r = frame->reader->section_bytes(
          ss, "tensor '" + e.name + "': scales section", &unused, &s)) {
    return r;
  }
  *codes = c;
  *scales = s;
  *scale_bytes = ss ? ss->raw_length() : 0;
  return GIFT_OK;
}

giftResult_t giftFrameVerify(giftFrame* frame) {
  gift::clear_error();
  return verify(frame, nullptr);
}

giftResult_t giftFrameVerifyWithBasis(giftFrame* frame, const giftBasis* given) {
  gift::clear_error();
  return verify(frame, given);
}

giftResult_t giftFrameWriterCreate(giftFrameWriter** writer) {
  gift::clear_error();
  if (!writer) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameWriterCreate: null pointer");
  *writer = new (std::nothrow) giftFrameWriter();
  return *writer ? GIFT_OK : fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory");
}

void giftFrameWriterFree(giftFrameWriter* writer) { delete writer; }

giftResult_t giftFrameWriterSetThreads(giftFrameWriter* writer, int threads) {
  gift::clear_error();
  if (!writer) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null writer");
  if (threads < 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "threads is negative (%d)", threads);
  writer->writer.set_threads(threads);
  return GIFT_OK;
}

giftResult_t giftFrameWriterSetCompression(giftFrameWriter* writer, int zstd_level) {
  gift::clear_error();
  if (!writer) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null writer");
  if (zstd_level < 0 || zstd_level > 22) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "zstd level %d is not in [0, 22]", zstd_level);
  }
  writer->writer.set_compression(zstd_level);
  return GIFT_OK;
}

giftResult_t giftFrameWriterAddMetadata(giftFrameWriter* writer, const char* key,
                                        const char* value) {
  gift::clear_error();
  if (!writer || !key || !value) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null argument");
  return writer->writer.add_metadata(key, value);
}

giftResult_t giftFrameWriterAddTensor(giftFrameWriter* writer, const char* name,
                                      const uint64_t* shape, uint32_t ndim, giftDType_t dtype,
                                      const void* data, const giftQuantParams* params) {
  gift::clear_error();
  if (!writer || !name) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null writer or name");
  try {
    gift::container::TensorShape s;
    if (const giftResult_t r = gift::container::make_shape(shape, ndim, &s)) {
      return fail(r, "tensor '%s': %s", name, giftGetLastErrorMessage());
    }
    if (!params) return writer->writer.add_tensor(name, s, dtype, data, nullptr);
    giftQuantParams p;
    if (const giftResult_t r = gift::load_params(params, &p)) {
      return fail(r, "tensor '%s': %s", name, giftGetLastErrorMessage());
    }
    return writer->writer.add_tensor(name, s, dtype, data, &p);
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory while encoding '%s'", name);
  }
}

giftResult_t giftFrameWriterFinish(giftFrameWriter* writer, void** data, uint64_t* size) {
  gift::clear_error();
  if (!writer || !data || !size) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null argument");
  try {
    std::vector<uint8_t> bytes;
    if (const giftResult_t r = writer->writer.finish(&bytes)) return r;
    void* p = std::malloc(bytes.size() ? bytes.size() : 1);
    if (!p) return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory");
    std::memcpy(p, bytes.data(), bytes.size());
    *data = p;
    *size = bytes.size();
    return GIFT_OK;
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory while finishing a frame");
  }
}

giftResult_t giftFrameWriterWriteOutput(giftFrameWriter* writer, giftOutput* out) {
  gift::clear_error();
  if (!writer || !out) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null argument");
  if (const giftResult_t r = out->file.settle()) return r;  // a write behind first
  try {
    return writer->writer.write_to(&out->file);
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory while finishing a frame");
  }
}

giftResult_t giftFrameWriterWriteFile(giftFrameWriter* writer, const char* path) {
  gift::clear_error();
  if (!writer || !path) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null argument");
  try {
    giftOutput out;
    if (const giftResult_t r = out.file.open(path)) return r;
    if (const giftResult_t r = writer->writer.write_to(&out.file)) return r;
    return out.file.commit();
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory while finishing a frame");
  }
}

giftResult_t giftFrameWriterStreamTo(giftFrameWriter* writer, giftOutput* out, size_t count,
                                     const char* const* names, const uint32_t* ndims,
                                     const int* lossless) {
  gift::clear_error();
  if (!writer || !out || (count && (!names || !ndims)))
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "null argument");
  if (const giftResult_t r = out->file.settle()) return r;  // a write behind first
  try {
    std::vector<gift::container::FrameWriter::Declared> declared(count);
    uint64_t name_bytes = 0;
    for (size_t i = 0; i < count; ++i) {
      if (!names[i]) return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor name %zu is NULL", i);
      if (ndims[i] > gift::container::kMaxDims) {
        return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor '%s': %u dimensions, at most %u", names[i],
                    ndims[i], gift::container::kMaxDims);
      }
      name_bytes += std::strlen(names[i]);
      if (name_bytes > gift::container::kMaxHeaderBytes) {
        return fail(GIFT_ERROR_INVALID_ARGUMENT, "declared names exceed a header's %llu bytes",
                    (unsigned long long)gift::container::kMaxHeaderBytes);
      }
      declared[i] = {names[i], ndims[i], lossless && lossless[i]};
    }
    return writer->writer.stream_to(&out->file, declared);
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory");
  }
}

giftResult_t giftFrameWriterSetScratchDir(giftFrameWriter* writer, const char* dir) {
  gift::clear_error();
  if (!writer || !dir) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null argument");
  return writer->writer.use_scratch(dir);
}

void giftFree(void* p) { std::free(p); }

giftResult_t giftWriteFile(const char* path, const void* data, uint64_t size) {
  gift::clear_error();
  if (!path || (size && !data))
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftWriteFile: null pointer");
  return gift::write_file_atomically(path, static_cast<const uint8_t*>(data), size);
}

}  // extern "C"
