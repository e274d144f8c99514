// The NCCL backend: fixed-size collectives on ncclUint8, enqueued on the caller's stream.
#include <nccl.h>

#include <cstdio>
#include <new>

#include "gift/gift_nccl.h"

namespace {

struct NcclContext {
  ncclComm_t comm = nullptr;
  char error[256] = {};
};

giftResult_t nccl_result(NcclContext& c, ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return GIFT_OK;
  const char* detail = ncclGetLastError(c.comm);
  snprintf(c.error, sizeof c.error, "%s: %s%s%s", call, ncclGetErrorString(r),
           detail && *detail ? ": " : "", detail ? detail : "");
  return GIFT_ERROR_INTERNAL;
}

giftResult_t all_to_all(void* ctx, const void* send, void* recv, uint64_t bytes,
                        cudaStream_t stream) {
  NcclContext& c = *static_cast<NcclContext*>(ctx);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
  return nccl_result(c, ncclAlltoAll(send, recv, bytes, ncclUint8, c.comm, stream), "ncclAlltoAll");
#else
  int world = 0;
  if (giftResult_t rc = nccl_result(c, ncclCommCount(c.comm, &world), "ncclCommCount")) return rc;
  if (giftResult_t rc = nccl_result(c, ncclGroupStart(), "ncclGroupStart")) return rc;
  // Every pair is posted before the group ends, so NCCL may run them all at once.
  giftResult_t rc = GIFT_OK;
  for (int r = 0; r < world && rc == GIFT_OK; ++r) {
    const uint64_t at = uint64_t(r) * bytes;
    rc = nccl_result(
        c, ncclSend(static_cast<const char*>(send) + at, bytes, ncclUint8, r, c.comm, stream),
        "ncclSend");
    if (rc == GIFT_OK) {
      rc = nccl_result(c,
                       ncclRecv(static_cast<char*>(recv) + at, bytes, ncclUint8, r, c.comm, stream),
                       "ncclRecv");
    }
  }
  const giftResult_t end = nccl_result(c, ncclGroupEnd(), "ncclGroupEnd");
  return rc != GIFT_OK ? rc : end;
#endif
}

giftResult_t all_gather(void* ctx, const void* send, void* recv, uint64_t bytes,
                        cudaStream_t stream) {
  NcclContext& c = *static_cast<NcclContext*>(ctx);
  return nccl_result(c, ncclAllGather(send, recv, bytes, ncclUint8, c.comm, stream),
                     "ncclAllGather");
}

const char* last_error(void* ctx) { return static_cast<NcclContext*>(ctx)->error; }

void destroy(void* ctx) { delete static_cast<NcclContext*>(ctx); }

}  // namespace

extern "C" giftResult_t giftCommInitNccl(ncclComm_t comm, const giftAllReduceConfig* config,
                                         giftDeviceComm** out) {
  if (!out || !comm) {
    return giftBackendFail(GIFT_ERROR_INVALID_ARGUMENT, "giftCommInitNccl: out or comm is NULL");
  }
  *out = nullptr;
  NcclContext* c = new (std::nothrow) NcclContext;
  if (!c) return giftBackendFail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for an NCCL communicator");
  c->comm = comm;
  giftDeviceCommBackend b = {};
  b.size = sizeof b;
  b.magic = GIFT_STRUCT_MAGIC;
  b.version = GIFT_VERSION_NUMBER;
  b.ctx = c;
  giftResult_t rc = nccl_result(*c, ncclCommCount(comm, &b.world), "ncclCommCount");
  if (rc == GIFT_OK) rc = nccl_result(*c, ncclCommUserRank(comm, &b.rank), "ncclCommUserRank");
  if (rc != GIFT_OK) {
    rc = giftBackendFail(rc, c->error);
    destroy(c);
    return rc;
  }
  b.all_to_all = all_to_all;
  b.all_gather = all_gather;
  b.last_error = last_error;
  b.destroy = destroy;
  rc = giftDeviceCommCreate(&b, config, out);
  if (rc != GIFT_OK) destroy(c);
  return rc;
}
