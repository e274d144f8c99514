// The I/O that giftc encode and decode do, without the codec: map IN and fault it in band by
// band (MADV_POPULATE_READ, as giftc does), read one byte per page, and write BYTES bytes in
// 256 KiB calls to a new file, its blocks allocated ahead, named OUT once complete (a
// temporary name, then a rename).
// giftc_stream_bench.py times it beside each command, with BYTES the size of that command's
// output: what is left of the command's time is the codec's, and a target that the floor
// alone misses cannot be met by any codec. A benchmark tool, not a test.
//
// Usage: io_floor IN OUT BYTES
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr uint64_t kBandBytes = uint64_t(2) << 20;     // giftc's encode bands: 1M elements
constexpr uint64_t kWriteBytes = uint64_t(256) << 10;  // giftc's bytes per write(2)

int fail(const char* what, const std::string& path) {
  std::fprintf(stderr, "io_floor: %s %s: %s\n", what, path.c_str(), std::strerror(errno));
  return 1;
}

bool write_all(int fd, const char* p, uint64_t n) {
  while (n) {
    const ssize_t w = ::write(fd, p, std::min(n, kWriteBytes));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    n -= uint64_t(w);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: io_floor IN OUT BYTES\n");
    return 2;
  }
  const std::string in = argv[1], out = argv[2], temp = out + ".io_floor-tmp";
  char* end = nullptr;
  const uint64_t bytes = std::strtoull(argv[3], &end, 10);
  if (!*argv[3] || *end) {
    std::fprintf(stderr, "io_floor: BYTES: not a number: %s\n", argv[3]);
    return 2;
  }
  const int fd = ::open(in.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0) return fail("cannot open", in);
  const uint64_t size = uint64_t(st.st_size);
  void* map = size ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
  if (map == MAP_FAILED) return fail("cannot map", in);
  const int o = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (o < 0) return fail("cannot create", temp);
  // Blocks allocated ahead, as giftc's outputs do (decode the whole file, encode each
  // section): where the file system can, writing then allocates nothing page by page.
  if (bytes) (void)::fallocate(o, FALLOC_FL_KEEP_SIZE, 0, off_t(bytes));
  const std::vector<char> piece(kBandBytes, 1);
  const char* p = static_cast<const char*>(map);
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  volatile char sink = 0;  // every page is read, so that none is left to fault later
  uint64_t written = 0;
  for (uint64_t at = 0; at < size || written < bytes; at += kBandBytes) {
    if (at < size) {
      const uint64_t n = std::min(kBandBytes, size - at);
#ifdef MADV_POPULATE_READ
      (void)::madvise(const_cast<char*>(p) + at, n, MADV_POPULATE_READ);
#endif
      for (uint64_t i = 0; i < n; i += page) sink = p[at + i];
    }
    // The output keeps pace with the input, as the commands' bands do.
    const uint64_t due = at + kBandBytes >= size
                             ? bytes
                             : uint64_t(double(bytes) * double(at + kBandBytes) / double(size));
    for (; written < due; written += std::min(kBandBytes, due - written)) {
      if (!write_all(o, piece.data(), std::min(kBandBytes, due - written))) {
        ::unlink(temp.c_str());
        return fail("cannot write", temp);
      }
    }
  }
  (void)sink;
  if (::close(o) != 0) {
    ::unlink(temp.c_str());
    return fail("cannot write", temp);
  }
  if (::rename(temp.c_str(), out.c_str()) != 0) return fail("cannot rename to", out);
  if (map && ::munmap(map, size) != 0) return fail("cannot unmap", in);
  ::close(fd);
  return 0;
}
