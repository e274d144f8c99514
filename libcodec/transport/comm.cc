// The communicator driver: the algorithm's sequence of local steps and exchanges, written
// once against giftCommBackend so that every backend runs the same steps on the same bytes.
#include <cinttypes>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "api/handles.h"
#include "common/error.h"
#include "common/id_hex.h"
#include "common/xxh3.h"
#include "gift/gift_transport.h"
#include "transport/config.h"
#include "transport/reduce_plan.h"
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
  uint64_t layout = 0;           // hash of the tensors' dtypes and shapes (CallSignature)
  uint64_t names = 0;            // hash of their names (CallSignature)
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
  std::unique_ptr<giftBasis> basis;  // the communicator's copy, set on every plan
};

namespace {

const char* backend_detail(const giftComm& c) {
  const char* d = c.backend.last_error ? c.backend.last_error(c.backend.ctx) : nullptr;
  return d ? d : "(no detail)";
}

// The same error on every rank: rank `rank`'s code with its message, broadcast from it.
giftResult_t fail_as(giftComm& c, int code, int rank, const char* step) {
  char text[512] = {};
  if (rank == c.backend.rank) snprintf(text, sizeof text, "%s", giftGetLastErrorMessage());
  if (c.backend.broadcast(c.backend.ctx, text, sizeof text, rank) != GIFT_OK) {
    snprintf(text, sizeof text, "(its message was lost: %s)", backend_detail(c));
  }
  text[sizeof text - 1] = '\0';
  return fail(giftResult_t(code), "rank %d failed in %s: %s", rank, step, text);
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
  return fail_as(c, code, rank, step);
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

giftResult_t bucket_for(giftComm& c, const gift::transport::BucketShape& shape,
                        const giftBucketTensor* tensors, size_t n, Bucket** out) {
  const std::string key = gift::transport::bucket_key(shape);
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
  if (const giftResult_t rc = giftReducePlanSetBasis(plan, c.basis.get())) return rc;
  b.message_bytes = giftReducePlanMessageBytes(plan);
  std::vector<uint64_t> words;
  for (size_t i = 0; i < shape.dtypes.size(); ++i) {
    words.push_back(uint64_t(shape.dtypes[i]));
    words.push_back(shape.shapes[i].size());
    words.insert(words.end(), shape.shapes[i].begin(), shape.shapes[i].end());
  }
  b.layout = XXH3_64bits(words.data(), words.size() * sizeof(uint64_t));
  words.clear();
  for (const std::string& name : shape.names)
    words.push_back(XXH3_64bits(name.data(), name.size()));
  b.names = XXH3_64bits(words.data(), words.size() * sizeof(uint64_t));
  const uint64_t all = b.message_bytes * uint64_t(c.backend.world);
  b.send.resize(all);
  b.recv.resize(all);
  b.reduced.resize(b.message_bytes);
  *out = &c.buckets.emplace(key, std::move(b)).first->second;
  return GIFT_OK;
}

// What every rank states before a call sends anything: the outcome of its local checks and
// what the call's messages depend on. Ranks that differ there would exchange messages of other
// sizes (a truncation in the backend, or a hang), or decode each other's bytes by other rules
// (silently wrong sums); compared first, the difference fails the call on every rank, named,
// before any plan advances.
struct CallSignature {
  uint64_t code;  // of the local checks
  uint64_t kind, block, scale_dtype, op, integrity, coords, reselect_every, nonfinite;
  uint64_t tensors, elements;
  uint64_t layout;  // Bucket::layout
  uint64_t names;   // Bucket::names
  uint64_t calls;   // the plan's call counter
};

// A config field as the message names it: by the names of its enum's values where it has
// some (their order is the enum's), as a number otherwise.
struct SignatureField {
  const char* name;
  uint64_t CallSignature::*field;
  std::vector<const char*> values;

  std::string text(const CallSignature& s) const {
    const uint64_t v = s.*field;
    return v < values.size() ? values[v] : std::to_string(v);
  }
};
const SignatureField kConfigFields[] = {
    {"kind", &CallSignature::kind, {"e4m3", "e5m2"}},
    {"block", &CallSignature::block, {}},
    {"scale_dtype", &CallSignature::scale_dtype, {"f32", "e8m0"}},
    {"op", &CallSignature::op, {"sum", "avg"}},
    {"integrity", &CallSignature::integrity, {"off", "on"}},
    {"coords", &CallSignature::coords, {"euclidean", "gift", "auto"}},
    {"reselect_every", &CallSignature::reselect_every, {}},
    {"nonfinite", &CallSignature::nonfinite, {"error", "keep"}},
};

CallSignature signature(const giftComm& c, giftResult_t local,
                        const gift::transport::BucketShape& shape, const Bucket* b) {
  const giftAllReduceConfig& k = c.config;
  // As the plans read them: integrity is on or off, and reselect_every counts only in AUTO.
  const bool measures = k.coords == GIFT_COORDS_MODE_AUTO;
  CallSignature sig = {uint64_t(local),
                       uint64_t(k.kind),
                       k.block,
                       uint64_t(k.scale_dtype),
                       uint64_t(k.op),
                       uint64_t(k.integrity != 0),
                       uint64_t(k.coords),
                       measures ? k.reselect_every : 0,
                       uint64_t(k.nonfinite),
                       shape.dtypes.size(),
                       shape.offset.empty() ? 0 : shape.offset.back(),
                       0,
                       0,
                       0};
  // Without a plan the local checks failed, and the comparison stops at their outcome.
  if (b) {
    sig.layout = b->layout;
    sig.names = b->names;
    sig.calls = gift::transport::plan_calls(b->plan.get());
  }
  return sig;
}

// How rank r's signature differs from rank 0's, or "" where it does not.
std::string difference(const CallSignature& zero, const CallSignature& sig, int r) {
  const std::string who = "rank " + std::to_string(r) + "'s ";
  for (const SignatureField& f : kConfigFields) {
    if (sig.*f.field != zero.*f.field) {
      return who + "config differs from rank 0's in " + f.name + " (" + f.text(sig) +
             ", rank 0's " + f.text(zero) + ")";
    }
  }
  if (sig.tensors != zero.tensors || sig.elements != zero.elements) {
    return who + "bucket holds " + std::to_string(sig.tensors) + " tensors of " +
           std::to_string(sig.elements) + " elements, rank 0's " + std::to_string(zero.tensors) +
           " of " + std::to_string(zero.elements);
  }
  if (sig.layout != zero.layout) {
    return who + "bucket's tensors differ from rank 0's in their dtypes or shapes";
  }
  // Names pick each matrix's whitener, and name the tensors in errors and dumps: the same
  // shapes under other names are most likely other tensors (another order).
  if (sig.names != zero.names) {
    return who + "bucket's tensors differ from rank 0's in their names (the same dtypes and " +
           "shapes: the tensors in another order?)";
  }
  if (sig.calls != zero.calls) {
    return who + "plan for this bucket has made " + std::to_string(sig.calls) +
           " calls, rank 0's " + std::to_string(zero.calls) +
           " (a plan created or loaded on some ranks only?)";
  }
  return "";
}

// All-gathers the signatures: the first rank whose local checks failed fails the call on
// every rank with its message; otherwise the first rank that differs from rank 0 does.
giftResult_t agree_on_call(giftComm& c, const CallSignature& mine) {
  std::vector<CallSignature> all(size_t(c.backend.world));
  if (c.backend.all_gather(c.backend.ctx, &mine, all.data(), sizeof mine) != GIFT_OK) {
    return exchange_failed(c, "the all-gather of the call's signatures");
  }
  for (int r = 0; r < c.backend.world; ++r) {
    if (all[r].code != GIFT_OK) return fail_as(c, int(all[r].code), r, "checking its arguments");
  }
  for (int r = 1; r < c.backend.world; ++r) {
    const std::string d = difference(all[0], all[r], r);
    if (!d.empty())
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "the ranks' calls differ: %s", d.c_str());
  }
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
  // No rank commits the call's state before every rank's result has passed its checks.
  gift::transport::count_call(b.plan.get(), b.send.data());
  gift::transport::StepScratch scratch;
  // Memory that runs out here fails this rank's step, which every rank then agrees on, where
  // an exception would leave the others waiting in the agreement.
  rc = gift::without_exceptions("checking the result", [&] {
    return gift::transport::check_result(b.plan.get(), b.send.data(), recv, &scratch);
  });
  if ((rc = agree(c, rc, "checking the result"))) return rc;
  rc = gift::without_exceptions("decoding the result", [&] {
    return gift::transport::decode_checked_result(b.plan.get(), b.send.data(), recv, scratch);
  });
  return agree(c, rc, "decoding the result");
}

// The id in the 16 bytes at `id` (giftBasisId's layout), for messages.
std::string id_at(const uint8_t* id) {
  uint64_t lo, hi;
  memcpy(&lo, id, 8);
  memcpy(&hi, id + 8, 8);
  return gift::id_or_none(lo, hi);
}

// Every rank's basis id, so that a rank holding another basis is named on every rank before
// any message in the wrong coordinates is sent.
giftResult_t check_same_basis(giftComm& c, const giftBasis* basis) {
  uint8_t mine[16] = {};
  if (basis) {
    memcpy(mine, &basis->basis.id.lo, 8);
    memcpy(mine + 8, &basis->basis.id.hi, 8);
  }
  std::vector<uint8_t> all(16 * size_t(c.backend.world));
  if (c.backend.all_gather(c.backend.ctx, mine, all.data(), 16) != GIFT_OK) {
    return exchange_failed(c, "the all-gather of basis ids");
  }
  std::string differ;
  for (int r = 1; r < c.backend.world; ++r) {
    if (memcmp(all.data(), all.data() + 16 * r, 16) != 0) {
      differ += (differ.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) +
                " holds " + id_at(all.data() + 16 * r);
    }
  }
  if (differ.empty()) return GIFT_OK;
  return fail(GIFT_ERROR_BASIS_MISSING, "the ranks hold different bases: rank 0 holds %s, %s",
              id_at(all.data()).c_str(), differ.c_str());
}

// The communicator's move to `basis`, made aside on this rank (the ranks' ids compared, the
// copy and every plan's change prepared): nothing changes until every rank has it.
struct BasisMove {
  std::unique_ptr<giftBasis> basis;
  std::vector<std::pair<giftReducePlan*, gift::transport::BasisChangePtr>> plans;
};

giftResult_t prepare_move(giftComm& c, const giftBasis* basis, BasisMove* move) {
  if (const giftResult_t rc = check_same_basis(c, basis)) return rc;
  move->basis.reset(basis ? new giftBasis(*basis) : nullptr);
  for (auto& [key, b] : c.buckets) {
    gift::transport::BasisChangePtr change;
    if (const giftResult_t rc =
            gift::transport::prepare_basis(b.plan.get(), move->basis.get(), &change))
      return rc;
    move->plans.emplace_back(b.plan.get(), std::move(change));
  }
  return GIFT_OK;
}

// Every rank's count of tensors and a hash of their names and dimensions, compared with
// rank 0's before any moment moves: ranks given other dimensions would make different numbers
// of all-gathers. Every rank reaches the same verdict from the same gathered bytes.
giftResult_t check_same_statistics(giftComm& c, size_t n, const char* const* names,
                                   const uint32_t* dims) {
  uint64_t mine[2] = {uint64_t(n), 0};
  for (size_t i = 0; i < n; ++i) {
    mine[1] = XXH3_64bits_withSeed(names[i], strlen(names[i]) + 1, mine[1]);
    mine[1] = XXH3_64bits_withSeed(&dims[i], sizeof dims[i], mine[1]);
  }
  std::vector<uint64_t> all(2 * size_t(c.backend.world));
  if (c.backend.all_gather(c.backend.ctx, mine, all.data(), sizeof mine) != GIFT_OK) {
    return exchange_failed(c, "the all-gather of the statistics' names and dimensions");
  }
  for (int r = 1; r < c.backend.world; ++r) {
    if (all[2 * size_t(r)] != all[0]) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT,
                  "rank %d gives statistics of %llu tensors, rank 0 of %llu", r,
                  (unsigned long long)all[2 * size_t(r)], (unsigned long long)all[0]);
    }
    if (all[2 * size_t(r) + 1] != all[1]) {
      return fail(GIFT_ERROR_INVALID_ARGUMENT,
                  "rank %d's statistics differ from rank 0's in their names or dimensions", r);
    }
  }
  return GIFT_OK;
}

// Moment elements each rank sends per all-gather: the gathered parts take world x 4 MiB,
// not world copies of the moment (512 MiB for 8 ranks at d_in = 4096).
constexpr uint64_t kMomentPart = uint64_t(1) << 20;

// The buffers of average_moment, allocated once for all of a refresh's tensors: the gathered
// parts on every rank (the world's parts of at most kMomentPart elements), the averaged moment
// on rank 0 (the largest tensor's).
struct MomentBuffers {
  std::vector<float> gathered;
  std::vector<double> averaged;
};

// Sizes *b for moments of dims[i]^2 elements, and the ranks agree on whether each could
// (check_same_statistics has made the dimensions, and so the all-gathers that follow, the
// same on every rank).
giftResult_t allocate_moments(giftComm& c, size_t n, const uint32_t* dims, MomentBuffers* b) {
  uint64_t largest = 0;
  for (size_t i = 0; i < n; ++i) largest = std::max(largest, uint64_t(dims[i]) * dims[i]);
  giftResult_t rc = GIFT_OK;
  try {
    b->gathered.resize(std::min(largest, kMomentPart) * uint64_t(c.backend.world));
    if (c.backend.rank == 0) b->averaged.resize(largest);
  } catch (const std::exception&) {  // bad_alloc, or length_error past what a vector holds
    rc = fail(GIFT_ERROR_OUT_OF_MEMORY, "rank %d: no memory for a moment of %llu elements",
              c.backend.rank, (unsigned long long)largest);
  }
  // Every rank joins every all-gather: a rank without its buffers says so first.
  return agree(c, rc, "allocating the averaged moments");
}

// The moments summed over the ranks in rank order, in fp32, divided by the world size, into the
// first count elements of b->averaged on rank 0; in parts of kMomentPart elements (the backends
// gather to every rank, and only rank 0 sums).
giftResult_t average_moment(giftComm& c, const float* mine, uint64_t count, MomentBuffers* b) {
  const uint64_t world = uint64_t(c.backend.world);
  const float w = float(c.backend.world);
  float* all = b->gathered.data();
  for (uint64_t at = 0; at < count; at += kMomentPart) {
    const uint64_t n = std::min(kMomentPart, count - at);
    if (c.backend.all_gather(c.backend.ctx, mine + at, all, n * sizeof(float)) != GIFT_OK) {
      return exchange_failed(c, "the all-gather of activation statistics");
    }
    if (c.backend.rank != 0) continue;
    for (uint64_t i = 0; i < n; ++i) {
      float sum = all[i];
      for (uint64_t r = 1; r < world; ++r) sum += all[r * n + i];
      b->averaged[at + i] = sum / w;
    }
  }
  return GIFT_OK;
}

// Rank 0's fit of every tensor to the averaged moments, as .giftb bytes.
giftResult_t fit_on_root(giftComm& c, size_t n, const char* const* names,
                         const float* const* moments, const uint32_t* dims,
                         const giftFitParams* params, std::vector<uint8_t>* bytes) {
  giftBasisBuilder* builder = nullptr;
  giftResult_t rc = c.backend.rank == 0 ? giftBasisBuilderCreate(params, &builder) : GIFT_OK;
  const std::unique_ptr<giftBasisBuilder, decltype(&giftBasisBuilderFree)> owner(
      builder, giftBasisBuilderFree);
  if ((rc = agree(c, rc, "creating the basis builder"))) return rc;
  MomentBuffers buffers;
  if ((rc = allocate_moments(c, n, dims, &buffers))) return rc;
  for (size_t i = 0; i < n; ++i) {
    if ((rc = average_moment(c, moments[i], uint64_t(dims[i]) * dims[i], &buffers))) return rc;
    if (c.backend.rank == 0) {
      rc = giftBasisBuilderAdd(builder, names[i], buffers.averaged.data(), dims[i], "activations",
                               nullptr, 0, nullptr, 0, nullptr, nullptr);
    }
    if ((rc = agree(c, rc, "fitting a whitener"))) return rc;
  }
  if (c.backend.rank != 0) return GIFT_OK;
  giftBasis* basis = nullptr;
  if ((rc = giftBasisBuilderFinish(builder, &basis))) return rc;
  const std::unique_ptr<giftBasis, decltype(&giftBasisFree)> b(basis, giftBasisFree);
  void* data = nullptr;
  uint64_t size = 0;
  if ((rc = giftBasisSerialize(basis, 0, &data, &size))) return rc;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  bytes->assign(p, p + size);
  giftFree(data);
  return GIFT_OK;
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

giftResult_t giftCommSetBasis(giftComm* comm, const giftBasis* basis) {
  gift::clear_error();
  if (!comm) return fail(GIFT_ERROR_INVALID_ARGUMENT, "comm is NULL");
  BasisMove move;
  giftResult_t rc = gift::without_exceptions("setting the basis",
                                             [&] { return prepare_move(*comm, basis, &move); });
  // Every rank's move made aside before any rank takes its own: a rank that could not make it
  // (out of memory) leaves every rank in the old basis, where the ranks stay alike.
  if ((rc = agree(*comm, rc, "setting the basis"))) return rc;
  comm->basis = std::move(move.basis);
  for (auto& [plan, change] : move.plans) gift::transport::take_basis(plan, std::move(change));
  return GIFT_OK;
}

giftResult_t giftCommRefreshBasis(giftComm* comm, size_t n, const char* const* names,
                                  const float* const* moments, const uint32_t* dims,
                                  const giftFitParams* params, giftBasis** basis) {
  gift::clear_error();
  if (!comm) return fail(GIFT_ERROR_INVALID_ARGUMENT, "comm is NULL");
  giftComm& c = *comm;
  if (basis) *basis = nullptr;
  giftResult_t rc = GIFT_OK;
  for (size_t i = 0; i < n && rc == GIFT_OK; ++i) {
    if (!names || !names[i] || !moments || !moments[i] || !dims || dims[i] == 0)
      rc = fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor %zu: no name, moment or dimension", i);
  }
  if ((rc = agree(c, rc, "checking the statistics"))) return rc;
  try {
    if ((rc = check_same_statistics(c, n, names, dims))) return rc;
    std::vector<uint8_t> bytes;
    if ((rc = fit_on_root(c, n, names, moments, dims, params, &bytes)))
      return agree(c, rc, "fitting");
    rc = agree(c, GIFT_OK, "fitting the basis");
    if (rc) return rc;
    uint64_t size = bytes.size();
    if (c.backend.broadcast(c.backend.ctx, &size, sizeof size, 0) != GIFT_OK)
      return exchange_failed(c, "the broadcast of the basis size");
    bytes.resize(size);
    if (c.backend.broadcast(c.backend.ctx, bytes.data(), size, 0) != GIFT_OK)
      return exchange_failed(c, "the broadcast of the basis");
    giftBasis* fitted = nullptr;
    rc = giftBasisFromBytes(bytes.data(), size, &fitted);
    std::unique_ptr<giftBasis, decltype(&giftBasisFree)> owner(fitted, giftBasisFree);
    if ((rc = agree(c, rc, "reading the broadcast basis"))) return rc;
    if ((rc = giftCommSetBasis(comm, fitted))) return rc;
    if (basis) *basis = owner.release();
    return GIFT_OK;
  } catch (const std::bad_alloc&) {
    return agree(c, fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory to refresh the basis"),
                 "refreshing the basis");
  }
}

}  // extern "C"

namespace {

// A call's arguments checked, its plan found or made, and its signature agreed on every rank
// before anything is encoded: `early` is a failure found before (a stream where none goes).
giftResult_t all_reduce_steps(giftComm& c, giftResult_t early, const giftBucketTensor* tensors,
                              const void* const* send, void* const* recv, size_t n) {
  namespace tr = gift::transport;
  tr::BucketShape shape;
  Bucket* b = nullptr;
  giftResult_t rc = early;
  try {
    if (rc == GIFT_OK) rc = tr::read_bucket(tensors, n, &shape);
    if (rc == GIFT_OK) rc = bucket_for(c, shape, tensors, n, &b);
  } catch (const std::bad_alloc&) {
    rc = fail(GIFT_ERROR_OUT_OF_MEMORY, "no memory for a bucket's plan and messages");
  }
  // Both sets of buffers now, so that no later step can fail on one rank only for them.
  if (rc == GIFT_OK) rc = tr::check_tensor_pointers(shape, send);
  if (rc == GIFT_OK && (rc = tr::check_tensor_pointers(shape, recv))) {
    const std::string why = giftGetLastErrorMessage();
    rc = fail(rc, "recv: %s", why.c_str());
  }
  if ((rc = agree_on_call(c, signature(c, rc, shape, rc == GIFT_OK ? b : nullptr)))) return rc;
  rc = giftReduceEncodeShards(b->plan.get(), send, b->send.data());
  if ((rc = agree(c, rc, "encoding its shards"))) return rc;
  return run(c, *b, recv);
}

// No exception crosses the C API: memory that runs out between the steps (their signatures,
// messages' texts) fails this rank's call, which may leave the others in an exchange.
giftResult_t all_reduce(giftComm& c, giftResult_t early, const giftBucketTensor* tensors,
                        const void* const* send, void* const* recv, size_t n) {
  try {
    return all_reduce_steps(c, early, tensors, send, recv, n);
  } catch (const std::bad_alloc&) {
    return fail(GIFT_ERROR_OUT_OF_MEMORY, "rank %d ran out of memory in an all-reduce call",
                c.backend.rank);
  }
}

}  // namespace

extern "C" {

giftResult_t giftAllReduceBucket(giftComm* comm, const giftBucketTensor* tensors,
                                 const void* const* send, void* const* recv, size_t n) {
  gift::clear_error();
  if (!comm) return fail(GIFT_ERROR_INVALID_ARGUMENT, "comm is NULL");
  return all_reduce(*comm, GIFT_OK, tensors, send, recv, n);
}

giftResult_t giftAllReduce(giftComm* comm, const void* send, void* recv, uint64_t count,
                           giftDType_t dtype, void* stream) {
  gift::clear_error();
  if (!comm) return fail(GIFT_ERROR_INVALID_ARGUMENT, "comm is NULL");
  // Refused on every rank, as any other argument, not on this one only.
  const giftResult_t early =
      stream ? fail(GIFT_ERROR_INVALID_ARGUMENT,
                    "stream must be NULL: this communicator works on host buffers")
             : GIFT_OK;
  const giftBucketTensor t = {"buffer", dtype, 1, &count};
  return all_reduce(*comm, early, &t, &send, &recv, 1);
}

}  // extern "C"
