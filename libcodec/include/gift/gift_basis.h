/* libgift: GIFT coordinates. A basis holds, per matrix name, a whitener T of the input side
 * (FORMAT.md 2.4); a matrix W is encoded as W T and decoded as Q(W T) T^-1, which can lower
 * the round-trip error where the gradient's geometry is uneven. This header fits bases,
 * loads and saves them (.giftb), names them by id, encodes tensors in their coordinates
 * with the measured choice between GIFT and Euclidean coordinates, and decodes with a
 * basis held apart from the frame.
 *
 * Conventions as in gift.h: every call returns a giftResult_t, sized structs start from
 * their GIFT_..._INIT macro. */
#ifndef GIFT_GIFT_BASIS_H
#define GIFT_GIFT_BASIS_H

#include "gift/gift.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct giftBasis giftBasis;

/* A basis from a .giftb file (memory-mapped while read) or from its bytes (copied). The
 * contents are checked against the id the basis names (GIFT_ERROR_CORRUPT_INPUT if they
 * differ). */
GIFT_API giftResult_t giftBasisLoad(const char* path, giftBasis** basis);
GIFT_API giftResult_t giftBasisFromBytes(const void* data, uint64_t size, giftBasis** basis);

/* The basis as the bytes of a .giftb frame (freed with giftFree), or written to `path`
 * through a temporary name and a rename. zstd_level 0 stores it uncompressed. */
GIFT_API giftResult_t giftBasisSerialize(const giftBasis* basis, int zstd_level, void** data,
                                         uint64_t* size);
GIFT_API giftResult_t giftBasisSave(const giftBasis* basis, const char* path, int zstd_level);
GIFT_API void giftBasisFree(giftBasis* basis);

/* The id (all zero for NULL), and as 32 lowercase hex digits, high half first. */
GIFT_API giftBasisId giftBasisGetId(const giftBasis* basis);
GIFT_API void giftBasisIdFormat(giftBasisId id, char hex[33]);

typedef struct {
  size_t size; /* sizeof(giftBasisEntryInfo) */
  unsigned int magic;
  unsigned int version;
  const char* name;   /* the matrix it whitens; valid until the basis is freed */
  uint32_t dim;       /* d_in: the matrix's columns */
  uint32_t rank;      /* r */
  double damping;     /* what it was fitted with */
  const char* source; /* "activations" or "gradients" */
} giftBasisEntryInfo;

#define GIFT_BASIS_ENTRY_INFO_INIT \
  { sizeof(giftBasisEntryInfo), GIFT_STRUCT_MAGIC, GIFT_VERSION_NUMBER, "", 0, 0, 0.0, "" }

/* Entries are in name order. */
GIFT_API uint64_t giftBasisEntryCount(const giftBasis* basis);
GIFT_API giftResult_t giftBasisGetEntry(const giftBasis* basis, uint64_t index,
                                        giftBasisEntryInfo* info);
GIFT_API giftResult_t giftBasisFindEntry(const giftBasis* basis, const char* name, uint64_t* index);

/* ---- Fitting ------------------------------------------------------------------------ */

/* How a whitener is fitted to a second moment A: its top `rank` eigenpairs (exact up to
 * exact_max_dim, or where rank + oversample reaches dim; else by randomized subspace iteration
 * on rank + oversample vectors, power_iterations of them, at most
 * GIFT_FIT_MAX_POWER_ITERATIONS) plus the residual diagonal, floored at the damping (times
 * mean diag A when damping_relative), a positive finite number. */
#define GIFT_FIT_MAX_POWER_ITERATIONS 64
typedef struct {
  size_t size; /* sizeof(giftFitParams) */
  unsigned int magic;
  unsigned int version;
  uint32_t rank;
  double damping;
  int damping_relative;
  uint32_t exact_max_dim;
  uint32_t oversample;
  uint32_t power_iterations;
  uint64_t seed;
} giftFitParams;

#define GIFT_FIT_PARAMS_INIT \
  { sizeof(giftFitParams), GIFT_STRUCT_MAGIC, GIFT_VERSION_NUMBER, 32, 1e-3, 1, 1024, 10, 4, 1 }

/* A = W^T W / rows for a rows x cols gradient W of `dtype`, into `a` (cols x cols doubles,
 * row-major): the second moment to fit when no activation statistics exist. A gradient holding
 * NaN or Inf is refused (GIFT_ERROR_NONFINITE_INPUT, naming how many and the first), here and
 * by giftGradientSecondMomentUpdate. */
GIFT_API giftResult_t giftGradientSecondMoment(const void* w, giftDType_t dtype, uint64_t rows,
                                               uint64_t cols, double* a);
/* The moment of a later dump folded into `a` in place, as the smoothing over dumps taken in
 * turn: a = decay a + (1 - decay) W^T W / rows, decay in [0, 1), where `a` holds a symmetric
 * moment (giftGradientSecondMoment's, or this function's). One matrix, not two. Only the upper
 * triangle of `a` is read; the lower one is then written as its mirror. Both functions leave
 * `a` untouched on an error; giftGradientSecondMoment never reads it. */
GIFT_API giftResult_t giftGradientSecondMomentUpdate(const void* w, giftDType_t dtype,
                                                     uint64_t rows, uint64_t cols, double decay,
                                                     double* a);

typedef struct giftBasisBuilder giftBasisBuilder;
GIFT_API giftResult_t giftBasisBuilderCreate(const giftFitParams* params,
                                             giftBasisBuilder** builder);
GIFT_API void giftBasisBuilderFree(giftBasisBuilder* builder);

/* Fits a whitener for matrix `name` to the dim x dim second moment `a` (row-major,
 * symmetric positive semi-definite; `source` says where it came from: "activations" or
 * "gradients"). With n_dampings > 0 the candidate dampings replace params->damping: each is
 * measured on `probe` (probe_rows x dim fp32, a gradient of that matrix) by the encoder's
 * estimate under `measure` and the lowest kept (the first without a probe). *chosen, if
 * not NULL, gets the damping kept. A zero `a` (the matrix saw no input, or only values whose
 * squares underflow) has nothing to whiten by: the matrix gets no whitener, so it stays
 * Euclidean wherever the basis is used, the call succeeds, and *chosen is 0. */
GIFT_API giftResult_t giftBasisBuilderAdd(giftBasisBuilder* builder, const char* name,
                                          const double* a, uint32_t dim, const char* source,
                                          const double* dampings, uint32_t n_dampings,
                                          const float* probe, uint64_t probe_rows,
                                          const giftQuantParams* measure, double* chosen);

/* The basis of every whitener added (the builder stays usable). */
GIFT_API giftResult_t giftBasisBuilderFinish(giftBasisBuilder* builder, giftBasis** basis);

/* ---- Coordinates -------------------------------------------------------------------- */

/* W <- W T and W <- W T^-1 in place for a rows x cols fp32 matrix named `name`
 * (GIFT_ERROR_BASIS_MISSING when the basis has no whitener of that width for it). */
GIFT_API giftResult_t giftBasisWhiten(const giftBasis* basis, const char* name, float* w,
                                      uint64_t rows, uint64_t cols);
GIFT_API giftResult_t giftBasisUnwhiten(const giftBasis* basis, const char* name, float* w,
                                        uint64_t rows, uint64_t cols);

typedef enum {
  GIFT_COORDS_MODE_EUCLIDEAN = 0, /* never whiten */
  GIFT_COORDS_MODE_GIFT = 1,      /* whiten every matrix the basis covers (whose dimensions
                                     are at least min_dim and values finite) */
  GIFT_COORDS_MODE_AUTO = 2       /* whiten where the measured estimate says it helps */
} giftCoordsMode_t;

/* The measured choice: on a deterministic sample of up to sample_rows evenly spaced rows,
 * the round-trip error in both coordinates; GIFT where it is lower by more than `margin`
 * (a fraction), both dimensions are at least min_dim, and the whitening costs at most
 * flops_budget (0: no limit). Matrices holding NaN or Inf stay Euclidean. Functions that take
 * a giftSelectParams take NULL for GIFT_SELECT_PARAMS_INIT's. */
typedef struct {
  size_t size; /* sizeof(giftSelectParams) */
  unsigned int magic;
  unsigned int version;
  giftCoordsMode_t mode;
  double margin;
  uint32_t sample_rows;
  uint32_t min_dim;
  double flops_budget;
} giftSelectParams;

#define GIFT_SELECT_PARAMS_INIT                                                                    \
  {                                                                                                \
    sizeof(giftSelectParams), GIFT_STRUCT_MAGIC, GIFT_VERSION_NUMBER, GIFT_COORDS_MODE_AUTO, 0.05, \
        256, 16, 0.0                                                                               \
  }

/* The choice for one rows x cols fp32 matrix without encoding it (selection->reason is
 * valid until the calling thread's next call of this function). */
GIFT_API giftResult_t giftChooseCoords(const giftBasis* basis, const char* name, const float* w,
                                       uint64_t rows, uint64_t cols, const giftQuantParams* params,
                                       const giftSelectParams* select, giftSelection* selection);

/* Like giftFrameWriterAddTensor for an FP8 tensor, in the coordinates the choice picks
 * (Euclidean for tensors of fewer than 2 dimensions); the choice and both estimates are
 * recorded in the frame. `selection` may be NULL; its reason is valid until the writer is
 * freed. The basis must outlive the call only. */
GIFT_API giftResult_t giftFrameWriterAddTensorInBasis(
    giftFrameWriter* writer, const char* name, const uint64_t* shape, uint32_t ndim,
    giftDType_t dtype, const void* data, const giftQuantParams* params, const giftBasis* basis,
    const giftSelectParams* select, giftSelection* selection);

/* Carries `basis` inside the frame (compressed as the writer's data sections are), so that
 * it decodes on its own: the basis of every tensor in GIFT coordinates, before or after it
 * (GIFT_ERROR_INVALID_ARGUMENT, naming both ids, for a tensor in another). */
GIFT_API giftResult_t giftFrameWriterEmbedBasis(giftFrameWriter* writer, const giftBasis* basis);

/* The basis a frame carries (checked against Frame.basis_id), or NULL in *basis when it
 * carries none; owned by the frame. */
GIFT_API giftResult_t giftFrameEmbeddedBasis(giftFrame* frame, const giftBasis** basis);

/* giftFrameDecodeTensor with `basis` for tensors in GIFT coordinates (NULL: the frame's
 * embedded one). A basis of another id than the tensor names is GIFT_ERROR_BASIS_MISSING,
 * naming both. */
GIFT_API giftResult_t giftFrameDecodeTensorWithBasis(giftFrame* frame, uint64_t index,
                                                     const giftBasis* basis, void* dst,
                                                     uint64_t dst_bytes, giftDType_t dst_dtype);

/* giftFrameDecodeRows with `basis` for tensors in GIFT coordinates (NULL: the frame's
 * embedded one). */
GIFT_API giftResult_t giftFrameDecodeRowsWithBasis(giftFrame* frame, uint64_t index,
                                                   uint64_t first_row, uint64_t rows,
                                                   const giftBasis* basis, void* dst,
                                                   uint64_t dst_bytes, giftDType_t dst_dtype);

/* giftFrameVerify with `basis` for tensors in GIFT coordinates (NULL: the frame's embedded
 * one, as giftFrameVerify), so that a frame whose basis travels apart can be verified; the
 * embedded basis, if any, is verified either way. */
GIFT_API giftResult_t giftFrameVerifyWithBasis(giftFrame* frame, const giftBasis* basis);

#ifdef __cplusplus
}
#endif

#endif /* GIFT_GIFT_BASIS_H */
