// The device communicator driver: comm.cc's sequence of local steps and exchanges on device
// buffers, enqueued on the caller's stream, for backends that move device memory (NCCL).
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <new>
#include <string>

#include "common/error.h"
#include "gift/gift_transport_cuda.h"
#include "transport/config.h"

using gift::fail;

namespace {

using DevicePlanPtr = std::unique_ptr<giftReduceDevicePlan, decltype(&giftReduceDevicePlanDestroy)>;

// A bucket shape's plan and its message buffers on the device: `world` messages out (later
// the gathered result), `world` in, and this rank's reduced shard.
struct DeviceBucket {
  DevicePlanPtr plan{nullptr, giftReduceDevicePlanDestroy};
  uint64_t message_bytes = 0;
  uint8_t* memory = nullptr;
  uint8_t *send = nullptr, *recv = nullptr, *reduced = nullptr;

  DeviceBucket() = default;
  DeviceBucket(const DeviceBucket&) = delete;
  DeviceBucket& operator=(const DeviceBucket&) = delete;
  ~DeviceBucket() { cudaFree(memory); }
};

}  // namespace

struct giftDeviceComm {
  giftDeviceCommBackend backend;
  giftAllReduceConfig config;
  std::map<std::string, std::unique_ptr<DeviceBucket>> buckets;
};

namespace {

giftResult_t cuda_failed(cudaError_t e, const char* what) {
  return fail(GIFT_ERROR_DEVICE, "CUDA: %s: %s", what, cudaGetErrorString(e));
}

giftResult_t exchange_failed(const giftDeviceComm& c, const char* what) {
  const char* d = c.backend.last_error ? c.backend.last_error(c.backend.ctx) : nullptr;
  return fail(GIFT_ERROR_INTERNAL, "rank %d: %s failed: %s", c.backend.rank, what,
              d ? d : "(no detail)");
}

giftResult_t bucket_for(giftDeviceComm& c, const giftBucketTensor* tensors, size_t n,
                        DeviceBucket** out) {
  gift::transport::BucketShape shape;
  if (const giftResult_t rc = gift::transport::read_bucket(tensors, n, &shape)) return rc;
  const std::string key = gift::transport::bucket_key(shape);
  auto it = c.buckets.find(key);
  if (it != c.buckets.end()) {
    *out = it->second.get();
    return GIFT_OK;
  }
  auto b = std::make_unique<DeviceBucket>();
  giftReduceDevicePlan* plan = nullptr;
  if (const giftResult_t rc = giftReduceDevicePlanCreate(&c.config, c.backend.world, c.backend.rank,
                                                         tensors, n, &plan)) {
    return rc;
  }
  b->plan.reset(plan);
  const uint64_t m = giftReduceDevicePlanMessageBytes(plan);
  const uint64_t w = uint64_t(c.backend.world);
  b->message_bytes = m;
  void* memory = nullptr;
  if (const cudaError_t e = cudaMalloc(&memory, (2 * w + 1) * m)) {
    return cuda_failed(e, "cudaMalloc(message buffers)");
  }
  b->memory = static_cast<uint8_t*>(memory);
  // Zero once: encodes write only their shard's scales and codes, so the padding stays zero
  // in every message sent, as on the CPU.
  if (const cudaError_t e = cudaMemset(memory, 0, (2 * w + 1) * m)) {
    return cuda_failed(e, "cudaMemset(message buffers)");
  }
  b->send = b->memory;
  b->recv = b->memory + w * m;
  b->reduced = b->memory + 2 * w * m;
  *out = c.buckets.emplace(key, std::move(b)).first->second.get();
  return GIFT_OK;
}

}  // namespace

extern "C" {

giftResult_t giftDeviceCommCreate(const giftDeviceCommBackend* backend,
                                  const giftAllReduceConfig* config, giftDeviceComm** comm) {
  gift::clear_error();
  if (!comm) return fail(GIFT_ERROR_INVALID_ARGUMENT, "comm is NULL");
  *comm = nullptr;
  if (!backend || backend->size < sizeof(giftDeviceCommBackend) ||
      backend->magic != GIFT_STRUCT_MAGIC) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "backend is NULL, or its size or magic is not that of a giftDeviceCommBackend");
  }
  if (!backend->all_to_all || !backend->all_gather) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "the backend lacks a collective");
  }
  if (backend->world < 1 || backend->rank < 0 || backend->rank >= backend->world) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "backend: rank %d of world %d", backend->rank,
                backend->world);
  }
  try {
    auto c = std::make_unique<giftDeviceComm>();
    c->backend = *backend;
    if (const giftResult_t rc = gift::transport::read_device_config(config, &c->config)) {
      return rc;
    }
    *comm = c.release();
    return GIFT_OK;
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for a communicator");
  }
}

void giftDeviceCommDestroy(giftDeviceComm* comm) {
  if (!comm) return;
  if (comm->backend.destroy) comm->backend.destroy(comm->backend.ctx);
  delete comm;
}

giftResult_t giftDeviceAllReduceBucket(giftDeviceComm* comm, const giftBucketTensor* tensors,
                                       const void* const* send, void* const* recv, size_t n,
                                       cudaStream_t stream) {
  gift::clear_error();
  if (!comm) return fail(GIFT_ERROR_INVALID_ARGUMENT, "comm is NULL");
  giftDeviceComm& c = *comm;
  DeviceBucket* b = nullptr;
  try {
    if (const giftResult_t rc = bucket_for(c, tensors, n, &b)) return rc;
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for a bucket's plan");
  }
  giftReduceDevicePlan* plan = b->plan.get();
  const uint64_t m = b->message_bytes;
  if (const giftResult_t rc = giftReduceEncodeShardsDevice(plan, send, b->send, stream)) return rc;
  if (c.backend.all_to_all(c.backend.ctx, b->send, b->recv, m, stream) != GIFT_OK) {
    return exchange_failed(c, "the all-to-all of shards");
  }
  if (const giftResult_t rc = giftReduceSumShardDevice(plan, b->recv, b->reduced, stream)) {
    return rc;
  }
  if (c.backend.all_gather(c.backend.ctx, b->reduced, b->send, m, stream) != GIFT_OK) {
    return exchange_failed(c, "the all-gather of reduced shards");
  }
  return giftReduceDecodeResultDevice(plan, b->send, recv, stream);
}

giftResult_t giftDeviceAllReduce(giftDeviceComm* comm, const void* send, void* recv, uint64_t count,
                                 giftDType_t dtype, cudaStream_t stream) {
  const giftBucketTensor t = {"buffer", dtype, 1, &count};
  return giftDeviceAllReduceBucket(comm, &t, &send, &recv, 1, stream);
}

giftResult_t giftDeviceCommStatus(giftDeviceComm* comm) {
  gift::clear_error();
  if (!comm) return fail(GIFT_ERROR_INVALID_ARGUMENT, "comm is NULL");
  for (auto& [key, b] : comm->buckets) {
    if (const giftResult_t rc = giftReduceDevicePlanStatus(b->plan.get())) return rc;
  }
  return GIFT_OK;
}

}  // extern "C"
