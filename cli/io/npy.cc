#include "io/npy.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "failure.h"

namespace gift::io {
namespace {

constexpr uint64_t kMaxHeaderBytes = kNpyMostHeaderBytes - 12;
constexpr int kMaxDims = 32;

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

  // The dict, parsed strictly as NumPy writes it: '{', the keys 'descr', 'fortran_order' and
  // 'shape', each once, in any order, with their values, separated by commas (one after the
  // last allowed), '}', then spaces and the final newline. NumPy refuses other keys; Python
  // reads a key given twice as its last value, so a header that reads two ways is refused.
  size_t i = 0;
  const auto spaces = [&] {
    while (i < h.size() && h[i] == ' ') ++i;
  };
  const auto at = [&](char c) {  // the next character past spaces is c
    spaces();
    return i < h.size() && h[i] == c;
  };
  const auto take = [&](char c) { return at(c) && (++i, true); };
  const auto quoted = [&](const char* what) {
    spaces();
    const size_t end = i < h.size() && h[i] == '\'' ? h.find('\'', i + 1) : std::string::npos;
    if (end == std::string::npos) bad(name, what);
    const std::string text = h.substr(i + 1, end - i - 1);
    i = end + 1;
    return text;
  };
  std::string descr;
  bool fortran = false, seen[3] = {false, false, false}, zero = false, overflow = false;
  uint64_t count = 1;
  if (!take('{')) bad(name, "header is not a dict");
  while (!take('}')) {
    if (i == h.size() || h[i] == '\n') bad(name, "header dict not closed with '}'");
    const std::string key = quoted("unreadable key in the header");
    if (!take(':')) bad(name, "a key without ':' in the header");
    const int k = key == "descr" ? 0 : key == "fortran_order" ? 1 : key == "shape" ? 2 : -1;
    if (k < 0) corrupt(name + ": not a supported .npy file: unexpected key '" + key + "'");
    if (seen[k]) corrupt(name + ": not a supported .npy file: '" + key + "' given twice");
    seen[k] = true;
    spaces();
    if (k == 0) {
      descr = quoted("unreadable 'descr'");
    } else if (k == 1) {
      fortran = h.compare(i, 4, "True") == 0;
      if (!fortran && h.compare(i, 5, "False") != 0) bad(name, "'fortran_order' is not a bool");
      i += fortran ? 4 : 5;
    } else {
      if (!take('(')) bad(name, "'shape' is not a tuple");
      bool comma = false;  // after the last dimension: (N) is a number, (N,) a 1-tuple
      while (!take(')')) {
        if (at('-')) bad(name, "negative dimension in 'shape'");
        if (i >= h.size() || h[i] < '0' || h[i] > '9')
          bad(name, "non-integer dimension in 'shape'");
        uint64_t d = 0;
        for (; i < h.size() && h[i] >= '0' && h[i] <= '9'; ++i) {
          if (d > (UINT64_MAX - 9) / 10) bad(name, "dimension overflows 64 bits");
          d = d * 10 + uint64_t(h[i] - '0');
        }
        if (out->shape.size() == kMaxDims) bad(name, "more than 32 dimensions");
        zero = zero || d == 0;
        overflow = overflow || (d && count > UINT64_MAX / d);
        count = overflow ? 0 : count * d;
        out->shape.push_back(d);
        comma = take(',');
        if (!comma && !at(')')) bad(name, "unreadable 'shape'");
      }
      if (out->shape.size() == 1 && !comma)
        bad(name, "'shape' is a number in parentheses, not a tuple (one dimension is (N,))");
    }
    if (!take(',') && !at('}')) bad(name, "header dict not closed with '}'");
  }
  if (h.find_first_not_of(" \n", i) != std::string::npos) bad(name, "bytes after the header dict");
  if (!seen[0]) bad(name, "header has no 'descr'");
  if (!seen[1]) bad(name, "header has no 'fortran_order'");
  if (!seen[2]) bad(name, "header has no 'shape' tuple");
  if (descr == "<f4") {
    out->dtype = GIFT_DTYPE_F32;
  } else if (descr == "<f2") {
    out->dtype = GIFT_DTYPE_F16;
  } else {
    corrupt(name + ": unsupported .npy dtype '" + descr +
            "' (supported: '<f4' float32, '<f2' float16)");
  }
  if (fortran) corrupt(name + ": Fortran-ordered arrays are not supported");
  if (zero) count = 0;  // e.g. (2**32, 2**32, 0): no elements, whatever the others' product
  if (overflow && !zero) bad(name, "element count overflows 64 bits");
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
