// GIFT coordinates in frames: bases stored as frames, the basis a frame carries, and tensors
// encoded in or decoded from a basis's coordinates. The layer above container/ and coords/,
// which know nothing of each other.
#include "api/coords_frames.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "common/error.h"
#include "gift_generated.h"
#include "numerics/convert.h"
#include "numerics/simd.h"

namespace gift::coords {

giftResult_t serialize_basis(const Basis& b, int zstd_level, std::vector<uint8_t>* out) {
  container::FrameWriter w;
  w.set_compression(zstd_level);
  w.set_basis_kind(b.id.lo, b.id.hi);
  for (const BasisEntry& e : b.entries) {
    const Whitener& wh = e.whitener;
    for (int i = 0; i < kWhitenerParts; ++i) {
      const std::vector<float>& p = whitener_part(wh, i);
      container::TensorShape shape;
      const uint64_t dims2[2] = {wh.dim, wh.rank};
      const uint64_t dims1[1] = {p.size()};
      if (const giftResult_t r =
              container::make_shape(i == 0 ? dims2 : dims1, i == 0 ? 2 : 1, &shape))
        return r;
      if (const giftResult_t r = w.add_tensor(e.name + "#" + kWhitenerPartNames[i], shape,
                                              GIFT_DTYPE_F32, p.data(), nullptr)) {
        return r;
      }
    }
    char damping[32];
    std::snprintf(damping, sizeof damping, "%.17g", e.damping);
    if (const giftResult_t r = w.add_metadata(e.name + "#damping", damping)) return r;
    if (const giftResult_t r = w.add_metadata(e.name + "#source", e.source)) return r;
  }
  return w.finish(out);
}

giftResult_t parse_basis(const uint8_t* bytes, uint64_t size, const std::string& name, Basis* out) {
  const char* n = name.c_str();
  std::unique_ptr<container::FrameReader> r;
  if (const giftResult_t e =
          container::FrameReader::open(container::borrow_bytes(bytes, size), name, &r))
    return e;
  const fb::Frame* h = r->header();
  if (h->kind() != fb::FrameKind::Basis || !h->basis_id()) {
    return fail(GIFT_ERROR_CORRUPT_INPUT, "%s: not a basis frame", n);
  }
  std::map<std::string, std::string> metadata;
  if (h->metadata()) {
    for (const fb::KeyValue* kv : *h->metadata())
      metadata[kv->key()->str()] = kv->value() ? kv->value()->str() : "";
  }
  std::map<std::string, BasisEntry> entries;
  std::map<std::string, std::vector<uint64_t>> shapes;  // of each part, to check at the end
  for (size_t i = 0; i < r->tensors().size(); ++i) {
    const container::TensorEntry& t = r->tensors()[i];
    const size_t hash = t.name.rfind('#');
    const std::string which = hash == std::string::npos ? "" : t.name.substr(hash + 1);
    const int k =
        int(std::find(std::begin(kWhitenerPartNames), std::end(kWhitenerPartNames), which) -
            std::begin(kWhitenerPartNames));
    if (k == kWhitenerParts || !t.raw || t.dtype != GIFT_DTYPE_F32) {
      return fail(GIFT_ERROR_CORRUPT_INPUT, "%s: unexpected tensor '%s' in a basis", n,
                  t.name.c_str());
    }
    BasisEntry& e = entries[t.name.substr(0, hash)];
    e.name = t.name.substr(0, hash);
    std::vector<float>& values = whitener_part(e.whitener, k);
    values.resize(t.elements);
    if (const giftResult_t rc = r->decode(i, values.data(), values.size() * 4, GIFT_DTYPE_F32))
      return rc;
    for (const float x : values) {
      if (!std::isfinite(x))
        return fail(GIFT_ERROR_CORRUPT_INPUT, "%s: '%s' holds a non-finite value", n,
                    t.name.c_str());
    }
    shapes[t.name] = t.shape;
  }
  out->entries.clear();
  for (auto& [en, e] : entries) {
    Whitener& w = e.whitener;
    const std::vector<uint64_t> v_shape = shapes[en + "#v"];
    if (v_shape.size() != 2 || v_shape[0] > UINT32_MAX || v_shape[1] > v_shape[0]) {
      return fail(GIFT_ERROR_CORRUPT_INPUT, "%s: '%s#v' is not d_in x r with r <= d_in", n,
                  en.c_str());
    }
    w.dim = uint32_t(v_shape[0]);
    w.rank = uint32_t(v_shape[1]);
    const std::vector<uint64_t> want[5] = {v_shape, {w.rank}, {w.rank}, {w.dim}, {w.dim}};
    for (int k = 1; k < 5; ++k) {
      if (shapes[en + "#" + kWhitenerPartNames[k]] != want[k]) {
        return fail(GIFT_ERROR_CORRUPT_INPUT,
                    "%s: '%s#%s' is missing or not of shape [%" PRIu64 "]", n, en.c_str(),
                    kWhitenerPartNames[k], want[k][0]);
      }
    }
    const auto damping = metadata.find(en + "#damping");
    const auto source = metadata.find(en + "#source");
    char* end = nullptr;
    if (damping == metadata.end() || source == metadata.end() ||
        (e.damping = std::strtod(damping->second.c_str(), &end), end == damping->second.c_str())) {
      return fail(GIFT_ERROR_CORRUPT_INPUT, "%s: '%s' lacks its #damping or #source metadata", n,
                  en.c_str());
    }
    e.source = source->second;
    out->entries.push_back(std::move(e));
  }
  out->id = basis_id(out->entries);
  out->origin = name;
  if (out->id.lo != h->basis_id()->lo() || out->id.hi != h->basis_id()->hi()) {
    return fail(GIFT_ERROR_CORRUPT_INPUT, "%s: basis id does not match its contents", n);
  }
  return GIFT_OK;
}

giftResult_t read_basis_file(const std::string& path, Basis* out) {
  std::unique_ptr<container::ByteSource> src;
  if (const giftResult_t r = container::map_file(path, &src)) return r;
  return parse_basis(src->data(), src->size(), path, out);
}

giftResult_t read_embedded_basis(const container::FrameReader& r, Basis* out, bool* found) {
  std::vector<uint8_t> scratch;
  const uint8_t* bytes = nullptr;
  uint64_t size = 0;
  *found = false;
  if (const giftResult_t rc = r.embedded_basis(&scratch, &bytes, &size)) return rc;
  if (!r.header()->basis()) return GIFT_OK;
  const std::string name = r.name() + ": embedded basis";
  if (const giftResult_t rc = parse_basis(bytes, size, name, out)) return rc;
  const fb::BasisId* said = r.header()->basis_id();
  if (!said || said->lo() != out->id.lo || said->hi() != out->id.hi) {
    return fail(GIFT_ERROR_FIELD_INVALID, "%s has id %s, the frame's basis_id says %s",
                name.c_str(), out->id.hex().c_str(),
                said ? BasisId{said->lo(), said->hi()}.hex().c_str() : "nothing");
  }
  *found = true;
  return GIFT_OK;
}

giftResult_t resolve_whitener(const container::FrameReader& r, size_t index, const Basis* basis,
                              const Whitener** out) {
  const container::TensorEntry& e = r.tensors()[index];
  const fb::BasisId* want = e.fb->basis_id();
  const BasisId want_id{want ? want->lo() : 0, want ? want->hi() : 0};
  if (!basis) {
    return fail(GIFT_ERROR_BASIS_MISSING,
                "%s: tensor '%s': encoded in basis %s, and no basis is given", r.name().c_str(),
                e.name.c_str(), want_id.hex().c_str());
  }
  if (!(basis->id == want_id)) {
    return fail(GIFT_ERROR_BASIS_MISSING,
                "%s: tensor '%s': encoded in basis %s, but basis file %s has %s", r.name().c_str(),
                e.name.c_str(), want_id.hex().c_str(), basis->origin.c_str(),
                basis->id.hex().c_str());
  }
  const Whitener* t = basis->find(e.name);
  if (!t || t->dim != e.cols) {
    return fail(GIFT_ERROR_BASIS_MISSING, "%s: tensor '%s': basis %s has no whitener for it",
                r.name().c_str(), e.name.c_str(), want_id.hex().c_str());
  }
  *out = t;
  return GIFT_OK;
}

giftResult_t decode_rows_in_basis(const container::FrameReader& r, size_t index, const Basis* basis,
                                  uint64_t first_row, uint64_t rows, void* dst, uint64_t dst_bytes,
                                  giftDType_t dst_dtype,
                                  container::FrameReader::SectionCache* cache) {
  if (index >= r.tensors().size() || r.tensors()[index].fb->coords() != fb::Coords::Gift) {
    return r.decode_rows(index, first_row, rows, dst, dst_bytes, dst_dtype, false, cache);
  }
  const container::TensorEntry& e = r.tensors()[index];
  if (const giftResult_t rc = r.check_output(index, dst, dst_bytes, dst_dtype, rows * e.cols))
    return rc;
  const Whitener* t = nullptr;
  if (const giftResult_t rc = resolve_whitener(r, index, basis, &t)) return rc;
  // The inverse whitening acts on each row by itself: a band maps back alone. It is done in
  // place in an fp32 output (aligned as floats: check_output); another output gets the fp32
  // rows converted from a buffer, left uninitialized (the decode writes every element: a
  // zero-filled one cost a pass more).
  const uint64_t n = rows * e.cols;
  std::unique_ptr<float[]> temporary;
  float* v = static_cast<float*>(dst);
  if (dst_dtype != GIFT_DTYPE_F32) {
    temporary.reset(new float[n]);
    v = temporary.get();
  }
  if (const giftResult_t rc =
          r.decode_rows(index, first_row, rows, v, n * 4, GIFT_DTYPE_F32, true, cache))
    return rc;
  unwhiten(*t, v, rows, r.threads());
  if (temporary) convert_elements(v, GIFT_DTYPE_F32, dst, dst_dtype, n);
  return GIFT_OK;
}

giftResult_t decode_in_basis(const container::FrameReader& r, size_t index, const Basis* basis,
                             void* dst, uint64_t dst_bytes, giftDType_t dst_dtype) {
  if (const giftResult_t rc = r.check_output(index, dst, dst_bytes, dst_dtype)) return rc;
  container::FrameReader::SectionCache fresh;  // a whole decode checks the sections again
  return decode_rows_in_basis(r, index, basis, 0, r.tensors()[index].rows, dst, dst_bytes,
                              dst_dtype, &fresh);
}

container::CoordsChoice record(const Selection& s, const BasisId& id) {
  container::CoordsChoice c;
  c.gift = s.gift;
  c.has_selection = s.made;
  if (s.made) {
    c.basis_lo = id.lo;
    c.basis_hi = id.hi;
  }
  c.euclidean_error = s.euclidean_error;
  c.gift_error = s.gift_error;
  c.transform_flops = s.transform_flops;
  c.reason = s.reason;
  return c;
}

giftResult_t add_tensor_in_basis(container::FrameWriter* w, const std::string& name,
                                 const container::TensorShape& shape, giftDType_t dtype,
                                 const void* data, const giftQuantParams& p, const Basis* basis,
                                 const SelectOptions& o, Selection* out) {
  // Only matrices can be whitened; everything else, and Euclidean by request, as given.
  if (!basis || o.mode == CoordsMode::kEuclidean || shape.dims.size() < 2) {
    *out = Selection{};
    return w->add_tensor(name, shape, dtype, data, &p);
  }
  // Read for the choice: a scan for non-finite values and a sample of rows, never the whole
  // tensor in fp32; then, in GIFT coordinates, whitened band by band as the writer encodes.
  const uint64_t cols = shape.cols, row_bytes = cols * dtype_size(dtype);
  const uint8_t* rows = static_cast<const uint8_t*>(data);
  const bool all_finite = simd::abs_max_bits(data, dtype, shape.elements) < 0x7F800000u;
  std::vector<float> sample(sample_rows(shape.rows, o) * cols);
  for (uint64_t i = 0; i < sample.size() / std::max<uint64_t>(cols, 1); ++i) {
    convert_elements(rows + sample_row(i, shape.rows, o) * row_bytes, dtype, &sample[i * cols],
                     GIFT_DTYPE_F32, cols);
  }
  const Whitener* t = basis->find(name);
  SelectOptions on_threads = o;
  on_threads.threads = w->threads();
  *out = choose_from_sample(sample.data(), all_finite, shape.rows, cols, t, p, on_threads);
  std::vector<float>().swap(sample);
  if (out->gift) {
    const container::CoordsChoice c = record(*out, basis->id);
    bool refused = false;
    const auto whitened = [&](uint64_t r0, uint64_t n, float* dst) {
      convert_elements(rows + r0 * row_bytes, dtype, dst, GIFT_DTYPE_F32, n * cols);
      whiten(*t, dst, n, w->threads());
      return inverse_stays_finite(*t, dst, n);
    };
    if (const giftResult_t r = w->add_tensor_rows(name, shape, dtype, p, c, whitened, &refused))
      return r;
    if (!refused) return GIFT_OK;
    out->gift = false;
    out->reason = "values too large: decoding in GIFT coordinates could overflow fp32";
  }
  const container::CoordsChoice c = record(*out, basis->id);
  return w->add_tensor(name, shape, dtype, data, &p, &c);
}

}  // namespace gift::coords
