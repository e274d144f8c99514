/* libgift compressed all-reduce: the local steps and the generic communicator.
 *
 * The algorithm (DESIGN.md "Transport") lives here once; backends (MPI in gift_mpi.h, NCCL,
 * the Python DDP hook) only move bytes. Per call, every rank:
 *   1. giftReduceEncodeShards: views the bucket (its tensors in order, each converted to
 *      fp32, plus this rank's error-feedback residual) as one flat buffer cut into `world`
 *      shards on block boundaries, and encodes shard r into message r (FP8 codes + scales);
 *   2. the backend sends message r to rank r (all-to-all of fixed-size messages);
 *   3. giftReduceSumShard: rank r decodes the `world` messages of its shard, sums them in fp32
 *      in rank order (divides by world for GIFT_REDUCE_AVG; where that is Inf or NaN, as
 *      when values near FLT_MAX overflow the sum, divides each value first), encodes the sum
 *      once;
 *   4. the backend all-gathers the reduced messages;
 *   5. giftReduceDecodeResult: decodes them and writes each tensor in its own dtype.
 * So every value is rounded to FP8 twice whatever the world size, and every rank decodes the
 * same bytes: replicas end bit-identical. (Tensors in GIFT coordinates are whitened back in
 * step 5 with fused multiply-adds: bit-identical where every rank's CPU has them, AVX2 and
 * newer on x86, Arm64, as the device plans do; a rank without them, SSE4 say, ends within
 * fp32 rounding of the others.)
 *
 * Scale groups are blocks of `block` elements of the flat bucket (tensor boundaries do not
 * cut blocks); shard r holds blocks [r*nb/world, (r+1)*nb/world) in the balanced split of the
 * nb blocks (a shard may be empty). This layout is part of the contract: tests and error
 * bounds rely on it. */
#ifndef GIFT_GIFT_TRANSPORT_H
#define GIFT_GIFT_TRANSPORT_H

#include "gift/gift.h"
#include "gift/gift_basis.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sized public structs start with {size, magic, version} (NCCL style), so that a struct from
 * an older or newer header is read safely: the library reads at most `size` bytes of it. */

typedef enum { GIFT_REDUCE_SUM = 0, GIFT_REDUCE_AVG = 1 } giftReduceOp_t;

typedef struct {
  size_t size;          /* sizeof(giftAllReduceConfig) */
  unsigned int magic;   /* GIFT_STRUCT_MAGIC */
  unsigned int version; /* GIFT_VERSION_NUMBER of the header the caller compiled against */
  giftFp8Kind_t kind;
  uint32_t block; /* scale block: power of two in [GIFT_BLOCK_MIN, GIFT_BLOCK_MAX] */
  giftScaleDType_t scale_dtype;
  giftRounding_t rounding;
  uint64_t seed; /* stochastic rounding: varied per call, rank and shard inside */
  giftReduceOp_t op;
  int error_feedback; /* 1: carry each encode's residual into the next call */
  int integrity;      /* 1: an XXH3-64 checksum over every message, checked on receipt */
  /* Every dump_every-th call (0: never), rank 0 writes the result as a GIFT frame into the
   * directory dump_path. With dump_every 0, the environment variables GIFT_DUMP_EVERY and
   * GIFT_DUMP_DIR switch dumps on for programs that cannot change their config. A bucket
   * dumps to allreduce-<bucket>-<call>.gift, <bucket> a hash of its tensors' names, dtypes and
   * shapes. Rank 0's plan fails its creation where the folder cannot take files
   * (GIFT_ERROR_IO) or a frame cannot hold the bucket's tensor names (two alike, an empty or
   * non-UTF-8 one: GIFT_ERROR_INVALID_ARGUMENT); a dump that fails later fails its call with
   * GIFT_ERROR_IO after the call completed (result written, state committed), which the
   * message says. */
  uint32_t dump_every;
  const char* dump_path;
  int threads; /* codec threads per rank: 0 all hardware threads (see giftQuantParams) */
  /* Coordinates of the bucket's matrices once a basis is set (giftReducePlanSetBasis,
   * giftCommSetBasis): GIFT whitens every matrix the basis covers; AUTO whitens those where
   * the encoder's estimate, summed over the ranks, is lower by the margin (measured on the
   * first call after a basis is set and every reselect_every calls (0: that first call
   * only), decided once for all
   * ranks by rank 0); EUCLIDEAN never. */
  giftCoordsMode_t coords;
  uint32_t reselect_every;
  /* NaN or Inf in a bucket. GIFT_NONFINITE_ERROR: the call fails with
   * GIFT_ERROR_NONFINITE_INPUT naming the tensor and element (on every rank, through
   * giftComm; device plans report it from giftReduceDevicePlanStatus). GIFT_NONFINITE_KEEP:
   * they travel as the FP8 kind's NaN codes (Inf codes in E5M2; block scales come from the
   * finite values) and the call completes, every rank holding a non-finite value wherever a
   * rank had one (across the row, for a matrix in GIFT coordinates), as after an fp32
   * all-reduce (Inf arrives as NaN in E4M3), so that a loss scaler sees the overflow on
   * every rank and skips the step. Either way the call commits no error feedback and no
   * choice of coordinates (see giftReduceDecodeResult). */
  giftNonFinite_t nonfinite;
} giftAllReduceConfig;

#define GIFT_ALLREDUCE_CONFIG_INITIALIZER                                                          \
  {                                                                                                \
    sizeof(giftAllReduceConfig), GIFT_STRUCT_MAGIC, GIFT_VERSION_NUMBER, GIFT_FP8_E4M3,            \
        GIFT_BLOCK_DEFAULT, GIFT_SCALE_DTYPE_F32, GIFT_ROUND_NEAREST, 0, GIFT_REDUCE_SUM, 1, 1, 0, \
        NULL, 0, GIFT_COORDS_MODE_AUTO, 50, GIFT_NONFINITE_ERROR                                   \
  }

/* One tensor of a bucket. ndim 0 is a scalar; a zero in shape makes it empty. */
typedef struct {
  /* NULL gives "t<index>". It picks the matrix's whitener in a basis, and names the tensor in
   * errors and dumps: the same on every rank (giftComm compares them). */
  const char* name;
  giftDType_t dtype;
  uint32_t ndim;
  const uint64_t* shape;
} giftBucketTensor;

/* ---- Local steps ---------------------------------------------------------------------- */

/* The state of one bucket shape on one rank: layout, work buffers (allocated at creation, or
 * for GIFT coordinates when a basis is set), the error-feedback residuals and the call
 * counter. Not thread-safe; one per bucket. */
typedef struct giftReducePlan giftReducePlan;

GIFT_API giftResult_t giftReducePlanCreate(const giftAllReduceConfig* config, int world, int rank,
                                           const giftBucketTensor* tensors, size_t n,
                                           giftReducePlan** plan);
GIFT_API void giftReducePlanDestroy(giftReducePlan* plan);

/* The basis whose coordinates the bucket's matrices travel in from the next call (NULL: none,
 * all Euclidean). A 2-D-or-more tensor whose name the basis covers, with its last dimension
 * the whitener's width, is eligible; 1-D tensors and scalars stay Euclidean. Every rank must
 * set the same basis: messages carry its id, and a message in another basis fails the
 * receiving step with GIFT_ERROR_BASIS_MISSING naming the sender (giftCommSetBasis checks
 * the ids on all ranks first). The error-feedback residual of this rank's encode is kept in
 * original coordinates and survives; the reduced shard's residual, in the coordinates of the
 * flat bucket, is dropped for the tensors whose coordinates change, and with another basis
 * (another id) for every tensor that was whitened. The plan keeps its own copy of the
 * whiteners it needs. */
GIFT_API giftResult_t giftReducePlanSetBasis(giftReducePlan* plan, const giftBasis* basis);

/* Which tensors currently travel in GIFT coordinates: coords[i] for tensor i (n entries). */
GIFT_API giftResult_t giftReducePlanCoords(const giftReducePlan* plan, giftCoords_t* coords,
                                           size_t n);

/* Bytes of every message of the plan (equal on all ranks, for fixed-size collectives). */
GIFT_API uint64_t giftReducePlanMessageBytes(const giftReducePlan* plan);

/* Step 1: tensors[i] is the i-th tensor of the bucket in its dtype; send receives `world`
 * messages, message r for rank r. */
GIFT_API giftResult_t giftReduceEncodeShards(giftReducePlan* plan, const void* const* tensors,
                                             uint8_t* send);

/* Step 3: recv holds the `world` messages this rank received, in sender order; out_msg
 * receives the reduced shard. A message that fails its checksum or does not belong to this
 * call and shard fails with GIFT_ERROR_SECTION_CHECKSUM or GIFT_ERROR_CORRUPT_INPUT naming
 * the sender. */
GIFT_API giftResult_t giftReduceSumShard(giftReducePlan* plan, const uint8_t* recv,
                                         uint8_t* out_msg);

/* Step 5: gathered holds the `world` reduced messages in rank order; out_tensors[i] receives
 * tensor i in its dtype (it may be the input of step 1: in place).
 * The error feedback a call computes (both residuals), and the choice of coordinates a
 * measuring call makes, become the plan's here, and only when the result is finite, which
 * every rank reads from the same gathered bytes. So a call abandoned before step 5 completes
 * (a step failed on this rank or another) or whose result holds a NaN or Inf
 * (GIFT_NONFINITE_KEEP) leaves them as they were on every rank, and is not dumped; a
 * measuring call of that kind is measured again on the next call. This is decided per plan:
 * when a loss scaler skips a training step for one bucket's overflow, the other buckets'
 * plans keep that call's residuals (the rounding error of gradients the step did not apply,
 * one FP8 rounding per value, carried into the next call as any call's is). "Finite" is the
 * result in fp32, as the messages carry it: a finite fp32 value that overflows a 16-bit
 * tensor's dtype (past 65504 in fp16) is written as Inf there, and the call counts as finite
 * (it commits, is dumped, and does not fail under GIFT_NONFINITE_ERROR). */
GIFT_API giftResult_t giftReduceDecodeResult(giftReducePlan* plan, const uint8_t* gathered,
                                             void* const* out_tensors);

/* For backends without an agreement of their own (the DDP hook): after a step failed on
 * this rank, writes n messages that say so at msgs (giftReducePlanMessageBytes each), to send
 * in the call's remaining exchanges in place of the step's output. A rank whose step 3 or 5
 * receives one fails it with GIFT_ERROR_REMOTE naming this rank, and sends the same onwards:
 * every rank fails the call instead of waiting in an exchange this rank left. */
GIFT_API giftResult_t giftReduceAbandon(const giftReducePlan* plan, uint8_t* msgs, int n);

/* The plan's state between calls (its call counter, error-feedback residuals and choice of
 * coordinates) as bytes, so that a training run can be checkpointed and resumed with the
 * same results. The state loads only into a plan of the same config (its coordinates mode
 * included), world, rank and tensors (dtypes and shapes; GIFT_ERROR_INVALID_ARGUMENT
 * otherwise) that holds the same basis (set it first; GIFT_ERROR_BASIS_MISSING otherwise).
 * States saved by earlier releases still load: those of the second state version whatever
 * the coordinates mode, those of the first where the dtypes and element counts match. */
GIFT_API uint64_t giftReducePlanStateBytes(const giftReducePlan* plan);
GIFT_API giftResult_t giftReducePlanSaveState(const giftReducePlan* plan, void* state,
                                              uint64_t bytes);
GIFT_API giftResult_t giftReducePlanLoadState(giftReducePlan* plan, const void* state,
                                              uint64_t bytes);

/* ---- Communicators -------------------------------------------------------------------- */

/* What a backend provides: collectives over host buffers of fixed-size messages. Each
 * returns GIFT_OK or an error code; last_error then gives the backend's detail. A collective
 * that fails on some ranks only fails their call at once, while the others may wait in it or
 * in the next one: the communicator cannot recover from that, and the job should end
 * (MPI_Abort). The outcomes the library agrees on are its own checks and steps. */
typedef struct {
  size_t size; /* sizeof(giftCommBackend) */
  unsigned int magic;
  unsigned int version;
  void* ctx;
  int world;
  int rank;
  /* Rank i's send[j*bytes ..) goes to rank j's recv[i*bytes ..). */
  giftResult_t (*all_to_all)(void* ctx, const void* send, void* recv, uint64_t bytes);
  /* Rank i's send[0, bytes) goes to every rank's recv[i*bytes ..). */
  giftResult_t (*all_gather)(void* ctx, const void* send, void* recv, uint64_t bytes);
  /* Agreement on an outcome: on return *code is the largest code over the ranks and *rank
   * the lowest rank that had it. */
  giftResult_t (*agree)(void* ctx, int* code, int* rank);
  /* root's buf[0, bytes) to every rank. */
  giftResult_t (*broadcast)(void* ctx, void* buf, uint64_t bytes, int root);
  const char* (*last_error)(void* ctx); /* detail of the last failed call; may be NULL */
  void (*destroy)(void* ctx);           /* may be NULL */
} giftCommBackend;

typedef struct giftComm giftComm;

/* For backends built on libgift (gift_mpi, gift_nccl, a caller's own) that fail before a
 * communicator exists: makes `message` the calling thread's giftGetLastErrorMessage and
 * returns `code`. */
GIFT_API giftResult_t giftBackendFail(giftResult_t code, const char* message);

/* A communicator over a backend; plans are cached per bucket shape (the tensors' names,
 * dtypes and shapes), with their error feedback, for the communicator's life: calls with the
 * same shape share one plan's error feedback. Backend headers (gift_mpi.h) wrap this. Its
 * checks (of the config) are local: a rank refused here fails alone, so check the result on
 * every rank before the first call. */
GIFT_API giftResult_t giftCommCreate(const giftCommBackend* backend,
                                     const giftAllReduceConfig* config, giftComm** comm);
GIFT_API void giftCommDestroy(giftComm* comm);

/* All-reduce of one flat buffer (send == recv allowed). stream must be NULL for host backends.
 * Its bucket is one tensor named "buffer": every giftAllReduce of the same count and dtype
 * shares one plan, and so its error feedback (buffers that need theirs apart, layers of the
 * same size, go through giftAllReduceBucket under names of their own). Collective: every rank
 * calls it with the same count and dtype. An error on any rank is returned on every rank, and
 * the message names the rank and step that failed; the error feedback and the choice of
 * coordinates then stay as they were on every rank, and recv holds no result (but for a dump
 * that failed after its call completed, which the message says). Before anything is sent, the
 * ranks compare their calls: a rank whose arguments fail their checks, whose bucket (element
 * count, dtypes, shapes, names) differs from rank 0's, whose config differs in what the messages
 * depend on (kind, block, scale_dtype, op, integrity, coords, and reselect_every under AUTO,
 * nonfinite), or whose plan for the bucket has made another number of calls, fails the call on
 * every rank, named, before any plan changes. A call that fails later (a NaN, a corrupted
 * message) still counts as a call on every rank: stochastic rounding draws other bits for the
 * calls after it than without it. */
GIFT_API giftResult_t giftAllReduce(giftComm* comm, const void* send, void* recv, uint64_t count,
                                    giftDType_t dtype, void* stream);

/* Sets `basis` (NULL: none) for every bucket, present and future, after checking that every
 * rank sets the same one: the 16-byte ids are all-gathered, and a mismatch fails on every
 * rank with GIFT_ERROR_BASIS_MISSING naming the ranks and their ids. Every rank makes its
 * plans' change aside first, and takes it only once every rank has: a failure (memory that
 * runs out on one rank) fails on every rank and leaves every rank in the basis it had.
 * Collective. */
GIFT_API giftResult_t giftCommSetBasis(giftComm* comm, const giftBasis* basis);

/* Refits the basis from activation statistics and sets it (collective): moments[i] is this
 * rank's dims[i] x dims[i] fp32 second moment of the inputs of matrix names[i]; they are
 * summed over the ranks in rank order in fp32 and averaged, rank 0 fits a whitener to each
 * (giftBasisBuilderAdd with `params`, source "activations": a zero moment gets none, and its
 * matrix stays Euclidean), and broadcasts the basis's bytes,
 * so every rank ends with the same basis id. *basis (may be NULL) receives a copy for the
 * caller (giftBasisFree). Every rank gives the same names and dimensions in the same order;
 * where one differs, the call fails on every rank (GIFT_ERROR_INVALID_ARGUMENT, naming it)
 * before any moment moves. The moments travel in all-gathers of 1M elements a rank (4 MiB
 * times the world size in memory); rank 0 also holds one averaged moment in double. */
GIFT_API giftResult_t giftCommRefreshBasis(giftComm* comm, size_t n, const char* const* names,
                                           const float* const* moments, const uint32_t* dims,
                                           const giftFitParams* params, giftBasis** basis);

/* All-reduce of a bucket of n tensors (send[i] == recv[i] allowed), with giftAllReduce's
 * rules for errors and for ranks whose calls differ. */
GIFT_API giftResult_t giftAllReduceBucket(giftComm* comm, const giftBucketTensor* tensors,
                                          const void* const* send, void* const* recv, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* GIFT_GIFT_TRANSPORT_H */
