// giftc compare: error of decoded tensors against their originals, band by band of rows
// (memory does not grow with the files).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "commands.h"
#include "io/tensor_file.h"
#include "json_output.h"

namespace giftc {
namespace {

struct CompareOptions {
  std::string reference, decoded, activations;
  std::vector<std::string> bases;
  bool json = false;
  int threads = 0;
};

// Bands of about this many elements of each file are read and compared at a time.
constexpr uint64_t kBandElems = uint64_t(1) << 21;

// The tensors of a file, read in bands of rows as fp32: frames are decoded (a tensor in GIFT
// coordinates with the one of `bases` whose id it names, if any), tensor files widened exactly
// from their mapping.
class Source {
 public:
  Source(const std::string& path, const std::vector<BasisPtr>& bases, int threads)
      : frame_(nullptr, giftFrameClose) {
    // Standard input holds either kind, told apart by its first bytes as encode does; so does
    // a file whose name has no tensor file's extension (a frame, or a tensor file by its first
    // bytes).
    const bool tensors_from_stdin =
        path == "-" && !gift::io::is_frame(stdin_bytes().data, stdin_bytes().size);
    if (!tensors_from_stdin && gift::io::kind_of_path(path) == gift::io::FileKind::kUnknown &&
        (path == "-" || !gift::io::file_lacks_frame_magic(path))) {
      frame_ = open_frame(path);
      check(giftFrameSetThreads(frame_.get(), threads));
      giftFrameInfo frame = GIFT_FRAME_INFO_INIT;
      check(giftFrameGetInfo(frame_.get(), &frame));
      entries_.reserve(giftFrameTensorCount(frame_.get()));
      for (uint64_t i = 0; i < giftFrameTensorCount(frame_.get()); ++i) {
        const giftTensorInfo e = tensor_info(frame_.get(), i);
        entries_.push_back({e.name, std::vector<uint64_t>(e.shape, e.shape + e.ndim), e.rows,
                            e.cols, e.row_align, e.col_align, basis_for(e, frame, bases)});
      }
      return;
    }
    if (tensors_from_stdin) {
      const gift::io::MappedBytes& in = stdin_bytes();
      gift::io::parse_tensor_file(gift::io::sniff_kind(in.data, in.size), in.data, in.size,
                                  gift::io::kStdinName, "tensor", &file_);
    } else {
      gift::io::read_tensor_file(path, &file_);
    }
    entries_.reserve(file_.tensors.size());
    for (const gift::io::TensorRef& r : file_.tensors) {
      const uint64_t cols = r.shape.empty() ? 1 : r.shape.back();
      entries_.push_back({r.name, r.shape, cols ? r.elements() / cols : 0, cols, 1, 1, nullptr});
    }
  }

  struct Entry {
    std::string name;
    std::vector<uint64_t> shape;
    uint64_t rows, cols, row_align, col_align;
    const giftBasis* basis;  // for a tensor in GIFT coordinates
  };
  const std::vector<Entry>& entries() const { return entries_; }
  // Tensors no read() has checked (gift::io::check_unread); a frame was checked when opened.
  void check_unread() const { gift::io::check_unread(file_); }

  // The piece of `pieces` rows [r0, r0 + n), or with n = 1 columns [c0, c0 + cols) of row r0.
  void read(const Pieces& pieces, size_t i, uint64_t r0, uint64_t n, uint64_t c0, uint64_t cols,
            float* out) {
    const uint64_t count = n * cols;
    if (frame_) {
      pieces.decode(frame_.get(), i, entries_[i].basis, r0, n, c0, cols, out, GIFT_DTYPE_F32);
      return;
    }
    const gift::io::TensorRef& t = file_.tensors[i];
    check(giftConvert(t.data() + (r0 * entries_[i].cols + c0) * giftDTypeSize(t.dtype), t.dtype,
                      out, GIFT_DTYPE_F32, count));
  }

 private:
  // The basis given that tensor `e` names; else none where the frame carries it, or the first
  // given (whose mismatch the library reports, naming its file).
  static const giftBasis* basis_for(const giftTensorInfo& e, const giftFrameInfo& frame,
                                    const std::vector<BasisPtr>& bases) {
    const auto same = [&e](giftBasisId id) {
      return id.lo == e.basis_id.lo && id.hi == e.basis_id.hi;
    };
    if (e.coords != GIFT_COORDS_GIFT || bases.empty()) return nullptr;
    for (const BasisPtr& b : bases) {
      if (same(giftBasisGetId(b.get()))) return b.get();
    }
    return same(frame.basis_id) ? nullptr : bases.front().get();
  }

  FramePtr frame_;
  gift::io::TensorFile file_;
  std::vector<Entry> entries_;
};

void run_compare(const CompareOptions& o, const Verbosity& v) {
  bound_threads(o.threads);
  std::vector<std::string> inputs = o.bases;
  inputs.insert(inputs.end(), {o.reference, o.decoded, o.activations});
  if (std::count(inputs.begin(), inputs.end(), "-") > 1)
    throw Failure(kUsage, "standard input (-) can be read once: give it as one input only");
  std::vector<BasisPtr> bases;
  for (const std::string& path : o.bases) bases.push_back(read_basis(path));
  Source ref(o.reference, bases, o.threads), dec(o.decoded, bases, o.threads);
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < dec.entries().size(); ++i) by_name[dec.entries()[i].name] = i;
  // Activation statistics: the d_in x d_in A of each gradient, by name, for the A-norm error;
  // widened when its gradient is compared.
  gift::io::TensorFile acts;
  std::map<std::string, const gift::io::TensorRef*> act_by_name;
  if (!o.activations.empty()) {
    gift::io::read_tensor_file(o.activations, &acts);
    for (const gift::io::TensorRef& t : acts.tensors) act_by_name[t.name] = &t;
  }
  nlohmann::ordered_json doc;
  doc["reference"] = o.reference;
  doc["decoded"] = o.decoded;
  // Each tensor's metrics, by its place in the reference: printed once every tensor is
  // measured (a failure prints nothing), from these (a JSON document of every tensor held
  // 400 bytes a tensor more).
  std::vector<giftErrorMetrics> measured;
  measured.reserve(ref.entries().size());
  giftErrorMetrics total = GIFT_ERROR_METRICS_INIT;
  auto row = [](const giftErrorMetrics& m) {
    // No pair measured, every one holding NaN or Inf: no metric, where the library's ratios of
    // empty sums (those of two empty tensors) read as a perfect match.
    const bool none = m.count == 0 && m.nonfinite > 0;
    const auto metric = [none](double v) {
      return none ? nlohmann::ordered_json() : json_number(v);
    };
    nlohmann::ordered_json j{{"rel_l2", metric(m.rel_l2)},
                             {"cosine", metric(m.cosine)},
                             {"max_abs", metric(m.max_abs)},
                             {"bias", metric(m.bias)}};
    j["rel_anorm"] = m.rel_anorm < 0 ? nlohmann::ordered_json() : metric(m.rel_anorm);
    j["nonfinite"] = m.nonfinite;
    return j;
  };
  // Two single-tensor files (two .npy, say) are compared whatever their names.
  if (ref.entries().size() == 1 && dec.entries().size() == 1)
    by_name = {{ref.entries()[0].name, 0}};
  std::vector<float> ref_band, dec_band;
  for (size_t i = 0; i < ref.entries().size(); ++i) {
    const Source::Entry& r = ref.entries()[i];
    const auto it = by_name.find(r.name);
    if (it == by_name.end())
      throw Failure(kBadInput, o.decoded + ": has no tensor '" + r.name + "'");
    const Source::Entry& d = dec.entries()[it->second];
    if (d.shape != r.shape)
      throw Failure(kBadInput, "tensor '" + r.name + "': shape " +
                                   shape_string(r.shape.data(), uint32_t(r.shape.size())) + " in " +
                                   o.reference + ", " +
                                   shape_string(d.shape.data(), uint32_t(d.shape.size())) + " in " +
                                   o.decoded);
    const auto a = act_by_name.find(r.name);
    std::vector<float> a_values;
    if (a != act_by_name.end()) {
      if (r.shape.size() != 2) {
        throw Failure(kBadInput, o.activations + ": tensor '" + r.name +
                                     "' is an A for a matrix; the gradient has " +
                                     std::to_string(r.shape.size()) + " dimensions");
      }
      // As fit takes it: a d x d matrix, d the gradient's columns (an 8 x 32 A was read as
      // 16 x 16).
      const std::vector<uint64_t> square = {r.cols, r.cols};
      if (a->second->shape != square) {
        throw Failure(kBadInput,
                      o.activations + ": tensor '" + r.name + "' is " +
                          shape_string(a->second->shape.data(), uint32_t(a->second->shape.size())) +
                          ", not " + shape_string(square.data(), 2) + " for the gradient's " +
                          std::to_string(r.cols) + " columns");
      }
      a_values = gift::io::widen_to_float(*a->second);
      // An A that cannot be a second moment would give an A-norm that means nothing, shown
      // as if there were no A: refused, with the cheap checks (finite, nonnegative diagonal).
      const size_t nonfinite = std::count_if(a_values.begin(), a_values.end(),
                                             [](float x) { return !std::isfinite(x); });
      if (nonfinite) {
        throw Failure(kBadInput, o.activations + ": tensor '" + r.name + "' holds " +
                                     std::to_string(nonfinite) + " non-finite values");
      }
      for (uint64_t k = 0; k < r.cols; ++k) {
        if (a_values[k * r.cols + k] < 0) {
          throw Failure(kBadInput, o.activations + ": tensor '" + r.name +
                                       "' is not positive semi-definite: diagonal entry " +
                                       std::to_string(k) + " is negative");
        }
      }
    }
    giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
    // The A-norm takes whole rows (of A's width), as tensors in GIFT coordinates do.
    const Pieces pieces(
        r.rows, r.cols, {r.row_align, d.row_align},
        a_values.empty() ? Pieces::Aligns{r.col_align, d.col_align} : Pieces::Aligns{0, 0},
        kBandElems);
    ref_band.resize(pieces.piece_elements());
    dec_band.resize(pieces.piece_elements());
    // giftComputeErrorMetrics refuses an A that is not semi-definite, which the checks above
    // do not see (a negative eigenvalue): the tensor is then measured without it, and has no
    // rel_anorm, nor a part in the total's (a negative "norm" means nothing).
    bool indefinite = false;
    pieces.each([&](uint64_t r0, uint64_t n, uint64_t c0, uint64_t cols) {
      ref.read(pieces, i, r0, n, c0, cols, ref_band.data());
      dec.read(pieces, it->second, r0, n, c0, cols, dec_band.data());
      giftErrorMetrics part = GIFT_ERROR_METRICS_INIT;
      if (!indefinite && !a_values.empty()) {
        const giftResult_t measured = giftComputeErrorMetrics(ref_band.data(), dec_band.data(), n,
                                                              cols, a_values.data(), &part);
        // Nothing else in the call can be invalid: the shapes and A's entries were checked.
        if (measured != GIFT_ERROR_INVALID_ARGUMENT) {
          check(measured);
          check(giftErrorMetricsMerge(&m, &part));
          return;
        }
        if (!v.quiet) {
          std::fprintf(stderr, "giftc: warning: %s: tensor '%s': %s: no rel_anorm for it\n",
                       shown(o.activations, stderr).c_str(), shown(r.name, stderr).c_str(),
                       giftGetLastErrorMessage());
        }
        indefinite = true;
        m.sum_ref_asq = m.sum_err_asq = 0;
        m.rel_anorm = -1;
        part = GIFT_ERROR_METRICS_INIT;
      }
      check(giftComputeErrorMetrics(ref_band.data(), dec_band.data(), n, cols, nullptr, &part));
      check(giftErrorMetricsMerge(&m, &part));
    });
    check(giftErrorMetricsMerge(&total, &m));
    measured.push_back(m);
  }
  if (ref.entries().size() != dec.entries().size()) {
    throw Failure(kBadInput, o.decoded + ": holds " + std::to_string(dec.entries().size()) +
                                 " tensors, " + o.reference + " holds " +
                                 std::to_string(ref.entries().size()));
  }
  // Tensors of one file only, and activations of no compared tensor, are checked too.
  ref.check_unread();
  dec.check_unread();
  gift::io::check_unread(acts);
  const auto tensor_row = [&](size_t i) {
    const Source::Entry& r = ref.entries()[i];
    nlohmann::ordered_json j{{"name", r.name}, {"elements", r.rows * r.cols}};
    j.update(row(measured[i]));
    return j;
  };
  if (o.json) {
    StreamedArray tensors(doc, "tensors", true);
    for (size_t i = 0; i < measured.size(); ++i) tensors.add(tensor_row(i));
    doc["total"] = row(total);
    tensors.end();
    return;
  }
  doc["total"] = row(total);
  const bool anorm = !o.activations.empty();
  std::printf("%-40s %12s %12s %12s %12s%s\n", "name", "rel_l2", "cosine", "max_abs", "bias",
              anorm ? "    rel_anorm" : "");
  // A metric as json_number left it: a number in `format`, "inf", or - for none.
  const auto cell = [](const nlohmann::ordered_json& v, const char* format) {
    char buf[32];
    if (v.is_number()) {
      std::snprintf(buf, sizeof buf, format, v.get<double>());
    } else {
      std::snprintf(buf, sizeof buf, "%12s", v.is_string() ? v.get<std::string>().c_str() : "-");
    }
    return std::string(buf);
  };
  auto print = [&](const std::string& name, const nlohmann::ordered_json& j) {
    std::printf("%s %s %s %s %s", padded(shown(name, stdout), 40).c_str(),
                cell(j["rel_l2"], "%12.4e").c_str(), cell(j["cosine"], "%12.8f").c_str(),
                cell(j["max_abs"], "%12.4e").c_str(), cell(j["bias"], "%12.4e").c_str());
    if (anorm) std::printf(" %s", cell(j["rel_anorm"], "%12.4e").c_str());
    std::printf("\n");
  };
  for (size_t i = 0; i < measured.size(); ++i) print(ref.entries()[i].name, tensor_row(i));
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
  c->add_option("--basis", o->bases,
                "Basis (.giftb) for tensors in GIFT coordinates of .gift inputs; again for a "
                "second basis (each tensor takes the one it names)")
      ->check(file_name())
      ->allow_extra_args(false);
  c->add_option("--activations", o->activations,
                "Activation statistics (the d_in x d_in A of each gradient, by name): adds the "
                "A-norm error")
      ->check(file_name());
  c->add_flag("--json", o->json, "Print a JSON document instead of a table");
  add_threads_option(c, &o->threads);
  c->callback([o, &v] { run_compare(*o, v); });
}

}  // namespace giftc
