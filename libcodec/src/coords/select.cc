#include "coords/select.h"

#include <cinttypes>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "gift_generated.h"
#include "numerics/elementwise.h"

namespace gift::coords {
namespace {

double round_trip_error(const std::vector<float>& x, uint64_t rows, uint64_t cols,
                        const giftQuantParams& p, const Whitener* t) {
  std::vector<float> v = x;
  if (t) whiten(*t, v.data(), rows);
  uint64_t sb = 0;
  giftScaleBytes(&p, rows, cols, &sb);
  std::vector<uint8_t> codes(v.size()), scales(sb);
  giftQuantParams q = p;
  q.nonfinite = GIFT_NONFINITE_KEEP;
  if (giftEncode(&q, v.data(), GIFT_DTYPE_F32, rows, cols, codes.data(), scales.data(), sb,
                 nullptr) ||
      giftDecode(&q, codes.data(), scales.data(), sb, rows, cols, v.data(), GIFT_DTYPE_F32)) {
    return INFINITY;
  }
  if (t) unwhiten(*t, v.data(), rows);
  giftErrorMetrics m;
  if (giftComputeErrorMetrics(x.data(), v.data(), rows, cols, nullptr, &m)) return INFINITY;
  return m.rel_l2;
}

}  // namespace

container::CoordsChoice choose_coords(const float* w, uint64_t rows, uint64_t cols,
                                      const Whitener* t, const BasisId& id,
                                      const giftQuantParams& p, const SelectOptions& o) {
  container::CoordsChoice c;
  if (o.mode == CoordsMode::kEuclidean) return c;
  c.has_selection = true;
  c.basis_lo = id.lo;
  c.basis_hi = id.hi;
  if (!t) {
    c.reason = "no whitener in the basis";
    return c;
  }
  if (t->dim != cols || rows < o.min_dim || cols < o.min_dim) {
    c.reason = t->dim != cols ? "basis dimension differs" : "too small";
    return c;
  }
  // Whitening mixes each row's values, so one NaN or Inf (kept by request) would spread
  // over its whole row; such tensors stay Euclidean, where it stays one element.
  for (uint64_t i = 0; i < rows * cols; ++i) {
    if (!std::isfinite(w[i])) {
      c.reason = "non-finite values";
      return c;
    }
  }
  c.transform_flops = 8.0 * double(rows) * double(cols) * double(t->rank);
  // Deterministic, evenly spaced rows.
  const uint64_t k = std::min<uint64_t>(rows, o.sample_rows);
  std::vector<float> sample(k * cols);
  for (uint64_t i = 0; i < k; ++i) {
    std::memcpy(&sample[i * cols], w + (i * rows / k) * cols, cols * 4);
  }
  c.euclidean_error = float(round_trip_error(sample, k, cols, p, nullptr));
  c.gift_error = float(round_trip_error(sample, k, cols, p, t));
  if (o.mode == CoordsMode::kGift) {
    c.gift = true;
    c.reason = "forced (--coords gift)";
  } else if (o.flops_budget > 0 && c.transform_flops > o.flops_budget) {
    c.reason = "transform over the cost budget";
  } else if (c.gift_error < (1.0 - o.margin) * c.euclidean_error) {
    c.gift = true;
    c.reason = "lower estimated error";
  } else {
    c.reason = "no gain over the margin";
  }
  return c;
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

giftResult_t decode_tensor(const container::FrameReader& r, size_t index, const Basis* basis,
                           void* dst, uint64_t dst_bytes, giftDType_t dst_dtype) {
  if (index >= r.tensors().size() || r.tensors()[index].fb->coords() != fb::Coords::Gift) {
    return r.decode(index, dst, dst_bytes, dst_dtype);
  }
  const container::TensorEntry& e = r.tensors()[index];
  if (const giftResult_t rc = r.check_output(index, dst, dst_bytes, dst_dtype)) return rc;
  const Whitener* t = nullptr;
  if (const giftResult_t rc = resolve_whitener(r, index, basis, &t)) return rc;
  std::vector<float> v(e.elements);
  if (const giftResult_t rc = r.decode(index, v.data(), v.size() * 4, GIFT_DTYPE_F32, true))
    return rc;
  unwhiten(*t, v.data(), e.rows);
  for (uint64_t i = 0; i < e.elements; ++i) {
    if (dst_dtype == GIFT_DTYPE_F32) {
      static_cast<float*>(dst)[i] = v[i];
    } else {
      static_cast<uint16_t*>(dst)[i] =
          dst_dtype == GIFT_DTYPE_BF16 ? num::bf16_from_float(v[i]) : num::f16_from_float(v[i]);
    }
  }
  return GIFT_OK;
}

}  // namespace gift::coords
