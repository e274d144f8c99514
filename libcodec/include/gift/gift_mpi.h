/* libgift_mpi: the compressed all-reduce over MPI (host buffers).
 *
 * A thin backend of gift_transport.h: it moves the fixed-size messages of the local steps
 * with MPI_Alltoall and MPI_Allgather; everything else (encoding, reduction in rank order,
 * error feedback, integrity checks, dumps) is libgift's. Link gift_mpi and MPI. */
#ifndef GIFT_GIFT_MPI_H
#define GIFT_GIFT_MPI_H

#include <mpi.h>

#include "gift/gift_transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator over a duplicate of `comm` (so its traffic never matches the caller's
 * messages); errors on it are returned, not fatal. Collective over `comm`, an
 * intracommunicator (MPI_COMM_NULL and intercommunicators are refused,
 * GIFT_ERROR_INVALID_ARGUMENT). config may be NULL for the defaults. Free with
 * giftCommDestroy (before MPI_Finalize). */
GIFT_API giftResult_t giftCommInitMpi(MPI_Comm comm, const giftAllReduceConfig* config,
                                      giftComm** out);

#ifdef __cplusplus
}
#endif

#endif /* GIFT_GIFT_MPI_H */
