// The MPI backend: fixed-size collectives on MPI_BYTE over a private communicator.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <new>

#include "gift/gift_mpi.h"

namespace {

struct MpiContext {
  MPI_Comm comm = MPI_COMM_NULL;
  char error[MPI_MAX_ERROR_STRING + 64] = {};
};

giftResult_t mpi_result(MpiContext& c, int err, const char* call) {
  if (err == MPI_SUCCESS) return GIFT_OK;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, text, &len);
  snprintf(c.error, sizeof c.error, "%s: %.*s", call, len, text);
  return GIFT_ERROR_INTERNAL;
}

// MPI counts are ints: a message past INT_MAX bytes travels as a count of contiguous
// chunks of a derived type. Messages are multiples of 64 bytes (gift_transport's layout).
struct Chunked {
  MPI_Datatype type = MPI_BYTE;
  int count = 0;
  bool derived = false;
};

giftResult_t chunked(MpiContext& c, uint64_t bytes, Chunked* out) {
  if (bytes <= uint64_t(INT_MAX)) {
    out->count = int(bytes);
    return GIFT_OK;
  }
  constexpr uint64_t kChunk = 64;
  if (bytes % kChunk != 0 || bytes / kChunk > uint64_t(INT_MAX)) {
    snprintf(c.error, sizeof c.error, "a message of %llu bytes is too large for MPI",
             static_cast<unsigned long long>(bytes));
    return GIFT_ERROR_INTERNAL;
  }
  if (giftResult_t rc = mpi_result(c, MPI_Type_contiguous(int(kChunk), MPI_BYTE, &out->type),
                                   "MPI_Type_contiguous")) {
    return rc;
  }
  out->derived = true;
  out->count = int(bytes / kChunk);
  return mpi_result(c, MPI_Type_commit(&out->type), "MPI_Type_commit");
}

void release(Chunked& k) {
  if (k.derived) MPI_Type_free(&k.type);
}

giftResult_t all_to_all(void* ctx, const void* send, void* recv, uint64_t bytes) {
  MpiContext& c = *static_cast<MpiContext*>(ctx);
  Chunked k;
  giftResult_t rc = chunked(c, bytes, &k);
  if (rc == GIFT_OK) {
    rc = mpi_result(c, MPI_Alltoall(send, k.count, k.type, recv, k.count, k.type, c.comm),
                    "MPI_Alltoall");
  }
  release(k);
  return rc;
}

giftResult_t all_gather(void* ctx, const void* send, void* recv, uint64_t bytes) {
  MpiContext& c = *static_cast<MpiContext*>(ctx);
  Chunked k;
  giftResult_t rc = chunked(c, bytes, &k);
  if (rc == GIFT_OK) {
    rc = mpi_result(c, MPI_Allgather(send, k.count, k.type, recv, k.count, k.type, c.comm),
                    "MPI_Allgather");
  }
  release(k);
  return rc;
}

giftResult_t agree(void* ctx, int* code, int* rank) {
  MpiContext& c = *static_cast<MpiContext*>(ctx);
  // MAXLOC: the largest code and, among ranks that have it, the lowest rank.
  int pair[2] = {*code, *rank};
  int result[2];
  if (giftResult_t rc = mpi_result(c, MPI_Allreduce(pair, result, 1, MPI_2INT, MPI_MAXLOC, c.comm),
                                   "MPI_Allreduce")) {
    return rc;
  }
  *code = result[0];
  *rank = result[1];
  return GIFT_OK;
}

// Any size (a basis may pass 2 GiB), in pieces whose counts fit MPI's ints; every rank knows
// `bytes`, so all make the same calls.
giftResult_t broadcast(void* ctx, void* buf, uint64_t bytes, int root) {
  MpiContext& c = *static_cast<MpiContext*>(ctx);
  constexpr uint64_t kPiece = uint64_t(1) << 30;
  for (uint64_t at = 0; at < bytes; at += kPiece) {
    const int n = int(std::min(kPiece, bytes - at));
    if (giftResult_t rc = mpi_result(
            c, MPI_Bcast(static_cast<char*>(buf) + at, n, MPI_BYTE, root, c.comm), "MPI_Bcast")) {
      return rc;
    }
  }
  return GIFT_OK;
}

const char* last_error(void* ctx) { return static_cast<MpiContext*>(ctx)->error; }

void destroy(void* ctx) {
  MpiContext* c = static_cast<MpiContext*>(ctx);
  if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
  delete c;
}

}  // namespace

extern "C" giftResult_t giftCommInitMpi(MPI_Comm comm, const giftAllReduceConfig* config,
                                        giftComm** out) {
  if (!out) return giftBackendFail(GIFT_ERROR_INVALID_ARGUMENT, "giftCommInitMpi: out is NULL");
  *out = nullptr;
  // Checked before MPI_Comm_dup, whose errors on them are fatal under MPI's default handler.
  if (comm == MPI_COMM_NULL)
    return giftBackendFail(GIFT_ERROR_INVALID_ARGUMENT, "giftCommInitMpi: MPI_COMM_NULL");
  int inter = 0;
  if (MPI_Comm_test_inter(comm, &inter) == MPI_SUCCESS && inter) {
    // Its collectives exchange with the remote group: the all-reduce is over one group.
    return giftBackendFail(GIFT_ERROR_INVALID_ARGUMENT,
                           "giftCommInitMpi: an intercommunicator (give an intracommunicator, "
                           "such as MPI_Intercomm_merge's)");
  }
  MpiContext* c = new (std::nothrow) MpiContext;
  if (!c) return giftBackendFail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for an MPI communicator");
  giftCommBackend b = {};
  b.size = sizeof b;
  b.magic = GIFT_STRUCT_MAGIC;
  b.version = GIFT_VERSION_NUMBER;
  b.ctx = c;
  giftResult_t rc = mpi_result(*c, MPI_Comm_dup(comm, &c->comm), "MPI_Comm_dup");
  if (rc == GIFT_OK) {
    rc = mpi_result(*c, MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN),
                    "MPI_Comm_set_errhandler");
  }
  if (rc == GIFT_OK) rc = mpi_result(*c, MPI_Comm_size(c->comm, &b.world), "MPI_Comm_size");
  if (rc == GIFT_OK) rc = mpi_result(*c, MPI_Comm_rank(c->comm, &b.rank), "MPI_Comm_rank");
  if (rc != GIFT_OK) {
    rc = giftBackendFail(rc, c->error);
    destroy(c);
    return rc;
  }
  b.all_to_all = all_to_all;
  b.all_gather = all_gather;
  b.agree = agree;
  b.broadcast = broadcast;
  b.last_error = last_error;
  b.destroy = destroy;
  rc = giftCommCreate(&b, config, out);
  if (rc != GIFT_OK) destroy(c);
  return rc;
}
