/* libgift public C API: FP8 gradient encoding with block scales.
 *
 * Everything here is plain C with opaque or POD types, explicit sizes and error codes, so
 * transports and other languages can embed it. No function throws; each returns a
 * giftResult_t, giftGetErrorString() names the code and giftGetLastErrorMessage() gives
 * the detail of the calling thread's last failure (which tensor, which element, why).
 *
 * Numerics are specified in format/FORMAT.md ("Numerics"); the functions below implement
 * exactly that text.
 *
 * Structs that may grow in later versions start with `size`, `magic` and `version` and have
 * an initializer (a GIFT_..._INIT macro and a ...Init function), as NCCL's config structs
 * do: the library reads and writes at most `size` bytes of the caller's struct, so a
 * program built against an older gift.h keeps working with a newer library. A struct
 * whose magic is not GIFT_STRUCT_MAGIC was not initialized and is refused; one larger than
 * the library knows comes from a newer gift.h and is refused too, since the library could
 * not honour its new fields. giftTensorInfo holds a giftQuantParams and a giftSelection by
 * value: those two grow only with a new version of giftTensorInfo, whose older layouts the
 * library keeps writing. */
#ifndef GIFT_GIFT_H
#define GIFT_GIFT_H

#include <stddef.h>
#include <stdint.h>

#include "gift/gift_version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(GIFT_BUILDING_LIBRARY) && defined(__GNUC__)
#define GIFT_API __attribute__((visibility("default")))
#else
#define GIFT_API
#endif

/* "GIFT" in ASCII, little-endian: the magic of an initialized sized struct. */
#define GIFT_STRUCT_MAGIC 0x54464947u

typedef enum {
  GIFT_OK = 0,
  GIFT_ERROR_INVALID_ARGUMENT = 1, /* a parameter is out of its documented range */
  GIFT_ERROR_NONFINITE_INPUT = 2,  /* NaN or Inf in the input while the policy is ERROR */
  GIFT_ERROR_BUFFER_TOO_SMALL = 3, /* an output buffer is smaller than required */
  GIFT_ERROR_OUT_OF_MEMORY = 4,
  GIFT_ERROR_INTERNAL = 5,
  GIFT_ERROR_IO = 6,            /* a file could not be opened, read or written */
  GIFT_ERROR_CORRUPT_INPUT = 7, /* a file is malformed, truncated or of an unsupported kind */
  /* GIFT frames (FORMAT.md section 2); each names the first check that failed. */
  GIFT_ERROR_FRAME_MAGIC = 10,       /* not a GIFT frame, or damaged by a text-mode transfer */
  GIFT_ERROR_FRAME_VERSION = 11,     /* a major version this build does not read */
  GIFT_ERROR_FRAME_TRUNCATED = 12,   /* shorter than its preamble says */
  GIFT_ERROR_HEADER_CHECKSUM = 13,   /* the header's bytes do not match its checksum */
  GIFT_ERROR_HEADER_INVALID = 14,    /* the header is not a valid FlatBuffer of gift.fbs */
  GIFT_ERROR_FIELD_INVALID = 15,     /* a header field is out of range (enum, shape, size) */
  GIFT_ERROR_SECTION_BOUNDS = 16,    /* a section lies outside the frame or overlaps another */
  GIFT_ERROR_SECTION_ALIGNMENT = 17, /* a section offset is not a multiple of 64 */
  GIFT_ERROR_SECTION_LENGTH = 18,    /* a section's length does not fit its tensor */
  GIFT_ERROR_SECTION_CHECKSUM = 19,  /* a section's bytes do not match its checksum */
  GIFT_ERROR_DECOMPRESSION = 20,     /* a compressed section does not decompress to its length */
  GIFT_ERROR_NOT_FOUND = 21,         /* no tensor of that name, or index out of range */
  GIFT_ERROR_BASIS_MISSING = 22,     /* a tensor needs a basis that is not at hand */
  GIFT_ERROR_DEVICE = 23,            /* no CUDA device, or a CUDA or cuBLAS call failed */
  GIFT_ERROR_REMOTE = 24             /* another rank abandoned the all-reduce call */
} giftResult_t;

typedef enum { GIFT_FP8_E4M3 = 0, GIFT_FP8_E5M2 = 1 } giftFp8Kind_t;

/* Element types of tensors that are encoded from or decoded to. */
typedef enum { GIFT_DTYPE_F32 = 0, GIFT_DTYPE_BF16 = 1, GIFT_DTYPE_F16 = 2 } giftDType_t;

/* Which elements share one scale. The tensor is viewed as rows x cols, cols being its last
 * dimension and rows the product of the others. Scales are stored row-major over the grid
 * of groups. */
typedef enum {
  GIFT_SCALE_TENSOR = 0, /* one scale */
  GIFT_SCALE_ROW = 1,    /* one scale per row */
  GIFT_SCALE_BLOCK = 2,  /* blocks of `block` contiguous elements of a row; the last may be short */
  GIFT_SCALE_TILE = 3    /* tiles of tile_rows x tile_cols; edge tiles may be short */
} giftScaleLayout_t;

typedef enum {
  GIFT_SCALE_DTYPE_F32 = 0, /* little-endian IEEE binary32, 4 bytes per scale */
  GIFT_SCALE_DTYPE_E8M0 = 1 /* OCP MX E8M0 power of two, 1 byte per scale */
} giftScaleDType_t;

typedef enum { GIFT_ROUND_NEAREST = 0, GIFT_ROUND_STOCHASTIC = 1 } giftRounding_t;

/* The coordinates a tensor's values are encoded in: plain (Euclidean), or the GIFT
 * coordinates of a basis (the input side of a matrix whitened; FORMAT.md 2.4). */
typedef enum { GIFT_COORDS_EUCLIDEAN = 0, GIFT_COORDS_GIFT = 1 } giftCoords_t;

typedef enum {
  GIFT_NONFINITE_ERROR = 0, /* NaN/Inf input fails the encode (the default) */
  GIFT_NONFINITE_KEEP = 1   /* store NaN codes (Inf codes in E5M2); scales from finite values */
} giftNonFinite_t;

#define GIFT_BLOCK_MIN 16
#define GIFT_BLOCK_MAX 4096
#define GIFT_BLOCK_DEFAULT 128

typedef struct {
  size_t size;          /* sizeof(giftQuantParams) */
  unsigned int magic;   /* GIFT_STRUCT_MAGIC */
  unsigned int version; /* GIFT_VERSION_NUMBER of the gift.h the caller was built with */
  giftFp8Kind_t kind;
  giftScaleLayout_t layout;
  uint32_t block;     /* GIFT_SCALE_BLOCK: power of two in [GIFT_BLOCK_MIN, GIFT_BLOCK_MAX] */
  uint32_t tile_rows; /* GIFT_SCALE_TILE: >= 1 */
  uint32_t tile_cols; /* GIFT_SCALE_TILE: >= 1 */
  giftScaleDType_t scale_dtype;
  giftRounding_t rounding;
  uint64_t seed;         /* stochastic rounding: generator key */
  uint32_t tensor_index; /* stochastic rounding: distinguishes tensors under one seed */
  giftNonFinite_t nonfinite;
} giftQuantParams;

/* Defaults: E4M3, blocks of 128, fp32 scales, round to nearest, non-finite is an error. */
#define GIFT_QUANT_PARAMS_INIT                                                                    \
  {                                                                                               \
    sizeof(giftQuantParams), GIFT_STRUCT_MAGIC, GIFT_VERSION_NUMBER, GIFT_FP8_E4M3,               \
        GIFT_SCALE_BLOCK, GIFT_BLOCK_DEFAULT, 128, 128, GIFT_SCALE_DTYPE_F32, GIFT_ROUND_NEAREST, \
        0, 0, GIFT_NONFINITE_ERROR                                                                \
  }

/* What an encode saw; filled also when it fails with GIFT_ERROR_NONFINITE_INPUT. Its layout
 * is fixed (device code writes it), so it has no size header and never grows. */
typedef struct {
  float amax;               /* largest finite magnitude in the tensor */
  uint64_t nonfinite_count; /* NaN and Inf elements */
  uint64_t first_nonfinite; /* flat index of the first one, or UINT64_MAX */
} giftEncodeStats;

/* Sets *params to GIFT_QUANT_PARAMS_INIT. */
GIFT_API void giftQuantParamsInit(giftQuantParams* params);

/* Checks a parameter set; the message says which field is wrong. */
GIFT_API giftResult_t giftQuantParamsValidate(const giftQuantParams* params);

/* Number of scales for a rows x cols tensor, and the bytes they take. */
GIFT_API giftResult_t giftScaleCount(const giftQuantParams* params, uint64_t rows, uint64_t cols,
                                     uint64_t* count);
GIFT_API giftResult_t giftScaleBytes(const giftQuantParams* params, uint64_t rows, uint64_t cols,
                                     uint64_t* bytes);

/* A codec context: runtime settings that are not part of the format (how many threads),
 * kept apart from the parameters that decide the bytes. One context serves one thread at a
 * time; every call that takes one accepts NULL for the defaults (all processors, or the
 * OpenMP thread limit of the calling thread when that is lower). */
typedef struct giftCtx giftCtx;
GIFT_API giftResult_t giftCtxCreate(giftCtx** ctx);
GIFT_API void giftCtxFree(giftCtx* ctx);
/* 0: the default; otherwise at most this many threads (capped at the processors). */
GIFT_API giftResult_t giftCtxSetThreads(giftCtx* ctx, int threads);
/* The threads a call with `ctx` (NULL: the defaults) made from the calling thread now runs on:
 * the count set, or the default (OpenMP's omp_get_max_threads()), capped at giftProcessors()
 * and at OpenMP's thread limit; 1 inside an OpenMP parallel region where the runtime allows no
 * nested one. */
GIFT_API int giftCtxThreads(const giftCtx* ctx);
/* The processors this process may keep busy: those its CPU affinity allows, fewer where its
 * cgroup's CPU quota is lower (ceil(quota / period), the lowest from its cgroup up to the root
 * of the hierarchy it sees mounted; cgroup v1 cpu.cfs_quota_us or v2 cpu.max), which OpenMP
 * runtimes do not count; at least 1. The quota is read once, at the first call of any function
 * that uses threads: a later move to another cgroup, or a new quota, is not seen. The
 * affinity is the OpenMP runtime's count for the calling thread (libgomp: that thread's
 * affinity, unless OMP_PLACES or OMP_PROC_BIND is set; LLVM's libomp: the process's at its
 * start), taken again when 50 ms have passed since that thread last took it. */
GIFT_API int giftProcessors(void);

/* Encodes rows*cols elements of `src_dtype` into rows*cols FP8 codes (row-major, the same
 * order as the input) and the scales. `stats` may be NULL. `src` must be aligned to its
 * element size and fp32 scales to 4 bytes (GIFT_ERROR_INVALID_ARGUMENT otherwise); so must
 * `dst` and the scales of giftDecode. The input, the codes and the scales (and for giftDecode
 * the codes, the scales and dst) must not overlap: the result of buffers that do is undefined. */
GIFT_API giftResult_t giftEncode(const giftCtx* ctx, const giftQuantParams* params, const void* src,
                                 giftDType_t src_dtype, uint64_t rows, uint64_t cols,
                                 uint8_t* codes, void* scales, uint64_t scales_bytes,
                                 giftEncodeStats* stats);

/* Decodes codes and scales back to rows*cols elements of `dst_dtype` (fp32 exactly
 * code*scale; bf16 and fp16 round that to nearest even). */
GIFT_API giftResult_t giftDecode(const giftCtx* ctx, const giftQuantParams* params,
                                 const uint8_t* codes, const void* scales, uint64_t scales_bytes,
                                 uint64_t rows, uint64_t cols, void* dst, giftDType_t dst_dtype);

/* Converts n elements between fp32, bf16 and fp16 (fp32 -> bf16/fp16 round to nearest even, as
 * FORMAT.md 1.10; widening is exact). src and dst may not overlap unless equal with the same
 * dtype. */
GIFT_API giftResult_t giftConvert(const void* src, giftDType_t src_dtype, void* dst,
                                  giftDType_t dst_dtype, uint64_t n);

/* Bytes of one element of `dtype` (4 or 2); 0 for a value that is not a giftDType_t. */
GIFT_API size_t giftDTypeSize(giftDType_t dtype);

/* Error of `approx` against `ref` (both rows x cols fp32). */
typedef struct {
  size_t size; /* sizeof(giftErrorMetrics) */
  unsigned int magic;
  unsigned int version;
  double rel_l2;    /* ||approx - ref||_F / ||ref||_F (0 when both are zero) */
  double cosine;    /* <approx, ref> / (||approx|| ||ref||) (1 when both are zero) */
  double max_abs;   /* max |approx - ref| */
  double bias;      /* mean (approx - ref) */
  double rel_anorm; /* ||(approx - ref) A^1/2||_F / ||ref A^1/2||_F, or -1 without A */
  /* The sums behind them, so that metrics over several tensors can be combined. */
  double sum_ref_sq, sum_approx_sq, sum_err_sq, sum_dot, sum_err;
  uint64_t count;
  /* ||ref A^1/2||_F^2 and ||(approx - ref) A^1/2||_F^2; 0 without A. */
  double sum_ref_asq, sum_err_asq;
  /* Pairs left out of every sum because ref or approx holds NaN or Inf there; `count` is the
   * pairs measured. */
  uint64_t nonfinite;
} giftErrorMetrics;

/* All sums zero, ratios as for two empty tensors: the start of a merge. */
#define GIFT_ERROR_METRICS_INIT                                                                 \
  {                                                                                             \
    sizeof(giftErrorMetrics), GIFT_STRUCT_MAGIC, GIFT_VERSION_NUMBER, 0.0, 1.0, 0.0, 0.0, -1.0, \
        0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, 0                                                 \
  }
GIFT_API void giftErrorMetricsInit(giftErrorMetrics* metrics);

/* `a` may be NULL; otherwise it is the cols x cols symmetric positive semi-definite matrix
 * (row-major fp32) defining the A-norm. An A that is not is refused (GIFT_ERROR_INVALID_ARGUMENT,
 * `out` then undefined), as far as the call can tell: a non-finite entry, a negative diagonal
 * entry, or an A-norm squared of ref or of approx - ref below -1/32 times its diagonal part
 * (sum of a_kk x_k^2: past the rounding of the products, and of an A kept in bf16 or fp16),
 * where the norm would mean nothing. The call judges its own rows: a matrix measured in parts
 * may have one refused where the whole would pass.
 * The sums over the pairs are taken in a fixed order
 * (eight lanes per chunk of 4096 pairs, in vector code): the same doubles for the same call
 * whatever vector instructions the machine has and whatever rounding mode the caller set, which
 * may differ in their last bits from sums taken pair by pair, and the same for any number of
 * threads: a long span is shared among the default threads (giftCtxThreads(NULL)). The A-norm's
 * products go through BLAS, whose kernels vary by machine. */
GIFT_API giftResult_t giftComputeErrorMetrics(const float* ref, const float* approx, uint64_t rows,
                                              uint64_t cols, const float* a, giftErrorMetrics* out);

/* Adds `part` into `total` (start from GIFT_ERROR_METRICS_INIT): the metrics of all tensors
 * seen as one. rel_anorm of the total covers the parts measured with an A (-1 when none
 * was). */
GIFT_API giftResult_t giftErrorMetricsMerge(giftErrorMetrics* total, const giftErrorMetrics* part);

/* ---- GIFT frames: the wire and file format (format/FORMAT.md, section 2) -------------- */

typedef struct giftFrame giftFrame;
typedef struct giftFrameWriter giftFrameWriter;

/* A basis id: XXH3-128 of a basis's canonical bytes (FORMAT.md 2.4); all zero for none.
 * Fixed layout. */
typedef struct {
  uint64_t lo, hi;
} giftBasisId;

typedef enum { GIFT_FRAME_TENSORS = 0, GIFT_FRAME_BASIS = 1 } giftFrameKind_t;

/* Opens and verifies a frame held in memory: preamble, header checksum, the FlatBuffers
 * header, and every field, shape and section reference (section checksums are checked as
 * each section is read). The bytes are used in place: keep them alive and unchanged until
 * giftFrameClose. */
GIFT_API giftResult_t giftFrameOpen(const void* data, uint64_t size, giftFrame** frame);

/* The same for a file, which is memory-mapped, not read into memory. The file must not be
 * truncated while the frame is open (reading a vanished page of a map faults). */
GIFT_API giftResult_t giftFrameOpenFile(const char* path, giftFrame** frame);

GIFT_API void giftFrameClose(giftFrame* frame);
/* Threads: the calls that read a frame (its info, tensors and metadata, giftFrameTensorData,
 * giftFrameVerify, giftFrameDecodeTensor and their WithBasis forms, giftFrameEmbeddedBasis)
 * may run on several threads at once; those that set something on it (giftFrameSet*,
 * giftFrameUseCuda) and the banded decodes (giftFrameDecodeRows, giftFrameDecodeRowPart and
 * their WithBasis forms) may not run beside any other call on the same frame. */

/* Threads decoding uses (0: the default, as for giftCtxSetThreads). */
GIFT_API giftResult_t giftFrameSetThreads(giftFrame* frame, int threads);

typedef struct {
  size_t size; /* sizeof(giftFrameInfo) */
  unsigned int magic;
  unsigned int version;
  uint32_t format_major, format_minor; /* of the frame */
  giftFrameKind_t kind;
  const char* producer; /* valid until giftFrameClose; "" when absent */
  uint64_t tensor_count;
  uint64_t metadata_count;
  int has_basis;        /* 1: the frame carries a basis (giftFrameEmbeddedBasis) */
  giftBasisId basis_id; /* of the embedded basis, or of a basis frame itself */
  uint64_t bytes;       /* of the whole frame */
} giftFrameInfo;

#define GIFT_FRAME_INFO_INIT                                                                     \
  {                                                                                              \
    sizeof(giftFrameInfo), GIFT_STRUCT_MAGIC, GIFT_VERSION_NUMBER, 0, 0, GIFT_FRAME_TENSORS, "", \
        0, 0, 0, {0, 0}, 0                                                                       \
  }
GIFT_API giftResult_t giftFrameGetInfo(const giftFrame* frame, giftFrameInfo* info);

GIFT_API uint64_t giftFrameTensorCount(const giftFrame* frame);

/* Metadata entry `index` (GIFT_ERROR_NOT_FOUND past the last); strings valid until close. */
GIFT_API giftResult_t giftFrameMetadata(const giftFrame* frame, uint64_t index, const char** key,
                                        const char** value);

/* Why a tensor is in the coordinates it is in: the encoder's measurement (FORMAT.md 2.2,
 * Tensor.selection). Strings are valid until giftFrameClose, or for giftSelection filled by
 * an encode, until the writer is freed. */
typedef struct {
  size_t size; /* sizeof(giftSelection) */
  unsigned int magic;
  unsigned int version;
  int made; /* 0: the encoder did not choose (no basis, or Euclidean asked) */
  giftCoords_t chosen;
  float euclidean_error;  /* estimated relative L2 round-trip errors; NaN: not estimated, */
  float gift_error;       /* Inf: the trial encode failed */
  double transform_flops; /* cost of the whitening */
  const char* reason;
} giftSelection;

#define GIFT_SELECTION_INIT                                                                        \
  {                                                                                                \
    sizeof(giftSelection), GIFT_STRUCT_MAGIC, GIFT_VERSION_NUMBER, 0, GIFT_COORDS_EUCLIDEAN, 0.0f, \
        0.0f, 0.0, ""                                                                              \
  }

typedef struct {
  size_t size; /* sizeof(giftTensorInfo) */
  unsigned int magic;
  unsigned int version;
  const char* name; /* UTF-8, valid until giftFrameClose */
  uint32_t ndim;
  const uint64_t* shape; /* ndim entries, valid until giftFrameClose */
  uint64_t elements;
  giftDType_t dtype;      /* of the original tensor */
  int raw;                /* 1: stored losslessly as its original bytes; params unused */
  giftCoords_t coords;    /* GIFT: encoded in the GIFT coordinates of a basis (see decode) */
  giftBasisId basis_id;   /* the basis of GIFT coordinates; zero otherwise */
  giftQuantParams params; /* how it was encoded */
  uint64_t stored_bytes;  /* codes + scales as stored in the frame */
  uint64_t raw_bytes;     /* codes + scales after decompression */
  int compressed;         /* 1: a section of it is zstd-compressed */
  giftSelection selection;
  int has_stats; /* the encoder's statistics, informative: */
  float amax;    /* largest finite magnitude of the encoded values */
  float rms;     /* root mean square of the finite ones */
  uint64_t nonfinite_count;
  uint64_t rows, cols; /* the rows x cols view decoding works on (giftFrameDecodeRows) */
  uint64_t row_align;  /* where a band of rows may start: a multiple of this */
  uint64_t col_align;  /* where a part of a row may start (giftFrameDecodeRowPart): a multiple
                          of this, or lie inside one such group; 0 in GIFT
                          coordinates, which decode whole rows only */
} giftTensorInfo;

#define GIFT_TENSOR_INFO_INIT                                                                      \
  {                                                                                                \
    sizeof(giftTensorInfo), GIFT_STRUCT_MAGIC, GIFT_VERSION_NUMBER, 0, 0, 0, 0, GIFT_DTYPE_F32, 0, \
        GIFT_COORDS_EUCLIDEAN, {0, 0}, GIFT_QUANT_PARAMS_INIT, 0, 0, 0, GIFT_SELECTION_INIT, 0,    \
        0.0f, 0.0f, 0, 0, 0, 1, 1                                                                  \
  }

GIFT_API giftResult_t giftFrameTensorInfo(const giftFrame* frame, uint64_t index,
                                          giftTensorInfo* info);
GIFT_API giftResult_t giftFrameFindTensor(const giftFrame* frame, const char* name,
                                          uint64_t* index);

/* Decodes tensor `index` into dst (elements * size of dst_dtype bytes, aligned to that size,
 * as for giftDecode; so for every decode of a frame below). A raw tensor comes
 * back bit-identical when dst_dtype is its own dtype. A tensor encoded in GIFT coordinates is
 * mapped back with the frame's embedded basis (GIFT_ERROR_BASIS_MISSING without one). */
GIFT_API giftResult_t giftFrameDecodeTensor(giftFrame* frame, uint64_t index, void* dst,
                                            uint64_t dst_bytes, giftDType_t dst_dtype);

/* Rows [first_row, first_row + rows) of tensor `index` in its rows x cols view (cols: the
 * last dimension, rows: the product of the others; giftTensorInfo.rows and .cols), decoded
 * into dst (rows * cols * size of dst_dtype bytes): the values giftFrameDecodeTensor gives
 * for them, so a large tensor decodes in bands through a small buffer. first_row must be a
 * multiple of giftTensorInfo.row_align (the tile height; 1 for other layouts), or the rows lie
 * within one tile's rows. The first
 * call for a tensor checks its sections (but see giftFrameSetLateChecksums), which the frame
 * keeps while later calls read the same tensor; compressed codes are decompressed forward, keeping
 * only the rows asked for (bands in order decompress them once; an earlier band starts again from
 * the beginning). Not for several threads on one frame. */
GIFT_API giftResult_t giftFrameDecodeRows(giftFrame* frame, uint64_t index, uint64_t first_row,
                                          uint64_t rows, void* dst, uint64_t dst_bytes,
                                          giftDType_t dst_dtype);

/* Columns [first_col, first_col + cols) of row `row` of tensor `index` decoded into dst (cols
 * * size of dst_dtype bytes): the values giftFrameDecodeTensor gives for them, for rows too
 * long for one buffer (a vector is one row). first_col must be a multiple of
 * giftTensorInfo.col_align (a block's or a tile's width; 1 for other layouts and raw tensors),
 * or the part lie within one such block or tile (for groups wider than a buffer).
 * A tensor in GIFT coordinates (col_align 0) is refused: its inverse transform takes whole
 * rows, giftFrameDecodeRowsWithBasis. Sections are checked and read as by
 * giftFrameDecodeRows, with which calls may alternate: the parts of one row in order, then
 * the next rows, are a run in order. */
GIFT_API giftResult_t giftFrameDecodeRowPart(giftFrame* frame, uint64_t index, uint64_t row,
                                             uint64_t first_col, uint64_t cols, void* dst,
                                             uint64_t dst_bytes, giftDType_t dst_dtype);

/* With late = 1, giftFrameDecodeRows (and giftFrameDecodeRowsWithBasis) checks a tensor's
 * uncompressed codes (or raw data) as it decodes its bands in order, from row 0 to the last: each
 * band's bytes are hashed right after they are decoded, while they are in the cache, instead of all
 * of them first (a 512 MiB bf16 decode on one core took 8% less time), and a mismatch is reported
 * by the call for the last band. Until that call returns GIFT_OK, the bands returned so far (and
 * the last one, on a mismatch) are unchecked: a caller that gets the error must discard
 * them (giftc decode writes to a giftOutput, which is never committed then), and a caller
 * that stops before the last band has no check of them at all. A band out of order, a
 * compressed section, and a tensor already found damaged are checked whole at their first
 * call, as by default (late = 0), where no band of a damaged section is ever returned. The
 * setting applies from the next tensor a call moves to. giftFrameDecodeTensor and
 * giftFrameVerify always check first. */
GIFT_API giftResult_t giftFrameSetLateChecksums(giftFrame* frame, int late);

/* Zero-copy access to an FP8 tensor's codes and scales where they lie in the frame (after
 * checking their checksums); for compressed sections, GIFT_ERROR_INVALID_ARGUMENT. The
 * pointers are valid until giftFrameClose. Sections start 64-byte aligned from the frame's
 * first byte: fp32 scales are aligned for giftDecode when that byte is (a file's map is; bytes
 * given to giftFrameOpen at an address not a multiple of 4 give scales it refuses). */
GIFT_API giftResult_t giftFrameTensorData(giftFrame* frame, uint64_t index, const uint8_t** codes,
                                          const void** scales, uint64_t* scale_bytes);

/* Reads every section (checksums, decompression) and decodes every tensor. */
GIFT_API giftResult_t giftFrameVerify(giftFrame* frame);

GIFT_API giftResult_t giftFrameWriterCreate(giftFrameWriter** writer);
GIFT_API void giftFrameWriterFree(giftFrameWriter* writer);

/* Threads encoding uses (0: the default, as for giftCtxSetThreads). */
GIFT_API giftResult_t giftFrameWriterSetThreads(giftFrameWriter* writer, int threads);

/* zstd level for the data sections of tensors added afterwards; 0 (the default) stores them
 * uncompressed. A section that does not shrink is stored uncompressed. */
GIFT_API giftResult_t giftFrameWriterSetCompression(giftFrameWriter* writer, int zstd_level);

/* A UTF-8 key and value for the header; a key once (GIFT_ERROR_INVALID_ARGUMENT again). The
 * header holds at most 64 MiB (FORMAT.md 2.1): metadata or a tensor name that would take the
 * names and metadata past it is refused when given (GIFT_ERROR_INVALID_ARGUMENT), and a
 * header past it with the tensors' records at the finish. */
GIFT_API giftResult_t giftFrameWriterAddMetadata(giftFrameWriter* writer, const char* key,
                                                 const char* value);

/* Encodes a tensor now (the data is not kept). params NULL stores it losslessly. */
GIFT_API giftResult_t giftFrameWriterAddTensor(giftFrameWriter* writer, const char* name,
                                               const uint64_t* shape, uint32_t ndim,
                                               giftDType_t dtype, const void* data,
                                               const giftQuantParams* params);

/* The finished frame in a buffer the caller frees with giftFree. */
GIFT_API giftResult_t giftFrameWriterFinish(giftFrameWriter* writer, void** data, uint64_t* size);

/* The finished frame written to `path` through a temporary file and a rename, so a failure
 * never leaves a partial file under that name. */
GIFT_API giftResult_t giftFrameWriterWriteFile(giftFrameWriter* writer, const char* path);

/* Keeps the sections of tensors added from now on in an unnamed scratch file in folder `dir`
 * instead of memory (use the output's folder, so the final copy stays in one file system),
 * and encodes FP8 tensors in bands of rows: the writer then holds a band (a few MiB) plus
 * the scales of the tensor being added, whatever the frame's size; under zstd, sections are
 * compressed as they are made (and made again, stored raw, where zstd cannot make them
 * smaller); a tensor with one scale (GIFT_SCALE_TENSOR) is read twice, first for its amax.
 * Only with giftFrameWriterUseCuda are tensors with one scale or with stochastic rounding
 * encoded whole (their codes in memory while they are added). Tensors added in GIFT coordinates
 * (gift_basis.h) are whitened band by band too, never held in fp32. The frame's bytes are the
 * same either way. The scratch file disappears with the writer or the process. Once per
 * writer. */
GIFT_API giftResult_t giftFrameWriterSetScratchDir(giftFrameWriter* writer, const char* dir);

/* Output written in order, as large as the disk allows: to a file through an unnamed (or,
 * where the file system cannot, a temporary) file beside `path` that replaces it only when
 * committed, after an fsync (see giftOutputSetSync), so neither a failure nor an interrupted
 * process leaves a partial file under that name; or to a descriptor the caller opened and
 * keeps (standard output, a pipe), as the bytes come. Freeing an uncommitted file output
 * discards it. */
typedef struct giftOutput giftOutput;
GIFT_API giftResult_t giftOutputOpenFile(const char* path, giftOutput** out);
GIFT_API giftResult_t giftOutputOpenFd(int fd, const char* name, giftOutput** out);
/* The output will be `total` bytes long: a file's space is allocated now, so a full disk
 * fails here, before anything is written, and writing is faster on file systems that
 * otherwise allocate as the bytes come. Nothing for a descriptor. */
GIFT_API giftResult_t giftOutputReserve(giftOutput* out, uint64_t total);
/* Appends `size` bytes. Into a file, writes under 4 KiB are gathered (up to 64 KiB) and made
 * by the next call that writes past them or ends the output, at the latest the commit, which
 * then reports their failure (a full disk, say); into a descriptor, every write is made here. */
GIFT_API giftResult_t giftOutputWrite(giftOutput* out, const void* data, uint64_t size);
/* As giftOutputWrite, but the bytes may be written on a background thread while the caller
 * goes on (making the next ones): the `size` bytes at `data` must stay as they are until the
 * next call that takes `out` returns (giftOutputWait, giftOutputFree and the frame writer's
 * calls included; giftOutputBytes excepted), which first waits for this write and returns its
 * failure, if any. Two buffers used in turn overlap making the bytes with writing them; where
 * no thread can be had, the write happens here; one under 4 KiB into a file is gathered, as
 * giftOutputWrite's are. A write into a pipe without a reader raises SIGPIPE on the thread
 * that reports it, as giftOutputWrite's own write(2) would. */
GIFT_API giftResult_t giftOutputWriteBehind(giftOutput* out, const void* data, uint64_t size);
/* Waits for a giftOutputWriteBehind in progress and makes the writes gathered: GIFT_OK once
 * every byte handed over is written, or the failure (which every later call on `out` reports
 * too). */
GIFT_API giftResult_t giftOutputWait(giftOutput* out);
GIFT_API giftResult_t giftOutputCommit(giftOutput* out);
/* Whether giftOutputCommit makes a file durable: 1 (the default) fsyncs it before it takes
 * its name (writeback starting as the bytes come, so that the fsync waits only for the
 * tail) and its folder after; 0 renames it at once, as cp, gzip and zstd finish outputs.
 * Either way no process ever sees a partial file under the name; without the sync, a crash
 * of the machine (not of the process) before the kernel has written the file back can leave
 * it incomplete there. Any time before the commit; nothing for a descriptor. */
GIFT_API giftResult_t giftOutputSetSync(giftOutput* out, int sync);
/* Whether giftOutputCommit replaces a file that already has the name: 1 (the default), or 0
 * to keep it: the finished file then takes the name only if it is free, in one step (a file
 * made under that name while the output was written is not lost), and the commit fails with
 * GIFT_ERROR_IO otherwise, discarding the output. Any time before the commit; nothing for a
 * descriptor. */
GIFT_API giftResult_t giftOutputSetReplace(giftOutput* out, int replace);
/* The permission bits (at most 0777) the committed file gets, as chmod(2) sets them: giftc
 * gives an output its input's, as gzip and zstd do, so that a file only its owner reads does
 * not come out readable by all. By default, and where the file system cannot set them (vfat,
 * some FUSE mounts), those of open(2) with mode 0666 (less the umask). Any time before the
 * commit; nothing for a descriptor. */
GIFT_API giftResult_t giftOutputSetMode(giftOutput* out, unsigned int mode);
/* Bytes written to `out` so far (a write behind's from the call that gives them, whatever
 * becomes of it; a giftOutputWrite that failed counts none). A failure of a write or of the commit
 * ends the output: every later call on it reports that failure again. */
GIFT_API uint64_t giftOutputBytes(const giftOutput* out);
GIFT_API void giftOutputFree(giftOutput* out);
/* Removes the temporary files of this process's unfinished file outputs (written under
 * `path`.tmp.XXXXXXXX beside their destination, its last component cut to 255 bytes, where
 * the file system has no unnamed files; elsewhere an interrupted process leaves nothing
 * anyway). Async-signal-safe: meant for a
 * handler of SIGINT or SIGTERM that then ends the process, as giftc's does; outputs open at
 * the time cannot be committed afterwards. */
GIFT_API void giftRemoveTemporaryFiles(void);

/* The finished frame appended to `out`, which the caller then commits. */
GIFT_API giftResult_t giftFrameWriterWriteOutput(giftFrameWriter* writer, giftOutput* out);

/* Streams the frame into `out` (a file from giftOutputOpenFile, nothing written to it yet)
 * as tensors are added, and encodes FP8 tensors in bands as giftFrameWriterSetScratchDir
 * does: giftFrameWriterWriteOutput(writer, out), called once, then writes the header in
 * front (and an embedded basis last), with no copy of the sections. The header comes first
 * and holds where each section lies, so its length must be known before the first one: the
 * writer is told the `count` tensors that will be added, in order, by name, number of
 * dimensions and whether each is stored losslessly (params NULL; lossless may be NULL for
 * none). Call it after the metadata and giftFrameWriterEmbedBasis, before the first tensor.
 * A frame that turns out otherwise (other tensors; matrices added with
 * giftFrameWriterAddTensorInBasis, a basis and a mode other than Euclidean, whose choices
 * the header records; metadata or a basis added later) is still written right: its
 * sections are copied once at the end into the output started again, which needs the
 * frame's size again on disk meanwhile. A tensor that fails leaves nothing in the output.
 * Until giftFrameWriterWriteOutput succeeds, the output refuses giftOutputWrite,
 * giftOutputReserve, giftOutputCommit and other writers' frames (after a failure, or with
 * the writer freed first, it can only be freed). Freeing `out` first leaves the writer
 * refusing tensors and finishing. An embedded basis waits in the scratch file if one was set
 * before giftFrameWriterEmbedBasis, else in memory. */
GIFT_API giftResult_t giftFrameWriterStreamTo(giftFrameWriter* writer, giftOutput* out,
                                              size_t count, const char* const* names,
                                              const uint32_t* ndims, const int* lossless);

GIFT_API void giftFree(void* p);

/* Writes `size` bytes to `path` as one giftOutput file: through a temporary, fsync and a
 * rename, so a failure never leaves a partial file under that name. */
GIFT_API giftResult_t giftWriteFile(const char* path, const void* data, uint64_t size);

/* The instruction set the CPU codec dispatches to on this machine ("AVX3", "AVX2", ...). */
GIFT_API const char* giftCpuTargetName(void);

/* Limits the CPU codec, process-wide and from its next call on, to instruction sets no wider
 * than `name` (as giftCpuTargetName spells them, in any case: "AVX2", "SSE4", ...); NULL lifts
 * the limit. For machines whose widest vectors run slower (clock throttling), and to measure
 * the narrower code on a wider machine. Every instruction set gives the same bytes, except in
 * GIFT coordinates: the whitening gives the same bytes on the sets with fused multiply-add
 * (AVX2 and up, NEON) and values within fp32 rounding of them on the others (SSE4, SSSE3, and
 * the portable SCALAR or EMU128). A set the CPU lacks limits the codec to the widest it has
 * below. GIFT_ERROR_INVALID_ARGUMENT, changing nothing, for a name not among
 * giftCpuTargetNames (the message lists them; they depend on the compiler and its flags).
 * The limit is Highway's (hwy::DisableTargets), shared by every library in the process that
 * uses the same shared libhwy; NULL also lifts any limit set through Highway. Call it while no
 * other thread is in libgift. */
GIFT_API giftResult_t giftCpuLimitTarget(const char* name);

/* The names giftCpuLimitTarget takes in this build, widest first, separated by spaces (x86,
 * GCC 12 and Highway 1.0.3: "AVX3 AVX2 SSE4 SSSE3 SCALAR"); a static string. */
GIFT_API const char* giftCpuTargetNames(void);

GIFT_API const char* giftGetErrorString(giftResult_t result);
GIFT_API const char* giftGetLastErrorMessage(void);
GIFT_API unsigned giftVersionNumber(void);

#ifdef __cplusplus
}
#endif

#endif /* GIFT_GIFT_H */
