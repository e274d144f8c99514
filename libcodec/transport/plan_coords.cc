#include "transport/plan_coords.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstring>

#include "api/handles.h"
#include "common/error.h"
#include "common/id_hex.h"
#include "common/xxh3.h"
#include "coords/select.h"
#include "numerics/fp_env.h"

namespace gift::transport {
namespace {

// Identifies the set of tensors in GIFT coordinates, so that a rank whose choice differs is
// caught at the first exchange instead of summing values in different coordinates.
uint32_t coords_hash(const std::vector<uint8_t>& in_gift) {
  if (std::find(in_gift.begin(), in_gift.end(), 1) == in_gift.end()) return 0;
  const uint32_t h = uint32_t(XXH3_64bits(in_gift.data(), in_gift.size()));
  return h ? h : 1;
}

uint64_t tensor_elements(const BucketShape& b, size_t i) { return b.offset[i + 1] - b.offset[i]; }

constexpr uint32_t kStateMagic = 0x53544647u;  // "GFTS"
// 1: a fingerprint without the shapes, 2: without the coordinates mode (StateKey).
constexpr uint32_t kStateVersion = 3;

}  // namespace

PlanCoords::PlanCoords(size_t tensors)
    : whitener(tensors),
      in_gift(tensors, 0),
      hash(coords_hash(in_gift)),
      estimates(2 * tensors, 0.0f) {}

void PlanCoords::set_basis(const BucketShape& bucket, const giftAllReduceConfig& config,
                           const giftBasis* basis, std::vector<uint8_t>* out) {
  std::vector<std::unique_ptr<coords::Whitener>> w(whitener.size());
  std::vector<uint8_t> choice(whitener.size(), 0);
  const bool use = basis && config.coords != GIFT_COORDS_MODE_EUCLIDEAN;
  for (size_t i = 0; use && i < w.size(); ++i) {
    const coords::Whitener* t = basis->basis.find(bucket.names[i]);
    const bool eligible = t && bucket.shapes[i].size() >= 2 && bucket.shapes[i].back() == t->dim &&
                          tensor_elements(bucket, i) > 0;
    if (!eligible) continue;
    w[i] = std::make_unique<coords::Whitener>(*t);
    choice[i] = config.coords == GIFT_COORDS_MODE_GIFT;
  }
  whitener = std::move(w);
  has_basis = basis != nullptr;
  basis_id = basis ? basis->basis.id : coords::BasisId{};
  calls_with_basis = 0;
  call_counts = false;  // a call in flight began with another basis
  *out = std::move(choice);
}

bool PlanCoords::other_basis(const giftBasis* basis) const {
  return has_basis != (basis != nullptr) || (basis && !(basis_id == basis->basis.id));
}

std::vector<std::pair<uint64_t, uint64_t>> PlanCoords::changed_ranges(
    const BucketShape& bucket, const Layout& layout, int rank, const std::vector<uint8_t>& choice,
    bool new_whiteners) const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  const uint64_t sb = layout.shard_begin[rank], se = layout.shard_begin[rank + 1];
  for (size_t i = 0; i < choice.size(); ++i) {
    if (choice[i] == in_gift[i] && !(new_whiteners && in_gift[i])) continue;
    const uint64_t b = std::max(sb, bucket.offset[i]), e = std::min(se, bucket.offset[i + 1]);
    if (b < e) out.emplace_back(b - sb, e - sb);
  }
  return out;
}

void PlanCoords::choose(const std::vector<uint8_t>& choice) {
  in_gift = choice;
  hash = coords_hash(in_gift);
}

giftResult_t PlanCoords::get(giftCoords_t* coords, size_t n) const {
  if (n != in_gift.size() || (n && !coords)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "the plan has %zu tensors, %zu asked for",
                in_gift.size(), n);
  }
  for (size_t i = 0; i < n; ++i) coords[i] = in_gift[i] ? GIFT_COORDS_GIFT : GIFT_COORDS_EUCLIDEAN;
  return GIFT_OK;
}

bool PlanCoords::any_in_gift() const {
  return std::any_of(in_gift.begin(), in_gift.end(), [](uint8_t g) { return g != 0; });
}

bool PlanCoords::measuring(const giftAllReduceConfig& config) const {
  if (!has_basis || config.coords != GIFT_COORDS_MODE_AUTO) return false;
  const uint64_t n = calls_with_basis;
  return n == 0 || (config.reselect_every > 0 && n % config.reselect_every == 0);
}

void PlanCoords::measure(const BucketShape& bucket, const giftQuantParams& params,
                         const float* flat) {
  const num::FpEnvGuard fp_env;
  coords::SelectOptions o;
  o.mode = coords::CoordsMode::kAuto;
  for (size_t i = 0; i + 1 < bucket.offset.size(); ++i) {
    float e = NAN, g = NAN;
    if (whitener[i]) {
      const uint64_t cols = whitener[i]->dim, rows = tensor_elements(bucket, i) / cols;
      const coords::Selection c =
          coords::choose_coords(flat + bucket.offset[i], rows, cols, whitener[i].get(), params, o);
      e = c.euclidean_error;
      g = c.gift_error;
    }
    estimates[2 * i] = e;
    estimates[2 * i + 1] = g;
  }
}

std::vector<uint8_t> PlanCoords::decide(const uint8_t* msgs, uint64_t message_bytes,
                                        uint64_t extra_at, int world) {
  std::fill(estimates.begin(), estimates.end(), 0.0f);
  std::vector<float> theirs(estimates.size());
  for (int s = 0; s < world; ++s) {
    memcpy(theirs.data(), msgs + uint64_t(s) * message_bytes + extra_at,
           theirs.size() * sizeof(float));
    for (size_t k = 0; k < theirs.size(); ++k) estimates[k] += theirs[k];
  }
  const double margin = coords::SelectOptions{}.margin;
  std::vector<uint8_t> d(in_gift.size(), 0);
  for (size_t i = 0; i < d.size(); ++i) {
    const double e = estimates[2 * i], g = estimates[2 * i + 1];
    d[i] = whitener[i] && std::isfinite(e) && std::isfinite(g) && g < (1.0 - margin) * e;
  }
  return d;
}

void PlanCoords::fill_header(MessageHeader* h) const {
  if (has_basis) {
    memcpy(h->basis_id, &basis_id.lo, 8);
    memcpy(h->basis_id + 8, &basis_id.hi, 8);
  } else {
    memset(h->basis_id, 0, sizeof h->basis_id);
  }
  h->coords_hash = hash;
}

giftResult_t PlanCoords::check_header(const MessageHeader& h, int sender, uint32_t step) const {
  uint8_t mine[16] = {};
  if (has_basis) {
    memcpy(mine, &basis_id.lo, 8);
    memcpy(mine + 8, &basis_id.hi, 8);
  }
  if (memcmp(h.basis_id, mine, sizeof mine) != 0) {
    uint64_t lo, hi;
    memcpy(&lo, h.basis_id, 8);
    memcpy(&hi, h.basis_id + 8, 8);
    return fail(GIFT_ERROR_BASIS_MISSING,
                "the message from rank %d in %s is in basis %s, this rank holds %s", sender,
                step_name(step), id_or_none(lo, hi).c_str(),
                id_or_none(basis_id.lo, basis_id.hi).c_str());
  }
  if (h.coords_hash != hash) {
    return fail(GIFT_ERROR_BASIS_MISSING,
                "the message from rank %d in %s chose other tensors for GIFT coordinates than "
                "this rank",
                sender, step_name(step));
  }
  return GIFT_OK;
}

StateKey state_key(int world, int rank, const giftAllReduceConfig& config,
                   const BucketShape& bucket) {
  std::vector<uint64_t> words = {uint64_t(world),          uint64_t(rank),
                                 uint64_t(config.kind),    config.block,
                                 uint64_t(config.op),      uint64_t(config.scale_dtype),
                                 uint64_t(config.rounding)};
  words.insert(words.end(), bucket.offset.begin(), bucket.offset.end());
  for (giftDType_t d : bucket.dtypes) words.push_back(uint64_t(d));
  StateKey key;
  key.v1 = XXH3_64bits(words.data(), words.size() * sizeof(uint64_t));
  for (const std::vector<uint64_t>& shape : bucket.shapes) {
    words.push_back(shape.size());
    words.insert(words.end(), shape.begin(), shape.end());
  }
  key.v2 = XXH3_64bits(words.data(), words.size() * sizeof(uint64_t));
  words.push_back(uint64_t(config.coords));
  key.v3 = XXH3_64bits(words.data(), words.size() * sizeof(uint64_t));
  return key;
}

giftResult_t save_state(const StateLayout& l, const StateKey& key, uint64_t call,
                        const PlanCoords& c, void* state, uint64_t bytes) {
  if (!state) return fail(GIFT_ERROR_INVALID_ARGUMENT, "state is NULL");
  if (bytes < l.bytes()) {
    return fail(GIFT_ERROR_BUFFER_TOO_SMALL, "the state takes %" PRIu64 " bytes, not %" PRIu64,
                l.bytes(), bytes);
  }
  const StateHeader h{kStateMagic,
                      kStateVersion,
                      key.v3,
                      call,
                      l.residual_count,
                      l.shard_residual_count,
                      c.calls_with_basis,
                      c.basis_id.lo,
                      c.basis_id.hi};
  uint8_t* out = static_cast<uint8_t*>(state);
  memcpy(out, &h, sizeof h);
  if (!c.in_gift.empty()) memcpy(out + l.coords_at(), c.in_gift.data(), c.in_gift.size());
  return GIFT_OK;
}

giftResult_t check_state(const StateLayout& l, const StateKey& key, const PlanCoords& c,
                         const void* state, uint64_t bytes, uint64_t* call) {
  if (!state) return fail(GIFT_ERROR_INVALID_ARGUMENT, "state is NULL");
  StateHeader h{};
  if (bytes >= sizeof h) memcpy(&h, state, sizeof h);
  const bool ours = (h.version == kStateVersion && h.fingerprint == key.v3) ||
                    (h.version == 2 && h.fingerprint == key.v2) ||
                    (h.version == 1 && h.fingerprint == key.v1);
  if (bytes != l.bytes() || h.magic != kStateMagic || !ours ||
      h.residual_count != l.residual_count || h.shard_residual_count != l.shard_residual_count) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "the state (%" PRIu64
                " bytes) was not saved from a plan of this config, world, "
                "rank and tensors",
                bytes);
  }
  if (h.basis_lo != c.basis_id.lo || h.basis_hi != c.basis_id.hi) {
    return fail(GIFT_ERROR_BASIS_MISSING,
                "the state was saved in basis %s, this plan holds %s: set that basis first",
                id_or_none(h.basis_lo, h.basis_hi).c_str(),
                id_or_none(c.basis_id.lo, c.basis_id.hi).c_str());
  }
  // A plan only ever commits finite residuals: a state holding another was damaged, and
  // loaded it would fail every later call (or, keeping non-finite values, poison them).
  const uint8_t* residuals = static_cast<const uint8_t*>(state) + l.residual_at();
  for (uint64_t i = 0; i < l.residual_count + l.shard_residual_count; ++i) {
    float r;
    memcpy(&r, residuals + i * sizeof r, sizeof r);
    if (!std::isfinite(r)) {
      return fail(GIFT_ERROR_CORRUPT_INPUT,
                  "the state holds a non-finite residual (value %" PRIu64 " of %" PRIu64
                  "): it was damaged",
                  i, l.residual_count + l.shard_residual_count);
    }
  }
  *call = h.call;
  return GIFT_OK;
}

void load_state_coords(const StateLayout& l, const void* state, PlanCoords* c) {
  StateHeader h;
  memcpy(&h, state, sizeof h);
  const uint8_t* in = static_cast<const uint8_t*>(state) + l.coords_at();
  std::vector<uint8_t> choice(c->in_gift.size());
  for (size_t i = 0; i < choice.size(); ++i) choice[i] = in[i] && c->whitener[i];
  c->choose(choice);
  c->calls_with_basis = h.calls_with_basis;
}

}  // namespace gift::transport
