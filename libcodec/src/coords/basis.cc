#include "coords/basis.h"

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>

#include "common/bytes.h"
#include "common/error.h"
#include "container/reader.h"
#include "container/writer.h"
#include "gift_generated.h"

namespace gift::coords {
namespace {

void append_u32(std::vector<uint8_t>* out, uint32_t v) {
  uint8_t b[4];
  store_le(b, v, 4);
  out->insert(out->end(), b, b + 4);
}

void append_floats(std::vector<uint8_t>* out, const std::vector<float>& v) {
  for (float f : v) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    append_u32(out, u);
  }
}

const char* const kParts[] = {"v", "c", "c_inv", "d_rsqrt", "d_sqrt"};

std::vector<float>* part(Whitener& w, int i) {
  std::vector<float>* parts[] = {&w.v, &w.c, &w.c_inv, &w.d_rsqrt, &w.d_sqrt};
  return parts[i];
}

}  // namespace

std::string BasisId::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 "%016" PRIx64, hi, lo);
  return buf;
}

const Whitener* Basis::find(const std::string& name) const {
  for (const BasisEntry& e : entries) {
    if (e.name == name) return &e.whitener;
  }
  return nullptr;
}

BasisId basis_id(const std::vector<BasisEntry>& entries) {
  std::vector<uint8_t> canon;
  for (const BasisEntry& e : entries) {
    append_u32(&canon, uint32_t(e.name.size()));
    canon.insert(canon.end(), e.name.begin(), e.name.end());
    append_u32(&canon, e.whitener.dim);
    append_u32(&canon, e.whitener.rank);
    Whitener& w = const_cast<Whitener&>(e.whitener);
    for (int i = 0; i < 5; ++i) append_floats(&canon, *part(w, i));
  }
  const XXH128_hash_t h = XXH3_128bits(canon.data(), canon.size());
  return {h.low64, h.high64};
}

void finish_basis(Basis* b) {
  std::sort(b->entries.begin(), b->entries.end(),
            [](const BasisEntry& x, const BasisEntry& y) { return x.name < y.name; });
  b->id = basis_id(b->entries);
}

giftResult_t serialize_basis(const Basis& b, int zstd_level, std::vector<uint8_t>* out) {
  container::FrameWriter w;
  w.set_compression(zstd_level);
  w.set_basis_kind(b.id.lo, b.id.hi);
  for (const BasisEntry& e : b.entries) {
    Whitener& wh = const_cast<Whitener&>(e.whitener);
    for (int i = 0; i < 5; ++i) {
      const std::vector<float>& p = *part(wh, i);
      container::TensorShape shape;
      const uint64_t dims2[2] = {wh.dim, wh.rank};
      const uint64_t dims1[1] = {p.size()};
      if (const giftResult_t r =
              container::make_shape(i == 0 ? dims2 : dims1, i == 0 ? 2 : 1, &shape))
        return r;
      if (const giftResult_t r =
              w.add_tensor(e.name + "#" + kParts[i], shape, GIFT_DTYPE_F32, p.data(), nullptr)) {
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
    const int k = int(std::find(std::begin(kParts), std::end(kParts), which) - std::begin(kParts));
    if (k == 5 || !t.raw || t.dtype != GIFT_DTYPE_F32) {
      return fail(GIFT_ERROR_CORRUPT_INPUT, "%s: unexpected tensor '%s' in a basis", n,
                  t.name.c_str());
    }
    BasisEntry& e = entries[t.name.substr(0, hash)];
    e.name = t.name.substr(0, hash);
    std::vector<float>& values = *part(e.whitener, k);
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
      if (shapes[en + "#" + kParts[k]] != want[k]) {
        return fail(GIFT_ERROR_CORRUPT_INPUT,
                    "%s: '%s#%s' is missing or not of shape [%" PRIu64 "]", n, en.c_str(),
                    kParts[k], want[k][0]);
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

}  // namespace gift::coords
