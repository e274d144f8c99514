// Output that never shows a partial file under its final name: a file is written unnamed
// (or under a temporary name where the file system cannot do that) beside its destination
// and renamed into place only when complete. The same interface writes to a descriptor
// (standard output, a pipe) where there is nothing to rename.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/background.h"
#include "gift/gift.h"

namespace gift {

// A file that sections of a frame are written to in order as they are made (FrameWriter): the
// writer's scratch file, or the output itself when it streams the frame there.
class SectionFile {
 public:
  virtual ~SectionFile() = default;
  virtual uint64_t size() const = 0;
  // Appends at the end.
  virtual giftResult_t write(const void* data, uint64_t size) = 0;
  // The same, perhaps on a background thread: `data` must stay as it is until the next call
  // on this file returns. Every other call waits for it first (and reports its failure).
  // `first`, if set, runs just before the write, on the same thread: work on the same bytes
  // (a section's checksum) that then leaves the caller's thread too.
  virtual giftResult_t write_behind(const void* data, uint64_t size, std::function<void()> first) {
    if (first) first();
    return write(data, size);
  }
  // Waits for a write_behind: its result.
  virtual giftResult_t settle() { return GIFT_OK; }
  // Drops the bytes from `size` on; the next write goes there.
  virtual giftResult_t truncate(uint64_t size) = 0;
  // Room for `more` bytes past the end, allocated ahead: only a speed-up, so a failure shows
  // later, precisely, when the bytes are written.
  virtual void allocate_ahead(uint64_t more) = 0;
  // Bytes from `offset` on may still be dropped (truncate): not worth sending to the disk
  // yet. UINT64_MAX: none.
  virtual void hold_writeback_from(uint64_t /*offset*/) {}
};

// Tests reach the path of file systems without unnamed files (O_TMPFILE): with false, outputs
// and scratch files opened from now on are named temporaries.
void set_unnamed_files_for_test(bool allowed);

class OutputFile : public SectionFile {
 public:
  OutputFile() = default;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  // Removes what was written unless commit() succeeded.
  ~OutputFile();

  giftResult_t open(const std::string& path);
  // Borrows fd (not closed here); `name` is used in messages.
  void open_fd(int fd, const std::string& name);

  // The file will hold `total` bytes: its blocks are allocated now, so a full disk fails
  // before anything is written and writing does not allocate page by page. A no-op for a
  // descriptor or a file system that cannot do it.
  giftResult_t reserve(uint64_t total);
  giftResult_t write(const void* data, uint64_t size) override;
  // write(2) runs on a background thread while the caller makes the next bytes.
  giftResult_t write_behind(const void* data, uint64_t size, std::function<void()> first) override;
  giftResult_t settle() override;
  // settle, then the small writes gathered are written (giftOutputWait: everything handed
  // over is in the file, or has failed).
  giftResult_t flush();
  // Appends `size` bytes of the file `fd` from `offset`, in the kernel where it can.
  giftResult_t append_from(int fd, uint64_t offset, uint64_t size);
  // A file only: drops the bytes from `size` on; the next write goes there.
  giftResult_t truncate(uint64_t size) override;
  // A file only: overwrites bytes already written.
  giftResult_t write_at(uint64_t offset, const void* data, uint64_t size);
  void allocate_ahead(uint64_t more) override;
  void hold_writeback_from(uint64_t offset) override {
    (void)settle();  // a failure is reported again by the next call that returns one
    hold_ = offset;
  }
  // A file only: hands over the descriptor of what was written (unnamed from now on, gone
  // when the caller closes it) in *old_fd and starts the output again, empty.
  giftResult_t restart(int* old_fd);
  // Whether commit syncs a file first (the default): see giftOutputSetSync. After any write
  // behind (which reads sync_); a failure is reported again by the next call that returns one.
  void set_sync(bool sync) {
    (void)settle();
    sync_ = sync;
  }
  // Whether commit replaces a file that has the name (the default): see giftOutputSetReplace.
  void set_replace(bool replace) {
    (void)settle();
    replace_ = replace;
  }
  // The permission bits a file gets at commit (giftOutputSetMode); by default open(2)'s.
  void set_mode(unsigned mode) {
    (void)settle();
    mode_ = int(mode & 0777);
  }
  // A file: fsync (when syncing), then the rename over the destination (or without replacing,
  // the name taken only if it is free), then (syncing) an fsync of its folder. A descriptor:
  // nothing to do. Refused while a frame writer streams into the file (its header is not written
  // yet).
  giftResult_t commit();
  // A frame writer streams into this output: `unfinished` while it has not written the
  // frame's header (commit is refused meanwhile); `lost` is called if the output goes first.
  void set_streaming(bool unfinished, std::function<void()> lost);
  // GIFT_ERROR_INVALID_ARGUMENT, with the message, while such a frame is unfinished.
  giftResult_t check_not_streaming() const;

  bool is_file() const { return owned_ && fd_ >= 0; }
  uint64_t written() const { return written_ + gathered_.size(); }
  uint64_t size() const override { return written(); }
  const std::string& name() const { return name_; }
  // A file's folder (where its temporary name lies).
  std::string folder() const;

 private:
  giftResult_t io_error(const char* what, int err) const;
  giftResult_t fail_io(const char* what, int err);
  // write(2) of the bytes after written_ - size, and writeback of what is then complete.
  giftResult_t put_bytes(const void* data, uint64_t size);
  giftResult_t fail_exists();
  // Ends the output with failure r (the last message): later calls report it again.
  giftResult_t fail_for_good(giftResult_t r);
  giftResult_t finish_named();
  void discard();
  void start_writeback();
  void forget_temporary();

  int fd_ = -1;
  bool owned_ = false, unnamed_ = false, committed_ = false, unfinished_ = false;
  bool sync_ = true, replace_ = true;
  int mode_ = -1;  // -1: as created
  std::string path_, temp_, name_;
  int temp_slot_ = -1;  // temp_'s place among the names giftRemoveTemporaryFiles removes
  uint64_t written_ = 0, reserved_ = 0;  // written_: bytes in the file (write(2) made)
  std::vector<uint8_t> gathered_;        // small writes to come after them (flush)
  uint64_t flushed_ = 0;                 // writeback started for [0, flushed_)
  uint64_t hold_ = UINT64_MAX;           // and not from here on
  std::function<void()> lost_;
  BackgroundJob behind_;  // write_behind's job and write(2), while nothing else touches the file
  giftResult_t failed_ = GIFT_OK;  // the failure that ended the output, and its message
  std::string failure_;
  bool broken_pipe_ = false;  // that failure was EPIPE on the background thread (SIGPIPE blocked)
};

// An unnamed scratch file in `dir` (the folder of an output, so that copying from it stays
// in one file system), removed by the kernel when closed, whatever ends the process.
class ScratchFile : public SectionFile {
 public:
  ScratchFile() = default;
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  ~ScratchFile();

  giftResult_t open(const std::string& dir);
  void allocate_ahead(uint64_t more) override;
  giftResult_t write(const void* data, uint64_t size) override;
  giftResult_t truncate(uint64_t size) override;
  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& dir() const { return dir_; }
  uint64_t size() const override { return size_; }
  // Reads back [offset, offset + n) into dst.
  giftResult_t read(uint64_t offset, void* dst, uint64_t n) const;

 private:
  int fd_ = -1;
  std::string dir_;
  uint64_t size_ = 0;
};

// Writes bytes to path through an OutputFile.
giftResult_t write_file_atomically(const std::string& path, const uint8_t* data, uint64_t size);
inline giftResult_t write_file_atomically(const std::string& path,
                                          const std::vector<uint8_t>& bytes) {
  return write_file_atomically(path, bytes.data(), bytes.size());
}

}  // namespace gift
