// A basis: per tensor name, the whitener of the GIFT coordinates it was fitted for. Stored as a
// frame of kind Basis (.giftb): for tensor NAME, raw tensors "NAME#v" (d x r), "NAME#c",
// "NAME#c_inv" (r) and "NAME#d_rsqrt", "NAME#d_sqrt" (d), and metadata "NAME#damping" and
// "NAME#source". Its id is XXH3-128 of the canonical bytes (see basis_id).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coords/whitener.h"
#include "gift/gift.h"

namespace gift::coords {

struct BasisEntry {
  std::string name;
  Whitener whitener;
  double damping = 0;
  std::string source;  // "gradients" or "activations"
};

struct BasisId {
  uint64_t lo = 0, hi = 0;
  bool operator==(const BasisId& o) const { return lo == o.lo && hi == o.hi; }
  std::string hex() const;
};

struct Basis {
  std::vector<BasisEntry> entries;  // sorted by name
  BasisId id;
  std::string origin;  // where it was read from, for messages

  const Whitener* find(const std::string& name) const;
};

// The canonical bytes, in name order: per entry the name's length (u32) and bytes, dim and
// rank (u32), then v, c, c_inv, d_rsqrt, d_sqrt as little-endian fp32; the id is their
// XXH3-128. Any change to any whitener changes the id.
BasisId basis_id(const std::vector<BasisEntry>& sorted_entries);

// Sorts the entries and sets the id.
void finish_basis(Basis* b);

// The five arrays of a whitener in canonical order, with the names FORMAT.md 2.4 gives
// their tensors in a basis frame ("NAME#v", ...).
constexpr int kWhitenerParts = 5;
extern const char* const kWhitenerPartNames[kWhitenerParts];
std::vector<float>& whitener_part(Whitener& w, int i);
const std::vector<float>& whitener_part(const Whitener& w, int i);

}  // namespace gift::coords
