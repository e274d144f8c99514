#include "common.h"

#include <fcntl.h>
#include <langinfo.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cwchar>
#include <utility>

#include "io/tensor_file.h"

namespace giftc {

// Options are checked where they are parsed (usage errors, exit 1), so what the library
// still refuses comes from the data: an all-zero gradient, duplicate names, bad metadata.
int exit_code_for(giftResult_t r) {
  switch (r) {
    case GIFT_OK:
      return kOk;
    case GIFT_ERROR_IO:
    case GIFT_ERROR_OUT_OF_MEMORY:
      return kIoError;
    case GIFT_ERROR_BASIS_MISSING:
      return kBasis;
    default:
      return kBadInput;
  }
}

void check(giftResult_t r, const std::string& context) {
  if (r == GIFT_OK) return;
  const std::string msg = giftGetLastErrorMessage();
  throw Failure(exit_code_for(r), context.empty() ? msg : context + ": " + msg);
}

namespace {

// A path the library would refuse as not a regular file, refused here saying what to do.
void check_regular(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw Failure(kIoError, path + ": " + gift::io::not_regular(st));
}

}  // namespace

BasisPtr read_basis(const std::string& path) {
  giftBasis* b = nullptr;
  if (!path.empty()) {
    check_regular(path);
    check(giftBasisLoad(path.c_str(), &b));
  }
  return BasisPtr(b, giftBasisFree);
}

FramePtr open_frame(const std::string& path) {
  giftFrame* f = nullptr;
  if (path != "-") {
    check_regular(path);
    check(giftFrameOpenFile(path.c_str(), &f));
    return FramePtr(f, giftFrameClose);
  }
  const gift::io::MappedBytes& in = stdin_bytes();
  check(giftFrameOpen(in.data, in.size, &f), gift::io::kStdinName);
  return FramePtr(f, giftFrameClose);
}

const gift::io::MappedBytes& stdin_bytes() {
  static const gift::io::MappedBytes in = gift::io::map_stdin();
  return in;
}

WriterPtr new_writer() {
  giftFrameWriter* w = nullptr;
  check(giftFrameWriterCreate(&w));
  return WriterPtr(w, giftFrameWriterFree);
}

std::string basis_id_hex(giftBasisId id) {
  char hex[33];
  giftBasisIdFormat(id, hex);
  return hex;
}

giftTensorInfo tensor_info(const giftFrame* f, uint64_t index) {
  giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
  check(giftFrameTensorInfo(f, index, &info));
  return info;
}

std::vector<std::pair<std::string, std::string>> frame_metadata(const giftFrame* f) {
  std::vector<std::pair<std::string, std::string>> md;
  const char *k, *v;
  for (uint64_t i = 0; giftFrameMetadata(f, i, &k, &v) == GIFT_OK; ++i) md.emplace_back(k, v);
  return md;
}

giftFp8Kind_t parse_fp8(const std::string& s) {
  if (s == "e4m3") return GIFT_FP8_E4M3;
  if (s == "e5m2") return GIFT_FP8_E5M2;
  throw Failure(kUsage, "--fp8: '" + s + "' is not e4m3 or e5m2");
}

namespace {

// A string of decimal digits (non-empty, nothing else) as a number, where it is at most max.
bool digits_at_most(const std::string& digits, uint64_t max, uint64_t* v) {
  errno = 0;
  *v = std::strtoull(digits.c_str(), nullptr, 10);
  return errno != ERANGE && *v <= max;
}

}  // namespace

uint64_t parse_uint(const std::string& s, const std::string& what, uint64_t min, uint64_t max) {
  // Digits only: strtoull alone would take "-5" as 2^64 - 5 and clamp what overflows.
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) {
    throw Failure(kUsage, what + ": '" + s + "' is not " +
                              (min > 0 ? "a positive integer" : "a non-negative integer"));
  }
  uint64_t v;
  if (!digits_at_most(s, max, &v))
    throw Failure(kUsage, what + ": " + s + " is larger than " + std::to_string(max));
  if (v < min) throw Failure(kUsage, what + ": " + s + " is less than " + std::to_string(min));
  return v;
}

uint64_t parse_bytes(const std::string& s, const std::string& what, uint64_t min, uint64_t max) {
  const size_t digits = std::min(s.find_first_not_of("0123456789"), s.size());
  static const std::pair<const char*, int> kSuffixes[] = {{"", 0},     {"K", 10},   {"KiB", 10},
                                                          {"M", 20},   {"MiB", 20}, {"G", 30},
                                                          {"GiB", 30}, {"T", 40},   {"TiB", 40}};
  const auto out_of_range = [&](uint64_t limit, const char* side) {
    return Failure(kUsage, what + ": " + s + " is " + side + " than " + std::to_string(limit) +
                               (limit == 1 ? " byte" : " bytes"));
  };
  for (const auto& [name, shift] : kSuffixes) {
    if (s.compare(digits, std::string::npos, name) != 0 || digits == 0) continue;
    uint64_t v;
    // Past UINT64_MAX >> shift, the product overflows (and is past any max).
    if (!digits_at_most(s.substr(0, digits), UINT64_MAX >> shift, &v) || (v << shift) > max)
      throw out_of_range(max, "larger");
    if ((v << shift) < min) throw out_of_range(min, "less");
    return v << shift;
  }
  throw Failure(kUsage, what + ": '" + s +
                            "' is not a byte count (digits, with an optional K, M, G or T suffix)");
}

namespace {

uint32_t parse_u32(const std::string& s, const std::string& what) {
  return uint32_t(parse_uint(s, what, 1, UINT32_MAX));
}

}  // namespace

void parse_scale(const std::string& s, giftQuantParams* p) {
  if (s == "tensor") {
    p->layout = GIFT_SCALE_TENSOR;
  } else if (s == "row") {
    p->layout = GIFT_SCALE_ROW;
  } else if (s.rfind("block:", 0) == 0) {
    p->layout = GIFT_SCALE_BLOCK;
    p->block = parse_u32(s.substr(6), "--scale block");
  } else if (s.rfind("tile:", 0) == 0 && s.find('x') != std::string::npos) {
    const size_t x = s.find('x');
    p->layout = GIFT_SCALE_TILE;
    p->tile_rows = parse_u32(s.substr(5, x - 5), "--scale tile rows");
    p->tile_cols = parse_u32(s.substr(x + 1), "--scale tile columns");
  } else {
    throw Failure(kUsage, "--scale: '" + s + "' is not tensor, row, block:N or tile:RxC");
  }
  if (giftQuantParamsValidate(p) != GIFT_OK) {
    throw Failure(kUsage, std::string("--scale: ") + giftGetLastErrorMessage());
  }
}

giftScaleDType_t parse_scale_dtype(const std::string& s) {
  if (s == "f32") return GIFT_SCALE_DTYPE_F32;
  if (s == "e8m0") return GIFT_SCALE_DTYPE_E8M0;
  throw Failure(kUsage, "--scale-dtype: '" + s + "' is not f32 or e8m0");
}

giftRounding_t parse_rounding(const std::string& s) {
  if (s == "nearest") return GIFT_ROUND_NEAREST;
  if (s == "stochastic") return GIFT_ROUND_STOCHASTIC;
  throw Failure(kUsage, "--rounding: '" + s + "' is not nearest or stochastic");
}

giftDType_t parse_dtype(const std::string& s) {
  if (s == "f32") return GIFT_DTYPE_F32;
  if (s == "bf16") return GIFT_DTYPE_BF16;
  if (s == "f16") return GIFT_DTYPE_F16;
  throw Failure(kUsage, "--dtype: '" + s + "' is not f32, bf16 or f16");
}

std::string fp8_name(giftFp8Kind_t k) { return k == GIFT_FP8_E4M3 ? "e4m3" : "e5m2"; }

std::string scale_name(const giftQuantParams& p) {
  switch (p.layout) {
    case GIFT_SCALE_TENSOR:
      return "tensor";
    case GIFT_SCALE_ROW:
      return "row";
    case GIFT_SCALE_BLOCK:
      return "block:" + std::to_string(p.block);
    default:
      return "tile:" + std::to_string(p.tile_rows) + "x" + std::to_string(p.tile_cols);
  }
}

std::string scale_dtype_name(giftScaleDType_t d) {
  return d == GIFT_SCALE_DTYPE_F32 ? "f32" : "e8m0";
}

std::string dtype_name(giftDType_t d) {
  return d == GIFT_DTYPE_F32 ? "f32" : d == GIFT_DTYPE_BF16 ? "bf16" : "f16";
}

std::string shape_string(const uint64_t* shape, uint32_t ndim) {
  std::string s = "[";
  for (uint32_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b < 1024) {
    std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)b);
  } else if (b < (1u << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024);
  } else if (b < (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / (1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / (1 << 30));
  }
  return buf;
}

namespace {

// The character set the environment names (LC_ALL, LC_CTYPE, LANG), as a terminal shows text
// in: null where it names none this machine has. Read once; the process's own locale stays C.
locale_t terminal_locale() {
  static const locale_t loc = ::newlocale(LC_CTYPE_MASK, "", static_cast<locale_t>(0));
  return loc;
}

bool utf8_terminal() {
  static const bool utf8 = [] {
    const locale_t loc = terminal_locale();
    return loc && std::strcmp(::nl_langinfo_l(CODESET, loc), "UTF-8") == 0;
  }();
  return utf8;
}

}  // namespace

std::string shown(const std::string& text, FILE* stream) {
  if (!::isatty(::fileno(stream))) return text;
  const bool utf8 = utf8_terminal();
  std::string out;
  const auto escape = [&out](const char* format, unsigned v) {
    char buf[12];
    std::snprintf(buf, sizeof buf, format, v);
    out += buf;
  };
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t len = gift::io::utf8_sequence_length(text, i);
    if (c < 0x20 || c == 0x7F || (c >= 0x80 && (!utf8 || len == 0))) {
      escape("\\x%02X", c);
      ++i;
    } else if (c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {  // C1: U+0080-9F
      escape("\\u%04X", static_cast<unsigned char>(text[i + 1]) & 0xFFu);
      i += 2;
    } else {
      out.append(text, i, len);
      i += len;
    }
  }
  return out;
}

std::string padded(const std::string& text, size_t width) {
  // The terminal's columns: two for a wide character (CJK), none for a combining mark, one for
  // what its character set cannot read.
  size_t columns = 0;
  const locale_t loc = terminal_locale();
  const locale_t before = loc ? ::uselocale(loc) : static_cast<locale_t>(0);
  std::mbstate_t state{};
  for (size_t i = 0; i < text.size();) {
    wchar_t wc = 0;
    const size_t len = std::mbrtowc(&wc, text.data() + i, text.size() - i, &state);
    if (len == 0 || len > text.size() - i) {
      state = std::mbstate_t{};
      ++columns;
      ++i;
      continue;
    }
    const int w = ::wcwidth(wc);
    columns += w < 0 ? 1 : size_t(w);
    i += len;
  }
  if (loc) ::uselocale(before);
  return columns < width ? text + std::string(width - columns, ' ') : text;
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

void check_output(const std::string& path, bool force, const std::vector<std::string>& inputs) {
  struct stat out;
  if (::lstat(path.c_str(), &out) != 0) return;
  if (S_ISLNK(out.st_mode)) {  // /dev/stdout with standard output on a file is one
    throw Failure(kUsage, path +
                              ": is a symbolic link; giftc replaces only regular files (for "
                              "standard output, give -o -)");
  }
  if (!S_ISREG(out.st_mode)) {
    throw Failure(kUsage, path +
                              ": exists and is not a regular file; giftc replaces only "
                              "regular files");
  }
  for (const std::string& in : inputs) {
    struct stat st;
    if (::stat(in.c_str(), &st) == 0 && st.st_dev == out.st_dev && st.st_ino == out.st_ino)
      throw Failure(kUsage, path + ": is the input " + in + "; choose another output");
  }
  if (!force) throw Failure(kUsage, path + ": already exists (use -f to overwrite)");
}

namespace {

// The least common multiple of `aligns` (1 for none), or 0 past `most`.
uint64_t lcm_within(const Pieces::Aligns& aligns, uint64_t most) {
  uint64_t l = 1;
  for (const uint64_t a : aligns) {
    uint64_t x = l, y = a;
    while (y) x = std::exchange(y, x % y);
    if (l / x > most / a) return 0;
    l = l / x * a;
  }
  return l;
}

}  // namespace

Pieces::Pieces(uint64_t rows_, uint64_t cols_, Aligns row_aligns_, Aligns col_aligns_,
               uint64_t budget)
    : rows(rows_), cols(cols_), row_aligns(row_aligns_), col_aligns(col_aligns_) {
  if (cols == 0) {  // no elements: one band, however many rows (2^58 of them were 2^37 bands)
    band = std::max<uint64_t>(rows, 1);
    return;
  }
  const uint64_t fit = budget / cols;  // whole rows within the budget
  const bool whole_rows = std::count(col_aligns.begin(), col_aligns.end(), 0) > 0;
  if (fit || whole_rows) {
    const uint64_t l = lcm_within(row_aligns, fit);
    band = std::min(l ? fit / l * l : std::max<uint64_t>(fit, 1), std::max<uint64_t>(rows, 1));
    return;
  }
  const uint64_t l = lcm_within(col_aligns, budget);
  part = std::min(cols, l ? budget / l * l : budget);
}

void Pieces::decode(giftFrame* frame, uint64_t index, const giftBasis* basis, uint64_t r0,
                    uint64_t n, uint64_t c0, uint64_t w, void* dst, giftDType_t dtype) const {
  const uint64_t bytes = n * w * giftDTypeSize(dtype);
  check(w == cols ? giftFrameDecodeRowsWithBasis(frame, index, r0, n, basis, dst, bytes, dtype)
                  : giftFrameDecodeRowPart(frame, index, r0, c0, w, dst, bytes, dtype));
}

std::string scratch_dir(const std::string& output) {
  if (output.empty()) return gift::io::temp_dir();
  const size_t slash = output.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : output.substr(0, slash);
}

OutputPtr open_output(const std::string& path, int fd, bool sync, bool replace,
                      const std::vector<std::string>& inputs) {
  giftOutput* out = nullptr;
  check(fd >= 0 ? giftOutputOpenFd(fd, path.c_str(), &out)
                : giftOutputOpenFile(path.c_str(), &out));
  OutputPtr owned(out, giftOutputFree);
  check(giftOutputSetSync(out, sync));
  check(giftOutputSetReplace(out, replace));
  unsigned shared = 0777;
  bool any = false;
  for (const std::string& in : inputs) {
    struct stat st;
    if (in.empty() || in == "-" || ::stat(in.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    shared &= unsigned(st.st_mode) & 0777;
    any = true;
  }
  if (any) check(giftOutputSetMode(out, shared));
  return owned;
}

namespace {

// 'c' for a character device, 'p' for a FIFO, else 0.
char device_kind(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return S_ISCHR(st.st_mode) ? 'c' : S_ISFIFO(st.st_mode) ? 'p' : 0;
}

// `path` opened for writing, refused while it is a terminal unless `force`.
int open_not_terminal(const std::string& path, bool force) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) throw Failure(kIoError, path + ": cannot open: " + std::strerror(errno));
  if (::isatty(fd) && !force) {
    ::close(fd);
    throw Failure(kUsage, path + ": not writing binary data to a terminal (or -f)");
  }
  return fd;
}

}  // namespace

bool is_device(const std::string& path) { return device_kind(path) != 0; }

OutputTarget check_target(const std::string& path, bool std_out, bool force,
                          const std::vector<std::string>& inputs) {
  OutputTarget t;
  t.std_out = std_out;
  const char kind = std_out ? 0 : device_kind(path);
  t.device = kind != 0;
  if (std_out) {
    if (::isatty(STDOUT_FILENO) && !force)
      throw Failure(kUsage, "not writing binary data to a terminal (redirect it, or -f)");
  } else if (!t.device) {
    check_output(path, force, inputs);
  } else if (kind == 'c') {
    t.device_fd = open_not_terminal(path, force);
  }
  return t;
}

int OutputTarget::open_fd(const std::string& path, bool force) const {
  if (std_out) return STDOUT_FILENO;
  if (device_fd >= 0) return device_fd;
  return device ? open_not_terminal(path, force) : -1;
}

CLI::Validator file_name() {
  return CLI::Validator(
      [](const std::string& v) { return v.empty() ? std::string("an empty file name") : ""; }, "",
      "file name");
}

void add_threads_option(CLI::App* command, int* threads) {
  command
      ->add_option("--threads", *threads,
                   "Threads, at most one per processor (default: every processor giftc may "
                   "use, as its CPU affinity and cgroup CPU quota allow)")
      ->check(CLI::Validator(
          [](const std::string& v) {
            // As the number is read: after any leading blanks (" -1" was let through).
            const size_t at = v.find_first_not_of(" \t\n\v\f\r");
            return at != std::string::npos && v[at] == '-' ? "must not be negative" : "";
          },
          "", "non-negative"));
}

namespace {

int codec_threads(int asked) {
  giftCtx* raw = nullptr;
  check(giftCtxCreate(&raw));
  const std::unique_ptr<giftCtx, decltype(&giftCtxFree)> ctx(raw, giftCtxFree);
  check(giftCtxSetThreads(ctx.get(), asked));
  return giftCtxThreads(ctx.get());
}

// A thread count from the environment as OpenBLAS reads it (atoi), or 0 where unset: an
// empty or smaller value counts as unset.
int count_in(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::max(std::atoi(v), 0) : 0;
}

}  // namespace

int bound_threads(int asked) {
  const int threads = codec_threads(asked);
  omp_set_num_threads(threads);
  // OpenBLAS counts neither --threads nor a cgroup's CPU quota: on its own it works on one
  // thread per processor of the affinity (or OMP_NUM_THREADS's count). libgift loads it only
  // when a command first needs it (fit, metrics against A), and OpenBLAS then takes its count
  // from OPENBLAS_NUM_THREADS, set here unless given: --threads's count, never more than
  // OpenBLAS would start (a larger pool reserves a buffer per thread, which under a ulimit -v
  // OpenBLAS 0.3.21 retries forever; OMP_NUM_THREADS=1 keeps it at 1).
  if (!count_in("OPENBLAS_NUM_THREADS") && !count_in("GOTO_NUM_THREADS")) {
    const int omp = count_in("OMP_NUM_THREADS");
    const int blas = omp ? std::min(threads, omp) : threads;
    setenv("OPENBLAS_NUM_THREADS", std::to_string(blas).c_str(), 1);
  }
  return threads;
}

void add_fsync_flag(CLI::App* command, bool* fsync) {
  command->add_flag("--fsync", *fsync,
                    "Sync the output and its folder to the disk before the command ends "
                    "(slower; the output then survives a crash of the machine)");
}

void write_output(const std::string& path, int fd, const void* data, uint64_t size, bool sync,
                  bool replace, const std::vector<std::string>& inputs) {
  const OutputPtr out = open_output(path, fd, sync, replace, inputs);
  check(giftOutputReserve(out.get(), size));
  check(giftOutputWrite(out.get(), data, size));
  check(giftOutputCommit(out.get()));
}

Progress::Progress(const char* label, uint64_t total, const Verbosity& v)
    : label_(label), total_(total), on_(!v.quiet && ::isatty(STDERR_FILENO) && total > 1) {}

Progress::~Progress() { clear(); }

void Progress::clear() const {
  if (on_) std::fprintf(stderr, "\r\033[K");
}

void Progress::end() {
  clear();
  on_ = false;
}

void Progress::step(uint64_t done) {
  if (on_)
    std::fprintf(stderr, "\r%s: %llu/%llu", label_, (unsigned long long)done,
                 (unsigned long long)total_);
}

}  // namespace giftc
