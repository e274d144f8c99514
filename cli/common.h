// What every giftc subcommand shares: exit codes, errors, option parsing, output files,
// progress on a terminal.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "failure.h"
#include "gift/gift.h"
#include "gift/gift_basis.h"
#include "io/tensor_file.h"

namespace giftc {

int exit_code_for(giftResult_t r);

// Throws a Failure with the library's last message when r is not GIFT_OK.
void check(giftResult_t r, const std::string& context = "");

struct Verbosity {
  bool quiet = false;
  bool verbose = false;
};

// Option values as the command line spells them. Integers: decimal digits in [min, max].
uint64_t parse_uint(const std::string& s, const std::string& what, uint64_t min, uint64_t max);
// Byte counts: decimal digits with an optional binary suffix, K, M, G or T (also KiB, MiB,
// GiB, TiB; powers of 1024, as dd and zstd read them), the product in [min, max].
uint64_t parse_bytes(const std::string& s, const std::string& what, uint64_t min, uint64_t max);
giftFp8Kind_t parse_fp8(const std::string& s);
void parse_scale(const std::string& s, giftQuantParams* p);  // tensor|row|block:N|tile:RxC
giftScaleDType_t parse_scale_dtype(const std::string& s);
giftRounding_t parse_rounding(const std::string& s);
giftDType_t parse_dtype(const std::string& s);

std::string fp8_name(giftFp8Kind_t k);
std::string scale_name(const giftQuantParams& p);
std::string scale_dtype_name(giftScaleDType_t d);
std::string dtype_name(giftDType_t d);
std::string shape_string(const uint64_t* shape, uint32_t ndim);
std::string human_bytes(uint64_t bytes);

// The library's handles, freed on every path.
using BasisPtr = std::unique_ptr<giftBasis, decltype(&giftBasisFree)>;
using FramePtr = std::unique_ptr<giftFrame, decltype(&giftFrameClose)>;
using WriterPtr = std::unique_ptr<giftFrameWriter, decltype(&giftFrameWriterFree)>;

// The basis file given with --basis (exit 3 when unreadable, 2 when damaged); null for "".
BasisPtr read_basis(const std::string& path);

// A frame file, verified as giftFrameOpenFile does ("-": standard input).
FramePtr open_frame(const std::string& path);

// Standard input, read to its end once per run (the mapping outlives every use of it).
const gift::io::MappedBytes& stdin_bytes();

WriterPtr new_writer();

std::string basis_id_hex(giftBasisId id);

// Tensor `index` of a frame, its metadata entries.
giftTensorInfo tensor_info(const giftFrame* f, uint64_t index);
std::vector<std::pair<std::string, std::string>> frame_metadata(const giftFrame* f);

// Text from a file or the command line (names, metadata, file names, messages quoting them) as
// it may reach a terminal: control characters become \xNN when `stream` is a terminal, as ls
// shows odd names, so a hostile name cannot move the cursor or retitle the window; so do bytes
// that are not UTF-8, and C1 controls U+0080-U+009F become \u0080-\u009F. Where the
// environment's locale is not UTF-8 every byte past ASCII is escaped (0x9B is CSI to an 8-bit
// terminal, in UTF-8 text too). Elsewhere (a pipe, a file) the text is unchanged.
std::string shown(const std::string& text, FILE* stream);
// `text` (shown) padded with blanks to `width` terminal columns, as the environment's locale
// counts them (a CJK character two, a combining mark none), not as bytes (printf's %-32s).
std::string padded(const std::string& text, size_t width);

bool file_exists(const std::string& path);

// Refuses an existing output unless `force` (usage error, nothing touched); never replaces
// what is not a regular file (a device, a FIFO, a link, a folder), nor any of `inputs`
// (compared by device and inode, so another name of an input is caught too). "-" is standard
// output, which every command that writes checks for first.
void check_output(const std::string& path, bool force, const std::vector<std::string>& inputs = {});

// The pieces a rows x cols tensor is worked through within `budget` elements, as each frame
// it is read from (one or two) allows (giftFrameDecodeRows, giftFrameDecodeRowPart): bands of whole
// rows, or where one row is longer than the budget, parts of a row. A piece starts at a multiple of
// each of `row_aligns` (tiles' heights, 1 for none; for parts, `col_aligns`: blocks' or tiles'
// widths), or ends before the next one, inside one such group; a 0 among col_aligns keeps rows
// whole (a tensor in GIFT coordinates). Bands are a multiple of every row alignment where that
// fits, else as large as the budget allows, cut short where they would cross a group they start
// inside (two frames whose tiles are 96 and 128 rows high: bands of [0, 256), [256, 288),
// [288, 384), ... for a budget of 256 rows). f(row, rows, col, cols) for each piece in order;
// the largest piece's elements, for the buffer, from piece_elements.
struct Pieces {
  uint64_t rows, cols;          // the tensor
  uint64_t band = 1, part = 0;  // most rows per band; columns per part of a row (0: whole rows)
  using Aligns = std::array<uint64_t, 2>;  // held by value: decode keeps one per tensor
  Aligns row_aligns, col_aligns;

  Pieces(uint64_t rows, uint64_t cols, Aligns row_aligns, Aligns col_aligns, uint64_t budget);
  uint64_t piece_elements() const { return part ? part : band * cols; }
  // The piece (r0, n rows, c0, w columns) that each() gave, of tensor `index` of `frame`,
  // decoded into dst (room for the piece) as dtype: whole rows through `basis` (those of a
  // tensor in GIFT coordinates are always whole), or a part of a row.
  void decode(giftFrame* frame, uint64_t index, const giftBasis* basis, uint64_t r0, uint64_t n,
              uint64_t c0, uint64_t w, void* dst, giftDType_t dtype) const;
  // A tensor without rows is one empty piece, so that its sections are still read and their
  // checksums checked, as for any other tensor.
  template <typename F>
  void each(F&& f) const {
    if (rows == 0) f(uint64_t(0), uint64_t(0), uint64_t(0), cols);
    for (uint64_t r0 = 0; r0 < rows;) {
      if (!part) {
        const uint64_t r1 = piece_end(r0, std::min(band, rows - r0), row_aligns);
        f(r0, r1 - r0, uint64_t(0), cols);
        r0 = r1;
        continue;
      }
      for (uint64_t c0 = 0; c0 < cols;) {
        const uint64_t c1 = piece_end(c0, std::min(part, cols - c0), col_aligns);
        f(r0, uint64_t(1), c0, c1 - c0);
        c0 = c1;
      }
      ++r0;
    }
  }
  // Where the piece of at most `most` from x0 ends: before the next multiple of each alignment
  // that x0 is not a multiple of.
  static uint64_t piece_end(uint64_t x0, uint64_t most, const Aligns& aligns) {
    uint64_t x1 = x0 + most;
    for (const uint64_t a : aligns) {
      if (a > 1 && x0 % a) x1 = std::min(x1, x0 - x0 % a + a);
    }
    return x1;
  }
};

// Where scratch data for `output` goes: its folder (so copying it in stays in one file
// system); for "" (standard output), $TMPDIR or /tmp.
std::string scratch_dir(const std::string& output);

using OutputPtr = std::unique_ptr<giftOutput, decltype(&giftOutputFree)>;

// Standard output (named `path` in messages), or the file `path`: unnamed or under a
// temporary name until committed, then renamed, and synced first only with --fsync (`sync`),
// as cp, gzip and zstd leave their outputs to the kernel's writeback. Without -f (`replace`
// false) it takes the name only if the name is still free then: check_output looked before
// the work, and a file made there meanwhile is kept (the command fails). A file takes the
// permission bits its `inputs` share (those every one that is a regular file has), as gzip
// and zstd give theirs: a dump only its owner reads does not come out readable by all.
OutputPtr open_output(const std::string& path, int fd, bool sync, bool replace,
                      const std::vector<std::string>& inputs);

// Where a command writes `path`: standard output (std_out), a character device or a FIFO
// named as the output (/dev/null, a named pipe), which a rename cannot replace and which is
// written as the bytes come, as standard output is; or a file.
struct OutputTarget {
  bool std_out = false, device = false;
  int device_fd = -1;  // a character device, opened by check_target
  bool streamed() const { return std_out || device; }
  // The descriptor for open_output: standard output's; the device's; a FIFO's, opened for
  // writing now (that blocks until its reader comes, so commands call this once their input
  // is read); -1 for a file.
  int open_fd(const std::string& path, bool force) const;
};
// Checked before any work: standard output, or a character device named as the output (opened
// now, as a shell's redirection would), refused while it is a terminal unless `force`; a file
// as check_output says.
OutputTarget check_target(const std::string& path, bool std_out, bool force,
                          const std::vector<std::string>& inputs);
bool is_device(const std::string& path);

// `size` bytes as the file `path`, or into `fd` (standard output, a device or a FIFO, named
// `path` in messages), through open_output.
void write_output(const std::string& path, int fd, const void* data, uint64_t size, bool sync,
                  bool replace, const std::vector<std::string>& inputs);

// "label: i/n" on standard error while it is a terminal and not quiet.
class Progress {
 public:
  Progress(const char* label, uint64_t total, const Verbosity& v);
  ~Progress();
  void step(uint64_t done);
  // Clears the line before a message on standard error (the next step draws it again).
  void clear() const;
  // Clears it for good, before the command's summary (which the destructor's clearing came
  // after, the summary then following "decode: 5/5" on its line).
  void end();

 private:
  const char* label_;
  uint64_t total_;
  bool on_;
};

}  // namespace giftc
