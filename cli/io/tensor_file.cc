#include "io/tensor_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include <utility>

#include "failure.h"
#include "io/npy.h"

namespace gift::io {

size_t utf8_sequence_length(const std::string& s, size_t i) {
  const uint8_t c = uint8_t(s[i]);
  const size_t len = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
  if (len == 0 || i + len > s.size()) return 0;
  uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
  for (size_t k = 1; k < len; ++k) {
    const uint8_t d = uint8_t(s[i + k]);
    if ((d >> 6) != 0x2) return 0;
    cp = (cp << 6) | (d & 0x3Fu);
  }
  const uint32_t shortest[5] = {0, 0, 0x80, 0x800, 0x10000};
  return cp < shortest[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) ? 0 : len;
}

std::string ascii_escaped(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const unsigned c = uint8_t(ch);
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += c >= 0x20 && c < 0x7F && c != '\\' ? std::string(1, ch) : std::string(hex);
  }
  return out;
}

namespace {

// The safetensors format's own limit on its JSON header.
constexpr uint64_t kMaxSafetensorsHeader = uint64_t(100) << 20;

// JSON nesting: far more than a header needs, far less than would strain the stack.
constexpr int kMaxSafetensorsDepth = 64;

constexpr const char* kUnknownKind =
    "unknown file type (expected .safetensors, .npy or .npz, by its name or its first bytes)";

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  throw giftc::Failure(giftc::kBadInput, file + ": " + what);
}

[[noreturn]] void io_error(const std::string& file, const std::string& what) {
  throw giftc::Failure(giftc::kIoError, file + ": " + what);
}

// The formats are little-endian; loads byte by byte need neither alignment nor a host order.
uint64_t load_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

std::string not_regular(const struct stat& st) {
  const bool stream = S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode) || S_ISSOCK(st.st_mode);
  return stream ? "not a regular file but a pipe or device (giftc reads one as standard input: "
                  "give - and redirect it)"
                : "not a regular file";
}

namespace {

// Maps `fd` read-only and keeps the mapping alive in *storage: tensors point into it, so a
// large dump is never copied. Closes fd.
void map_fd(int fd, const std::string& name, std::vector<std::shared_ptr<void>>* storage,
            const uint8_t** data, uint64_t* size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    io_error(name, not_regular(st));
  }
  *data = nullptr;
  *size = uint64_t(st.st_size);
  if (*size == 0) {
    ::close(fd);
    return;
  }
  void* p = ::mmap(nullptr, size_t(*size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) io_error(name, std::string("cannot map: ") + std::strerror(e));
  const size_t length = size_t(*size);
  storage->push_back(std::shared_ptr<void>(p, [length](void* q) { ::munmap(q, length); }));
  *data = static_cast<const uint8_t*>(p);
}

void map_into(const std::string& path, TensorFile* out, const uint8_t** data, uint64_t* size) {
  // Opened without waiting (a FIFO's open waits for a writer), then refused by map_fd if not
  // a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) io_error(path, std::string("cannot open: ") + std::strerror(errno));
  map_fd(fd, path, &out->storage, data, size);
}

}  // namespace

std::string temp_dir() {
  const char* env = std::getenv("TMPDIR");
  return env && *env ? env : "/tmp";
}

namespace {

// An unnamed file in temp_dir(), gone with its last descriptor; `name` is what it holds.
int scratch_file(const std::string& name) {
  const std::string dir = temp_dir();
  int tmp = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (tmp < 0) {
    std::string path = dir + "/giftc-scratch-XXXXXX";
    tmp = ::mkostemp(path.data(), O_CLOEXEC);
    if (tmp >= 0) ::unlink(path.c_str());
  }
  if (tmp < 0)
    io_error(name, "cannot create a scratch file in " + dir + ": " + std::strerror(errno));
  return tmp;
}

// n bytes at p appended to the scratch file tmp.
void append_scratch(int tmp, const uint8_t* p, uint64_t n, const std::string& name) {
  for (uint64_t done = 0; done < n;) {
    const ssize_t w = ::write(tmp, p + done, size_t(std::min<uint64_t>(n - done, 1u << 30)));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = w < 0 ? errno : ENOSPC;
      io_error(name, "cannot keep it in " + temp_dir() + ": " + std::strerror(e));
    }
    done += uint64_t(w);
  }
}

// A scratch file holding everything `fd` gives until its end, so that a stream is read as
// a file: mapped, in bounded memory.
int spill(int fd, const std::string& name) {
  const int tmp = scratch_file(name);
  try {
    std::vector<uint8_t> buf(uint64_t(1) << 20);
    for (;;) {
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        io_error(name, std::string("read failed: ") + std::strerror(e));
      }
      if (n == 0) break;
      append_scratch(tmp, buf.data(), uint64_t(n), name);
    }
  } catch (...) {
    ::close(tmp);
    throw;
  }
  return tmp;
}

// Names reach frames, output files and JSON reports as C strings, so they must be UTF-8
// without NUL.
bool utf8_without_nul(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0 || s[i] == '\0') return false;
    i += len;
  }
  return true;
}

// A .npy file's tensor is named for the file: its stem, escaped where it is not a valid name
// (a file name need not be UTF-8; w\xe9.npy's tensor was refused as "not UTF-8").
std::string stem_of(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  const size_t dot = base.find_last_of('.');
  const std::string stem = dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
  return utf8_without_nul(stem) ? stem : ascii_escaped(stem);
}

void add_npy(const uint8_t* b, uint64_t size, const std::string& where,
             const std::string& tensor_name, TensorFile* out) {
  TensorRef t{tensor_name, {}, GIFT_DTYPE_F32, nullptr, 0, 0, {}, {}, {}};
  uint64_t offset = 0;
  parse_npy_header(b, size, where, &t.shape, &t.dtype, &offset);
  t.mapped = b + offset;
  t.bytes = size - offset;
  out->tensors.push_back(std::move(t));
}

// A name as messages show it: as it is where valid, else escaped (a NUL would end the message).
std::string shown(const std::string& name) {
  return utf8_without_nul(name) ? name : ascii_escaped(name);
}

// Inflates a deflated member of `usize` raw bytes, handing them to put in order, in pieces
// of at most 1 MiB, and stops once it has handed `upto` (> 0) of them; false on bad deflate
// data or another size.
bool inflate_member(const uint8_t* deflated, uint64_t csize, uint64_t usize, const FetchPut& put,
                    uint64_t upto = UINT64_MAX) {
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK)
    throw giftc::Failure(giftc::kIoError, "zlib init failed");
  std::unique_ptr<z_stream, int (*)(z_stream*)> end(&z, inflateEnd);
  z.next_in = const_cast<Bytef*>(deflated);
  z.avail_in = uInt(csize);
  std::vector<uint8_t> buf(std::min<uint64_t>(upto, uint64_t(1) << 20));
  for (;;) {
    z.next_out = buf.data();
    z.avail_out = uInt(buf.size());
    const int rc = inflate(&z, Z_NO_FLUSH);
    const uint64_t n = buf.size() - z.avail_out;
    if (z.total_out > usize) return false;
    if (n) put(buf.data(), n);
    if (rc == Z_STREAM_END) return z.total_out == usize;
    if (rc != Z_OK) return false;  // Z_BUF_ERROR: the data ends before the stream does
    if (z.total_out >= upto) return true;
  }
}

// One member of a ZIP archive as its central directory and local header describe it.
struct ZipMember {
  std::string name, shown;  // shown: as messages show it
  uint64_t method, csize, usize, local, data;
  uint32_t crc;
};

// The central directory of a ZIP archive, every member checked to lie in the file and no
// two sharing bytes: entries pointing at one deflated member would otherwise inflate it
// again and again (a zip bomb made of a small archive).
void zip_members(const uint8_t* b, uint64_t size, const std::string& path,
                 std::vector<ZipMember>* out) {
  // End of central directory: the last 22..65557 bytes.
  const uint64_t min_eocd = 22;
  if (size < min_eocd) bad(path, "not a ZIP archive (too short)");
  uint64_t eocd = UINT64_MAX;
  for (uint64_t i = size - min_eocd + 1; i-- > 0 && size - i <= min_eocd + 65535;) {
    if (load_le(b + i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd == UINT64_MAX) bad(path, "not a ZIP archive (no end of central directory)");
  const uint64_t entries = load_le(b + eocd + 10, 2);
  const uint64_t cd_size = load_le(b + eocd + 12, 4);
  const uint64_t cd_off = load_le(b + eocd + 16, 4);
  if (cd_off == 0xFFFFFFFF || entries == 0xFFFF) bad(path, "ZIP64 archives are not supported");
  if (cd_off > eocd || cd_size > eocd - cd_off) bad(path, "central directory out of bounds");
  uint64_t p = cd_off;
  for (uint64_t e = 0; e < entries; ++e) {
    if (p + 46 > cd_off + cd_size || load_le(b + p, 4) != 0x02014b50) {
      bad(path, "damaged central directory");
    }
    ZipMember m;
    m.method = load_le(b + p + 10, 2);
    m.crc = uint32_t(load_le(b + p + 16, 4));
    m.csize = load_le(b + p + 20, 4);
    m.usize = load_le(b + p + 24, 4);
    const uint64_t nlen = load_le(b + p + 28, 2);
    const uint64_t xlen = load_le(b + p + 30, 2);
    const uint64_t clen = load_le(b + p + 32, 2);
    m.local = load_le(b + p + 42, 4);
    if (p + 46 + nlen > cd_off + cd_size) bad(path, "damaged central directory");
    m.name.assign(reinterpret_cast<const char*>(b + p + 46), nlen);
    m.shown = shown(m.name);
    p += 46 + nlen + xlen + clen;
    if (m.local + 30 > size || load_le(b + m.local, 4) != 0x04034b50) {
      bad(path, "member '" + m.shown + "': bad local header");
    }
    m.data = m.local + 30 + load_le(b + m.local + 26, 2) + load_le(b + m.local + 28, 2);
    if (m.data > size || m.csize > size - m.data)
      bad(path, "member '" + m.shown + "' out of bounds");
    out->push_back(std::move(m));
  }
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  for (const ZipMember& m : *out) extents.emplace_back(m.local, m.data + m.csize);
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].first < extents[i - 1].second)
      bad(path, "ZIP members overlap (a damaged or hostile archive)");
  }
}

// The archive's CRC-32 of a member's bytes, checked as numpy does ("Bad CRC-32").
uLong add_crc(uLong crc, const uint8_t* data, uint64_t n) {
  for (uint64_t at = 0; at < n; at += 1u << 30)
    crc = crc32(crc, data + at, uInt(std::min<uint64_t>(n - at, 1u << 30)));
  return crc;
}

void check_crc(uLong crc, const ZipMember& m, const std::string& path) {
  if (uint32_t(crc) != m.crc) bad(path, "member '" + m.shown + "': bad CRC-32 (damaged data)");
}

// .npz: a ZIP archive of .npy members, stored or deflated (numpy.savez and savez_compressed).
void parse_npz(const uint8_t* b, uint64_t size, const std::string& path, TensorFile* out) {
  std::vector<ZipMember> members;
  zip_members(b, size, path, &members);
  for (const ZipMember& m : members) {
    // numpy.load names a member without the .npy suffix by its whole name.
    const std::string where = path + ":" + m.shown;
    const std::string tensor =
        ends_with(m.name, ".npy") ? m.name.substr(0, m.name.size() - 4) : m.name;
    if (m.method == 0) {
      if (m.csize != m.usize) bad(path, "member '" + m.shown + "': stored sizes differ");
      check_crc(add_crc(crc32(0L, Z_NULL, 0), b + m.data, m.csize), m, path);
      add_npy(b + m.data, m.csize, where, tensor, out);
    } else if (m.method == 8) {
      // usize comes from the archive, so a hostile archive could claim up to 4 GiB; deflate
      // cannot expand more than about 1032:1, so cap it by that.
      if (m.usize / 1032 > m.csize + 1) bad(path, "member '" + m.shown + "': impossible size");
      // Only its .npy header is inflated here (a member no larger than that whole, and
      // checked). A larger one is inflated whole when the tensor is asked for
      // (TensorRef::data), one at a time, and its deflate data and CRC-32 are checked then,
      // before data() returns, or by check_unread: inflating it here too, to check it first,
      // took as long as the rest of an encode (a 64 MiB savez_compressed archive, 0.85 s to
      // about 0.45 s).
      const auto bad_deflate = [path, shown = m.shown] {
        bad(path, "member '" + shown + "': bad deflate data");
      };
      std::vector<uint8_t> head;
      const uint64_t head_bytes = std::min<uint64_t>(m.usize, kNpyMostHeaderBytes);
      if (m.usize > 0 &&
          !inflate_member(
              b + m.data, m.csize, m.usize,
              [&](const uint8_t* p, uint64_t n) { head.insert(head.end(), p, p + n); }, head_bytes))
        bad_deflate();
      auto checked = std::make_shared<bool>(head_bytes == m.usize);
      if (*checked) check_crc(add_crc(crc32(0L, Z_NULL, 0), head.data(), head.size()), m, path);
      TensorRef t{tensor, {}, GIFT_DTYPE_F32, nullptr, 0, 0, {}, {}, checked};
      uint64_t offset = 0;
      parse_npy_header(head.data(), m.usize, where, &t.shape, &t.dtype, &offset);
      t.bytes = m.usize - offset;
      t.fetch = [deflated = b + m.data, m, offset, path, bad_deflate,
                 checked](const FetchPut& put) {
        uLong crc = crc32(0L, Z_NULL, 0);
        uint64_t seen = 0;  // raw bytes so far, the header's dropped
        const bool ok =
            inflate_member(deflated, m.csize, m.usize, [&](const uint8_t* p, uint64_t n) {
              crc = add_crc(crc, p, n);
              const uint64_t drop = std::min(n, offset - std::min(seen, offset));
              seen += n;
              if (n > drop) put(p + drop, n - drop);
            });
        if (!ok) bad_deflate();
        check_crc(crc, m, path);
        *checked = true;
      };
      out->tensors.push_back(std::move(t));
    } else {
      bad(path, "member '" + m.shown + "': unsupported ZIP compression method " +
                    std::to_string(m.method));
    }
  }
}

// Names become frame tensor names and keys of output files: non-empty, valid as above, each
// once.
void check_names(const TensorFile& f, const std::string& path) {
  std::vector<const std::string*> names;
  for (const TensorRef& t : f.tensors) {
    if (t.name.empty()) bad(path, "a tensor has an empty name");
    if (!utf8_without_nul(t.name)) {
      bad(path, "tensor name '" + ascii_escaped(t.name) + "' is not UTF-8 without NUL");
    }
    names.push_back(&t.name);
  }
  std::sort(names.begin(), names.end(), [](auto* a, auto* c) { return *a < *c; });
  for (size_t i = 1; i < names.size(); ++i) {
    if (*names[i] == *names[i - 1]) bad(path, "tensor '" + *names[i] + "' appears twice");
  }
  for (const auto& [k, v] : f.metadata) {
    if (!utf8_without_nul(k) || !utf8_without_nul(v))
      bad(path, "metadata '" + ascii_escaped(k) + "' is not UTF-8 without NUL");
  }
}

giftDType_t* dtype_of_name(const std::string& s, giftDType_t* d) {
  if (s == "F32")
    *d = GIFT_DTYPE_F32;
  else if (s == "BF16")
    *d = GIFT_DTYPE_BF16;
  else if (s == "F16")
    *d = GIFT_DTYPE_F16;
  else
    return nullptr;
  return d;
}

const char* dtype_name(giftDType_t d) {
  return d == GIFT_DTYPE_F32 ? "F32" : d == GIFT_DTYPE_BF16 ? "BF16" : "F16";
}

}  // namespace

namespace {

uint64_t product(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

}  // namespace

uint64_t TensorRef::elements() const { return product(shape); }

FetchedTensor::~FetchedTensor() {
  mapping.reset();
  if (scratch >= 0) ::close(scratch);
}

const uint8_t* TensorRef::data() const {
  // An empty tensor's address is a word of its own: aligned, and not null.
  static const uint64_t kEmpty = 0;
  if (mapped) return mapped;
  if (!fetch || bytes == 0) return reinterpret_cast<const uint8_t*>(&kEmpty);
  FetchedTensor& f = *fetched;
  if (f.tensor == index) return f.at;
  f.tensor = SIZE_MAX;
  f.mapping.reset();  // the last one goes first: one tensor at a time
  const std::string what = f.file + ": tensor '" + name + "'";
  uint64_t done = 0;  // bytes handed over; more than `bytes` only where the input changed
  const auto fits = [&](uint64_t n) { return done < bytes ? std::min(n, bytes - done) : 0; };
  if (bytes <= FetchedTensor::kHeldBytes) {
    const uint64_t words = (bytes + 7) / 8;
    if (f.capacity < words) {
      f.words.reset();
      f.words.reset(new uint64_t[words]);
      f.capacity = words;
    }
    uint8_t* dst = reinterpret_cast<uint8_t*>(f.words.get());
    fetch([&](const uint8_t* p, uint64_t n) {
      std::memcpy(dst + done, p, fits(n));
      done += n;
    });
    f.at = dst;
  } else {
    if (f.scratch < 0) f.scratch = scratch_file(what);
    if (::ftruncate(f.scratch, 0) != 0 || ::lseek(f.scratch, 0, SEEK_SET) != 0) {
      const int e = errno;
      io_error(what, std::string("cannot reuse its scratch file: ") + std::strerror(e));
    }
    fetch([&](const uint8_t* p, uint64_t n) {
      append_scratch(f.scratch, p, fits(n), what);
      done += n;
    });
    if (done == bytes) {
      void* m = ::mmap(nullptr, size_t(bytes), PROT_READ, MAP_SHARED, f.scratch, 0);
      const int e = errno;
      if (m == MAP_FAILED) io_error(what, std::string("cannot map: ") + std::strerror(e));
      const size_t length = size_t(bytes);
      f.mapping = std::shared_ptr<void>(m, [length](void* q) { ::munmap(q, length); });
      f.at = static_cast<const uint8_t*>(m);
    }
  }
  if (done != bytes) io_error(what, "its bytes changed while read");
  f.tensor = index;
  return f.at;
}
uint64_t TensorHeader::elements() const { return product(shape); }

namespace {

// Bytes released at once, at least: a thread's start and end cost about what unmapping 1 MiB
// does.
constexpr uint64_t kLeastReleasedBytes = uint64_t(8) << 20;
// Tensors at most this far apart in memory are one span: a safetensors file's follow one
// another (an .npz's stored members, headers apart, are released each on its own).
constexpr uintptr_t kMostGap = 64;
// The releasing thread's stack: a default 8 MiB one counts against RLIMIT_DATA, which bounds
// giftc's memory (the man page's ulimit -d), and the thread only makes one system call. It
// holds the libraries' thread-local storage too (OpenBLAS's alone is 60 KiB: 64 KiB stacks
// were refused), as the library's own background thread's does.
constexpr size_t kReleaseStackBytes = size_t(256) << 10;

}  // namespace

PagesReleaser::~PagesReleaser() { wait(); }

void PagesReleaser::wait() {
  if (running_) pthread_join(thread_, nullptr);
  running_ = false;
  range_.storage.clear();
}

void PagesReleaser::release(const TensorFile& f, size_t i) {
  const TensorRef& t = f.tensors[i];
  if (!t.mapped) return;
  const uintptr_t at = reinterpret_cast<uintptr_t>(t.mapped);
  if (at < span_end_ || at - span_end_ > kMostGap) span_begin_ = at;
  span_end_ = at + t.bytes;
  if (span_end_ - span_begin_ < kLeastReleasedBytes) return;
  wait();
  // The pages wholly inside the span: those at its ends may hold other bytes still to be read.
  // The mappings are held until the release has ended: once unmapped, the addresses could
  // be another mapping's.
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  range_ = {(span_begin_ + page - 1) & ~(page - 1), span_end_ & ~(page - 1), f.storage};
  span_begin_ = span_end_;
  const auto run = [](void* r) -> void* {
    const Range& range = *static_cast<const Range*>(r);
    (void)::madvise(reinterpret_cast<void*>(range.begin), range.end - range.begin, MADV_DONTNEED);
    return nullptr;
  };
  // Every signal blocked, so that giftc's handlers run on its main thread only.
  sigset_t all, before;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &before);
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) == 0) {
    running_ = pthread_attr_setstacksize(&attr, kReleaseStackBytes) == 0 &&
               pthread_create(&thread_, &attr, run, &range_) == 0;
    pthread_attr_destroy(&attr);
    if (running_) pthread_setname_np(thread_, "gift-release");  // told from the codec's
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  // Without a thread the pages are unmapped at the end, as before.
  if (!running_) range_.storage.clear();
}

std::vector<float> widen_to_float(const TensorRef& t) {
  std::vector<float> out(t.elements());
  if (giftConvert(t.data(), t.dtype, out.data(), GIFT_DTYPE_F32, out.size()) != GIFT_OK)
    throw giftc::Failure(giftc::kBadInput, "tensor '" + t.name + "': " + giftGetLastErrorMessage());
  return out;
}

FileKind kind_of_path(const std::string& path) {
  if (ends_with(path, ".safetensors")) return FileKind::kSafetensors;
  if (ends_with(path, ".npy")) return FileKind::kNpy;
  if (ends_with(path, ".npz")) return FileKind::kNpz;
  return FileKind::kUnknown;
}

// What a safetensors header must pass before it is parsed into values, in a pass that keeps
// none: no name given twice (a parse would silently keep its last entry), and no nesting past
// kMaxSafetensorsDepth (a header nests three levels: header, tensor, shape; parsing is
// iterative, but printing a value into a message recurses once per level). A parser callback
// did both before, but nlohmann's callback parser scans an object's members at the end of
// each object inside it: quadratic in the tensors (40,000 took 36 s to encode).
struct HeaderCheck : nlohmann::json_sax<nlohmann::json> {
  int depth = 0;  // containers open
  bool too_deep = false;
  std::unordered_set<std::string> seen;  // the top level's keys
  std::string duplicate;                 // the first given twice

  bool open() {
    too_deep = depth >= kMaxSafetensorsDepth;
    ++depth;
    return !too_deep;
  }
  bool start_object(std::size_t) override { return open(); }
  bool start_array(std::size_t) override { return open(); }
  bool end_object() override { return --depth, true; }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override {
    if (depth == 1 && !seen.insert(k).second && duplicate.empty()) duplicate = k;
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;  // the parse of the values says why
  }
};

void parse_safetensors(const uint8_t* b, uint64_t size, const std::string& name, TensorFile* out) {
  if (size < 8) bad(name, "not a safetensors file (shorter than its 8-byte header length)");
  const uint64_t hlen = load_le(b, 8);
  if (hlen > kMaxSafetensorsHeader) bad(name, "safetensors header longer than 100 MiB");
  if (hlen > size - 8) bad(name, "truncated safetensors header");
  HeaderCheck check;
  const bool checked = nlohmann::json::sax_parse(b + 8, b + 8 + hlen, &check);
  if (check.too_deep) {
    bad(name, "safetensors header nests JSON deeper than " + std::to_string(kMaxSafetensorsDepth) +
                  " levels");
  }
  if (!check.duplicate.empty())
    bad(name, "the header names '" + ascii_escaped(check.duplicate) + "' twice");
  const nlohmann::json h = checked ? nlohmann::json::parse(b + 8, b + 8 + hlen, nullptr, false)
                                   : nlohmann::json(nlohmann::json::value_t::discarded);
  if (h.is_discarded()) {
    // Parsed again, for the reason.
    try {
      const nlohmann::json again = nlohmann::json::parse(b + 8, b + 8 + hlen);
      (void)again;
    } catch (const nlohmann::json::parse_error& e) {
      const bool utf8 = std::strstr(e.what(), "UTF-8") != nullptr;
      bad(name, std::string("safetensors header is not ") + (utf8 ? "UTF-8" : "valid JSON") +
                    " (at byte " + std::to_string(e.byte) + " of the header)");
    } catch (const nlohmann::json::exception&) {  // a number past double's range, say
      bad(name, "safetensors header is not valid JSON (a number out of range)");
    }
  }
  if (h.is_discarded() || !h.is_object()) bad(name, "safetensors header is not a JSON object");
  const uint8_t* base = b + 8 + hlen;
  const uint64_t data_size = size - 8 - hlen;
  struct Extent {
    uint64_t begin, end;
  };
  // Sized once: 200,000 tensors' records grown by doubling held 1.5 times them.
  std::vector<Extent> extents;
  extents.reserve(h.size());
  out->tensors.reserve(h.size());
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) bad(name, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) bad(name, "__metadata__ value of '" + m.key() + "' is not a string");
        out->metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const std::string tn = "tensor '" + shown(it.key()) + "': ";
    const nlohmann::json& t = *it;
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") ||
        !t.contains("data_offsets")) {
      bad(name, tn + "needs dtype, shape and data_offsets");
    }
    TensorRef ref{it.key(), {}, GIFT_DTYPE_F32, nullptr, 0, 0, {}, {}, {}};
    if (!t["dtype"].is_string() || !dtype_of_name(t["dtype"].get<std::string>(), &ref.dtype)) {
      bad(name, tn + "unsupported dtype " + t["dtype"].dump() + " (supported: F32, BF16, F16)");
    }
    const nlohmann::json& shape = t["shape"];
    const nlohmann::json& offs = t["data_offsets"];
    if (!shape.is_array() || shape.size() > 32 || !offs.is_array() || offs.size() != 2) {
      bad(name, tn + "malformed shape or data_offsets");
    }
    uint64_t n = 1;
    for (const auto& d : shape) {
      if (d.is_number_integer() && !d.is_number_unsigned())
        bad(name, tn + "shape holds a negative dimension");
      if (!d.is_number_unsigned()) bad(name, tn + "shape holds a non-integer");
      const uint64_t v = d.get<uint64_t>();
      if (v && n > UINT64_MAX / 8 / v) bad(name, tn + "element count overflows");
      n *= v;
      ref.shape.push_back(v);
    }
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      bad(name, tn + "data_offsets must be two non-negative integers");
    }
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    if (begin > end || end > data_size) bad(name, tn + "data_offsets out of bounds");
    if (end - begin != n * giftDTypeSize(ref.dtype)) {
      bad(name, tn + "data_offsets hold " + std::to_string(end - begin) +
                    " bytes, shape and dtype need " + std::to_string(n * giftDTypeSize(ref.dtype)));
    }
    ref.mapped = base + begin;
    ref.bytes = end - begin;
    extents.push_back({begin, end});
    out->tensors.push_back(std::move(ref));
  }
  // The data must be covered exactly: no overlap and no hole (the format's rule).
  std::vector<size_t> order(out->tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Empty tensors take no bytes and may sit at any offset (the safetensors library puts them
  // where it likes): they are ordered first among equals and do not take part.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t c) {
    return std::make_pair(extents[a].begin, extents[a].end) <
           std::make_pair(extents[c].begin, extents[c].end);
  });
  uint64_t at = 0;
  for (size_t i : order) {
    if (extents[i].begin == extents[i].end) continue;
    if (extents[i].begin != at)
      bad(name, "tensor data overlaps or leaves a hole at byte " + std::to_string(at));
    at = extents[i].end;
  }
  if (at != data_size) bad(name, "tensor data does not end at the end of the file");
  // File order: by offset, as writers lay tensors out.
  std::vector<TensorRef> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back(std::move(out->tensors[i]));
  out->tensors = std::move(sorted);
}

// libgift reads elements of their own size at aligned addresses; a tensor that lies at an
// odd offset of its file (an .npz member, a hand-made safetensors file) is copied aside
// when it is asked for, into the file's one place for such tensors (FetchedTensor).
void align_data(TensorFile* f, const std::string& name) {
  const auto fetched = std::make_shared<FetchedTensor>();
  fetched->file = name;
  for (size_t i = 0; i < f->tensors.size(); ++i) {
    TensorRef& t = f->tensors[i];
    t.index = i;
    t.fetched = fetched;
    const uint64_t width = giftDTypeSize(t.dtype);
    if (!t.mapped || reinterpret_cast<uintptr_t>(t.mapped) % width == 0) continue;
    const uint8_t* src = t.mapped;
    const uint64_t n = t.bytes;
    t.mapped = nullptr;
    t.fetch = [src, n](const FetchPut& put) { put(src, n); };
  }
  // A scratch directory that cannot be used fails now, not after the tensors before.
  for (const TensorRef& t : f->tensors) {
    if (t.fetch && t.bytes > FetchedTensor::kHeldBytes) {
      fetched->scratch = scratch_file(name + ": tensor '" + t.name + "'");
      break;
    }
  }
}

MappedBytes map_stdin() {
  // As gzip and zstd do: a terminal would only wait for a file typed by hand.
  if (::isatty(STDIN_FILENO)) {
    throw giftc::Failure(giftc::kUsage,
                         "standard input is a terminal: name a file, or redirect one (< FILE)");
  }
  MappedBytes m;
  std::vector<std::shared_ptr<void>> storage;
  map_fd(spill(STDIN_FILENO, kStdinName), kStdinName, &storage, &m.data, &m.size);
  if (!storage.empty()) m.storage = storage.front();
  return m;
}

FileKind sniff_kind(const uint8_t* b, uint64_t size) {
  if (size >= 6 && std::memcmp(b, "\x93NUMPY", 6) == 0) return FileKind::kNpy;
  if (size >= 4 && std::memcmp(b, "PK\x03\x04", 4) == 0) return FileKind::kNpz;
  return FileKind::kSafetensors;
}

void check_unread(const TensorFile& f) {
  for (const TensorRef& t : f.tensors)
    if (t.checked && !*t.checked) t.fetch([](const uint8_t*, uint64_t) {});
}

void read_tensor_file(const std::string& path, TensorFile* out) {
  const bool from_stdin = path == "-";
  FileKind kind = kind_of_path(path);
  const uint8_t* b = nullptr;
  uint64_t size = 0;
  if (from_stdin) {
    MappedBytes m = map_stdin();
    b = m.data;
    size = m.size;
    if (m.storage) out->storage.push_back(m.storage);
    kind = sniff_kind(b, size);
  } else {
    map_into(path, out, &b, &size);  // one that cannot be opened says so first
    // A name without a known extension: the kind its first bytes say, as for standard input
    // (a safetensors file's JSON header starts after its 8-byte length).
    const FileKind held = sniff_kind(b, size);
    if (kind == FileKind::kUnknown) {
      kind = held != FileKind::kSafetensors || (size > 8 && b[8] == '{') ? held : kind;
    } else if (held != kind && held != FileKind::kSafetensors) {
      // A file whose first bytes are another kind's: said so, where its parse by the name's
      // kind failed on something else (a .npy named .safetensors: "header longer than 100
      // MiB").
      bad(path, std::string("holds ") + (held == FileKind::kNpy ? "a .npy file" : "a ZIP archive") +
                    " (its first bytes), not what its name's extension says");
    }
  }
  parse_tensor_file(kind, b, size, input_name(path), from_stdin ? "tensor" : stem_of(path), out);
}

bool is_frame(const uint8_t* b, uint64_t size) {
  if (!b) return false;
  giftFrame* frame = nullptr;
  const giftResult_t r = giftFrameOpen(b, size, &frame);
  giftFrameClose(frame);
  return r != GIFT_ERROR_FRAME_MAGIC;
}

bool file_lacks_frame_magic(const std::string& path) {
  // Not a pipe's first bytes, which reading would take from it (or wait for a writer): it is
  // refused as an input where it is opened.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return false;
  }
  uint8_t head[32];
  ssize_t n;
  do {
    n = ::read(fd, head, sizeof head);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  // The preamble's first 8 bytes are the magic: a prefix of a frame opens as a truncated one.
  return n >= 0 && (n < 8 || !is_frame(head, uint64_t(n)));
}

void parse_tensor_file(FileKind kind, const uint8_t* b, uint64_t size, const std::string& name,
                       const std::string& npy_tensor, TensorFile* out) {
  // A frame under a tensor file's name would otherwise be read as a broken one.
  if (is_frame(b, size)) bad(name, "is a GIFT frame, not a tensor file (giftc decode reads it)");
  static const uint8_t kEmpty[1] = {0};
  if (!b) b = kEmpty;
  if (kind == FileKind::kSafetensors) {
    parse_safetensors(b, size, name, out);
  } else if (kind == FileKind::kNpy) {
    add_npy(b, size, name, npy_tensor, out);
  } else if (kind == FileKind::kNpz) {
    parse_npz(b, size, name, out);
  } else {
    bad(name, kUnknownKind);
  }
  check_names(*out, name);
  align_data(out, name);
}

namespace {

// s as a JSON string, by nlohmann::json's own writer (the bytes a document's dump gave).
void append_json_string(std::string& out, const std::string& s) { out += nlohmann::json(s).dump(); }

}  // namespace

std::vector<uint8_t> safetensors_header(const std::vector<TensorHeader>& tensors,
                                        const std::map<std::string, std::string>& metadata,
                                        const std::string& source) {
  // The JSON text is written as it goes, as a document of every tensor would dump it (keys in
  // byte order, no spaces): a document took 500 bytes a tensor, 100 MB for 200,000 tensors.
  static const std::string kMetadataKey = "__metadata__";
  const size_t n = tensors.size();
  std::vector<uint64_t> at(n + 1, 0);  // tensor i's data is [at[i], at[i + 1])
  size_t estimate = 2;
  for (size_t i = 0; i < n; ++i) {
    const TensorHeader& t = tensors[i];
    if (t.name == kMetadataKey) {
      throw giftc::Failure(giftc::kUsage,
                           source +
                               ": tensor '__metadata__': a .safetensors file keeps that name "
                               "for its metadata" +
                               (n == 1 ? " (decode it to .npy)" : ""));
    }
    at[i + 1] = at[i] + t.elements() * giftDTypeSize(t.dtype);
    estimate += t.name.size() + 96 + 21 * t.shape.size();
  }
  // Entry n, where there is metadata, is the metadata's.
  std::vector<size_t> order(n + (metadata.empty() ? 0 : 1));
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto key = [&](size_t i) -> const std::string& {
    return i < n ? tensors[i].name : kMetadataKey;
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  std::string js = "{";
  js.reserve(estimate);
  for (const size_t i : order) {
    if (js.size() > 1) js += ',';
    append_json_string(js, key(i));
    js += ":{";
    if (i == n) {
      for (const auto& [k, v] : metadata) {
        if (js.back() != '{') js += ',';
        append_json_string(js, k);
        js += ':';
        append_json_string(js, v);
      }
      js += '}';
      continue;
    }
    js += "\"data_offsets\":[" + std::to_string(at[i]) + "," + std::to_string(at[i + 1]) +
          "],\"dtype\":";
    append_json_string(js, dtype_name(tensors[i].dtype));
    js += ",\"shape\":[";
    for (size_t d = 0; d < tensors[i].shape.size(); ++d)
      js += (d ? "," : "") + std::to_string(tensors[i].shape[d]);
    js += "]}";
  }
  js += '}';
  while ((8 + js.size()) % 8) js += ' ';  // keeps the data 8-byte aligned, as writers do
  std::vector<uint8_t> out(8 + js.size());
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(js.size() >> (8 * i));  // little-endian
  std::memcpy(out.data() + 8, js.data(), js.size());
  return out;
}

std::vector<uint8_t> npy_header(const TensorHeader& t) {
  std::string shape;
  for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
  if (t.shape.size() == 1) shape += ",";
  std::string header = std::string("{'descr': '") + (t.dtype == GIFT_DTYPE_F32 ? "<f4" : "<f2") +
                       "', 'fortran_order': False, 'shape': (" + shape + "), }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string pre = "\x93NUMPY";
  pre += char(1);
  pre += char(0);
  pre += char(header.size() & 0xFF);
  pre += char(header.size() >> 8);
  std::vector<uint8_t> out;
  for (const std::string* part : {&pre, &header}) {
    for (char c : *part) out.push_back(static_cast<uint8_t>(c));
  }
  return out;
}

}  // namespace gift::io
