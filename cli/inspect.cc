// giftc inspect: what a frame holds, as a table or as JSON.
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "commands.h"
#include "json_output.h"

namespace giftc {
namespace {

struct InspectOptions {
  std::string input, basis;
  bool json = false, verify = false;
  int threads = 0;
};

std::string estimate_text(const nlohmann::ordered_json& e) {
  if (e.is_null()) return "-";
  if (e.is_string()) return e.get<std::string>();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", e.get<double>());
  return buf;
}

// Original over stored bytes, or - where either is 0 (a tensor without elements, whose
// scales may still take bytes).
std::string ratio_text(uint64_t original, uint64_t stored) {
  if (!original || !stored) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", double(original) / double(stored));
  return buf;
}

const char* coords_name(giftCoords_t c) { return c == GIFT_COORDS_GIFT ? "gift" : "euclidean"; }

// A tensor's entry in the JSON document; the table's row is printed from it too.
nlohmann::ordered_json tensor_json(const giftTensorInfo& e, uint64_t original) {
  nlohmann::ordered_json j;
  j["name"] = e.name;
  j["shape"] = std::vector<uint64_t>(e.shape, e.shape + e.ndim);
  j["dtype"] = dtype_name(e.dtype);
  j["encoding"] = e.raw ? "raw" : "fp8";
  if (!e.raw) {
    j["fp8"] = fp8_name(e.params.kind);
    j["scale"] = scale_name(e.params);
    j["scale_dtype"] = scale_dtype_name(e.params.scale_dtype);
    j["rounding"] = e.params.rounding == GIFT_ROUND_NEAREST ? "nearest" : "stochastic";
    if (e.params.rounding == GIFT_ROUND_STOCHASTIC) {
      j["seed"] = e.params.seed;
      j["tensor_index"] = e.params.tensor_index;
    }
  }
  j["coords"] = coords_name(e.coords);
  if (e.coords == GIFT_COORDS_GIFT) j["basis_id"] = basis_id_hex(e.basis_id);
  if (e.selection.made) {
    const giftSelection& s = e.selection;
    j["selection"] = {{"chosen", coords_name(s.chosen)},
                      {"euclidean_error", json_number(s.euclidean_error)},
                      {"gift_error", json_number(s.gift_error)},
                      {"transform_flops", s.transform_flops},
                      {"reason", s.reason}};
  }
  if (e.has_stats) {
    j["stats"] = {{"amax", e.amax}, {"rms", e.rms}, {"nonfinite", e.nonfinite_count}};
  }
  j["original_bytes"] = original;
  j["stored_bytes"] = e.stored_bytes;
  j["decompressed_bytes"] = e.raw_bytes;
  j["compression"] = e.compressed ? "zstd" : "none";
  return j;
}

// A tensor's row of the table (and its selection's line), from its JSON entry.
void print_row(const nlohmann::ordered_json& j) {
  const bool fp8 = j["encoding"] == "fp8";
  std::string shape = "[";
  for (size_t i = 0; i < j["shape"].size(); ++i)
    shape += (i ? "," : "") + std::to_string(j["shape"][i].get<uint64_t>());
  shape += "]";
  const uint64_t orig = j["original_bytes"], st = j["stored_bytes"];
  std::printf(
      "%s %-16s %-5s %-5s %-14s %-5s %-10s %11s %11s %6s\n",
      padded(shown(j["name"].get<std::string>(), stdout), 32).c_str(), shape.c_str(),
      j["dtype"].get<std::string>().c_str(), fp8 ? j["fp8"].get<std::string>().c_str() : "raw",
      fp8 ? (j["scale"].get<std::string>() + " " + j["scale_dtype"].get<std::string>()).c_str()
          : "-",
      j["coords"] == "gift" ? "gift" : "eucl", fp8 ? j["rounding"].get<std::string>().c_str() : "-",
      human_bytes(orig).c_str(), human_bytes(st).c_str(), ratio_text(orig, st).c_str());
  if (j.contains("selection")) {
    const auto& s = j["selection"];
    std::printf("%-32s   selection: %s (euclidean %s, gift %s) %s\n", "",
                s["chosen"].get<std::string>().c_str(), estimate_text(s["euclidean_error"]).c_str(),
                estimate_text(s["gift_error"]).c_str(), s["reason"].get<std::string>().c_str());
  }
}

void run_inspect(const InspectOptions& o, const Verbosity& v) {
  bound_threads(o.threads);
  const FramePtr f = open_frame(o.input);
  check(giftFrameSetThreads(f.get(), o.threads));
  if (!o.basis.empty() && !o.verify) throw Failure(kUsage, "--basis is for --verify");
  // The library's verdict, the same call every embedder makes. With --json a frame that
  // fails it is still described, the failure in the document too (a script reads one
  // document either way), and giftc exits as it would without --json.
  std::optional<Failure> verify_failure;
  if (o.verify) {
    const BasisPtr basis = read_basis(o.basis);
    try {
      check(giftFrameVerifyWithBasis(f.get(), basis.get()));
    } catch (const Failure& e) {
      if (!o.json) throw;
      verify_failure = e;
    }
  }
  giftFrameInfo info = GIFT_FRAME_INFO_INIT;
  check(giftFrameGetInfo(f.get(), &info));

  nlohmann::ordered_json doc;
  doc["file"] = o.input;
  doc["format_version"] =
      std::to_string(info.format_major) + "." + std::to_string(info.format_minor);
  doc["kind"] = info.kind == GIFT_FRAME_BASIS ? "Basis" : "Tensors";
  // A basis's own id, which errors about a frame's basis name: read from its sections, so a
  // damaged one has none (null; --verify says what is wrong), and is still described.
  BasisPtr own(nullptr, giftBasisFree);
  if (info.kind == GIFT_FRAME_BASIS) {
    giftBasis* b = nullptr;
    const gift::io::MappedBytes* in = o.input == "-" ? &stdin_bytes() : nullptr;
    if ((in ? giftBasisFromBytes(in->data, in->size, &b) : giftBasisLoad(o.input.c_str(), &b)) ==
        GIFT_OK) {
      own.reset(b);
    }
    doc["basis_id"] = own ? nlohmann::ordered_json(basis_id_hex(giftBasisGetId(b))) : nullptr;
    doc["whiteners"] = own ? nlohmann::ordered_json(giftBasisEntryCount(b)) : nullptr;
  }
  doc["producer"] = info.producer;
  doc["metadata"] = nlohmann::ordered_json::object();
  for (const auto& [k, val] : frame_metadata(f.get())) doc["metadata"][k] = val;
  // The basis the frame carries (--embed-basis), which decodes its GIFT tensors on its own.
  const giftBasis* embedded = nullptr;
  check(giftFrameEmbeddedBasis(f.get(), &embedded), o.input);
  doc["embedded_basis"] = nullptr;
  if (embedded) {
    doc["embedded_basis"] = {{"basis_id", basis_id_hex(giftBasisGetId(embedded))},
                             {"whiteners", giftBasisEntryCount(embedded)}};
  }
  if (!o.json) {  // the table's heading: the rows follow as each tensor is read
    std::printf("%s: GIFT frame %s, %s, %zu tensor%s, producer \"%s\"\n",
                shown(o.input, stdout).c_str(), doc["format_version"].get<std::string>().c_str(),
                doc["kind"].get<std::string>().c_str(), size_t(info.tensor_count),
                info.tensor_count == 1 ? "" : "s",
                shown(doc["producer"].get<std::string>(), stdout).c_str());
    for (const auto& [k, val] : doc["metadata"].items())
      std::printf("  %s = %s\n", shown(k, stdout).c_str(),
                  shown(val.get<std::string>(), stdout).c_str());
    if (own) {
      const uint64_t whiteners = giftBasisEntryCount(own.get());
      std::printf("  basis %s (%llu whitener%s)\n", doc["basis_id"].get<std::string>().c_str(),
                  (unsigned long long)whiteners, whiteners == 1 ? "" : "s");
    } else if (info.kind == GIFT_FRAME_BASIS) {
      std::printf("  basis id unreadable (its sections do not load: --verify says why)\n");
    }
    if (embedded) {
      const uint64_t whiteners = giftBasisEntryCount(embedded);
      std::printf("  embedded basis %s (%llu whitener%s)\n",
                  doc["embedded_basis"]["basis_id"].get<std::string>().c_str(),
                  (unsigned long long)whiteners, whiteners == 1 ? "" : "s");
    }
    std::printf("\n%-32s %-16s %-5s %-5s %-14s %-5s %-10s %11s %11s %6s\n", "name", "shape",
                "dtype", "fp8", "scales", "coords", "rounding", "original", "stored", "ratio");
  }
  // The tensors as they are read, table rows or the document's elements: no document of
  // every tensor held.
  StreamedArray tensors(doc, "tensors", o.json);
  uint64_t total_original = 0, total_stored = 0;
  for (uint64_t i = 0; i < info.tensor_count; ++i) {
    const giftTensorInfo e = tensor_info(f.get(), i);
    const uint64_t original = e.elements * giftDTypeSize(e.dtype);
    total_original += original;
    total_stored += e.stored_bytes;
    const nlohmann::ordered_json j = tensor_json(e, original);
    o.json ? tensors.add(j) : print_row(j);
  }
  const uint64_t file_bytes = info.bytes;
  doc["totals"] = {{"tensors", info.tensor_count},
                   {"original_bytes", total_original},
                   {"stored_bytes", total_stored},
                   {"file_bytes", file_bytes},
                   {"ratio", file_bytes ? double(total_original) / double(file_bytes) : 0.0}};
  if (o.verify) doc["verified"] = !verify_failure;
  if (verify_failure) {
    doc["verify_error"] = {{"exit_status", verify_failure->code},
                           {"message", verify_failure->what()}};
  }

  if (o.json) {
    tensors.end();
    if (verify_failure) throw *verify_failure;
    return;
  }
  std::printf("%-32s %-16s %-5s %-5s %-14s %-5s %-10s %11s %11s %6s\n", "total", "", "", "", "", "",
              "", human_bytes(total_original).c_str(), human_bytes(total_stored).c_str(),
              ratio_text(total_original, total_stored).c_str());
  std::printf("%-32s %-16s %-5s %-5s %-14s %-5s %-10s %11s %11s %6s\n",
              "file (with header, padding)", "", "", "", "", "", "", "",
              human_bytes(file_bytes).c_str(), ratio_text(total_original, file_bytes).c_str());
  if (o.verify && !v.quiet)
    std::printf("\nverified: every checksum matches and every tensor decodes\n");
}

}  // namespace

void add_inspect(CLI::App& app, Verbosity& v) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* c = app.add_subcommand("inspect", "Show what a GIFT frame holds");
  c->add_option("IN", o->input, "Frame (.gift or .giftb)")->required();
  c->add_flag("--json", o->json, "Print a JSON document instead of a table");
  c->add_flag("--verify", o->verify, "Check every checksum and decode every tensor");
  c->add_option("--basis", o->basis,
                "Basis (.giftb) for --verify of tensors in GIFT coordinates (default: the "
                "embedded one)")
      ->check(file_name());
  add_threads_option(c, &o->threads);
  c->callback([o, &v] { run_inspect(*o, v); });
}

}  // namespace giftc
