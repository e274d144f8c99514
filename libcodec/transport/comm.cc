// The communicator driver: the algorithm's sequence of local steps and exchanges, written
// once against giftCommBackend so that every backend runs the same steps on the same bytes.
#include <cinttypes>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "common/error.h"
#include "gift/gift_transport.h"
#include "transport/config.h"
#include "transport/testing.h"

using gift::fail;

namespace {

struct Corruption {
  int step = -1, sender = -1, receiver = -1;
};
Corruption g_corruption;

using PlanPtr = std::unique_ptr<giftReducePlan, decltype(&giftReducePlanDestroy)>;

// A bucket shape's plan and its message buffers, reused by every call on that shape.
struct Bucket {
  PlanPtr plan{nullptr, giftReducePlanDestroy};
  uint64_t message_bytes = 0;
  std::vector<uint8_t> send;     // world messages out; later the gathered result
  std::vector<uint8_t> recv;     // world messages in
  std::vector<uint8_t> reduced;  // this rank's reduced shard
};

}  // namespace

struct giftComm {
  giftCommBackend backend;
  giftAllReduceConfig config;
  std::string dump_path;  // config.dump_path points here: the caller's string may not live on
  std::map<std::string, Bucket> buckets;
};

namespace {

const char* backend_detail(const giftComm& c) {
  const char* d = c.backend.last_error ? c.backend.last_error(c.backend.ctx) : nullptr;
  return d ? d : "(no detail)";
}

// Every rank learns the outcome of a local step; a failure anywhere becomes the same error
// everywhere, with the first failing rank's message, so no rank waits in an exchange that
// the others have abandoned.
giftResult_t agree(giftComm& c, giftResult_t local, const char* step) {
  int code = int(local), rank = c.backend.rank;
  if (c.backend.agree(c.backend.ctx, &code, &rank) != GIFT_OK) {
    return fail(GIFT_ERROR_INTERNAL, "agreeing on the outcome of %s failed: %s", step,
                backend_detail(c));
  }
  if (code == GIFT_OK) return GIFT_OK;
  char text[512] = {};
  if (rank == c.backend.rank) snprintf(text, sizeof text, "%s", giftGetLastErrorMessage());
  if (c.backend.broadcast(c.backend.ctx, text, sizeof text, rank) != GIFT_OK) {
    snprintf(text, sizeof text, "(its message was lost: %s)", backend_detail(c));
  }
  text[sizeof text - 1] = '\0';
  return fail(giftResult_t(code), "rank %d failed in %s: %s", rank, step, text);
}

giftResult_t exchange_failed(const giftComm& c, const char* what) {
  return fail(GIFT_ERROR_INTERNAL, "rank %d: %s failed: %s", c.backend.rank, what,
              backend_detail(c));
}

void apply_test_corruption(const giftComm& c, int step, uint8_t* messages, uint64_t bytes) {
  const Corruption k = g_corruption;
  if (k.step != step || k.receiver != c.backend.rank) return;
  messages[uint64_t(k.sender) * bytes + bytes - 1] ^= 0x5A;
}

giftResult_t bucket_for(giftComm& c, const giftBucketTensor* tensors, size_t n, Bucket** out) {
  const std::string key = gift::transport::bucket_key(tensors, n);
  auto it = c.buckets.find(key);
  if (it != c.buckets.end()) {
    *out = &it->second;
    return GIFT_OK;
  }
  giftReducePlan* plan = nullptr;
  if (const giftResult_t rc =
          giftReducePlanCreate(&c.config, c.backend.world, c.backend.rank, tensors, n, &plan)) {
    return rc;
  }
  Bucket b;
  b.plan.reset(plan);
  b.message_bytes = giftReducePlanMessageBytes(plan);
  const uint64_t all = b.message_bytes * uint64_t(c.backend.world);
  b.send.resize(all);
  b.recv.resize(all);
  b.reduced.resize(b.message_bytes);
  *out = &c.buckets.emplace(key, std::move(b)).first->second;
  return GIFT_OK;
}

giftResult_t run(giftComm& c, Bucket& b, void* const* recv) {
  const uint64_t m = b.message_bytes;
  if (c.backend.all_to_all(c.backend.ctx, b.send.data(), b.recv.data(), m) != GIFT_OK) {
    return exchange_failed(c, "the all-to-all of shards");
  }
  apply_test_corruption(c, 0, b.recv.data(), m);
  giftResult_t rc = giftReduceSumShard(b.plan.get(), b.recv.data(), b.reduced.data());
  if ((rc = agree(c, rc, "the reduction of its shard"))) return rc;
  if (c.backend.all_gather(c.backend.ctx, b.reduced.data(), b.send.data(), m) != GIFT_OK) {
    return exchange_failed(c, "the all-gather of reduced shards");
  }
  apply_test_corruption(c, 1, b.send.data(), m);
  rc = giftReduceDecodeResult(b.plan.get(), b.send.data(), recv);
  return agree(c, rc, "decoding the result");
}

}  // namespace

namespace gift::transport::testing {

void corrupt_message(int step, int sender, int receiver) {
  g_corruption = {step, sender, receiver};
}

}  // namespace gift::transport::testing

extern "C" {

giftResult_t giftCommCreate(const giftCommBackend* backend, const giftAllReduceConfig* config,
                            giftComm** comm) {
  gift::clear_error();
  if (!comm) return fail(GIFT_ERROR_INVALID_ARGUMENT, "comm is NULL");
  *comm = nullptr;
  if (!backend || backend->size < sizeof(giftCommBackend) || backend->magic != GIFT_STRUCT_MAGIC) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "backend is NULL, or its size or magic is not that of a giftCommBackend");
  }
  if (!backend->all_to_all || !backend->all_gather || !backend->agree || !backend->broadcast) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "the backend lacks a collective");
  }
  if (backend->world < 1 || backend->rank < 0 || backend->rank >= backend->world) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "backend: rank %d of world %d", backend->rank,
                backend->world);
  }
  try {
    auto c = std::make_unique<giftComm>();
    c->backend = *backend;
    if (const giftResult_t rc = gift::transport::read_config(config, &c->config)) return rc;
    if (c->config.dump_path) {
      c->dump_path = c->config.dump_path;
      c->config.dump_path = c->dump_path.c_str();
    }
    *comm = c.release();
    return GIFT_OK;
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for a communicator");
  }
}

void giftCommDestroy(giftComm* comm) {
  if (!comm) return;
  if (comm->backend.destroy) comm->backend.destroy(comm->backend.ctx);
  delete comm;
}

giftResult_t giftAllReduceBucket(giftComm* comm, const giftBucketTensor* tensors,
                                 const void* const* send, void* const* recv, size_t n) {
  gift::clear_error();
  if (!comm) return fail(GIFT_ERROR_INVALID_ARGUMENT, "comm is NULL");
  giftComm& c = *comm;
  Bucket* b = nullptr;
  giftResult_t rc = GIFT_OK;
  try {
    rc = bucket_for(c, tensors, n, &b);
  } catch (const std::bad_alloc&) {
    rc = fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for a bucket's plan and messages");
  }
  if (rc == GIFT_OK) rc = giftReduceEncodeShards(b->plan.get(), send, b->send.data());
  if ((rc = agree(c, rc, "encoding its shards"))) return rc;
  return run(c, *b, recv);
}

giftResult_t giftAllReduce(giftComm* comm, const void* send, void* recv, uint64_t count,
                           giftDType_t dtype, void* stream) {
  gift::clear_error();
  if (stream) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "stream must be NULL: this communicator works on host buffers");
  }
  const giftBucketTensor t = {"buffer", dtype, 1, &count};
  return giftAllReduceBucket(comm, &t, &send, &recv, 1);
}

}  // extern "C"
