#include "common/output_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/error.h"
#include "common/temporaries.h"

namespace gift {
namespace {

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// A name beside `path` that did not exist: `make` creates it (O_EXCL or link), or fails
// with errno; EEXIST tries another. The name is path's own with a suffix, its last
// component cut where that would pass NAME_MAX (255 bytes on Linux's file systems).
template <typename Make>
bool fresh_name(const std::string& path, std::string* name, Make&& make) {
  constexpr size_t kSuffix = 13, kNameMax = 255;  // ".tmp." and 8 hex digits
  const size_t slash = path.rfind('/'), base = slash == std::string::npos ? 0 : slash + 1;
  const std::string stem = path.substr(0, base + std::min(path.size() - base, kNameMax - kSuffix));
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".tmp.%08x", unsigned(rd()));
    *name = stem + suffix;
    if (make(*name)) return true;
    if (errno != EEXIST) return false;
  }
  return false;
}

// A rename is durable once the folder is synced. EINVAL: a file system that cannot sync a
// folder (some FUSE ones), where there is nothing more to do.
bool sync_folder(const std::string& dir, int* err) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const bool ok = fd >= 0 && (::fsync(fd) == 0 || errno == EINVAL);
  *err = errno;
  if (fd >= 0) ::close(fd);
  return ok;
}

// File systems without unnamed files say so in one of these ways.
bool no_tmpfile(int err) { return err == EOPNOTSUPP || err == EISDIR || err == EINVAL; }

std::atomic<bool> unnamed_files_allowed{true};  // set_unnamed_files_for_test

int open_unnamed(const std::string& dir, int access) {
  if (!unnamed_files_allowed.load(std::memory_order_relaxed)) {
    errno = EOPNOTSUPP;
    return -1;
  }
  return ::open(dir.c_str(), O_TMPFILE | access | O_CLOEXEC, 0666);
}

// Bytes per write(2). On our CI's VM, 512 MiB written from one buffer 8 MiB per call took
// 0.17 to 3.7 s from run to run, 256 KiB per call 0.15 to 0.18 s every time (1 MiB: slow
// now and then). The likely cause: a large write lets the page cache take folios of a higher
// order, and where a balloon reports free memory to the host those come back only through
// the host's page faults. The extra system calls cost nothing measurable.
constexpr uint64_t kWritePiece = uint64_t(256) << 10;

// At the file position, or at `offset` (pwrite, the position unchanged) when one is given.
giftResult_t write_all(int fd, const uint8_t* p, uint64_t size, int* err, int64_t offset = -1) {
  while (size) {
    const size_t chunk = std::min<uint64_t>(size, kWritePiece);
    const ssize_t n = offset < 0 ? ::write(fd, p, chunk) : ::pwrite(fd, p, chunk, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *err = n < 0 ? errno : ENOSPC;
      return GIFT_ERROR_IO;
    }
    p += n;
    size -= uint64_t(n);
    if (offset >= 0) offset += n;
  }
  return GIFT_OK;
}

// Drops a file's bytes from `size` on and puts the file position there.
bool truncate_at(int fd, uint64_t size) {
  return ::ftruncate(fd, off_t(size)) == 0 && ::lseek(fd, off_t(size), SEEK_SET) >= 0;
}

// SectionFile::allocate_ahead for a file whose end is `size`. Less than kAllocateAheadMin is
// left to the file system's own allocation as the bytes come: a call per section of a few
// bytes cost more than writing it (giftc encode of 200,000 tensors of 4 x 4: 15% of its time).
constexpr uint64_t kAllocateAheadMin = uint64_t(1) << 20;
void allocate_past(int fd, uint64_t size, uint64_t more) {
  if (fd >= 0 && more >= kAllocateAheadMin)
    (void)::fallocate(fd, FALLOC_FL_KEEP_SIZE, off_t(size), off_t(more));
}

// Writeback is started every this many bytes, so that it overlaps the rest of the work and
// commit's fsync waits only for the tail.
constexpr uint64_t kWritebackBytes = uint64_t(8) << 20;

// Writes into a file below kSmallWrite bytes are gathered, up to kGatherBytes, and written as
// one: a frame of many small tensors took four write(2) calls a tensor (giftc encode of
// 200,000 tensors of 4 x 4: 800,000 calls, a quarter of its time), and its decode one.
constexpr uint64_t kSmallWrite = uint64_t(4) << 10, kGatherBytes = uint64_t(64) << 10;

}  // namespace

OutputFile::~OutputFile() {
  if (lost_) lost_();
  (void)settle();
  discard();
}

giftResult_t OutputFile::check_not_streaming() const {
  if (!unfinished_) return GIFT_OK;
  return fail(GIFT_ERROR_INVALID_ARGUMENT,
              "%s: a frame streams into it and is not finished (giftFrameWriterWriteOutput)",
              name_.c_str());
}

void OutputFile::set_streaming(bool unfinished, std::function<void()> lost) {
  unfinished_ = unfinished;
  lost_ = std::move(lost);
}

// Once the file is no longer under temp_ (unlinked, or renamed into place): a signal
// handler's giftRemoveTemporaryFiles leaves that name alone from now on.
void OutputFile::forget_temporary() {
  temporary_remove(temp_slot_);
  temp_slot_ = -1;
}

void OutputFile::discard() {
  gathered_.clear();
  if (owned_ && fd_ >= 0) ::close(fd_);
  if (owned_ && !committed_ && !unnamed_ && !temp_.empty()) ::unlink(temp_.c_str());
  forget_temporary();
  fd_ = -1;
  owned_ = false;
  reserved_ = 0;
}

giftResult_t OutputFile::io_error(const char* what, int err) const {
  return fail(GIFT_ERROR_IO, "%s: %s: %s", name_.c_str(), what, std::strerror(err));
}

giftResult_t OutputFile::fail_io(const char* what, int err) {
  return fail_for_good(io_error(what, err));
}

giftResult_t OutputFile::fail_for_good(giftResult_t r) {
  failed_ = r;
  failure_ = last_message();
  discard();
  return r;
}

giftResult_t OutputFile::settle() {
  if (!failed_) {
    failed_ = behind_.wait();
    if (!failed_) return GIFT_OK;
    failure_ = last_message();
    discard();
    // A write(2) to a pipe whose reader has gone raises SIGPIPE in the thread that made it,
    // which ends the process unless the caller handles it (as `giftc decode -c | head` ends,
    // like gzip -dc). Written on the background thread, it met EPIPE with the signal blocked:
    // it is raised here, on the caller's thread, as the write on it would have. (A job the
    // caller ran itself, without a thread, got the signal already.)
    if (broken_pipe_) ::raise(SIGPIPE);
  }
  return fail(failed_, "%s", failure_.c_str());
}

void set_unnamed_files_for_test(bool allowed) { unnamed_files_allowed.store(allowed); }

giftResult_t OutputFile::open(const std::string& path) {
  (void)settle();
  discard();
  failed_ = GIFT_OK;
  path_ = name_ = path;
  written_ = reserved_ = flushed_ = 0;
  hold_ = UINT64_MAX;
  committed_ = false;
  temp_.clear();
  owned_ = true;
  // Unnamed until complete: an interrupted run leaves nothing behind, not even a temporary.
  fd_ = open_unnamed(folder_of(path), O_RDWR);  // read back if a streamed frame must move
  unnamed_ = fd_ >= 0;
  if (fd_ < 0 && no_tmpfile(errno)) {
    // Recorded once created, never before: until then the name may be another process's
    // file; and no signal in between (TemporaryCreation).
    const TemporaryCreation creation;
    fresh_name(path, &temp_, [&](const std::string& n) {
      fd_ = ::open(n.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      return fd_ >= 0;
    });
    if (fd_ >= 0) temp_slot_ = temporary_add(temp_);
  }
  if (fd_ < 0) {
    const int err = errno;
    temp_.clear();  // the last name tried may be another process's file: not ours to remove
    return fail_io("cannot create a temporary file", err);
  }
  return GIFT_OK;
}

void OutputFile::open_fd(int fd, const std::string& name) {
  (void)settle();
  discard();
  failed_ = GIFT_OK;
  fd_ = fd;
  name_ = name;
  written_ = 0;
  committed_ = false;
}

giftResult_t OutputFile::reserve(uint64_t total) {
  if (const giftResult_t r = flush()) return r;
  if (fd_ < 0 || !owned_ || total <= written_) return GIFT_OK;
  if (::fallocate(fd_, 0, off_t(written_), off_t(total - written_)) == 0) {
    reserved_ = total;
    return GIFT_OK;
  }
  if (errno == ENOSPC || errno == EFBIG || errno == EDQUOT)
    return fail_io("cannot reserve space", errno);
  return GIFT_OK;  // not supported here: blocks are allocated as the bytes come
}

giftResult_t OutputFile::write(const void* data, uint64_t size) {
  // A write behind first, as for every call: its buffer is the caller's again once this
  // returns. Gathered into a file only: a descriptor (a pipe) gets the bytes as they come.
  if (const giftResult_t r = settle()) return r;
  if (size < kSmallWrite && is_file()) {
    if (gathered_.size() + size > kGatherBytes) {
      if (const giftResult_t r = flush()) return r;
    }
    if (gathered_.capacity() < kGatherBytes) gathered_.reserve(kGatherBytes);
    const auto* p = static_cast<const uint8_t*>(data);
    gathered_.insert(gathered_.end(), p, p + size);
    return GIFT_OK;
  }
  if (const giftResult_t r = flush()) return r;
  if (fd_ < 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: not open", name_.c_str());
  written_ += size;
  if (const giftResult_t r = put_bytes(data, size)) {
    written_ -= size;  // not all of them were
    return fail_for_good(r);
  }
  return GIFT_OK;
}

giftResult_t OutputFile::write_behind(const void* data, uint64_t size,
                                      std::function<void()> first) {
  if (size < kSmallWrite && is_file()) {  // gathered (copied): less than a thread's hand-off
    if (const giftResult_t r = settle()) return r;  // `first` runs after the write before it
    if (first) first();
    return write(data, size);
  }
  if (const giftResult_t r = flush()) return r;
  if (fd_ < 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: not open", name_.c_str());
  written_ += size;
  return behind_.start([this, data, size, first = std::move(first)] {
    if (first) first();
    return put_bytes(data, size);
  });
}

giftResult_t OutputFile::flush() {
  if (const giftResult_t r = settle()) return r;
  if (gathered_.empty()) return GIFT_OK;
  const uint64_t size = gathered_.size();
  written_ += size;
  const giftResult_t r = put_bytes(gathered_.data(), size);
  gathered_.clear();
  if (!r) return GIFT_OK;
  written_ -= size;  // not all of them were, as for a write that fails
  return fail_for_good(r);
}

// Touches only the descriptor, the writeback's own fields and broken_pipe_, so that it may run
// behind.
giftResult_t OutputFile::put_bytes(const void* data, uint64_t size) {
  int err = 0;
  broken_pipe_ = false;
  if (write_all(fd_, static_cast<const uint8_t*>(data), size, &err) != GIFT_OK) {
    broken_pipe_ = err == EPIPE && on_background_thread();
    return io_error("write failed", err);
  }
  start_writeback();
  return GIFT_OK;
}

void OutputFile::start_writeback() {
  // Only a head start for commit's fsync, which reports any failure: errors are ignored here.
  // Without the fsync, the kernel's own writeback is left alone, as for any other writer.
  const uint64_t end = std::min(written_, hold_);
  if (!owned_ || !sync_ || end < flushed_ + kWritebackBytes) return;
  (void)::sync_file_range(fd_, off_t(flushed_), off_t(end - flushed_), SYNC_FILE_RANGE_WRITE);
  flushed_ = end;
}

giftResult_t OutputFile::truncate(uint64_t size) {
  if (const giftResult_t r = flush()) return r;
  if (!is_file()) return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: not a file", name_.c_str());
  if (!truncate_at(fd_, size)) return fail_io("cannot truncate", errno);
  written_ = size;
  flushed_ = std::min(flushed_, size);
  return GIFT_OK;
}

giftResult_t OutputFile::write_at(uint64_t offset, const void* data, uint64_t size) {
  if (const giftResult_t r = flush()) return r;
  if (!is_file() || offset + size > written_) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: cannot write there", name_.c_str());
  }
  int err = 0;
  if (write_all(fd_, static_cast<const uint8_t*>(data), size, &err, int64_t(offset)) != GIFT_OK)
    return fail_io("write failed", err);
  return GIFT_OK;
}

void OutputFile::allocate_ahead(uint64_t more) {
  if (settle()) return;  // reported again by the next call that returns a result
  if (is_file()) allocate_past(fd_, written_, more);
}

giftResult_t OutputFile::restart(int* old_fd) {
  if (const giftResult_t r = flush()) return r;
  if (!is_file()) return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: not a file", name_.c_str());
  const int fd = fd_;
  if (!unnamed_) ::unlink(temp_.c_str());  // the descriptor keeps the bytes until closed
  forget_temporary();
  fd_ = -1;
  owned_ = false;
  if (const giftResult_t r = open(path_)) {
    ::close(fd);
    return r;
  }
  *old_fd = fd;
  return GIFT_OK;
}

giftResult_t OutputFile::append_from(int src, uint64_t offset, uint64_t size) {
  if (const giftResult_t r = flush()) return r;
  if (fd_ < 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: not open", name_.c_str());
  loff_t off = loff_t(offset);
  uint64_t left = size;
  while (left) {  // in the kernel: no copy through this process
    const ssize_t n = ::copy_file_range(src, &off, fd_, nullptr, left, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      left -= uint64_t(n);
      written_ += uint64_t(n);
      start_writeback();
      continue;
    }
    if (n < 0 && errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP &&
        errno != EBADF)
      return fail_io("write failed", errno);
    break;  // not between these two files (a pipe, another file system): copy below
  }
  std::vector<uint8_t> buf(std::min<uint64_t>(left, uint64_t(1) << 20));
  while (left) {
    const ssize_t n = ::pread(src, buf.data(), std::min<uint64_t>(left, buf.size()), off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail_io("cannot read back scratch data", n < 0 ? errno : EIO);
    int err = 0;
    if (write_all(fd_, buf.data(), uint64_t(n), &err) != GIFT_OK)
      return fail_io("write failed", err);
    off += n;
    left -= uint64_t(n);
    written_ += uint64_t(n);
    start_writeback();
  }
  return GIFT_OK;
}

giftResult_t OutputFile::commit() {
  if (const giftResult_t r = flush()) return r;
  if (fd_ < 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: not open", name_.c_str());
  if (const giftResult_t r = check_not_streaming()) return r;
  if (!owned_) {
    committed_ = true;
    return GIFT_OK;
  }
  if (reserved_ > written_ && ::ftruncate(fd_, off_t(written_)) != 0)
    return fail_io("cannot finish writing", errno);
  // Where the file system cannot set them (vfat, some FUSE mounts: EPERM), the file keeps the
  // bits it was made with, as zstd leaves them: the output is not lost for its permissions.
  if (mode_ >= 0) (void)::fchmod(fd_, mode_t(mode_));
  if (sync_ && ::fsync(fd_) != 0) return fail_io("cannot finish writing", errno);
  const std::string proc = "/proc/self/fd/" + std::to_string(fd_);
  if (unnamed_ && !replace_) {
    // The name itself, linked only if it is free: a file that took it meanwhile stays.
    if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path_.c_str(), AT_SYMLINK_FOLLOW) != 0)
      return errno == EEXIST ? fail_exists() : fail_io("cannot name the finished file", errno);
    unnamed_ = false;
    const int closed = ::close(fd_), err = errno;
    fd_ = -1;
    if (closed != 0) {
      ::unlink(path_.c_str());  // ours: the name was free a moment ago
      return fail_io("cannot finish writing", err);
    }
    return finish_named();
  }
  if (unnamed_) {
    // A name only now: linked under a fresh temporary, then renamed over the destination
    // (a link cannot replace an existing file).
    const TemporaryCreation creation;
    const bool linked = fresh_name(path_, &temp_, [&](const std::string& n) {
      return ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, n.c_str(), AT_SYMLINK_FOLLOW) == 0;
    });
    if (!linked) {
      const int err = errno;
      temp_.clear();
      return fail_io("cannot name the finished file", err);
    }
    unnamed_ = false;
    temp_slot_ = temporary_add(temp_);
  }
  if (::close(fd_) != 0) {
    fd_ = -1;
    return fail_io("cannot finish writing", errno);
  }
  fd_ = -1;
  if (!replace_) {
    // The temporary takes the name only if it is free: renameat2's RENAME_NOREPLACE, or
    // where the file system lacks it, a link (which never replaces) and the temporary's unlink.
    int err = ::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE) == 0
                  ? 0
                  : errno;
    if (err == EINVAL || err == ENOSYS) {
      err = ::link(temp_.c_str(), path_.c_str()) == 0 ? 0 : errno;
      if (err == 0) ::unlink(temp_.c_str());
    }
    if (err == EEXIST) return fail_exists();
    if (err != 0) return fail_io("cannot finish writing", err);
  } else if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    return fail_io("cannot finish writing", errno);
  }
  forget_temporary();
  return finish_named();
}

giftResult_t OutputFile::fail_exists() {
  // Worded for whoever made the output not to replace a file: an API user (giftOutputSetReplace)
  // or a command's user (giftc without -f), who never heard of the function.
  return fail_for_good(fail(GIFT_ERROR_IO,
                            "%s: already exists (a file took that name while the output was "
                            "written): it is kept, as this output replaces no file",
                            name_.c_str()));
}

// Once the finished file has its name.
giftResult_t OutputFile::finish_named() {
  committed_ = true;
  owned_ = false;
  int err = 0;
  if (sync_ && !sync_folder(folder_of(path_), &err)) {
    return fail(GIFT_ERROR_IO, "%s: written, but its folder cannot be synced: %s", name_.c_str(),
                std::strerror(err));
  }
  return GIFT_OK;
}

std::string OutputFile::folder() const { return folder_of(path_); }

ScratchFile::~ScratchFile() {
  if (fd_ >= 0) ::close(fd_);
}

giftResult_t ScratchFile::open(const std::string& dir) {
  dir_ = dir;
  fd_ = open_unnamed(dir, O_RDWR);
  if (fd_ < 0 && no_tmpfile(errno)) {
    const TemporaryCreation creation;  // no signal between its creation and its unlink
    std::string name;
    if (fresh_name(dir + "/.gift-scratch", &name, [&](const std::string& n) {
          fd_ = ::open(n.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
          return fd_ >= 0;
        }))
      ::unlink(name.c_str());  // nameless from here on, as an O_TMPFILE would be
  }
  if (fd_ < 0) {
    return fail(GIFT_ERROR_IO, "%s: cannot create a scratch file: %s", dir.c_str(),
                std::strerror(errno));
  }
  return GIFT_OK;
}

void ScratchFile::allocate_ahead(uint64_t more) { allocate_past(fd_, size_, more); }

giftResult_t ScratchFile::write(const void* data, uint64_t size) {
  int err = 0;
  if (write_all(fd_, static_cast<const uint8_t*>(data), size, &err) != GIFT_OK) {
    return fail(GIFT_ERROR_IO, "%s: cannot write scratch data: %s", dir_.c_str(),
                std::strerror(err));
  }
  size_ += size;
  return GIFT_OK;
}

giftResult_t ScratchFile::truncate(uint64_t size) {
  if (!truncate_at(fd_, size)) {
    return fail(GIFT_ERROR_IO, "%s: cannot truncate scratch data: %s", dir_.c_str(),
                std::strerror(errno));
  }
  size_ = size;
  return GIFT_OK;
}

giftResult_t ScratchFile::read(uint64_t offset, void* dst, uint64_t n) const {
  uint8_t* p = static_cast<uint8_t*>(dst);
  for (uint64_t done = 0; done < n;) {
    const ssize_t r = ::pread(fd_, p + done, size_t(std::min<uint64_t>(n - done, 1u << 30)),
                              off_t(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return fail(GIFT_ERROR_IO, "%s: cannot read scratch data back: %s", dir_.c_str(),
                  r < 0 ? std::strerror(errno) : "it is shorter than written");
    }
    done += uint64_t(r);
  }
  return GIFT_OK;
}

giftResult_t write_file_atomically(const std::string& path, const uint8_t* data, uint64_t size) {
  OutputFile out;
  if (const giftResult_t r = out.open(path)) return r;
  if (const giftResult_t r = out.write(data, size)) return r;
  return out.commit();
}

}  // namespace gift
