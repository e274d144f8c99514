// The C API of GIFT coordinates (gift_basis.h): bases, fitting, whitening, the measured
// choice of coordinates, and frames written and read in a basis's coordinates.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "api/coords_frames.h"
#include "api/frame_basis.h"
#include "api/handles.h"
#include "common/error.h"
#include "common/output_file.h"
#include "common/sized.h"
#include "container/census.h"
#include "coords/select.h"
#include "gift/gift_basis.h"
#include "numerics/codec.h"
#include "numerics/convert.h"
#include "numerics/shapes.h"
#include "numerics/simd.h"

using gift::fail;

namespace {

const giftFitParams kDefaultFit = GIFT_FIT_PARAMS_INIT;
const giftSelectParams kDefaultSelect = GIFT_SELECT_PARAMS_INIT;

// Every entry point catches allocation failure here, so none throws across the C boundary.
template <class F>
giftResult_t guarded(const char* what, F&& f) {
  gift::clear_error();
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "%s: out of memory", what);
  }
}

giftResult_t new_basis(gift::coords::Basis b, giftBasis** out) {
  *out = new giftBasis{std::move(b)};
  return GIFT_OK;
}

giftResult_t load_select(const giftSelectParams* in, gift::coords::SelectOptions* out) {
  giftSelectParams s = kDefaultSelect;  // NULL: the defaults
  if (in) {
    if (const giftResult_t r = gift::read_sized(in, kDefaultSelect, &s, "giftSelectParams"))
      return r;
  }
  const int mode = gift::enum_int(s.mode);
  if (mode != GIFT_COORDS_MODE_EUCLIDEAN && mode != GIFT_COORDS_MODE_GIFT &&
      mode != GIFT_COORDS_MODE_AUTO)
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown coordinates mode %d", mode);
  if (!(s.margin >= 0 && s.margin < 1))
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "margin %g is not in [0, 1)", s.margin);
  if (!(s.flops_budget >= 0))
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "flops budget %g is negative", s.flops_budget);
  if (s.sample_rows == 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "sample_rows is 0");
  using M = gift::coords::CoordsMode;
  out->mode = s.mode == GIFT_COORDS_MODE_EUCLIDEAN ? M::kEuclidean
              : s.mode == GIFT_COORDS_MODE_GIFT    ? M::kGift
                                                   : M::kAuto;
  out->margin = s.margin;
  out->sample_rows = s.sample_rows;
  out->min_dim = s.min_dim;
  out->flops_budget = s.flops_budget;
  return GIFT_OK;
}

giftSelection to_public(const gift::coords::Selection& s, const char* reason) {
  giftSelection o = GIFT_SELECTION_INIT;
  o.made = s.made;
  o.chosen = s.gift ? GIFT_COORDS_GIFT : GIFT_COORDS_EUCLIDEAN;
  o.euclidean_error = s.euclidean_error;
  o.gift_error = s.gift_error;
  o.transform_flops = s.transform_flops;
  o.reason = reason;
  return o;
}

giftResult_t find_whitener(const giftBasis* basis, const char* name, uint64_t cols,
                           const gift::coords::Whitener** out) {
  if (!basis || !name) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null basis or name");
  const gift::coords::Whitener* t = basis->basis.find(name);
  if (!t || t->dim != cols) {
    return fail(GIFT_ERROR_BASIS_MISSING, "basis %s has no whitener of width %llu for '%s'",
                basis->basis.id.hex().c_str(), (unsigned long long)cols, name);
  }
  *out = t;
  return GIFT_OK;
}

// The public calls take no context: the default thread count (thread_count(nullptr)).
template <void (*Apply)(const gift::coords::Whitener&, float*, uint64_t, int)>
giftResult_t apply(const giftBasis* basis, const char* name, float* w, uint64_t rows, uint64_t cols,
                   const char* what) {
  return guarded(what, [&] {
    const gift::coords::Whitener* t = nullptr;
    if (const giftResult_t r = find_whitener(basis, name, cols, &t)) return r;
    if (rows && !w) return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: null data", what);
    Apply(*t, w, rows, 0);
    return GIFT_OK;
  });
}

}  // namespace

extern "C" {

giftResult_t giftBasisLoad(const char* path, giftBasis** basis) {
  return guarded("giftBasisLoad", [&] {
    if (!path || !basis) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftBasisLoad: null pointer");
    *basis = nullptr;
    gift::coords::Basis b;
    if (const giftResult_t r = gift::coords::read_basis_file(path, &b)) return r;
    return new_basis(std::move(b), basis);
  });
}

giftResult_t giftBasisFromBytes(const void* data, uint64_t size, giftBasis** basis) {
  return guarded("giftBasisFromBytes", [&] {
    if (!basis || (size && !data))
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftBasisFromBytes: null pointer");
    *basis = nullptr;
    gift::coords::Basis b;
    if (const giftResult_t r =
            gift::coords::parse_basis(static_cast<const uint8_t*>(data), size, "basis", &b))
      return r;
    return new_basis(std::move(b), basis);
  });
}

giftResult_t giftBasisSerialize(const giftBasis* basis, int zstd_level, void** data,
                                uint64_t* size) {
  return guarded("giftBasisSerialize", [&] {
    if (!basis || !data || !size)
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftBasisSerialize: null pointer");
    if (zstd_level < 0 || zstd_level > 22)
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "zstd level %d is not in [0, 22]", zstd_level);
    std::vector<uint8_t> bytes;
    if (const giftResult_t r = gift::coords::serialize_basis(basis->basis, zstd_level, &bytes))
      return r;
    void* p = std::malloc(bytes.size() ? bytes.size() : 1);
    if (!p) return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory");
    std::memcpy(p, bytes.data(), bytes.size());
    *data = p;
    *size = bytes.size();
    return GIFT_OK;
  });
}

giftResult_t giftBasisSave(const giftBasis* basis, const char* path, int zstd_level) {
  return guarded("giftBasisSave", [&] {
    if (!basis || !path) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftBasisSave: null pointer");
    if (zstd_level < 0 || zstd_level > 22)
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "zstd level %d is not in [0, 22]", zstd_level);
    std::vector<uint8_t> bytes;
    if (const giftResult_t r = gift::coords::serialize_basis(basis->basis, zstd_level, &bytes))
      return r;
    return gift::write_file_atomically(path, bytes);
  });
}

void giftBasisFree(giftBasis* basis) { delete basis; }

giftBasisId giftBasisGetId(const giftBasis* basis) {
  return basis ? giftBasisId{basis->basis.id.lo, basis->basis.id.hi} : giftBasisId{0, 0};
}

void giftBasisIdFormat(giftBasisId id, char hex[33]) {
  if (hex) std::snprintf(hex, 33, "%s", gift::coords::BasisId{id.lo, id.hi}.hex().c_str());
}

uint64_t giftBasisEntryCount(const giftBasis* basis) {
  return basis ? basis->basis.entries.size() : 0;
}

giftResult_t giftBasisGetEntry(const giftBasis* basis, uint64_t index, giftBasisEntryInfo* info) {
  gift::clear_error();
  if (!basis) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftBasisGetEntry: null basis");
  if (index >= basis->basis.entries.size())
    return fail(GIFT_ERROR_NOT_FOUND, "no basis entry %llu", (unsigned long long)index);
  const gift::coords::BasisEntry& e = basis->basis.entries[index];
  giftBasisEntryInfo i = GIFT_BASIS_ENTRY_INFO_INIT;
  i.name = e.name.c_str();
  i.dim = e.whitener.dim;
  i.rank = e.whitener.rank;
  i.damping = e.damping;
  i.source = e.source.c_str();
  return gift::write_sized(i, info, "giftBasisEntryInfo");
}

giftResult_t giftBasisFindEntry(const giftBasis* basis, const char* name, uint64_t* index) {
  gift::clear_error();
  if (!basis || !name || !index)
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftBasisFindEntry: null pointer");
  const auto& es = basis->basis.entries;
  for (size_t i = 0; i < es.size(); ++i) {
    if (es[i].name == name) {
      *index = i;
      return GIFT_OK;
    }
  }
  return fail(GIFT_ERROR_NOT_FOUND, "basis %s has no entry '%s'", basis->basis.id.hex().c_str(),
              name);
}

namespace {

// giftGradientSecondMoment and giftGradientSecondMomentUpdate (decay 0: a is only written).
giftResult_t second_moment(const char* what, const void* w, giftDType_t dtype, uint64_t rows,
                           uint64_t cols, double decay, double* a) {
  return guarded(what, [&] {
    if (!a || (rows && cols && !w))
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s: null pointer", what);
    if (!gift::known_dtype(dtype))
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "unknown dtype %d", gift::enum_int(dtype));
    if (rows == 0 || cols == 0 || cols > UINT32_MAX || rows > UINT64_MAX / cols)
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "shape %llux%llu has no second moment",
                  (unsigned long long)rows, (unsigned long long)cols);
    if (!(decay >= 0 && decay < 1))
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "decay %g is not in [0, 1)", decay);
    // NaN or Inf would spread through the whole moment (the builder then named a place in A):
    // refused before `a` is touched, naming the gradient's own first one.
    if (gift::simd::abs_max_bits(w, dtype, rows * cols) >= 0x7F800000u) {
      gift::container::Census c;
      c.add(w, dtype, 0, rows * cols);
      return gift::nonfinite_error(c.stats, cols);
    }
    return gift::coords::gradient_second_moment(w, dtype, rows, uint32_t(cols), a, decay);
  });
}

}  // namespace

giftResult_t giftGradientSecondMoment(const void* w, giftDType_t dtype, uint64_t rows,
                                      uint64_t cols, double* a) {
  return second_moment("giftGradientSecondMoment", w, dtype, rows, cols, 0.0, a);
}

giftResult_t giftGradientSecondMomentUpdate(const void* w, giftDType_t dtype, uint64_t rows,
                                            uint64_t cols, double decay, double* a) {
  return second_moment("giftGradientSecondMomentUpdate", w, dtype, rows, cols, decay, a);
}

giftResult_t giftBasisBuilderCreate(const giftFitParams* params, giftBasisBuilder** builder) {
  return guarded("giftBasisBuilderCreate", [&] {
    if (!builder) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftBasisBuilderCreate: null pointer");
    *builder = nullptr;
    giftFitParams p;
    if (const giftResult_t r = gift::read_sized(params, kDefaultFit, &p, "giftFitParams")) return r;
    if (p.rank == 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "rank is 0");
    if (!(p.damping > 0) || !std::isfinite(p.damping))
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "damping %g is not a positive finite number",
                  p.damping);
    if (p.power_iterations > GIFT_FIT_MAX_POWER_ITERATIONS) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "power_iterations %u is above %u",
                  p.power_iterations, unsigned(GIFT_FIT_MAX_POWER_ITERATIONS));
    }
    auto* b = new giftBasisBuilder();
    b->options.rank = p.rank;
    b->options.damping = p.damping;
    b->options.damping_relative = p.damping_relative != 0;
    b->options.exact_max_dim = p.exact_max_dim;
    b->options.oversample = p.oversample;
    b->options.power_iterations = p.power_iterations;
    b->options.seed = p.seed;
    *builder = b;
    return GIFT_OK;
  });
}

void giftBasisBuilderFree(giftBasisBuilder* builder) { delete builder; }

giftResult_t giftBasisBuilderAdd(giftBasisBuilder* builder, const char* name, const double* a,
                                 uint32_t dim, const char* source, const double* dampings,
                                 uint32_t n_dampings, const float* probe, uint64_t probe_rows,
                                 const giftQuantParams* measure, double* chosen) {
  return guarded("giftBasisBuilderAdd", [&] {
    if (!builder || !name || !a || !source || (n_dampings && !dampings))
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftBasisBuilderAdd: null pointer");
    if (dim == 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "'%s': dimension 0", name);
    if (std::string(source) != "activations" && std::string(source) != "gradients") {
      return fail(GIFT_ERROR_INVALID_ARGUMENT,
                  "'%s': source '%s' is not \"activations\" or \"gradients\"", name, source);
    }
    const auto named = [name](const auto& e) { return e.name == name; };
    if (std::any_of(builder->entries.begin(), builder->entries.end(), named) ||
        std::count(builder->left_out.begin(), builder->left_out.end(), name)) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "'%s' added twice", name);
    }
    giftQuantParams q = GIFT_QUANT_PARAMS_INIT;
    if (probe && probe_rows) {
      if (const giftResult_t r = gift::load_params(measure ? measure : &q, &q)) return r;
    }
    const std::vector<double> candidates =
        n_dampings ? std::vector<double>(dampings, dampings + n_dampings)
                   : std::vector<double>{builder->options.damping};
    for (const double d : candidates) {
      if (!(d > 0))
        return fail(GIFT_ERROR_INVALID_ARGUMENT, "'%s': damping %g is not positive", name, d);
    }
    const std::string what = std::string("tensor '") + name + "'";
    // An eigendecomposition of NaN only says that it failed; say where the NaN is.
    uint64_t bad = 0, first = 0;
    bool zero = true;  // every entry (one pass over A for both)
    for (uint64_t k = 0; k < uint64_t(dim) * dim; ++k) {
      if (!std::isfinite(a[k]) && bad++ == 0) first = k;
      zero = zero && a[k] == 0;
    }
    if (bad) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT,
                  "'%s': the second moment holds %llu non-finite value%s, the first at (%llu, "
                  "%llu): its data has NaN or Inf",
                  name, (unsigned long long)bad, bad == 1 ? "" : "s",
                  (unsigned long long)(first / dim), (unsigned long long)(first % dim));
    }
    // The cheap half of semi-definiteness, as giftc compare checks its A: a negative diagonal
    // entry cannot come from a second moment (a file of something else, or of another order).
    bool diagonal = false;  // some entry positive
    for (uint64_t k = 0; k < dim; ++k) {
      diagonal = diagonal || a[k * dim + k] > 0;
      if (a[k * dim + k] < 0) {
        return fail(GIFT_ERROR_INVALID_ARGUMENT,
                    "'%s': the second moment is not positive semi-definite: diagonal entry %llu "
                    "is negative (%g)",
                    name, (unsigned long long)k, a[k * dim + k]);
      }
    }
    // A zero second moment (the matrix saw no input, or inputs whose squares underflow: a
    // frozen or dead layer, a zero-initialised one before it) has no geometry to whiten by:
    // the matrix gets no whitener and stays Euclidean, rather than failing the whole fit.
    // Semi-definite with a zero diagonal is zero: anything else off it is refused.
    if (zero) {
      builder->left_out.push_back(name);
      if (chosen) *chosen = 0;
      return GIFT_OK;
    }
    if (!diagonal) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT,
                  "'%s': the second moment is not positive semi-definite: its diagonal is zero "
                  "and other entries are not",
                  name);
    }
    gift::coords::LowRankPlusDiagonal fit;
    if (const giftResult_t r = gift::coords::fit_low_rank(a, dim, builder->options, &fit))
      return fail(r, "%s: %s", what.c_str(), giftGetLastErrorMessage());
    gift::coords::BasisEntry best;
    double best_error = INFINITY;
    for (const double d : candidates) {
      if (const giftResult_t r =
              gift::coords::redamp(a, d, builder->options.damping_relative, &fit))
        return fail(r, "%s: %s", what.c_str(), giftGetLastErrorMessage());
      gift::coords::BasisEntry e;
      e.name = name;
      e.damping = d;
      e.source = source;
      if (const giftResult_t r =
              gift::coords::make_whitener(fit.u, fit.l, fit.diag, dim, &e.whitener))
        return fail(r, "%s: %s", what.c_str(), giftGetLastErrorMessage());
      double err = 0;
      if (probe && probe_rows && candidates.size() > 1) {
        gift::coords::SelectOptions so;
        so.min_dim = 1;
        err = gift::coords::choose_coords(probe, probe_rows, dim, &e.whitener, q, so).gift_error;
      }
      if (err < best_error || best.name.empty()) {
        best_error = err;
        best = std::move(e);
      }
    }
    if (chosen) *chosen = best.damping;
    builder->entries.push_back(std::move(best));
    return GIFT_OK;
  });
}

giftResult_t giftBasisBuilderFinish(giftBasisBuilder* builder, giftBasis** basis) {
  return guarded("giftBasisBuilderFinish", [&] {
    if (!builder || !basis)
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftBasisBuilderFinish: null pointer");
    gift::coords::Basis b;
    b.entries = builder->entries;
    b.origin = "fitted basis";
    gift::coords::finish_basis(&b);
    return new_basis(std::move(b), basis);
  });
}

giftResult_t giftBasisWhiten(const giftBasis* basis, const char* name, float* w, uint64_t rows,
                             uint64_t cols) {
  return apply<gift::coords::whiten>(basis, name, w, rows, cols, "giftBasisWhiten");
}

giftResult_t giftBasisUnwhiten(const giftBasis* basis, const char* name, float* w, uint64_t rows,
                               uint64_t cols) {
  return apply<gift::coords::unwhiten>(basis, name, w, rows, cols, "giftBasisUnwhiten");
}

giftResult_t giftChooseCoords(const giftBasis* basis, const char* name, const float* w,
                              uint64_t rows, uint64_t cols, const giftQuantParams* params,
                              const giftSelectParams* select, giftSelection* selection) {
  return guarded("giftChooseCoords", [&] {
    if (!basis || !name || (rows && cols && !w))
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftChooseCoords: null pointer");
    if (cols && rows > UINT64_MAX / cols)
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftChooseCoords: shape overflows 64 bits");
    if (const giftResult_t r = gift::check_sized(selection, "giftSelection")) return r;
    giftQuantParams p;
    if (const giftResult_t r = gift::load_params(params, &p)) return r;
    gift::coords::SelectOptions o;
    if (const giftResult_t r = load_select(select, &o)) return r;
    const gift::coords::Selection s =
        gift::coords::choose_coords(w, rows, cols, basis->basis.find(name), p, o);
    thread_local std::string reason;
    reason = s.reason;
    return gift::write_sized(to_public(s, reason.c_str()), selection, "giftSelection");
  });
}

giftResult_t giftFrameWriterAddTensorInBasis(giftFrameWriter* writer, const char* name,
                                             const uint64_t* shape, uint32_t ndim,
                                             giftDType_t dtype, const void* data,
                                             const giftQuantParams* params, const giftBasis* basis,
                                             const giftSelectParams* select,
                                             giftSelection* selection) {
  return guarded("giftFrameWriterAddTensorInBasis", [&] {
    if (!writer || !name) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null writer or name");
    if (selection) {
      if (const giftResult_t r = gift::check_sized(selection, "giftSelection")) return r;
    }
    gift::container::TensorShape s;
    if (const giftResult_t r = gift::container::make_shape(shape, ndim, &s))
      return fail(r, "tensor '%s': %s", name, giftGetLastErrorMessage());
    if (!gift::known_dtype(dtype))
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor '%s': unknown dtype %d", name,
                  gift::enum_int(dtype));
    if (s.elements && !data)
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor '%s': null data", name);
    giftQuantParams p;
    if (const giftResult_t r = gift::load_params(params, &p))
      return fail(r, "tensor '%s': %s", name, giftGetLastErrorMessage());
    gift::coords::SelectOptions o;
    if (const giftResult_t r = load_select(select, &o)) return r;
    gift::coords::Selection chosen;
    if (const giftResult_t r = gift::coords::add_tensor_in_basis(
            &writer->writer, name, s, dtype, data, p, basis ? &basis->basis : nullptr, o, &chosen))
      return r;
    if (!selection) return GIFT_OK;
    writer->reasons.push_back(std::make_unique<std::string>(chosen.reason));
    return gift::write_sized(to_public(chosen, writer->reasons.back()->c_str()), selection,
                             "giftSelection");
  });
}

giftResult_t giftFrameWriterEmbedBasis(giftFrameWriter* writer, const giftBasis* basis) {
  return guarded("giftFrameWriterEmbedBasis", [&] {
    if (!writer || !basis) return fail(GIFT_ERROR_INVALID_ARGUMENT, "null writer or basis");
    std::vector<uint8_t> bytes;
    if (const giftResult_t r =
            gift::coords::serialize_basis(basis->basis, writer->writer.compression(), &bytes))
      return r;
    return writer->writer.embed_basis(std::move(bytes), basis->basis.id.lo, basis->basis.id.hi);
  });
}

giftResult_t giftFrameEmbeddedBasis(giftFrame* frame, const giftBasis** basis) {
  return guarded("giftFrameEmbeddedBasis", [&] {
    if (!frame || !basis)
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftFrameEmbeddedBasis: null pointer");
    return gift::frame_basis(frame, basis);
  });
}

giftResult_t giftFrameDecodeTensorWithBasis(giftFrame* frame, uint64_t index,
                                            const giftBasis* basis, void* dst, uint64_t dst_bytes,
                                            giftDType_t dst_dtype) {
  gift::clear_error();
  return gift::decode_with_basis(frame, index, basis, dst, dst_bytes, dst_dtype);
}

giftResult_t giftFrameDecodeRowsWithBasis(giftFrame* frame, uint64_t index, uint64_t first_row,
                                          uint64_t rows, const giftBasis* basis, void* dst,
                                          uint64_t dst_bytes, giftDType_t dst_dtype) {
  gift::clear_error();
  return gift::decode_rows_with_basis(frame, index, first_row, rows, basis, dst, dst_bytes,
                                      dst_dtype);
}

}  // extern "C"
