// The I/O of giftc encode and decode without the codec, in giftc's way: IN mapped and faulted
// in band by band (MADV_POPULATE_READ) with one byte per page read, and BYTES bytes written in
// 256 KiB calls from a buffer that stays in cache, to an unnamed file in OUT's folder whose
// blocks are allocated up front, linked under a temporary name once complete and renamed to
// OUT. (Close to giftc, not identical: giftc's bands are 1M elements, 2 MiB of bf16 or 4 MiB
// of fp32, here 2 MiB of input; its encode allocates each section's blocks as the section
// starts rather than the whole file at once; and its codec reads every byte of the input.)
// giftc_stream_bench.py times it beside each command, with BYTES the size of that command's
// output: what is left of the command's time is the codec's, and a target that this floor
// alone misses is out of reach of any codec reading and writing the way giftc does.
// A benchmark tool, not a test.
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

constexpr uint64_t kBandBytes = uint64_t(2) << 20;      // input mapped ahead per band
constexpr uint64_t kBufferBytes = uint64_t(512) << 10;  // output written from, reused
constexpr uint64_t kWriteBytes = uint64_t(256) << 10;   // giftc's bytes per write(2)

int fail(const char* what, const std::string& path) {
  std::fprintf(stderr, "io_floor: %s %s: %s\n", what, path.c_str(), std::strerror(errno));
  return 1;
}

bool write_all(int fd, const char* p, uint64_t n) {
  while (n) {
    const ssize_t w = ::write(fd, p, std::min(n, kWriteBytes));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = ENOSPC;
      return false;
    }
    p += w;
    n -= uint64_t(w);
  }
  return true;
}

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
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
  // Unnamed, or under the temporary name where the file system has no unnamed files (giftc's
  // fallback too).
  int o = ::open(folder_of(out).c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  const bool unnamed = o >= 0;
  if (!unnamed) o = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (o < 0) return fail("cannot create", temp);
  if (bytes) (void)::fallocate(o, 0, 0, off_t(bytes));  // where the file system can
  const std::vector<char> buffer(kBufferBytes, 1);
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
    for (; written < due; written += std::min(kBufferBytes, due - written)) {
      if (!write_all(o, buffer.data(), std::min(kBufferBytes, due - written))) {
        const int err = errno;
        if (!unnamed) ::unlink(temp.c_str());
        errno = err;
        return fail("cannot write", out);
      }
    }
  }
  (void)sink;
  if (unnamed) {
    const std::string self = "/proc/self/fd/" + std::to_string(o);
    (void)::unlink(temp.c_str());  // a run killed between the link and the rename left it
    if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, temp.c_str(), AT_SYMLINK_FOLLOW) != 0)
      return fail("cannot name", temp);
  }
  if (::rename(temp.c_str(), out.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    errno = err;
    return fail("cannot rename to", out);
  }
  if (::close(o) != 0) return fail("cannot write", out);
  if (map && ::munmap(map, size) != 0) return fail("cannot unmap", in);
  ::close(fd);
  return 0;
}
