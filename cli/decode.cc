// giftc decode: a GIFT frame back to a tensor file, tensor by tensor and band by band
// through one reused buffer, so memory does not grow with the output.
#include <algorithm>
#include <map>
#include <memory>
#include <new>

#include "commands.h"
#include "device.h"
#include "io/tensor_file.h"

namespace giftc {
namespace {

// The output buffer: bands of rows of about this many bytes per thread, so that a band stays
// in the cores' own caches from its decode to write(2)'s copy: a 512 MiB fp32 dump decoded
// on one thread in 0.163 s through 512 KiB bands, 0.182 s through 8 MiB ones.
constexpr uint64_t kBandBytesPerThread = uint64_t(512) << 10;
// The most for any band, and the size of those of tensors in GIFT coordinates: when their
// inverse whitening ran BLAS on each band (OpenBLAS with its own threads), it ran erratically on
// 512 KiB bands, 0.16 to 0.26 s for 128 MiB of them, and took a steady 0.18 s on 8 MiB ones.
// Well below the size from which the codec streams its stores past the caches (codec.cc,
// kStreamBytes), which would leave write(2) to read the band from memory.
constexpr uint64_t kMostBandBytes = uint64_t(8) << 20;

struct DecodeOptions {
  std::string input, output, dtype, basis, format, device = "cpu";
  int threads = 0;
  bool force = false, to_stdout = false, fsync = false;
};

// IN without .gift, with ".decoded" before its tensor-file extension: decoding
// x.safetensors.gift must not aim at x.safetensors, most likely the user's lossless original.
std::string default_output(const std::string& in) {
  std::string base = in;
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".gift") == 0)
    base.resize(base.size() - 5);
  std::string ext = ".safetensors";  // .npz is read-only here, and unknown names get one
  if (gift::io::kind_of_path(base) == gift::io::FileKind::kNpy) ext = ".npy";
  if (gift::io::kind_of_path(base) != gift::io::FileKind::kUnknown) base.resize(base.rfind('.'));
  return base + ".decoded" + ext;
}

std::map<std::string, std::string> metadata_map(const giftFrame* f) {
  std::map<std::string, std::string> md;
  for (auto& [k, v] : frame_metadata(f)) md[k] = v;
  return md;
}

// Where the output goes and in which format: --format, else the output's extension; standard
// output (-c, -o -, or input from standard input without -o) is safetensors unless told.
struct Target {
  bool to_stdout;
  std::string path;  // for messages: the file, or "standard output"
  gift::io::FileKind kind;
};

Target target_of(const DecodeOptions& o) {
  Target t;
  t.to_stdout = o.to_stdout || o.output == "-" || (o.input == "-" && o.output.empty());
  if (o.to_stdout && !o.output.empty()) throw Failure(kUsage, "-c and -o: give one");
  t.path = t.to_stdout ? "standard output" : o.output.empty() ? default_output(o.input) : o.output;
  if (o.format == "safetensors") {
    t.kind = gift::io::FileKind::kSafetensors;
  } else if (o.format == "npy") {
    t.kind = gift::io::FileKind::kNpy;
  } else if (!o.format.empty()) {
    throw Failure(kUsage, "--format: '" + o.format + "' is not safetensors or npy");
  } else {
    // A device or a FIFO without an extension (/dev/null) takes safetensors as standard
    // output does; one named .npy, .npy.
    t.kind = t.to_stdout ? gift::io::FileKind::kSafetensors : gift::io::kind_of_path(t.path);
    if (t.kind == gift::io::FileKind::kUnknown && is_device(t.path))
      t.kind = gift::io::FileKind::kSafetensors;
  }
  if (t.kind != gift::io::FileKind::kSafetensors && t.kind != gift::io::FileKind::kNpy) {
    throw Failure(kUsage, t.path + ": output must be .safetensors or .npy (or give --format)");
  }
  return t;
}

void run_decode(const DecodeOptions& o, const Verbosity& v) {
  const int threads = bound_threads(o.threads);
  Target target = target_of(o);
  const OutputTarget where =
      check_target(target.path, target.to_stdout, o.force, {o.input, o.basis});
  target.to_stdout = where.streamed();
  const Device device = parse_device(o.device);
  const BasisPtr basis = read_basis(o.basis);
  const FramePtr f = open_frame(o.input);
  use_device(f.get(), device);
  check(giftFrameSetThreads(f.get(), o.threads));
  // A file is written unnamed (or under a temporary name) and discarded on any error, so its
  // bands may be checked as they are decoded (the codes read once, not twice); standard
  // output cannot take back what it was given, and gets no band of a damaged section.
  check(giftFrameSetLateChecksums(f.get(), !target.to_stdout));
  const uint64_t n = giftFrameTensorCount(f.get());
  const bool npy = target.kind == gift::io::FileKind::kNpy;
  if (npy && n != 1) {
    throw Failure(kUsage, o.input + ": holds " + std::to_string(n) +
                              " tensors; a .npy file holds one (decode to .safetensors)");
  }
  // Per tensor, what the output's header and the loop below need (a frame's information on
  // a tensor, all of it kept, took 350 bytes a tensor): its header, and its pieces, bands of
  // rows, or parts of rows longer than the budget (a tensor in GIFT coordinates decodes whole
  // rows, of its basis' width), for the threads the library will run; and a buffer sized for
  // the largest piece.
  std::vector<gift::io::TensorHeader> headers;
  std::vector<Pieces> pieces;
  headers.reserve(n);
  pieces.reserve(n);
  uint64_t buffer_bytes = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const giftTensorInfo e = tensor_info(f.get(), i);
    const giftDType_t dt = o.dtype.empty() ? e.dtype : parse_dtype(o.dtype);
    if (npy && dt == GIFT_DTYPE_BF16) {
      throw Failure(kUsage, o.dtype.empty()
                                ? "tensor '" + std::string(e.name) +
                                      "' is bf16, which .npy cannot hold: decode to "
                                      ".safetensors, or to .npy with --dtype f32"
                                : "--dtype bf16: .npy has no bfloat16 type (use .safetensors)");
    }
    headers.push_back({e.name, std::vector<uint64_t>(e.shape, e.shape + e.ndim), dt});
    const uint64_t size = giftDTypeSize(dt);
    // A tensor in GIFT coordinates is whitened back in fp32 (in place, or for a 16-bit output
    // in an fp32 copy of the band the library makes): its bands are counted in fp32 bytes.
    const uint64_t elements =
        e.coords == GIFT_COORDS_GIFT
            ? kMostBandBytes / sizeof(float)
            : std::min(kBandBytesPerThread * uint64_t(threads), kMostBandBytes) / size;
    pieces.emplace_back(e.rows, e.cols, Pieces::Aligns{e.row_align, 1},
                        Pieces::Aligns{e.col_align, 1}, elements);
    buffer_bytes = std::max(buffer_bytes, pieces.back().piece_elements() * size);
  }
  // Where a processor is free, a second buffer: each piece is written behind (write(2)'s copy
  // on that processor) while the next one is decoded into the other buffer; not where that
  // buffer cannot be had (a bound on memory). Made before the output, so that they outlive any
  // write still running when it is freed.
  std::unique_ptr<uint8_t[]> buffer[2];
  buffer[0].reset(new uint8_t[std::max<uint64_t>(1, buffer_bytes)]);
  if (buffer_bytes && threads < giftProcessors())
    buffer[1].reset(new (std::nothrow) uint8_t[buffer_bytes]);

  // Before the output exists: a header that cannot be written fails first.
  const std::vector<uint8_t> head =
      npy ? gift::io::npy_header(headers[0])
          : gift::io::safetensors_header(headers, metadata_map(f.get()),
                                         gift::io::input_name(o.input));
  const OutputPtr out =
      open_output(target.path, where.open_fd(target.path, o.force), o.fsync, o.force, {o.input});
  uint64_t total = head.size();
  for (const gift::io::TensorHeader& h : headers) total += h.elements() * giftDTypeSize(h.dtype);
  check(giftOutputReserve(out.get(), total));
  check(giftOutputWrite(out.get(), head.data(), head.size()));
  Progress progress("decode", n, v);
  const bool behind = bool(buffer[1]);
  uint64_t turn = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const giftDType_t dt = headers[i].dtype;
    pieces[i].each([&](uint64_t r0, uint64_t rows, uint64_t c0, uint64_t cols) {
      const uint64_t bytes = rows * cols * giftDTypeSize(dt);
      uint8_t* into = buffer[behind ? turn++ % 2 : 0].get();
      try {
        pieces[i].decode(f.get(), i, basis.get(), r0, rows, c0, cols, into, dt);
      } catch (...) {
        check(giftOutputWait(out.get()));  // the earlier failure: a band's write before it
        throw;
      }
      check(behind ? giftOutputWriteBehind(out.get(), into, bytes)
                   : giftOutputWrite(out.get(), into, bytes));
    });
    progress.step(i + 1);
  }
  check(giftOutputCommit(out.get()));
  progress.end();
  if (!v.quiet)
    std::fprintf(stderr, "%s: %llu tensor%s -> %s\n",
                 shown(gift::io::input_name(o.input), stderr).c_str(), (unsigned long long)n,
                 n == 1 ? "" : "s", shown(target.path, stderr).c_str());
}

}  // namespace

void add_decode(CLI::App& app, Verbosity& v) {
  auto o = std::make_shared<DecodeOptions>();
  CLI::App* c = app.add_subcommand("decode", "Decode a GIFT frame to .safetensors or .npy");
  c->add_option("IN", o->input, "Input frame (.gift; - reads standard input)")->required();
  c->add_option("-o,--output", o->output,
                "Output file (default: IN without .gift, as NAME.decoded.safetensors or .npy; "
                "- writes standard output)")
      ->check(file_name());
  c->add_flag("-c,--stdout", o->to_stdout, "Write to standard output");
  c->add_option("--format", o->format,
                "Output format: safetensors or npy (default: by the output's extension; "
                "safetensors on standard output)");
  c->add_option("--dtype", o->dtype,
                "Output element type: f32, bf16 or f16 (default: each tensor's own)");
  c->add_option("--basis", o->basis,
                "Basis (.giftb) for tensors in GIFT coordinates (default: the embedded one)")
      ->check(file_name());
  c->add_option("--device", o->device,
                "Where to decode: cpu or cuda (the same values; the inverse whitening of "
                "tensors in GIFT coordinates stays on the CPU)")
      ->capture_default_str();
  add_threads_option(c, &o->threads);
  c->add_flag("-f,--force", o->force,
              "Overwrite an existing output; write binary data to a terminal");
  add_fsync_flag(c, &o->fsync);
  c->callback([o, &v] { run_decode(*o, v); });
}

}  // namespace giftc
