// giftc compare: error of decoded tensors against their originals.
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "io/tensor_file.h"

namespace giftc {
namespace {

struct CompareOptions {
  std::string reference, decoded, basis, activations;
  bool json = false;
};

struct Tensor {
  std::vector<uint64_t> shape;
  std::vector<float> values;
};

// Every tensor of a file as fp32: frames are decoded (with `basis` for tensors in GIFT
// coordinates), tensor files widened exactly.
std::vector<std::pair<std::string, Tensor>> load(const std::string& path, const giftBasis* basis) {
  std::vector<std::pair<std::string, Tensor>> out;
  if (gift::io::kind_of_path(path) == gift::io::FileKind::kUnknown) {
    const FramePtr f = open_frame(path);
    for (uint64_t i = 0; i < giftFrameTensorCount(f.get()); ++i) {
      const giftTensorInfo e = tensor_info(f.get(), i);
      Tensor t{std::vector<uint64_t>(e.shape, e.shape + e.ndim), std::vector<float>(e.elements)};
      check(giftFrameDecodeTensorWithBasis(f.get(), i, basis, t.values.data(), t.values.size() * 4,
                                           GIFT_DTYPE_F32));
      out.emplace_back(e.name, std::move(t));
    }
    return out;
  }
  gift::io::TensorFile file;
  gift::io::read_tensor_file(path, &file);
  for (const gift::io::TensorRef& r : file.tensors)
    out.emplace_back(r.name, Tensor{r.shape, gift::io::widen_to_float(r)});
  return out;
}

void run_compare(const CompareOptions& o, const Verbosity&) {
  const BasisPtr basis = read_basis(o.basis);
  const auto ref = load(o.reference, basis.get());
  const auto dec = load(o.decoded, basis.get());
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : dec) by_name[name] = &t;
  // Activation statistics: the d_in x d_in A of each gradient, by name, for the A-norm error.
  std::map<std::string, std::vector<float>> acts;
  if (!o.activations.empty()) {
    gift::io::TensorFile f;
    gift::io::read_tensor_file(o.activations, &f);
    for (const gift::io::TensorRef& t : f.tensors) acts[t.name] = gift::io::widen_to_float(t);
  }
  nlohmann::ordered_json doc;
  doc["reference"] = o.reference;
  doc["decoded"] = o.decoded;
  doc["tensors"] = nlohmann::ordered_json::array();
  giftErrorMetrics total = GIFT_ERROR_METRICS_INIT;
  auto row = [](const giftErrorMetrics& m) {
    nlohmann::ordered_json j{
        {"rel_l2", m.rel_l2}, {"cosine", m.cosine}, {"max_abs", m.max_abs}, {"bias", m.bias}};
    j["rel_anorm"] =
        m.rel_anorm < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(m.rel_anorm);
    j["nonfinite"] = m.nonfinite;
    return j;
  };
  // Two single-tensor files (two .npy, say) are compared whatever their names.
  if (ref.size() == 1 && dec.size() == 1) by_name = {{ref[0].first, &dec[0].second}};
  for (const auto& [name, r] : ref) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) throw Failure(kBadInput, o.decoded + ": has no tensor '" + name + "'");
    if (it->second->shape != r.shape)
      throw Failure(kBadInput, "tensor '" + name + "': shapes differ between the files");
    giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
    const uint64_t cols = r.shape.empty() ? 1 : r.shape.back();
    const uint64_t rows = cols ? r.values.size() / cols : 0;
    const auto a = acts.find(name);
    if (a != acts.end() && (r.shape.size() != 2 || a->second.size() != cols * cols)) {
      throw Failure(kBadInput, o.activations + ": tensor '" + name + "' holds " +
                                   std::to_string(a->second.size()) +
                                   " values, not the square of the gradient's " +
                                   std::to_string(cols) + " columns");
    }
    check(giftComputeErrorMetrics(r.values.data(), it->second->values.data(), rows, cols,
                                  a == acts.end() ? nullptr : a->second.data(), &m));
    check(giftErrorMetricsMerge(&total, &m));
    nlohmann::ordered_json j{{"name", name}, {"elements", r.values.size()}};
    j.update(row(m));
    doc["tensors"].push_back(j);
  }
  if (ref.size() != dec.size()) {
    throw Failure(kBadInput, o.decoded + ": holds " + std::to_string(dec.size()) + " tensors, " +
                                 o.reference + " holds " + std::to_string(ref.size()));
  }
  doc["total"] = row(total);
  if (o.json) {
    std::printf("%s\n", doc.dump(2).c_str());
    return;
  }
  const bool anorm = !o.activations.empty();
  std::printf("%-40s %12s %12s %12s %12s%s\n", "name", "rel_l2", "cosine", "max_abs", "bias",
              anorm ? "    rel_anorm" : "");
  auto print = [anorm](const std::string& name, const nlohmann::ordered_json& j) {
    std::printf("%-40s %12.4e %12.8f %12.4e %12.4e", shown(name, stdout).c_str(),
                j["rel_l2"].get<double>(), j["cosine"].get<double>(), j["max_abs"].get<double>(),
                j["bias"].get<double>());
    if (anorm && j["rel_anorm"].is_null()) std::printf(" %12s", "-");
    if (anorm && !j["rel_anorm"].is_null()) std::printf(" %12.4e", j["rel_anorm"].get<double>());
    std::printf("\n");
  };
  for (const auto& j : doc["tensors"]) print(j["name"].get<std::string>(), j);
  print("total", doc["total"]);
  if (const uint64_t n = doc["total"]["nonfinite"].get<uint64_t>()) {
    std::printf("%llu element pair(s) hold NaN or Inf and are left out of the metrics\n",
                (unsigned long long)n);
  }
}

}  // namespace

void add_compare(CLI::App& app, Verbosity& v) {
  auto o = std::make_shared<CompareOptions>();
  CLI::App* c = app.add_subcommand("compare", "Error of decoded tensors against the originals");
  c->add_option("REF", o->reference, "Original tensors (.safetensors, .npy, .npz or .gift)")
      ->required();
  c->add_option("DECODED", o->decoded,
                "Decoded tensors, matched by name (any two single-tensor files match)")
      ->required();
  c->add_option("--basis", o->basis,
                "Basis (.giftb) for tensors in GIFT coordinates of .gift inputs");
  c->add_option("--activations", o->activations,
                "Activation statistics (the d_in x d_in A of each gradient, by name): adds the "
                "A-norm error");
  c->add_flag("--json", o->json, "Print a JSON document instead of a table");
  c->callback([o, &v] { run_compare(*o, v); });
}

}  // namespace giftc
