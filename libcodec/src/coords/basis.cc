#include "coords/basis.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "common/bytes.h"
#include "common/error.h"
#include "common/id_hex.h"
#include "common/xxh3.h"

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

}  // namespace

const char* const kWhitenerPartNames[kWhitenerParts] = {"v", "c", "c_inv", "d_rsqrt", "d_sqrt"};

std::vector<float>& whitener_part(Whitener& w, int i) {
  std::vector<float>* parts[] = {&w.v, &w.c, &w.c_inv, &w.d_rsqrt, &w.d_sqrt};
  return *parts[i];
}

const std::vector<float>& whitener_part(const Whitener& w, int i) {
  return whitener_part(const_cast<Whitener&>(w), i);
}

std::string BasisId::hex() const { return id_hex(lo, hi); }

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
    for (int i = 0; i < kWhitenerParts; ++i) append_floats(&canon, whitener_part(e.whitener, i));
  }
  const XXH128_hash_t h = XXH3_128bits(canon.data(), canon.size());
  return {h.low64, h.high64};
}

void finish_basis(Basis* b) {
  std::sort(b->entries.begin(), b->entries.end(),
            [](const BasisEntry& x, const BasisEntry& y) { return x.name < y.name; });
  b->id = basis_id(b->entries);
}

}  // namespace gift::coords
