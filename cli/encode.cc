// giftc encode: a tensor file to a GIFT frame.
#include <re2/re2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "commands.h"
#include "device.h"
#include "io/tensor_file.h"

namespace giftc {
namespace {

// An --include or --exclude pattern (null for none). RE2 takes time linear in the name and
// a bounded stack whatever the pattern: std::regex backtracked, recursing per character, so
// that a hostile file's 30,000-byte name overflowed its stack and a pattern such as (a*)*b
// ran for ever. Latin-1, so that names are matched as bytes (. is one byte), as documented.
std::unique_ptr<RE2> name_pattern(const std::string& text, const char* option) {
  if (text.empty()) return nullptr;
  RE2::Options options;
  options.set_encoding(RE2::Options::EncodingLatin1);
  options.set_log_errors(false);
  auto re = std::make_unique<RE2>(text, options);
  if (!re->ok()) {
    throw Failure(kUsage, std::string(option) + ": bad regular expression: " + re->error());
  }
  return re;
}

bool matches(const std::unique_ptr<RE2>& re, const std::string& name) {
  return RE2::PartialMatch(name, *re);
}

struct EncodeOptions {
  std::string input, output;
  std::string fp8 = "e4m3", scale = "block:128", scale_dtype = "f32", rounding = "nearest";
  std::string seed = "0";
  int zstd = 0;
  std::string include, exclude;
  int threads = 0;
  bool keep_nonfinite = false, force = false, to_stdout = false, fsync = false;
  std::string basis, coords;
  std::string frame;  // the deprecated spelling of --coords, kept for one release
  bool embed_basis = false;
  double margin = 0.05, budget = 0;
  uint32_t min_dim = 16;
  std::string device = "cpu";
};

// The error the codec gives FP8 tensors with NaN or Inf, for a tensor stored losslessly.
void refuse_nonfinite(const gift::io::TensorRef& t, const std::string& file) {
  const uint64_t n = t.elements();
  const size_t width = giftDTypeSize(t.dtype);
  const uint8_t* data = t.data();
  std::vector<float> chunk(4096);
  uint64_t count = 0, first = 0;
  for (uint64_t i0 = 0; i0 < n; i0 += chunk.size()) {
    const uint64_t m = std::min<uint64_t>(chunk.size(), n - i0);
    check(giftConvert(data + i0 * width, t.dtype, chunk.data(), GIFT_DTYPE_F32, m), file);
    for (uint64_t k = 0; k < m; ++k) {
      if (!std::isfinite(chunk[k]) && count++ == 0) first = i0 + k;
    }
  }
  if (count) {
    throw Failure(kBadInput, file + ": tensor '" + t.name + "': " + std::to_string(count) +
                                 " non-finite value" + (count == 1 ? "" : "s") +
                                 " in the input, the first at index " + std::to_string(first) +
                                 " (--keep-nonfinite stores them)");
  }
}

void run_encode(const EncodeOptions& o, const Verbosity& v) {
  bound_threads(o.threads);
  giftQuantParams p;
  giftQuantParamsInit(&p);
  p.kind = parse_fp8(o.fp8);
  parse_scale(o.scale, &p);
  p.scale_dtype = parse_scale_dtype(o.scale_dtype);
  p.rounding = parse_rounding(o.rounding);
  p.seed = parse_uint(o.seed, "--seed", 0, UINT64_MAX);
  const Device device = parse_device(o.device);
  p.nonfinite = o.keep_nonfinite ? GIFT_NONFINITE_KEEP : GIFT_NONFINITE_ERROR;
  if (o.zstd < 0 || o.zstd > 22) throw Failure(kUsage, "--zstd: level must be in 1..22");
  const std::unique_ptr<RE2> include = name_pattern(o.include, "--include"),
                             exclude = name_pattern(o.exclude, "--exclude");
  // Standard output with -c or -o -, and by default for standard input, as zstd does.
  if (o.to_stdout && !o.output.empty()) throw Failure(kUsage, "-c and -o: give one");
  const bool std_out = o.to_stdout || o.output == "-" || (o.input == "-" && o.output.empty());
  const std::string out = std_out            ? "standard output"
                          : o.output.empty() ? o.input + ".gift"
                                             : o.output;
  const OutputTarget target = check_target(out, std_out, o.force, {o.input, o.basis});
  const bool to_stdout = target.streamed();

  giftSelectParams select = GIFT_SELECT_PARAMS_INIT;
  if (!(o.margin >= 0 && o.margin < 1)) throw Failure(kUsage, "--margin must be in [0, 1)");
  if (!(o.budget >= 0) || !std::isfinite(o.budget))
    throw Failure(kUsage, "--flops-budget must be a finite number, not negative");
  select.margin = o.margin;
  select.flops_budget = o.budget;
  select.min_dim = o.min_dim;
  if (!o.frame.empty()) {
    if (!o.coords.empty()) throw Failure(kUsage, "--frame is the old name of --coords: give one");
    if (!v.quiet) std::fprintf(stderr, "giftc: warning: --frame is deprecated; use --coords\n");
  }
  const std::string given = o.coords.empty() ? o.frame : o.coords;
  const std::string mode = given.empty() ? (o.basis.empty() ? "euclidean" : "auto") : given;
  if (mode == "euclidean") {
    select.mode = GIFT_COORDS_MODE_EUCLIDEAN;
  } else if (mode == "gift" || mode == "auto") {
    select.mode = mode == "gift" ? GIFT_COORDS_MODE_GIFT : GIFT_COORDS_MODE_AUTO;
    if (o.basis.empty()) throw Failure(kUsage, "--coords " + mode + " needs --basis FILE.giftb");
  } else {
    throw Failure(kUsage, "--coords: '" + mode + "' is not euclidean, gift or auto");
  }
  if (o.embed_basis && o.basis.empty())
    throw Failure(kUsage, "--embed-basis needs --basis FILE.giftb");
  // Options that would do nothing, said so rather than taken silently (a script may pass them
  // every time, so not refused): given other than their defaults.
  const EncodeOptions defaults;
  if (!v.quiet && o.basis.empty() &&
      (o.margin != defaults.margin || o.min_dim != defaults.min_dim || o.budget != defaults.budget))
    std::fprintf(stderr,
                 "giftc: warning: --margin, --min-dim and --flops-budget choose coordinates "
                 "with --basis; without one they do nothing\n");
  if (!v.quiet && p.rounding != GIFT_ROUND_STOCHASTIC && p.seed != 0)
    std::fprintf(stderr,
                 "giftc: warning: --seed is for --rounding stochastic; it does nothing here\n");
  const BasisPtr basis = read_basis(o.basis);

  gift::io::TensorFile in;
  gift::io::read_tensor_file(o.input, &in);
  const WriterPtr w = new_writer();
  // Encoded sections that cannot go straight into the output (see below) wait in an unnamed
  // file beside it, not in memory.
  check(giftFrameWriterSetScratchDir(w.get(), scratch_dir(to_stdout ? "" : out).c_str()));
  use_device(w.get(), device);
  check(giftFrameWriterSetCompression(w.get(), o.zstd));
  check(giftFrameWriterSetThreads(w.get(), o.threads));
  for (const auto& [k, val] : in.metadata) {
    if (giftFrameWriterAddMetadata(w.get(), k.c_str(), val.c_str()) != GIFT_OK)
      throw Failure(kBadInput, o.input + ": " + giftGetLastErrorMessage());
  }
  if (o.embed_basis) check(giftFrameWriterEmbedBasis(w.get(), basis.get()));

  // Only matrices (2-D and up) are quantized; vectors, scalars and excluded tensors are
  // stored losslessly and come back bit-identical.
  std::vector<int> lossless(in.tensors.size());
  std::vector<const char*> names(in.tensors.size());
  std::vector<uint32_t> ndims(in.tensors.size());
  bool any_included = false;
  for (size_t i = 0; i < in.tensors.size(); ++i) {
    const gift::io::TensorRef& t = in.tensors[i];
    const bool included = !include || matches(include, t.name);
    any_included = any_included || included;
    const bool selected = included && !(exclude && matches(exclude, t.name));
    lossless[i] = !(selected && t.shape.size() >= 2);
    names[i] = t.name.c_str();
    ndims[i] = uint32_t(t.shape.size());
  }
  // A pattern that matches nothing is likely a mistake (its stored size says so only later).
  if (!o.include.empty() && !any_included && !in.tensors.empty() && !v.quiet) {
    std::fprintf(stderr,
                 "giftc: warning: --include matches no tensor: every one is stored losslessly\n");
  }
  const OutputPtr output =
      open_output(out, target.open_fd(out, o.force), o.fsync, o.force, {o.input});
  giftOutput* sink = output.get();
  // A file gets the sections as they are made, its header written in front at the end. The
  // sections wait in the scratch file for a pipe, and where the header's length is known
  // only at the end: choosing coordinates records each choice, with its reason, there.
  if (!to_stdout && (!basis || select.mode == GIFT_COORDS_MODE_EUCLIDEAN)) {
    check(giftFrameWriterStreamTo(w.get(), sink, names.size(), names.data(), ndims.data(),
                                  lossless.data()));
  }

  uint64_t in_bytes = 0, quantized = 0, in_gift = 0;
  gift::io::PagesReleaser released;
  Progress progress("encode", in.tensors.size(), v);
  for (size_t i = 0; i < in.tensors.size(); ++i) {
    const gift::io::TensorRef& t = in.tensors[i];
    const bool fp8 = !lossless[i];
    giftQuantParams tp = p;
    tp.tensor_index = uint32_t(i);
    const uint32_t ndim = uint32_t(t.shape.size());
    giftSelection chosen = GIFT_SELECTION_INIT;
    // Lossless tensors obey the same non-finite rule as FP8 ones (the codec checks those).
    if (!fp8 && !o.keep_nonfinite) refuse_nonfinite(t, o.input);
    const giftResult_t r =
        fp8 ? giftFrameWriterAddTensorInBasis(w.get(), t.name.c_str(), t.shape.data(), ndim,
                                              t.dtype, t.data(), &tp, basis.get(), &select, &chosen)
            : giftFrameWriterAddTensor(w.get(), t.name.c_str(), t.shape.data(), ndim, t.dtype,
                                       t.data(), nullptr);
    if (r == GIFT_ERROR_NONFINITE_INPUT) {  // as refuse_nonfinite says it of lossless ones
      throw Failure(kBadInput,
                    o.input + ": " + giftGetLastErrorMessage() + " (--keep-nonfinite stores them)");
    }
    check(r, o.input);
    released.release(in, i);
    // --coords gift asked for GIFT coordinates: a tensor the basis names but cannot take
    // (another width, too small, non-finite or too large values) says why it stays Euclidean.
    uint64_t entry = 0;
    if (fp8 && select.mode == GIFT_COORDS_MODE_GIFT && chosen.chosen != GIFT_COORDS_GIFT &&
        !v.quiet && giftBasisFindEntry(basis.get(), t.name.c_str(), &entry) == GIFT_OK) {
      progress.clear();
      std::fprintf(stderr, "giftc: warning: tensor '%s' stays in Euclidean coordinates: %s\n",
                   shown(t.name, stderr).c_str(), chosen.reason);
    }
    in_bytes += t.bytes;
    quantized += fp8;
    in_gift += chosen.chosen == GIFT_COORDS_GIFT;
    if (v.verbose) {
      progress.clear();
      std::fprintf(
          stderr, "%s %s %s: %s%s\n", shown(t.name, stderr).c_str(),
          shape_string(t.shape.data(), ndim).c_str(), dtype_name(t.dtype).c_str(),
          fp8 ? (fp8_name(p.kind) + " " + scale_name(p)).c_str() : "raw",
          chosen.made
              ? (", " + std::string(chosen.chosen == GIFT_COORDS_GIFT ? "gift" : "euclidean") +
                 " (" + chosen.reason + ")")
                    .c_str()
              : "");
    }
    progress.step(i + 1);
  }
  check(giftFrameWriterWriteOutput(w.get(), sink));
  check(giftOutputCommit(sink));
  progress.end();
  if (!v.quiet) {
    const uint64_t out_bytes = giftOutputBytes(sink);
    std::fprintf(stderr,
                 "%s: %zu tensor%s (%llu FP8 of which %llu in GIFT coordinates, %llu raw), %s -> "
                 "%s (%.2fx) -> %s\n",
                 shown(gift::io::input_name(o.input), stderr).c_str(), in.tensors.size(),
                 in.tensors.size() == 1 ? "" : "s", (unsigned long long)quantized,
                 (unsigned long long)in_gift, (unsigned long long)(in.tensors.size() - quantized),
                 human_bytes(in_bytes).c_str(), human_bytes(out_bytes).c_str(),
                 out_bytes ? double(in_bytes) / double(out_bytes) : 0.0,
                 shown(out, stderr).c_str());
  }
}

}  // namespace

void add_encode(CLI::App& app, Verbosity& v) {
  auto o = std::make_shared<EncodeOptions>();
  CLI::App* c = app.add_subcommand(
      "encode", "Encode a tensor file (.safetensors, .npy, .npz) to a GIFT frame");
  c->add_option("IN", o->input, "Input tensor file (- reads standard input)")->required();
  c->add_option("-o,--output", o->output,
                "Output frame (default: IN.gift, or standard output for standard input; - "
                "writes standard output)")
      ->check(file_name());
  c->add_flag("-c,--stdout", o->to_stdout, "Write to standard output");
  c->add_option("--fp8", o->fp8, "FP8 kind: e4m3 or e5m2")->capture_default_str();
  c->add_option("--scale", o->scale, "Scale groups: tensor, row, block:N or tile:RxC")
      ->capture_default_str();
  c->add_option("--scale-dtype", o->scale_dtype, "Scale type: f32 or e8m0")->capture_default_str();
  c->add_option("--rounding", o->rounding, "Rounding: nearest or stochastic")
      ->capture_default_str();
  c->add_option("--seed", o->seed, "Seed of stochastic rounding")->capture_default_str();
  c->add_flag("--zstd{3}", o->zstd,
              "Compress data sections with zstd (--zstd=LEVEL, 1..22; bare: 3)");
  c->add_option("--include", o->include, "Quantize only tensors whose name matches this regex");
  c->add_option("--exclude", o->exclude, "Store tensors whose name matches this regex losslessly");
  add_threads_option(c, &o->threads);
  c->add_option("--device", o->device,
                "Where to encode: cpu or cuda (the same bytes; the choice of coordinates and the "
                "whitening stay on the CPU)")
      ->capture_default_str();
  c->add_option("--basis", o->basis, "Basis (.giftb) for GIFT coordinates")->check(file_name());
  c->add_option(
      "--coords", o->coords,
      "Coordinates: euclidean, gift or auto (default: auto with --basis, else euclidean)");
  c->add_option("--frame", o->frame, "Deprecated: the old name of --coords");
  c->add_flag("--embed-basis", o->embed_basis, "Carry the basis inside the frame");
  c->add_option("--margin", o->margin,
                "--coords auto: GIFT must lower the estimated error by this fraction")
      ->capture_default_str();
  c->add_option("--min-dim", o->min_dim, "--coords auto/gift: both dimensions at least this")
      ->capture_default_str();
  c->add_option("--flops-budget", o->budget,
                "--coords auto: largest transform cost per tensor in FLOPs (0: none)")
      ->capture_default_str();
  c->add_flag("--keep-nonfinite", o->keep_nonfinite,
              "Store NaN/Inf codes instead of failing on them");
  c->add_flag("-f,--force", o->force, "Overwrite an existing output");
  add_fsync_flag(c, &o->fsync);
  c->callback([o, &v] { run_encode(*o, v); });
}

}  // namespace giftc
