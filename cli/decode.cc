// giftc decode: a GIFT frame back to a tensor file.
#include <map>
#include <memory>

#include "commands.h"
#include "device.h"
#include "io/tensor_file.h"

namespace giftc {
namespace {

struct DecodeOptions {
  std::string input, output, dtype, basis, device = "cpu";
  int threads = 0;
  bool force = false;
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

void run_decode(const DecodeOptions& o, const Verbosity& v) {
  const std::string out = o.output.empty() ? default_output(o.input) : o.output;
  const gift::io::FileKind kind = gift::io::kind_of_path(out);
  if (kind != gift::io::FileKind::kSafetensors && kind != gift::io::FileKind::kNpy) {
    throw Failure(kUsage, out + ": output must be .safetensors or .npy");
  }
  check_output(out, o.force, {o.input, o.basis});
  const Device device = parse_device(o.device);
  const BasisPtr basis = read_basis(o.basis);
  const FramePtr f = open_frame(o.input);
  use_device(f.get(), device);
  if (o.threads < 0) throw Failure(kUsage, "--threads must not be negative");
  check(giftFrameSetThreads(f.get(), o.threads));
  const uint64_t n = giftFrameTensorCount(f.get());
  if (kind == gift::io::FileKind::kNpy && n != 1) {
    throw Failure(kUsage, o.input + ": holds " + std::to_string(n) +
                              " tensors; a .npy file holds one (decode to .safetensors)");
  }
  std::vector<gift::io::OwnedTensor> tensors;
  Progress progress("decode", n, v);
  for (uint64_t i = 0; i < n; ++i) {
    const giftTensorInfo e = tensor_info(f.get(), i);
    const giftDType_t dt = o.dtype.empty() ? e.dtype : parse_dtype(o.dtype);
    if (kind == gift::io::FileKind::kNpy && dt == GIFT_DTYPE_BF16) {
      throw Failure(kUsage, o.dtype.empty()
                                ? "tensor '" + std::string(e.name) +
                                      "' is bf16, which .npy cannot hold: decode to "
                                      ".safetensors, or to .npy with --dtype f32"
                                : "--dtype bf16: .npy has no bfloat16 type (use .safetensors)");
    }
    gift::io::OwnedTensor t{e.name, std::vector<uint64_t>(e.shape, e.shape + e.ndim), dt, {}};
    t.data.resize(e.elements * giftDTypeSize(dt));
    check(
        giftFrameDecodeTensorWithBasis(f.get(), i, basis.get(), t.data.data(), t.data.size(), dt));
    tensors.push_back(std::move(t));
    progress.step(i + 1);
  }
  if (kind == gift::io::FileKind::kNpy) {
    write_output(out, gift::io::serialize_npy(tensors[0]));
  } else {
    write_output(out, gift::io::serialize_safetensors(tensors, metadata_map(f.get())));
  }
  if (!v.quiet)
    std::fprintf(stderr, "%s: %llu tensors -> %s\n", o.input.c_str(), (unsigned long long)n,
                 out.c_str());
}

}  // namespace

void add_decode(CLI::App& app, Verbosity& v) {
  auto o = std::make_shared<DecodeOptions>();
  CLI::App* c = app.add_subcommand("decode", "Decode a GIFT frame to .safetensors or .npy");
  c->add_option("IN", o->input, "Input frame (.gift)")->required();
  c->add_option("-o,--output", o->output,
                "Output file (default: IN without .gift, as NAME.decoded.safetensors or .npy)");
  c->add_option("--dtype", o->dtype,
                "Output element type: f32, bf16 or f16 (default: each tensor's own)");
  c->add_option("--basis", o->basis,
                "Basis (.giftb) for tensors in GIFT coordinates (default: the embedded one)");
  c->add_option("--device", o->device,
                "Where to decode: cpu or cuda (the same values; the inverse whitening of "
                "tensors in GIFT coordinates stays on the CPU)")
      ->capture_default_str();
  c->add_option("--threads", o->threads, "Threads (default: all)");
  c->add_flag("-f,--force", o->force, "Overwrite an existing output");
  c->callback([o, &v] { run_decode(*o, v); });
}

}  // namespace giftc
