/* libgift_nccl: the compressed all-reduce over NCCL (device buffers, CUDA streams).
 *
 * A thin backend of gift_transport_cuda.h: it moves the fixed-size messages of the device
 * local steps with NCCL's all-to-all (grouped ncclSend/ncclRecv where NCCL lacks
 * ncclAlltoAll) and ncclAllGather on the caller's stream; encoding, the rank-order reduction
 * and error feedback are libgift's, with the CPU plan's bytes. Link gift_nccl, CUDA's runtime
 * and NCCL. Use the communicator with giftDeviceAllReduce, giftDeviceAllReduceBucket and
 * giftDeviceCommStatus. */
#ifndef GIFT_GIFT_NCCL_H
#define GIFT_GIFT_NCCL_H

#include <nccl.h>

#include "gift/gift_transport_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator over `comm` (not owned: keep it until giftDeviceCommDestroy, and do not
 * enqueue other work on it concurrently from another thread), on the CUDA device current at
 * the call, which must be comm's. config may be NULL for the defaults without integrity
 * checksums (see gift_transport_cuda.h). A failed NCCL call returns GIFT_ERROR_INTERNAL;
 * in the exchanges, giftGetLastErrorMessage then holds NCCL's message. */
GIFT_API giftResult_t giftCommInitNccl(ncclComm_t comm, const giftAllReduceConfig* config,
                                       giftDeviceComm** out);

#ifdef __cplusplus
}
#endif

#endif /* GIFT_GIFT_NCCL_H */
