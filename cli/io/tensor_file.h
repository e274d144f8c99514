// Gradient dumps people already have: safetensors, NumPy .npy and .npz. Reading validates
// the container before trusting any byte and memory-maps large files; writing goes through
// a temporary name and a rename.
#pragma once

#include <pthread.h>
#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gift/gift.h"

namespace gift::io {

// Where a file's tensors that cannot be read in place are made, one at a time: up to
// kHeldBytes in a buffer (memory for the largest such tensor), larger ones in an unnamed
// scratch file in $TMPDIR (or /tmp), mapped as the input files are, so that the process's
// own memory does not grow with a tensor (a tmpfs there holds them in shared memory instead).
struct FetchedTensor {
  static constexpr uint64_t kHeldBytes = uint64_t(16) << 20;
  std::string file;          // the tensors' file, for messages
  size_t tensor = SIZE_MAX;  // whose bytes `at` holds
  const uint8_t* at = nullptr;
  // 8-byte aligned, grown to the largest tensor held and never cleared: each fetch writes
  // all of its tensor's bytes.
  std::unique_ptr<uint64_t[]> words;
  uint64_t capacity = 0;  // in words
  int scratch = -1;       // the scratch file, made when first needed
  std::shared_ptr<void> mapping;

  FetchedTensor() = default;
  FetchedTensor(const FetchedTensor&) = delete;
  FetchedTensor& operator=(const FetchedTensor&) = delete;
  ~FetchedTensor();
};

// A tensor's bytes handed over in order, in pieces.
using FetchPut = std::function<void(const uint8_t* p, uint64_t n)>;

struct TensorRef {
  std::string name;
  std::vector<uint64_t> shape;
  giftDType_t dtype;
  const uint8_t* mapped;  // the bytes in place (aligned), or null where `fetch` makes them
  uint64_t bytes;
  size_t index = 0;  // in its file
  // Where mapped is null (a deflated .npz member, a tensor at an odd offset of its file):
  // hands its `bytes` bytes to put, which data() keeps in `fetched`.
  std::function<void(const FetchPut& put)> fetch;
  std::shared_ptr<FetchedTensor> fetched;
  // A deflated .npz member larger than its .npy header: whether a fetch has checked its
  // deflate data and CRC-32 yet (check_unread does it for the rest). Null for other tensors.
  std::shared_ptr<bool> checked;

  uint64_t elements() const;
  // Its little-endian elements in C order at an aligned address, valid while the file is
  // held and, for a fetched tensor, until another tensor of the file is asked for.
  const uint8_t* data() const;
};

// A set of named tensors and free key/value metadata, with the storage they point into.
struct TensorFile {
  std::vector<TensorRef> tensors;  // in file order
  std::map<std::string, std::string> metadata;
  std::vector<std::shared_ptr<void>> storage;
};

// Drops, on a background thread, the page mappings of tensors read in place that a command is
// done with: left to the end, unmapping a 512 MiB dump took giftc encode 13 ms (25 ms where the
// page cache held it in 4 KiB pages) on its one codec thread, a tenth of its time. The bytes
// stay in the page cache; a later read maps them again.
class PagesReleaser {
 public:
  PagesReleaser() = default;
  PagesReleaser(const PagesReleaser&) = delete;
  PagesReleaser& operator=(const PagesReleaser&) = delete;
  ~PagesReleaser();
  // Tensor i of f is done with: released with those before it that follow one another in
  // memory, once they reach 8 MiB and the release before has ended. Nothing for a fetched one.
  void release(const TensorFile& f, size_t i);

 private:
  void wait();

  struct Range {
    uintptr_t begin, end;
    std::vector<std::shared_ptr<void>> storage;  // the mappings, held until released
  } range_{};
  uintptr_t span_begin_ = 0, span_end_ = 0;  // done with, not released yet
  pthread_t thread_{};
  bool running_ = false;
};

// A tensor's values as fp32 (exact for every supported dtype).
std::vector<float> widen_to_float(const TensorRef& t);

enum class FileKind { kSafetensors, kNpy, kNpz, kUnknown };

// By extension (.safetensors, .npy, .npz).
FileKind kind_of_path(const std::string& path);

// What standard input is called in messages, and a command's input path ("-" for it) there.
inline const char* const kStdinName = "standard input";
inline std::string input_name(const std::string& path) { return path == "-" ? kStdinName : path; }

// Bytes of the well-formed UTF-8 sequence that starts at s[i] (shortest form, no surrogate, at
// most U+10FFFF: what JSON and the library take), or 0 where none does.
size_t utf8_sequence_length(const std::string& s, size_t i);
// For names that are not: printable ASCII but backslash kept, other bytes as \xNN.
std::string ascii_escaped(const std::string& s);

// Whether the file at `path` opens and its first bytes are not a GIFT frame's magic (false
// where it cannot be read: opening it as a frame then says why).
bool file_lacks_frame_magic(const std::string& path);

// Why an input of this kind (not a regular file) is refused, with what to do for a pipe.
std::string not_regular(const struct stat& st);

// Reads any supported kind; "-" reads standard input (kept in an unnamed scratch file, its
// kind told by its first bytes). Errors are giftc::Failure naming the file (and tensor):
// kIoError for files that cannot be read, kBadInput for malformed or unsupported ones.
void read_tensor_file(const std::string& path, TensorFile* out);

// Fetches, only to check them, the tensors of `f` not checked yet (deflated .npz members whose
// data() no call has read): a damaged member fails the command, kBadInput, even where it goes
// unused. Commands that may leave tensors unread call it before their outputs are complete.
void check_unread(const TensorFile& f);

// What read_tensor_file does once it holds a file's bytes: the tensors point into `bytes` (or
// into out->storage); `name` stands for the file in messages, and a .npy file's one tensor is
// called `npy_tensor`.
void parse_tensor_file(FileKind kind, const uint8_t* bytes, uint64_t size, const std::string& name,
                       const std::string& npy_tensor, TensorFile* out);

void parse_safetensors(const uint8_t* bytes, uint64_t size, const std::string& name,
                       TensorFile* out);

// The folder of unnamed scratch files that belong to no output file: $TMPDIR, or /tmp.
std::string temp_dir();

// Standard input to its end, mapped from an unnamed scratch file in $TMPDIR (or /tmp):
// any size, in bounded memory.
struct MappedBytes {
  std::shared_ptr<void> storage;  // the mapping, alive while this is held
  const uint8_t* data = nullptr;
  uint64_t size = 0;
};
MappedBytes map_stdin();

// The kind of a tensor file from its first bytes (safetensors unless .npy's or a zip's magic).
FileKind sniff_kind(const uint8_t* b, uint64_t size);

// Whether bytes begin as a GIFT frame, damaged or not (libgift knows one by its magic).
bool is_frame(const uint8_t* b, uint64_t size);

// What an output file says of a tensor before its data.
struct TensorHeader {
  std::string name;
  std::vector<uint64_t> shape;
  giftDType_t dtype;

  uint64_t elements() const;
};

// The bytes that precede the tensors' data, which follows in the given order, each
// elements * dtype size bytes, little-endian. A tensor named __metadata__, the key safetensors
// keeps for the file's metadata, fails (kUsage, naming `source`): the file would not read back.
std::vector<uint8_t> safetensors_header(const std::vector<TensorHeader>& tensors,
                                        const std::map<std::string, std::string>& metadata,
                                        const std::string& source);
std::vector<uint8_t> npy_header(const TensorHeader& tensor);

}  // namespace gift::io
