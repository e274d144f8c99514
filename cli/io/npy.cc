#include "io/npy.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "failure.h"

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

[[noreturn]] void corrupt(const std::string& message) {
  throw giftc::Failure(giftc::kBadInput, message);
}

[[noreturn]] void bad(const std::string& name, const char* what) {
  corrupt(name + ": not a supported .npy file: " + what);
}

}  // namespace

uint64_t NpyArray::count() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

void parse_npy(const uint8_t* b, uint64_t size, const std::string& name, NpyArray* out) {
  uint64_t offset = 0;
  parse_npy_header(b, size, name, &out->shape, &out->dtype, &offset);
  out->data.assign(b + offset, b + size);
}

void parse_npy_header(const uint8_t* b, uint64_t size, const std::string& name,
                      std::vector<uint64_t>* shape_out, giftDType_t* dtype_out,
                      uint64_t* data_offset) {
  NpyArray header;
  NpyArray* out = &header;
  if (size < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0) bad(name, "no .npy magic");
  const int major = b[6];
  uint64_t header_len, offset;
  if (major == 1) {
    header_len = uint64_t(b[8]) | uint64_t(b[9]) << 8;
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) bad(name, "truncated preamble");
    header_len =
        uint64_t(b[8]) | uint64_t(b[9]) << 8 | uint64_t(b[10]) << 16 | uint64_t(b[11]) << 24;
    offset = 12;
  } else {
    corrupt(name + ": unsupported .npy format version " + std::to_string(major) + "." +
            std::to_string(b[7]));
  }
  if (header_len > kMaxHeaderBytes) bad(name, "header longer than 64 KiB");
  if (header_len > size - offset) bad(name, "truncated header");
  const std::string h(reinterpret_cast<const char*>(b + offset), header_len);
  offset += header_len;

  size_t p;
  if (!find_key(h, "descr", &p)) bad(name, "header has no 'descr'");
  const size_t descr_end = h.find('\'', p + 1);
  if (h[p] != '\'' || descr_end == std::string::npos) bad(name, "unreadable 'descr'");
  const std::string descr = h.substr(p + 1, descr_end - p - 1);
  if (descr == "<f4") {
    out->dtype = GIFT_DTYPE_F32;
  } else if (descr == "<f2") {
    out->dtype = GIFT_DTYPE_F16;
  } else {
    corrupt(name + ": unsupported .npy dtype '" + descr +
            "' (supported: '<f4' float32, '<f2' float16)");
  }
  if (!find_key(h, "fortran_order", &p)) bad(name, "header has no 'fortran_order'");
  if (h.compare(p, 5, "False") != 0) {
    corrupt(name + ": Fortran-ordered arrays are not supported");
  }
  if (!find_key(h, "shape", &p) || h[p] != '(') bad(name, "header has no 'shape' tuple");
  const size_t close = h.find(')', p);
  if (close == std::string::npos) bad(name, "unterminated 'shape'");
  out->shape.clear();
  uint64_t count = 1;
  for (size_t i = p + 1; i < close;) {
    if (h[i] == ' ' || h[i] == ',') {
      ++i;
      continue;
    }
    if (h[i] < '0' || h[i] > '9') bad(name, "non-integer dimension in 'shape'");
    uint64_t d = 0;
    for (; i < close && h[i] >= '0' && h[i] <= '9'; ++i) {
      if (d > (UINT64_MAX - 9) / 10) bad(name, "dimension overflows 64 bits");
      d = d * 10 + uint64_t(h[i] - '0');
    }
    if (out->shape.size() == kMaxDims) bad(name, "more than 32 dimensions");
    if (d && count > UINT64_MAX / d) bad(name, "element count overflows 64 bits");
    count *= d;
    out->shape.push_back(d);
  }
  const uint64_t width = giftDTypeSize(out->dtype);
  if (count > UINT64_MAX / width) bad(name, "byte count overflows 64 bits");
  const uint64_t bytes = count * width;
  if (bytes != size - offset) {
    corrupt(name + ": .npy data is " + std::to_string(size - offset) +
            " bytes, the header's shape needs " + std::to_string(bytes) +
            " (truncated or trailing data)");
  }
  *shape_out = out->shape;
  *dtype_out = out->dtype;
  *data_offset = offset;
}

void read_npy(const std::string& path, NpyArray* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw giftc::Failure(giftc::kIoError, path + ": cannot open: " + std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) throw giftc::Failure(giftc::kIoError, path + ": read error");
  parse_npy(bytes.data(), bytes.size(), path, out);
}

}  // namespace gift::io
