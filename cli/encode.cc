// giftc encode: a tensor file to a GIFT frame.
#include <sys/stat.h>

#include <memory>
#include <regex>

#include "commands.h"
#include "io/tensor_file.h"

namespace giftc {
namespace {

struct EncodeOptions {
  std::string input, output;
  std::string fp8 = "e4m3", scale = "block:128", scale_dtype = "f32", rounding = "nearest";
  uint64_t seed = 0;
  int zstd = 0;
  std::string include, exclude;
  int threads = 0;
  bool keep_nonfinite = false, force = false;
};

void run_encode(const EncodeOptions& o, const Verbosity& v) {
  giftQuantParams p;
  giftQuantParamsInit(&p);
  p.kind = parse_fp8(o.fp8);
  parse_scale(o.scale, &p);
  p.scale_dtype = parse_scale_dtype(o.scale_dtype);
  p.rounding = parse_rounding(o.rounding);
  p.seed = o.seed;
  p.threads = o.threads;
  p.nonfinite = o.keep_nonfinite ? GIFT_NONFINITE_KEEP : GIFT_NONFINITE_ERROR;
  if (o.zstd < 0 || o.zstd > 22) throw Failure(kUsage, "--zstd: level must be in 1..22");
  std::regex include, exclude;
  try {
    if (!o.include.empty()) include = std::regex(o.include);
    if (!o.exclude.empty()) exclude = std::regex(o.exclude);
  } catch (const std::regex_error& e) {
    throw Failure(kUsage, std::string("--include/--exclude: bad regular expression: ") + e.what());
  }
  const std::string out = o.output.empty() ? o.input + ".gift" : o.output;
  check_output(out, o.force);

  gift::io::TensorFile in;
  check(gift::io::read_tensor_file(o.input, &in));
  std::unique_ptr<giftFrameWriter, decltype(&giftFrameWriterFree)> w(nullptr, giftFrameWriterFree);
  {
    giftFrameWriter* raw = nullptr;
    check(giftFrameWriterCreate(&raw));
    w.reset(raw);
  }
  check(giftFrameWriterSetCompression(w.get(), o.zstd));
  for (const auto& [k, val] : in.metadata)
    check(giftFrameWriterAddMetadata(w.get(), k.c_str(), val.c_str()));

  uint64_t in_bytes = 0, quantized = 0;
  Progress progress("encode", in.tensors.size(), v);
  for (size_t i = 0; i < in.tensors.size(); ++i) {
    const gift::io::TensorRef& t = in.tensors[i];
    // Only matrices (2-D and up) are quantized; vectors, scalars and excluded tensors are
    // stored losslessly and come back bit-identical.
    const bool selected = (o.include.empty() || std::regex_search(t.name, include)) &&
                          (o.exclude.empty() || !std::regex_search(t.name, exclude));
    const bool fp8 = selected && t.shape.size() >= 2;
    giftQuantParams tp = p;
    tp.tensor_index = uint32_t(i);
    check(giftFrameWriterAddTensor(w.get(), t.name.c_str(), t.shape.data(),
                                   uint32_t(t.shape.size()), t.dtype, t.data, fp8 ? &tp : nullptr),
          o.input);
    in_bytes += t.bytes;
    quantized += fp8;
    if (v.verbose) {
      std::fprintf(stderr, "%s %s %s: %s\n", t.name.c_str(),
                   shape_string(t.shape.data(), uint32_t(t.shape.size())).c_str(),
                   dtype_name(t.dtype).c_str(),
                   fp8 ? (fp8_name(p.kind) + " " + scale_name(p)).c_str() : "raw");
    }
    progress.step(i + 1);
  }
  check(giftFrameWriterWriteFile(w.get(), out.c_str()));
  if (!v.quiet) {
    const uint64_t out_bytes = [&] {
      struct stat st;
      return ::stat(out.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
    }();
    std::fprintf(stderr, "%s: %zu tensors (%llu FP8, %llu raw), %s -> %s (%.2fx) -> %s\n",
                 o.input.c_str(), in.tensors.size(), (unsigned long long)quantized,
                 (unsigned long long)(in.tensors.size() - quantized), human_bytes(in_bytes).c_str(),
                 human_bytes(out_bytes).c_str(),
                 out_bytes ? double(in_bytes) / double(out_bytes) : 0.0, out.c_str());
  }
}

}  // namespace

void add_encode(CLI::App& app, Verbosity& v) {
  auto o = std::make_shared<EncodeOptions>();
  CLI::App* c = app.add_subcommand(
      "encode", "Encode a tensor file (.safetensors, .npy, .npz) to a GIFT frame");
  c->add_option("IN", o->input, "Input tensor file")->required();
  c->add_option("-o,--output", o->output, "Output frame (default: IN.gift)");
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
  c->add_option("--threads", o->threads, "Threads (default: all)");
  c->add_flag("--keep-nonfinite", o->keep_nonfinite,
              "Store NaN/Inf codes instead of failing on them");
  c->add_flag("-f,--force", o->force, "Overwrite an existing output");
  c->callback([o, &v] { run_encode(*o, v); });
}

}  // namespace giftc
