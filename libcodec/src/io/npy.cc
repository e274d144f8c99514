#include "io/npy.h"

#include <cinttypes>
#include <cstring>
#include <fstream>
#include <iterator>

#include "common/error.h"
#include "numerics/codec.h"

namespace gift::io {
namespace {

// A header is a Python dict literal padded to 64 bytes; NumPy writes a few hundred bytes.
// Anything this large is not a header NumPy wrote.
constexpr uint64_t kMaxHeaderBytes = 1 << 16;
constexpr int kMaxDims = 32;

// Finds `'key':` in the header dict and returns the position just after the colon.
bool find_key(const std::string& h, const char* key, size_t* pos) {
  const std::string k = std::string("'") + key + "'";
  size_t p = h.find(k);
  if (p == std::string::npos) return false;
  p = h.find_first_not_of(' ', p + k.size());
  if (p == std::string::npos || h[p] != ':') return false;
  *pos = h.find_first_not_of(' ', p + 1);
  return *pos != std::string::npos;
}

giftResult_t bad(const std::string& name, const char* what) {
  return fail(GIFT_ERROR_CORRUPT_INPUT, "%s: not a supported .npy file: %s", name.c_str(), what);
}

}  // namespace

uint64_t NpyArray::count() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

giftResult_t parse_npy(const uint8_t* b, uint64_t size, const std::string& name, NpyArray* out) {
  uint64_t offset = 0;
  if (const giftResult_t r = parse_npy_header(b, size, name, &out->shape, &out->dtype, &offset)) {
    return r;
  }
  out->data.assign(b + offset, b + size);
  return GIFT_OK;
}

giftResult_t parse_npy_header(const uint8_t* b, uint64_t size, const std::string& name,
                              std::vector<uint64_t>* shape_out, giftDType_t* dtype_out,
                              uint64_t* data_offset) {
  NpyArray header;
  NpyArray* out = &header;
  if (size < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0) return bad(name, "no .npy magic");
  const int major = b[6];
  uint64_t header_len, offset;
  if (major == 1) {
    header_len = uint64_t(b[8]) | uint64_t(b[9]) << 8;
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return bad(name, "truncated preamble");
    header_len =
        uint64_t(b[8]) | uint64_t(b[9]) << 8 | uint64_t(b[10]) << 16 | uint64_t(b[11]) << 24;
    offset = 12;
  } else {
    return fail(GIFT_ERROR_CORRUPT_INPUT, "%s: unsupported .npy format version %d.%d", name.c_str(),
                major, int(b[7]));
  }
  if (header_len > kMaxHeaderBytes) return bad(name, "header longer than 64 KiB");
  if (header_len > size - offset) return bad(name, "truncated header");
  const std::string h(reinterpret_cast<const char*>(b + offset), header_len);
  offset += header_len;

  size_t p;
  if (!find_key(h, "descr", &p)) return bad(name, "header has no 'descr'");
  const size_t descr_end = h.find('\'', p + 1);
  if (h[p] != '\'' || descr_end == std::string::npos) return bad(name, "unreadable 'descr'");
  const std::string descr = h.substr(p + 1, descr_end - p - 1);
  if (descr == "<f4") {
    out->dtype = GIFT_DTYPE_F32;
  } else if (descr == "<f2") {
    out->dtype = GIFT_DTYPE_F16;
  } else {
    return fail(GIFT_ERROR_CORRUPT_INPUT,
                "%s: unsupported .npy dtype '%s' (supported: '<f4' float32, '<f2' float16)",
                name.c_str(), descr.c_str());
  }
  if (!find_key(h, "fortran_order", &p)) return bad(name, "header has no 'fortran_order'");
  if (h.compare(p, 5, "False") != 0) {
    return fail(GIFT_ERROR_CORRUPT_INPUT, "%s: Fortran-ordered arrays are not supported",
                name.c_str());
  }
  if (!find_key(h, "shape", &p) || h[p] != '(') return bad(name, "header has no 'shape' tuple");
  const size_t close = h.find(')', p);
  if (close == std::string::npos) return bad(name, "unterminated 'shape'");
  out->shape.clear();
  uint64_t count = 1;
  for (size_t i = p + 1; i < close;) {
    if (h[i] == ' ' || h[i] == ',') {
      ++i;
      continue;
    }
    if (h[i] < '0' || h[i] > '9') return bad(name, "non-integer dimension in 'shape'");
    uint64_t d = 0;
    for (; i < close && h[i] >= '0' && h[i] <= '9'; ++i) {
      if (d > (UINT64_MAX - 9) / 10) return bad(name, "dimension overflows 64 bits");
      d = d * 10 + uint64_t(h[i] - '0');
    }
    if (out->shape.size() == kMaxDims) return bad(name, "more than 32 dimensions");
    if (d && count > UINT64_MAX / d) return bad(name, "element count overflows 64 bits");
    count *= d;
    out->shape.push_back(d);
  }
  const uint64_t width = dtype_size(out->dtype);
  if (count > UINT64_MAX / width) return bad(name, "byte count overflows 64 bits");
  const uint64_t bytes = count * width;
  if (bytes != size - offset) {
    return fail(GIFT_ERROR_CORRUPT_INPUT,
                "%s: .npy data is %" PRIu64 " bytes, the header's shape needs %" PRIu64
                " (truncated or trailing data)",
                name.c_str(), size - offset, bytes);
  }
  *shape_out = out->shape;
  *dtype_out = out->dtype;
  *data_offset = offset;
  return GIFT_OK;
}

giftResult_t read_npy(const std::string& path, NpyArray* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return fail(GIFT_ERROR_IO, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) return fail(GIFT_ERROR_IO, "%s: read error", path.c_str());
  return parse_npy(bytes.data(), bytes.size(), path, out);
}

}  // namespace gift::io
