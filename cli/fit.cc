// giftc fit: a basis (.giftb) from gradient dumps, or from activation statistics.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <set>

#include "commands.h"
#include "io/tensor_file.h"

namespace giftc {
namespace {

// The first few of `names`, for a message on standard error.
std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < 5; ++i)
    text += (i ? ", " : "") + shown(names[i], stderr);
  return names.size() > 5 ? text + ", ..." : text;
}

struct FitCliOptions {
  std::vector<std::string> inputs;
  std::string output, activations;
  uint32_t rank = 32;
  double decay = 0.95;
  std::string damping = "auto";
  bool damping_absolute = false, force = false, fsync = false;
  int zstd = 0;
  int threads = 0;
};

// A d_in x d_in moment in fp64 is 8 d_in^2 bytes: 8 GiB at this bound.
constexpr uint64_t kMaxFitDim = 32768;
// Elements of activation statistics widened at a time (4 MiB of fp32).
constexpr uint64_t kWidenBand = uint64_t(1) << 20;

bool eligible(const gift::io::TensorRef& t) {
  return t.shape.size() == 2 && t.shape[0] >= 16 && t.shape[1] >= 16 && t.shape[1] <= kMaxFitDim;
}

const gift::io::TensorRef* find(const gift::io::TensorFile& f, const std::string& name) {
  for (const gift::io::TensorRef& t : f.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::vector<double> parse_dampings(const FitCliOptions& o) {
  // Candidate strengths: one given, or (auto) a ladder measured per tensor on the last dump.
  if (o.damping == "auto") {
    if (o.damping_absolute) throw Failure(kUsage, "--damping-absolute needs a --damping value");
    return {1e-3, 1e-2, 0.1, 1.0, 3.0, 10.0};
  }
  char* end = nullptr;
  const double d = std::strtod(o.damping.c_str(), &end);
  if (o.damping.empty() || *end || !(d > 0) || !std::isfinite(d))
    throw Failure(kUsage, "--damping: '" + o.damping + "' is not auto or a positive number");
  return {d};
}

// The second moment of one tensor: its activation statistics when given, else the
// gradients' own A_g = W^T W / d_out smoothed over the dumps in order
// (A <- decay A + (1 - decay) A_new). Empty when no dump has the tensor.
std::vector<double> second_moment(const FitCliOptions& o, const gift::io::TensorFile* acts,
                                  const std::vector<gift::io::TensorFile>& dumps,
                                  const std::string& name, uint32_t* dim) {
  std::vector<double> a;
  if (acts) {
    // Widened (exactly) to fp32 a band at a time, then to double: no fp32 copy of the matrix.
    const gift::io::TensorRef* t = find(*acts, name);
    *dim = uint32_t(t->shape[0]);
    a.resize(t->elements());
    std::vector<float> band(std::min<uint64_t>(a.size(), kWidenBand));
    const uint8_t* src = static_cast<const uint8_t*>(t->data());
    for (uint64_t i = 0; i < a.size(); i += band.size()) {
      const uint64_t n = std::min<uint64_t>(band.size(), a.size() - i);
      check(
          giftConvert(src + i * giftDTypeSize(t->dtype), t->dtype, band.data(), GIFT_DTYPE_F32, n),
          o.activations + ": tensor '" + name + "'");
      std::copy(band.begin(), band.begin() + ptrdiff_t(n), a.begin() + ptrdiff_t(i));
    }
    return a;
  }
  for (size_t k = 0; k < dumps.size(); ++k) {
    const gift::io::TensorRef* t = find(dumps[k], name);
    if (!t || !eligible(*t)) continue;
    const std::string what = o.inputs[k] + ": tensor '" + name + "'";
    if (a.empty()) {
      *dim = uint32_t(t->shape[1]);
      a.resize(t->shape[1] * t->shape[1]);
      check(giftGradientSecondMoment(t->data(), t->dtype, t->shape[0], t->shape[1], a.data()),
            what);
    } else if (*dim == t->shape[1]) {
      check(giftGradientSecondMomentUpdate(t->data(), t->dtype, t->shape[0], t->shape[1], o.decay,
                                           a.data()),
            what);
    } else {
      throw Failure(kBadInput, what + " changed shape between dumps");
    }
  }
  return a;
}

void run_fit(const FitCliOptions& o, const Verbosity& v) {
  bound_threads(o.threads);
  if (!(o.decay >= 0 && o.decay < 1)) throw Failure(kUsage, "--decay must be in [0, 1)");
  const std::vector<double> dampings = parse_dampings(o);
  if (o.rank == 0) throw Failure(kUsage, "--rank must be positive");
  if (o.zstd < 0 || o.zstd > 22) throw Failure(kUsage, "--zstd: level must be in 1..22");
  // Standard output (-), or a device or FIFO: the basis is written once it is whole.
  const bool std_out = o.output == "-";
  const std::string out = std_out ? "standard output" : o.output;
  std::vector<std::string> inputs = o.inputs;
  inputs.push_back(o.activations);
  if (std::count(inputs.begin(), inputs.end(), "-") > 1)
    throw Failure(kUsage, "standard input (-) can be read once: give it as one input only");
  const OutputTarget target = check_target(out, std_out, o.force, inputs);
  // Inputs stay mapped; each tensor's moment is built, fitted and dropped in turn, so memory
  // holds one d_in x d_in matrix at a time.
  std::vector<gift::io::TensorFile> dumps(o.inputs.size());
  for (size_t k = 0; k < o.inputs.size(); ++k) gift::io::read_tensor_file(o.inputs[k], &dumps[k]);
  gift::io::TensorFile acts;
  const std::string source = o.activations.empty() ? "gradients" : "activations";
  std::set<std::string> names;
  if (!o.activations.empty()) {
    gift::io::read_tensor_file(o.activations, &acts);
    for (const gift::io::TensorRef& t : acts.tensors) {
      if (t.shape.size() == 2 && t.shape[0] == t.shape[1] && t.shape[0] >= 16 &&
          t.shape[0] <= kMaxFitDim)
        names.insert(t.name);
    }
  } else {
    for (const gift::io::TensorFile& f : dumps) {
      for (const gift::io::TensorRef& t : f.tensors) {
        if (eligible(t)) names.insert(t.name);
      }
    }
  }
  if (names.empty()) {
    throw Failure(kBadInput, "no 2-D tensor of at least 16 x 16 (and at most " +
                                 std::to_string(kMaxFitDim) + " columns) to fit a whitener for");
  }
  giftFitParams fp = GIFT_FIT_PARAMS_INIT;
  fp.rank = o.rank;
  fp.damping = dampings[0];
  fp.damping_relative = !o.damping_absolute;
  giftBasisBuilder* builder = nullptr;
  check(giftBasisBuilderCreate(&fp, &builder));
  const std::unique_ptr<giftBasisBuilder, decltype(&giftBasisBuilderFree)> owner(
      builder, giftBasisBuilderFree);
  Progress progress("fit", names.size(), v);
  size_t done = 0;
  std::vector<std::string> unmeasured;  // --damping auto without a gradient to measure on
  std::vector<std::string> left_out;    // a zero second moment: no whitener
  for (const std::string& name : names) {
    const std::string what = "tensor '" + name + "'";
    uint32_t dim = 0;
    const std::vector<double> a =
        second_moment(o, o.activations.empty() ? nullptr : &acts, dumps, name, &dim);
    // The damping is measured on this tensor in the last dump, when it is there.
    const gift::io::TensorRef* last = find(dumps.back(), name);
    if (last && last->shape.size() == 2 && last->shape[1] != dim) {
      const std::string moment =
          o.activations.empty()
              ? what + " has " + std::to_string(dim) + " columns in an earlier dump"
              : o.activations + ": " + what + " holds a " + std::to_string(dim) + " x " +
                    std::to_string(dim) + " moment";
      throw Failure(kBadInput, moment + ", but the gradient in " + o.inputs.back() + " has " +
                                   std::to_string(last->shape[1]) + " columns");
    }
    // The probe: an fp32 gradient as it lies in the dump (data() is aligned), else widened.
    std::vector<float> w;
    const float* probe = nullptr;
    if (dampings.size() > 1 && last && last->shape.size() == 2) {
      if (last->dtype == GIFT_DTYPE_F32) {
        probe = reinterpret_cast<const float*>(last->data());
      } else {
        w = gift::io::widen_to_float(*last);
        probe = w.data();
      }
    }
    double chosen = 0;
    check(giftBasisBuilderAdd(builder, name.c_str(), a.data(), dim, source.c_str(), dampings.data(),
                              uint32_t(dampings.size()), probe, probe ? last->shape[0] : 0, nullptr,
                              &chosen));
    if (chosen == 0) {
      left_out.push_back(name);  // a zero moment: no whitener, nothing measured
    } else if (dampings.size() > 1 && !probe) {
      unmeasured.push_back(name);
    }
    if (v.verbose) {
      progress.clear();
      if (chosen == 0) {
        std::fprintf(stderr, "%s: zero second moment, left out\n", shown(name, stderr).c_str());
      } else {
        std::fprintf(stderr, "%s: damping %g\n", shown(name, stderr).c_str(), chosen);
      }
    }
    progress.step(++done);
  }
  if (!v.quiet) progress.clear();
  if (left_out.size() == names.size()) {
    throw Failure(kBadInput, "every tensor's second moment is zero (" + listed(left_out) +
                                 "): nothing to fit a whitener to");
  }
  if (!unmeasured.empty() && !v.quiet) {
    std::fprintf(stderr,
                 "giftc: warning: %zu tensor%s without a 2-D gradient in %s (%s): damping %g, "
                 "the first candidate, taken without measurement\n",
                 unmeasured.size(), unmeasured.size() == 1 ? "" : "s",
                 shown(o.inputs.back(), stderr).c_str(), listed(unmeasured).c_str(), dampings[0]);
  }
  if (!left_out.empty() && !v.quiet) {
    std::fprintf(stderr,
                 "giftc: warning: %zu tensor%s with a zero second moment (%s): no whitener, %s "
                 "Euclidean wherever the basis is used\n",
                 left_out.size(), left_out.size() == 1 ? "" : "s", listed(left_out).c_str(),
                 left_out.size() == 1 ? "it stays" : "they stay");
  }
  giftBasis* fitted = nullptr;
  check(giftBasisBuilderFinish(builder, &fitted));
  const BasisPtr basis(fitted, giftBasisFree);
  void* bytes = nullptr;
  uint64_t size = 0;
  check(giftBasisSerialize(basis.get(), o.zstd, &bytes, &size));
  const std::unique_ptr<void, decltype(&giftFree)> bytes_owner(bytes, giftFree);
  // Tensors the basis did not need (older dumps, a fixed damping's, 1-D ones) are checked too.
  for (const gift::io::TensorFile& f : dumps) gift::io::check_unread(f);
  gift::io::check_unread(acts);
  write_output(out, target.open_fd(out, o.force), bytes, size, o.fsync, o.force, inputs);
  progress.end();
  if (!v.quiet) {
    // The rank each whitener got: --rank, or less for a narrower matrix.
    uint32_t rank = 0;
    for (uint64_t i = 0; i < giftBasisEntryCount(basis.get()); ++i) {
      giftBasisEntryInfo e = GIFT_BASIS_ENTRY_INFO_INIT;
      check(giftBasisGetEntry(basis.get(), i, &e));
      rank = std::max(rank, e.rank);
    }
    const size_t whiteners = size_t(giftBasisEntryCount(basis.get()));
    std::fprintf(stderr, "%s: %zu whitener%s (rank up to %u, %s damping %s, from %s), basis %s\n",
                 shown(out, stderr).c_str(), whiteners, whiteners == 1 ? "" : "s", rank,
                 o.damping_absolute ? "absolute" : "relative",
                 o.damping == "auto" ? "measured per tensor" : o.damping.c_str(), source.c_str(),
                 basis_id_hex(giftBasisGetId(basis.get())).c_str());
  }
}

}  // namespace

void add_fit(CLI::App& app, Verbosity& v) {
  auto o = std::make_shared<FitCliOptions>();
  CLI::App* c = app.add_subcommand(
      "fit", "Fit a GIFT basis (.giftb) to gradient dumps or activation statistics");
  c->add_option("IN", o->inputs, "Gradient dumps, oldest first")->required();
  c->add_option("-o,--output", o->output, "Output basis (.giftb; - for standard output)")
      ->required()
      ->check(file_name());
  c->add_option("--rank", o->rank, "Rank r of each whitener")->capture_default_str();
  c->add_option(
       "--activations", o->activations,
       "Activation statistics: a tensor file whose tensor named like each gradient holds A")
      ->check(file_name());
  c->add_option("--decay", o->decay, "Smoothing of A over several dumps")->capture_default_str();
  c->add_option("--damping", o->damping,
                "Floor of the residual diagonal, relative to mean diag(A); auto: the best of "
                "1e-3..10 per tensor, measured on the last dump")
      ->capture_default_str();
  c->add_flag("--damping-absolute", o->damping_absolute, "Take --damping as an absolute value");
  c->add_flag("--zstd{3}", o->zstd, "Compress the basis with zstd (--zstd=LEVEL)");
  c->add_flag("-f,--force", o->force,
              "Overwrite an existing output; write binary data to a terminal");
  add_fsync_flag(c, &o->fsync);
  add_threads_option(c, &o->threads);
  c->callback([o, &v] { run_fit(*o, v); });
}

}  // namespace giftc
