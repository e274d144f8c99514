#include "container/writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/error.h"
#include "common/utf8.h"
#include "container/layout.h"
#include "gift_generated.h"
#include "numerics/codec.h"
#include "numerics/convert.h"
#include "numerics/elementwise.h"

namespace gift::container {

giftResult_t make_shape(const uint64_t* dims, uint32_t ndim, TensorShape* out) {
  if (ndim > kMaxDims) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%u dimensions, at most %u supported", ndim, kMaxDims);
  }
  if (ndim && !dims) return fail(GIFT_ERROR_INVALID_ARGUMENT, "shape is NULL");
  if (!matrix_view(dims, ndim, out)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "shape's element count overflows");
  }
  out->dims.assign(dims, dims + ndim);
  return GIFT_OK;
}

namespace {

// What a tensor's statistics say (FORMAT.md 2.2, Tensor.stats), over its values as given.
struct Census {
  float rms = 0;  // over the finite values
  giftEncodeStats stats{0.0f, 0, UINT64_MAX};
};

Census census(const void* data, giftDType_t dtype, uint64_t n) {
  Census c;
  double sum = 0;
  uint64_t count = 0;
  float chunk[4096];
  for (uint64_t i0 = 0; i0 < n; i0 += 4096) {
    const uint64_t m = std::min<uint64_t>(4096, n - i0);
    convert_elements(static_cast<const uint8_t*>(data) + i0 * dtype_size(dtype), dtype, chunk,
                     GIFT_DTYPE_F32, m);
    for (uint64_t k = 0; k < m; ++k) {
      const float v = chunk[k];
      if (std::isfinite(v)) {
        sum += double(v) * v;
        ++count;
        c.stats.amax = std::max(c.stats.amax, std::fabs(v));
      } else if (c.stats.nonfinite_count++ == 0) {
        c.stats.first_nonfinite = i0 + k;
      }
    }
  }
  c.rms = count ? float(std::sqrt(sum / double(count))) : 0.0f;
  return c;
}

}  // namespace

giftResult_t FrameWriter::add_metadata(std::string key, std::string value) {
  if (!valid_utf8_c_string(key) || !valid_utf8_c_string(value)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "metadata '%s': key and value must be UTF-8",
                ascii_escaped(key).c_str());
  }
  metadata_.emplace_back(std::move(key), std::move(value));
  return GIFT_OK;
}

giftResult_t FrameWriter::add_tensor(const std::string& name, const TensorShape& shape,
                                     giftDType_t dtype, const void* data,
                                     const giftQuantParams* params, const CoordsChoice* coords,
                                     int data_dtype_arg) {
  const giftDType_t data_dtype =
      data_dtype_arg < 0 ? dtype : static_cast<giftDType_t>(data_dtype_arg);
  if (name.empty()) return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor name is empty");
  if (!valid_utf8_c_string(name)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor name '%s' is not UTF-8 without NUL",
                ascii_escaped(name).c_str());
  }
  for (const Pending& t : tensors_) {
    if (t.name == name) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor '%s' added twice", name.c_str());
    }
  }
  if (!known_dtype(dtype)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor '%s': unknown dtype %d", name.c_str(),
                enum_int(dtype));
  }
  if (shape.elements && !data) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor '%s': data is NULL", name.c_str());
  }
  if (coords && coords->gift && (params == nullptr || data_dtype != GIFT_DTYPE_F32)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "tensor '%s': data in GIFT coordinates must be FP8-encoded fp32", name.c_str());
  }
  Pending t{name,  shape,
            dtype, params == nullptr,
            {},    {},
            0.0f,  {},
            {},    coords ? *coords : CoordsChoice{}};
  giftQuantParamsInit(&t.params);
  // The encoder reports FP8 tensors' statistics; lossless ones are counted here, so that a
  // NaN stored as it is still shows in the frame.
  const Census c = census(data, data_dtype, shape.elements);
  t.stats = c.stats;
  t.rms = c.rms;
  const uint64_t in_bytes = shape.elements * dtype_size(data_dtype);
  if (t.raw) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    t.codes = store_section(std::vector<uint8_t>(p, p + in_bytes), zstd_level_);
  } else {
    t.params = *params;
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
  }
  tensors_.push_back(std::move(t));
  return GIFT_OK;
}

namespace {

flatbuffers::Offset<fb::Section> section_ref(flatbuffers::FlatBufferBuilder& b,
                                             const StoredSection& s, uint64_t offset) {
  return fb::CreateSection(b, offset, s.bytes.size(), s.raw_length,
                           s.zstd ? fb::Compression::Zstd : fb::Compression::None, s.checksum);
}

}  // namespace

giftResult_t FrameWriter::finish(std::vector<uint8_t>* out) const {
  // The header holds the sections' offsets, which depend on the header's length. With every
  // scalar written (force_defaults) the length does not depend on the values, so a first
  // build with zero offsets measures it and a second writes the real ones.
  auto build = [&](uint64_t data_start, flatbuffers::FlatBufferBuilder& b) {
    b.ForceDefaults(true);
    uint64_t at = data_start;
    auto place = [&](const StoredSection& s) {
      const uint64_t off = at;
      at = align_up(at + s.bytes.size());
      return off;
    };
    std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
    for (const Pending& t : tensors_) {
      const auto name = b.CreateString(t.name);
      const auto shape = b.CreateVector(t.shape.dims);
      const auto codes = section_ref(b, t.codes, place(t.codes));
      flatbuffers::Offset<fb::Section> scales;
      if (!t.raw) scales = section_ref(b, t.scales, place(t.scales));
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
      tensors.push_back(tb.Finish());
    }
    std::vector<flatbuffers::Offset<fb::KeyValue>> kv;
    for (const auto& [k, v] : metadata_) {
      kv.push_back(fb::CreateKeyValue(b, b.CreateString(k), b.CreateString(v)));
    }
    const auto producer = b.CreateString("libgift " + std::to_string(GIFT_VERSION_MAJOR) + "." +
                                         std::to_string(GIFT_VERSION_MINOR) + "." +
                                         std::to_string(GIFT_VERSION_PATCH));
    flatbuffers::Offset<fb::Section> basis;
    if (has_embedded_) basis = section_ref(b, embedded_, place(embedded_));
    const fb::BasisId id(basis_lo_, basis_hi_);
    const auto frame =
        fb::CreateFrame(b, basis_kind_ ? fb::FrameKind::Basis : fb::FrameKind::Tensors, producer,
                        b.CreateVector(kv), b.CreateVector(tensors), basis,
                        basis_kind_ || has_embedded_ ? &id : nullptr);
    b.Finish(frame, fb::FrameIdentifier());
    return at;
  };

  flatbuffers::FlatBufferBuilder probe;
  build(0, probe);
  const uint64_t data_start = align_up(kPreambleBytes + probe.GetSize());
  flatbuffers::FlatBufferBuilder b;
  const uint64_t end = build(data_start, b);
  if (b.GetSize() != probe.GetSize() || b.GetSize() > kMaxHeaderBytes) {
    return fail(GIFT_ERROR_INTERNAL, "frame header of %u bytes could not be laid out",
                unsigned(b.GetSize()));
  }

  out->assign(end, 0);
  Preamble pre;
  pre.header_length = b.GetSize();
  pre.header_checksum = checksum64(b.GetBufferPointer(), b.GetSize());
  pre.frame_length = end;
  write_preamble(pre, out->data());
  std::memcpy(out->data() + kPreambleBytes, b.GetBufferPointer(), b.GetSize());
  // Sections in the order build() placed them; the last one's padding is not in the frame.
  std::vector<const StoredSection*> order;
  for (const Pending& t : tensors_) {
    order.push_back(&t.codes);
    if (!t.raw) order.push_back(&t.scales);
  }
  if (has_embedded_) order.push_back(&embedded_);
  uint64_t at = data_start, last_end = data_start;
  for (const StoredSection* sec : order) {
    if (!sec->bytes.empty()) std::memcpy(out->data() + at, sec->bytes.data(), sec->bytes.size());
    last_end = at + sec->bytes.size();
    at = align_up(last_end);
  }
  if (!order.empty()) {
    out->resize(last_end);
    store_le(out->data() + 24, out->size(), 8);
  }
  return GIFT_OK;
}

giftResult_t write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes) {
  return write_file_atomically(path, bytes.data(), bytes.size());
}

giftResult_t write_file_atomically(const std::string& path, const uint8_t* data, uint64_t size) {
  // A fresh name in the same folder (so the rename is atomic), created with the permissions
  // a plain create would give under the process umask.
  std::string tmp;
  int fd = -1;
  std::random_device rd;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".tmp.%08x", unsigned(rd()));
    tmp = path + suffix;
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    return fail(GIFT_ERROR_IO, "%s: cannot create a temporary file: %s", path.c_str(),
                std::strerror(errno));
  }
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return fail(GIFT_ERROR_IO, "%s: write failed: %s", path.c_str(), std::strerror(e));
    }
    done += uint64_t(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const int sync_errno = errno;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = !synced ? sync_errno : errno;
    ::unlink(tmp.c_str());
    return fail(GIFT_ERROR_IO, "%s: cannot finish writing: %s", path.c_str(), std::strerror(e));
  }
  return GIFT_OK;
}

}  // namespace gift::container
