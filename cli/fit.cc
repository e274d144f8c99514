// giftc fit: a basis (.giftb) from gradient dumps, or from activation statistics.
#include "frame/fit.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>

#include "commands.h"
#include "frame/basis.h"
#include "frame/select.h"
#include "io/tensor_file.h"

namespace giftc {
namespace {

struct FitCliOptions {
  std::vector<std::string> inputs;
  std::string output, activations;
  uint32_t rank = 32;
  double decay = 0.95;
  std::string damping = "auto";
  bool damping_absolute = false, force = false;
  int zstd = 0;
};

bool eligible(const gift::io::TensorRef& t) {
  return t.shape.size() == 2 && t.shape[0] >= 16 && t.shape[1] >= 16 && t.shape[1] <= 65536;
}

void run_fit(const FitCliOptions& o, const Verbosity& v) {
  if (o.decay < 0 || o.decay >= 1) throw Failure(kUsage, "--decay must be in [0, 1)");
  // Candidate strengths: one given, or (auto) a ladder measured per tensor on the last dump.
  std::vector<double> dampings;
  if (o.damping == "auto") {
    if (o.damping_absolute) throw Failure(kUsage, "--damping-absolute needs a --damping value");
    dampings = {1e-3, 1e-2, 0.1, 1.0, 3.0, 10.0};
  } else {
    char* end = nullptr;
    const double d = std::strtod(o.damping.c_str(), &end);
    if (o.damping.empty() || *end || !(d > 0))
      throw Failure(kUsage, "--damping: '" + o.damping + "' is not auto or a positive number");
    dampings = {d};
  }
  if (o.rank == 0) throw Failure(kUsage, "--rank must be positive");
  if (o.zstd < 0 || o.zstd > 22) throw Failure(kUsage, "--zstd: level must be in 1..22");
  check_output(o.output, o.force);
  // Second moments per tensor name: activation statistics when given, else the gradients'
  // own A_g = W^T W / d_out, smoothed over the dumps in order (A <- decay A + (1 - decay) A_new).
  std::map<std::string, std::vector<double>> moments;
  std::map<std::string, uint32_t> dims;
  std::map<std::string, std::vector<float>> last;  // each tensor of the last dump, for measuring
  std::string source = o.activations.empty() ? "gradients" : "activations";
  if (!o.activations.empty()) {
    gift::io::TensorFile acts;
    check(gift::io::read_tensor_file(o.activations, &acts));
    for (const gift::io::TensorRef& t : acts.tensors) {
      if (t.shape.size() != 2 || t.shape[0] != t.shape[1] || t.shape[0] < 16) continue;
      const std::vector<float> a = gift::io::widen_to_float(t);
      moments[t.name].assign(a.begin(), a.end());
      dims[t.name] = uint32_t(t.shape[0]);
    }
  }
  for (size_t k = 0; k < o.inputs.size(); ++k) {
    gift::io::TensorFile in;
    check(gift::io::read_tensor_file(o.inputs[k], &in));
    for (const gift::io::TensorRef& t : in.tensors) {
      if (!eligible(t)) continue;
      std::vector<float> w = gift::io::widen_to_float(t);
      if (k + 1 == o.inputs.size() && dampings.size() > 1) last[t.name] = w;
      if (!o.activations.empty()) continue;
      std::vector<double> a =
          gift::frame::gradient_second_moment(w.data(), t.shape[0], uint32_t(t.shape[1]));
      auto it = moments.find(t.name);
      if (it == moments.end()) {
        moments[t.name] = std::move(a);
        dims[t.name] = uint32_t(t.shape[1]);
      } else if (it->second.size() == a.size() && dims[t.name] == t.shape[1]) {
        for (size_t i = 0; i < a.size(); ++i)
          it->second[i] = o.decay * it->second[i] + (1 - o.decay) * a[i];
      } else {
        throw Failure(kBadInput,
                      o.inputs[k] + ": tensor '" + t.name + "' changed shape between dumps");
      }
    }
  }
  if (moments.empty())
    throw Failure(kBadInput, "no 2-D tensor of at least 16 x 16 to fit a whitener for");
  gift::frame::FitOptions fo;
  fo.rank = o.rank;
  fo.damping = dampings[0];
  fo.damping_relative = !o.damping_absolute;
  giftQuantParams measure;  // the encoder's defaults
  giftQuantParamsInit(&measure);
  gift::frame::Basis basis;
  Progress progress("fit", moments.size(), v);
  size_t done = 0;
  for (const auto& [name, a] : moments) {
    const std::string what = "tensor '" + name + "'";
    gift::frame::LowRankPlusDiagonal fit;
    check(gift::frame::fit_low_rank(a, dims[name], fo, &fit), what);
    gift::frame::BasisEntry best;
    double best_error = INFINITY;
    const auto w = last.find(name);
    for (double d : dampings) {
      check(gift::frame::redamp(a, d, fo.damping_relative, &fit), what);
      gift::frame::BasisEntry e;
      e.name = name;
      e.damping = d;
      e.source = source;
      check(gift::frame::make_whitener(fit.u, fit.l, fit.diag, dims[name], &e.whitener), what);
      double err = 0;
      if (w != last.end() && w->second.size() % dims[name] == 0) {
        gift::frame::SelectOptions so;
        so.min_dim = 1;
        const uint64_t rows = w->second.size() / dims[name];
        err = gift::frame::choose_frame(w->second.data(), rows, dims[name], &e.whitener, {},
                                        measure, so)
                  .gift_error;
      }
      if (err < best_error || best.name.empty()) {
        best_error = err;
        best = std::move(e);
      }
    }
    if (v.verbose) std::fprintf(stderr, "%s: damping %g\n", name.c_str(), best.damping);
    basis.entries.push_back(std::move(best));
    progress.step(++done);
  }
  gift::frame::finish_basis(&basis);
  std::vector<uint8_t> bytes;
  check(gift::frame::serialize_basis(basis, o.zstd, &bytes));
  write_output(o.output, bytes);
  if (!v.quiet) {
    std::fprintf(stderr, "%s: %zu whiteners (rank %u, %s damping %s, from %s), basis %s\n",
                 o.output.c_str(), basis.entries.size(), o.rank,
                 o.damping_absolute ? "absolute" : "relative",
                 o.damping == "auto" ? "measured per tensor" : o.damping.c_str(), source.c_str(),
                 basis.id.hex().c_str());
  }
}

}  // namespace

void add_fit(CLI::App& app, Verbosity& v) {
  auto o = std::make_shared<FitCliOptions>();
  CLI::App* c = app.add_subcommand(
      "fit", "Fit a GIFT basis (.giftb) to gradient dumps or activation statistics");
  c->add_option("IN", o->inputs, "Gradient dumps, oldest first")->required();
  c->add_option("-o,--output", o->output, "Output basis (.giftb)")->required();
  c->add_option("--rank", o->rank, "Rank r of each whitener")->capture_default_str();
  c->add_option(
      "--activations", o->activations,
      "Activation statistics: a tensor file whose tensor named like each gradient holds A");
  c->add_option("--decay", o->decay, "Smoothing of A over several dumps")->capture_default_str();
  c->add_option("--damping", o->damping,
                "Floor of the residual diagonal, relative to mean diag(A); auto: the best of "
                "1e-3..10 per tensor, measured on the last dump")
      ->capture_default_str();
  c->add_flag("--damping-absolute", o->damping_absolute, "Take --damping as an absolute value");
  c->add_flag("--zstd{3}", o->zstd, "Compress the basis with zstd (--zstd=LEVEL)");
  c->add_flag("-f,--force", o->force, "Overwrite an existing output");
  c->callback([o, &v] { run_fit(*o, v); });
}

}  // namespace giftc
