/* libgift compressed all-reduce on CUDA devices: the local steps of gift_transport.h on device
 * buffers, enqueued on a caller's stream.
 *
 * The same algorithm and the same bytes as the CPU plan (giftReducePlan): shards on the same
 * block boundaries, messages of the same layout and size (header, scales, codes, zero
 * padding), the `world` pieces of a shard summed in fp32 in rank order, the same division for
 * GIFT_REDUCE_AVG, the same second encode and error feedback (residuals in device memory).
 * So a device rank and a CPU rank exchange messages freely, and a GPU run can be checked
 * against the CPU steps. Backends (gift_nccl.h) only move the messages.
 *
 * GIFT coordinates (giftReduceDevicePlanSetBasis) follow the CPU plan's rules and give its
 * bytes: the whitener runs on the device in the CPU whitener's per-element order (fused
 * multiply-adds; the CPU side matches on every target with FMA, AVX2 and newer on x86), and
 * AUTO's measurement runs the CPU plan's estimator on the host. Saved states
 * (giftReduceDevicePlanSaveState) have the CPU plan's bytes: a state saved by either loads
 * into the other.
 *
 * Like gift_cuda.h, each step enqueues work on `stream` and returns once it is enqueued:
 * argument and launch errors come back at once; what the data holds (non-finite values under
 * GIFT_NONFINITE_ERROR, messages that are not this call's shard or are in another basis) is
 * recorded on the device
 * and reported by giftReduceDevicePlanStatus, which waits for the plan's work. Nothing else
 * synchronizes, except: with GIFT_COORDS_MODE_AUTO, a measuring call (the first with a basis
 * and every reselect_every-th) waits for `stream` three times (the input read back for the
 * estimates; rank 0's read of every rank's estimates; every rank's read of the decision);
 * and the basis and state functions below wait for the plan's work.
 * Differences from the CPU plan: no integrity checksums (config->integrity must be 0; a NULL
 * config gives the defaults with integrity 0) and no dumps (config->dump_every must be 0;
 * GIFT_DUMP_EVERY is ignored); a received message in another basis is not refused by the
 * step but reported by giftReduceDevicePlanStatus (GIFT_ERROR_BASIS_MISSING naming the
 * sender, as the CPU step says it), and the step's result is then meaningless; rank 0 looks
 * for estimates only on its own measuring calls.
 *
 * Only present in builds with CUDA (GIFT_HAVE_CUDA defined by the build). */
#ifndef GIFT_GIFT_TRANSPORT_CUDA_H
#define GIFT_GIFT_TRANSPORT_CUDA_H

#include <cuda_runtime_api.h>

#include "gift/gift_transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A bucket shape's state on one rank, on the CUDA device current at creation (its work
 * buffers and residuals are allocated there, once). Not thread-safe; one per bucket. */
typedef struct giftReduceDevicePlan giftReduceDevicePlan;

GIFT_API giftResult_t giftReduceDevicePlanCreate(const giftAllReduceConfig* config, int world,
                                                 int rank, const giftBucketTensor* tensors,
                                                 size_t n, giftReduceDevicePlan** plan);
GIFT_API void giftReduceDevicePlanDestroy(giftReduceDevicePlan* plan);

/* Bytes of every message: equal to giftReducePlanMessageBytes of the same bucket. */
GIFT_API uint64_t giftReduceDevicePlanMessageBytes(const giftReduceDevicePlan* plan);

/* The steps of gift_transport.h, on device buffers: tensors in their dtypes, aligned to their
 * element size; message buffers 16-byte aligned. The steps write each message's header,
 * scales and codes but never its padding, which the CPU plan writes as zeros: zero the
 * message buffers once when allocating them. Step 1. */
GIFT_API giftResult_t giftReduceEncodeShardsDevice(giftReduceDevicePlan* plan,
                                                   const void* const* tensors, uint8_t* send,
                                                   cudaStream_t stream);
/* Step 3. */
GIFT_API giftResult_t giftReduceSumShardDevice(giftReduceDevicePlan* plan, const uint8_t* recv,
                                               uint8_t* out_msg, cudaStream_t stream);
/* Step 5 (out_tensors may be the inputs of step 1: in place). */
GIFT_API giftResult_t giftReduceDecodeResultDevice(giftReduceDevicePlan* plan,
                                                   const uint8_t* gathered,
                                                   void* const* out_tensors, cudaStream_t stream);

/* Waits for the plan's enqueued steps, then reports what the device saw since the last
 * status: GIFT_ERROR_CORRUPT_INPUT (a received message was not this call's shard),
 * GIFT_ERROR_BASIS_MISSING (a received message was in another basis or chose other tensors
 * for GIFT coordinates) or GIFT_ERROR_NONFINITE_INPUT (NaN or Inf in an input or a reduced
 * sum, under GIFT_NONFINITE_ERROR), in that order, naming the first call, step and rank;
 * GIFT_OK otherwise. The record is cleared. */
GIFT_API giftResult_t giftReduceDevicePlanStatus(giftReduceDevicePlan* plan);

/* giftReducePlanSetBasis for a device plan: the same eligibility, modes and residual rules;
 * the plan keeps host and device copies of the whiteners it needs. Waits for the plan's
 * enqueued work first and for its own uploads before returning (the device current at the
 * call must be the plan's). On failure the plan keeps its previous basis. */
GIFT_API giftResult_t giftReduceDevicePlanSetBasis(giftReduceDevicePlan* plan,
                                                   const giftBasis* basis);

/* giftReducePlanCoords for a device plan (what the host knows: a decision of an AUTO
 * measurement takes effect in the giftReduceDecodeResultDevice of its call). */
GIFT_API giftResult_t giftReduceDevicePlanCoords(const giftReduceDevicePlan* plan,
                                                 giftCoords_t* coords, size_t n);

/* giftReducePlanStateBytes/SaveState/LoadState for a device plan, in host buffers, with the
 * CPU plan's bytes (a state saved from a CPU plan of the same config, world, rank, tensors and
 * basis loads here, and back). Both wait for the plan's enqueued work; the residuals are
 * copied from or to device memory. */
GIFT_API uint64_t giftReduceDevicePlanStateBytes(const giftReduceDevicePlan* plan);
GIFT_API giftResult_t giftReduceDevicePlanSaveState(const giftReduceDevicePlan* plan, void* state,
                                                    uint64_t bytes);
GIFT_API giftResult_t giftReduceDevicePlanLoadState(giftReduceDevicePlan* plan, const void* state,
                                                    uint64_t bytes);

/* ---- Device communicators ------------------------------------------------------------- */

/* What a device backend provides: collectives over device buffers of fixed-size messages,
 * enqueued on `stream` (stream-ordered before and after, no host synchronisation). */
typedef struct {
  size_t size; /* sizeof(giftDeviceCommBackend) */
  unsigned int magic;
  unsigned int version;
  void* ctx;
  int world;
  int rank;
  /* Rank i's send[j*bytes ..) goes to rank j's recv[i*bytes ..). */
  giftResult_t (*all_to_all)(void* ctx, const void* send, void* recv, uint64_t bytes,
                             cudaStream_t stream);
  /* Rank i's send[0, bytes) goes to every rank's recv[i*bytes ..). */
  giftResult_t (*all_gather)(void* ctx, const void* send, void* recv, uint64_t bytes,
                             cudaStream_t stream);
  const char* (*last_error)(void* ctx); /* detail of the last failed call; may be NULL */
  void (*destroy)(void* ctx);           /* may be NULL */
} giftDeviceCommBackend;

typedef struct giftDeviceComm giftDeviceComm;

/* A communicator over a device backend (gift_nccl.h makes one from an ncclComm_t), on the
 * CUDA device current at creation; plans and message buffers are allocated there on the
 * first call of each bucket shape and kept (with their error feedback) for its life.
 * config as for giftReduceDevicePlanCreate. */
GIFT_API giftResult_t giftDeviceCommCreate(const giftDeviceCommBackend* backend,
                                           const giftAllReduceConfig* config,
                                           giftDeviceComm** comm);
GIFT_API void giftDeviceCommDestroy(giftDeviceComm* comm);

/* All-reduce of one flat device buffer (send == recv allowed), enqueued on `stream`; the
 * device current at the call must be the communicator's. Collective: every rank calls it
 * with the same count and dtype. Unlike giftAllReduce, ranks do not agree on the outcome
 * (that would synchronize the host): an argument or launch error is returned on the rank
 * that has it, and what the data holds is reported by giftDeviceCommStatus. */
GIFT_API giftResult_t giftDeviceAllReduce(giftDeviceComm* comm, const void* send, void* recv,
                                          uint64_t count, giftDType_t dtype, cudaStream_t stream);

/* All-reduce of a bucket of n device tensors (send[i] == recv[i] allowed). */
GIFT_API giftResult_t giftDeviceAllReduceBucket(giftDeviceComm* comm,
                                                const giftBucketTensor* tensors,
                                                const void* const* send, void* const* recv,
                                                size_t n, cudaStream_t stream);

/* giftReduceDevicePlanStatus over the communicator's buckets: waits for their work and
 * returns the first problem found (later buckets keep theirs for the next status). */
GIFT_API giftResult_t giftDeviceCommStatus(giftDeviceComm* comm);

#ifdef __cplusplus
}
#endif

#endif /* GIFT_GIFT_TRANSPORT_CUDA_H */
