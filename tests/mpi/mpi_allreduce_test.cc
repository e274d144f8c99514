// The MPI backend end to end, run by ctest under mpirun with 1 to 4 ranks. Every rank
// rebuilds every rank's input from a seed, so each can check its own result against the
// exact reduction. A failed check is printed with its rank and counted; the ranks agree on
// the count at the end (checks never stop a rank early, which would hang the others).
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "allreduce_reference.h"
#include "gift/gift_mpi.h"
#include "transport/testing.h"

namespace {

using gift::test::Bucket;
using gift::test::TensorSpec;

int g_rank = 0, g_world = 1, g_failures = 0;

#define CHECK(cond, ...)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      ++g_failures;                                                               \
      fprintf(stderr, "rank %d: %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                               \
      fprintf(stderr, "\n");                                                      \
    }                                                                             \
  } while (0)

struct Comm {
  giftComm* c = nullptr;
  explicit Comm(const giftAllReduceConfig& config) {
    const giftResult_t rc = giftCommInitMpi(MPI_COMM_WORLD, &config, &c);
    CHECK(rc == GIFT_OK, "giftCommInitMpi: %s", giftGetLastErrorMessage());
  }
  ~Comm() { giftCommDestroy(c); }
};

giftAllReduceConfig base_config() {
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.threads = 1;
  return c;
}

// One all-reduce of `in` (this rank's bucket); the result in fresh buffers, but for tensor
// `no_output`, whose output is NULL.
Bucket allreduce(giftComm* comm, const std::vector<TensorSpec>& specs, const Bucket& in,
                 giftResult_t* rc, size_t no_output = SIZE_MAX) {
  const std::vector<giftBucketTensor> d = gift::test::describe(specs);
  Bucket out;
  std::vector<const void*> send;
  std::vector<void*> recv;
  for (size_t i = 0; i < specs.size(); ++i) {
    out.emplace_back(in[i].size());
    send.push_back(in[i].data());
    recv.push_back(i == no_output ? nullptr : out[i].data());
  }
  *rc = giftAllReduceBucket(comm, d.data(), send.data(), recv.data(), d.size());
  return out;
}

// Every rank's result hashes alike.
bool same_on_every_rank(const Bucket& out) {
  uint64_t h = 0;
  for (const auto& t : out) h = XXH3_64bits_withSeed(t.data(), t.size(), h);
  std::vector<uint64_t> all(static_cast<size_t>(g_world));
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (uint64_t x : all) {
    if (x != h) return false;
  }
  return true;
}

std::vector<std::vector<double>> all_inputs(const std::vector<TensorSpec>& specs, uint64_t seed) {
  std::vector<std::vector<double>> x;
  for (int r = 0; r < g_world; ++r) {
    x.push_back(gift::test::flat(specs, gift::test::make_input(specs, seed, r)));
  }
  return x;
}

void check_bound(const char* what, const std::vector<TensorSpec>& specs, const Bucket& out,
                 const giftAllReduceConfig& c, uint64_t seed) {
  const auto x = all_inputs(specs, seed);
  const std::vector<double> exact = gift::test::exact_reduce(x, c.op);
  const std::vector<double> bound = gift::test::error_bound(x, specs, c);
  const std::vector<double> got = gift::test::flat(specs, out);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - exact[i]) <= bound[i]) && bad++ == 0) first = i;
  }
  CHECK(bad == 0, "%s: %zu elements past the bound, first %zu: got %g, exact %g, bound %g", what,
        bad, first, got[first], exact[first], bound[first]);
}

void test_buckets() {
  struct Variant {
    const char* name;
    giftReduceOp_t op;
    giftFp8Kind_t kind;
    giftScaleDType_t scales;
  };
  const Variant variants[] = {
      {"sum e4m3 f32", GIFT_REDUCE_SUM, GIFT_FP8_E4M3, GIFT_SCALE_DTYPE_F32},
      {"avg e4m3 f32", GIFT_REDUCE_AVG, GIFT_FP8_E4M3, GIFT_SCALE_DTYPE_F32},
      {"avg e5m2 e8m0", GIFT_REDUCE_AVG, GIFT_FP8_E5M2, GIFT_SCALE_DTYPE_E8M0}};
  const std::vector<TensorSpec> buckets[] = {gift::test::mixed_bucket(),
                                             gift::test::tiny_bucket(),
                                             {{"nothing", GIFT_DTYPE_BF16, {4, 0}}}};
  for (const Variant& v : variants) {
    giftAllReduceConfig c = base_config();
    c.op = v.op;
    c.kind = v.kind;
    c.scale_dtype = v.scales;
    Comm comm(c);
    for (const auto& specs : buckets) {
      const Bucket in = gift::test::make_input(specs, 11, g_rank);
      giftResult_t rc;
      const Bucket out = allreduce(comm.c, specs, in, &rc);
      CHECK(rc == GIFT_OK, "%s: %s", v.name, giftGetLastErrorMessage());
      CHECK(same_on_every_rank(out), "%s: replicas differ", v.name);
      check_bound(v.name, specs, out, c, 11);
    }
  }
}

void test_flat_in_place() {
  const uint64_t n = 100003;
  const std::vector<TensorSpec> specs = {{"buffer", GIFT_DTYPE_F32, {n}}};
  const Bucket in = gift::test::make_input(specs, 5, g_rank);
  Bucket out(1, std::vector<uint8_t>(in[0].size())), inplace = in;
  giftAllReduceConfig c = base_config();
  Comm a(c), b(c);
  CHECK(giftAllReduce(a.c, in[0].data(), out[0].data(), n, GIFT_DTYPE_F32, nullptr) == GIFT_OK,
        "%s", giftGetLastErrorMessage());
  CHECK(giftAllReduce(b.c, inplace[0].data(), inplace[0].data(), n, GIFT_DTYPE_F32, nullptr) ==
            GIFT_OK,
        "%s", giftGetLastErrorMessage());
  CHECK(out == inplace, "in-place and out-of-place results differ");
  CHECK(same_on_every_rank(out), "replicas differ");
  check_bound("flat", specs, out, c, 5);
}

// Max over elements of |mean of the first T results - exact|, for each T in `at`.
std::vector<double> running_mean_errors(int error_feedback, const std::vector<int>& at) {
  const std::vector<TensorSpec> specs = {{"g", GIFT_DTYPE_F32, {3000}}};
  giftAllReduceConfig c = base_config();
  c.op = GIFT_REDUCE_AVG;
  c.error_feedback = error_feedback;
  Comm comm(c);
  const Bucket in = gift::test::make_input(specs, 21, g_rank);
  const std::vector<double> exact = gift::test::exact_reduce(all_inputs(specs, 21), c.op);
  std::vector<double> total(exact.size(), 0.0), errors;
  for (int t = 1; t <= at.back(); ++t) {
    giftResult_t rc;
    const std::vector<double> got = gift::test::flat(specs, allreduce(comm.c, specs, in, &rc));
    CHECK(rc == GIFT_OK, "%s", giftGetLastErrorMessage());
    for (size_t i = 0; i < got.size(); ++i) total[i] += got[i];
    if (std::find(at.begin(), at.end(), t) == at.end()) continue;
    double e = 0;
    for (size_t i = 0; i < got.size(); ++i) e = std::max(e, std::fabs(total[i] / t - exact[i]));
    errors.push_back(e);
  }
  return errors;
}

// With error feedback each encode's residual returns in the next call, so the residuals
// telescope: sum_t result_t = T exact - (the residuals left after call T) + fp32 slack.
// The residuals stay within about one call's error bound, hence |mean_T - exact| <= C / T
// with C = 2 x the first call's bound, over a floor of fp32 summation slack.
void test_error_feedback() {
  const std::vector<int> at = {1, 2, 4, 8, 16, 32, 64};
  const std::vector<TensorSpec> specs = {{"g", GIFT_DTYPE_F32, {3000}}};
  giftAllReduceConfig c = base_config();
  c.op = GIFT_REDUCE_AVG;
  const auto x = all_inputs(specs, 21);
  const std::vector<double> bound = gift::test::error_bound(x, specs, c);
  double C = 0, floor = 0;
  for (size_t i = 0; i < bound.size(); ++i) {
    C = std::max(C, 2 * bound[i]);
    double s = 0;
    for (const auto& xr : x) s += std::fabs(xr[i]);
    floor = std::max(floor, 4.0 * g_world * gift::test::kU * s);
  }
  const std::vector<double> with = running_mean_errors(1, at);
  const std::vector<double> without = running_mean_errors(0, at);
  for (size_t k = 0; k < at.size(); ++k) {
    CHECK(with[k] <= C / at[k] + floor, "error feedback, T=%d: error %g > C/T %g", at[k], with[k],
          C / at[k] + floor);
    CHECK(without[k] >= 0.5 * without[0], "no error feedback, T=%d: error %g fell below %g", at[k],
          without[k], 0.5 * without[0]);
  }
  CHECK(without[0] > 0, "the test gradient must not be exactly representable");
  CHECK(with.back() <= with[0] / 8, "error feedback: T=64 error %g not below %g", with.back(),
        with[0] / 8);
}

void test_corruption_is_reported_everywhere() {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  const Bucket in = gift::test::make_input(specs, 3, g_rank);
  for (int step = 0; step < 2; ++step) {
    Comm comm(base_config());
    const int sender = g_world - 1, receiver = 0;
    gift::transport::testing::corrupt_message(step, sender, receiver);
    giftResult_t rc;
    allreduce(comm.c, specs, in, &rc);
    gift::transport::testing::corrupt_message(-1, -1, -1);
    const std::string msg = giftGetLastErrorMessage();
    CHECK(rc == GIFT_ERROR_SECTION_CHECKSUM, "step %d: got %d (%s)", step, int(rc), msg.c_str());
    const std::string names = "rank 0 failed";
    const std::string from = "from rank " + std::to_string(sender);
    CHECK(msg.find(names) != std::string::npos && msg.find(from) != std::string::npos,
          "step %d: message lacks '%s' or '%s': %s", step, names.c_str(), from.c_str(),
          msg.c_str());
    // The communicator stays usable: the next call goes through.
    const Bucket out = allreduce(comm.c, specs, in, &rc);
    CHECK(rc == GIFT_OK, "after a corrupted call: %s", giftGetLastErrorMessage());
  }
}

// A config that dumps every `every` calls into `dir` (which outlives it), made on rank 0
// before any rank goes on.
giftAllReduceConfig dumping_into(const std::string& dir, uint32_t every) {
  if (g_rank == 0) std::filesystem::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  giftAllReduceConfig c = base_config();
  c.dump_every = every;
  c.dump_path = dir.c_str();
  return c;
}

void test_dump(const std::string& dir) {
  const giftAllReduceConfig c = dumping_into(dir, 2);
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  const Bucket in = gift::test::make_input(specs, 9, g_rank);
  Comm comm(c);
  Bucket out;
  for (int call = 1; call <= 2; ++call) {
    giftResult_t rc;
    out = allreduce(comm.c, specs, in, &rc);
    CHECK(rc == GIFT_OK, "%s", giftGetLastErrorMessage());
  }
  if (g_rank != 0) return;
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".gift") continue;
    ++files;
    giftFrame* f = nullptr;
    CHECK(giftFrameOpenFile(e.path().c_str(), &f) == GIFT_OK, "%s", giftGetLastErrorMessage());
    if (!f) continue;
    for (size_t i = 0; i < specs.size(); ++i) {
      uint64_t index = 0;
      std::vector<uint8_t> back(out[i].size());
      CHECK(giftFrameFindTensor(f, specs[i].name.c_str(), &index) == GIFT_OK &&
                giftFrameDecodeTensor(f, index, back.data(), back.size(), specs[i].dtype) ==
                    GIFT_OK &&
                back == out[i],
            "dumped tensor %s differs from the result: %s", specs[i].name.c_str(),
            giftGetLastErrorMessage());
    }
    giftFrameClose(f);
  }
  CHECK(files == 1, "%zu dump files in %s, expected 1 (call 2)", files, dir.c_str());
}

// Runs `calls` on a fresh communicator and returns the results of its successful calls: two
// runs that differ only in calls that failed on every rank must give the same bytes, since a
// failed call leaves every rank's plan (call counter, error feedback) as it was.
template <typename Calls>
std::vector<Bucket> successful_results(const giftAllReduceConfig& c, Calls&& calls) {
  Comm comm(c);
  std::vector<Bucket> results;
  calls(comm.c, [&](const Bucket& out, giftResult_t rc) {
    if (rc == GIFT_OK) results.push_back(out);
  });
  return results;
}

void expect_failed_everywhere(giftResult_t rc, giftResult_t want, const std::string& says,
                              const char* what) {
  const std::string msg = giftGetLastErrorMessage();
  CHECK(rc == want && msg.find(says) != std::string::npos, "%s: got %d (%s), want %d saying '%s'",
        what, int(rc), msg.c_str(), int(want), says.c_str());
}

// A call that fails on every rank for one rank's argument (a bad dtype, no output buffer)
// changes no rank's plan, its call counter included (stochastic rounding shows it): the calls
// after it give the bytes they give without it. One that fails later, for a result corrupted
// on its way to one rank, commits no rank's error feedback (nearest rounding: it does count
// as a call).
void test_failed_calls_leave_no_trace() {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  const Bucket in = gift::test::make_input(specs, 11, g_rank);
  const int last = g_world - 1;
  // One call of `bucket`, its result kept if it succeeds.
  const auto call = [&](giftComm* comm, auto&& keep, const std::vector<TensorSpec>& bucket) {
    giftResult_t rc;
    const Bucket out = allreduce(comm, bucket, in, &rc);
    keep(out, rc);
    return rc;
  };
  const auto good = [&](giftComm* comm, auto&& keep, int calls) {
    for (int i = 0; i < calls; ++i) {
      CHECK(call(comm, keep, specs) == GIFT_OK, "call %d: %s", i, giftGetLastErrorMessage());
    }
  };
  giftAllReduceConfig stochastic = base_config();
  stochastic.rounding = GIFT_ROUND_STOCHASTIC;
  stochastic.seed = 3;
  const std::vector<Bucket> want =
      successful_results(stochastic, [&](giftComm* comm, auto&& keep) { good(comm, keep, 3); });
  const std::vector<Bucket> want_nearest =
      successful_results(base_config(), [&](giftComm* comm, auto&& keep) { good(comm, keep, 3); });
  const auto bad_dtype = [&](giftComm* comm, auto&& keep) {
    std::vector<TensorSpec> odd = specs;
    if (g_rank == last) odd[1].dtype = giftDType_t(9);
    expect_failed_everywhere(call(comm, keep, odd), GIFT_ERROR_INVALID_ARGUMENT,
                             "rank " + std::to_string(last) + " failed in checking its arguments",
                             "a bad dtype on one rank");
    good(comm, keep, 3);
  };
  CHECK(successful_results(stochastic, bad_dtype) == want,
        "a call failed for one rank's dtype changed the later results");
  const auto no_output = [&](giftComm* comm, auto&& keep) {
    good(comm, keep, 1);
    giftResult_t rc;
    allreduce(comm, specs, in, &rc, g_rank == last ? 0 : SIZE_MAX);
    expect_failed_everywhere(rc, GIFT_ERROR_INVALID_ARGUMENT, "recv: tensor 0 ('w.fp32') has no",
                             "no output buffer on one rank");
    good(comm, keep, 2);
  };
  CHECK(successful_results(stochastic, no_output) == want,
        "a call failed for one rank's output buffer changed the later results");
  const auto corrupted = [&](giftComm* comm, auto&& keep) {
    good(comm, keep, 1);
    gift::transport::testing::corrupt_message(1, last, 0);  // the result, to rank 0 only
    const giftResult_t rc = call(comm, keep, specs);
    gift::transport::testing::corrupt_message(-1, -1, -1);
    expect_failed_everywhere(rc, GIFT_ERROR_SECTION_CHECKSUM,
                             "rank 0 failed in checking the result",
                             "a result corrupted on its way to rank 0");
    good(comm, keep, 2);
  };
  CHECK(successful_results(base_config(), corrupted) == want_nearest,
        "a result corrupted on its way to one rank changed the later results");
}

// Ranks that disagree on what a call is fail it on every rank before anything is sent, with
// the difference named, instead of hanging in an exchange of other sizes or summing bytes
// encoded by other rules; the communicator goes on.
void test_ranks_that_differ_are_named() {
  if (g_world < 2) return;
  const int last = g_world - 1;
  const std::string who = "rank " + std::to_string(last) + "'s ";
  const uint64_t n = 1000;
  std::vector<float> x(2 * n, 1.5f), y(2 * n);
  {
    Comm comm(base_config());
    const uint64_t count = g_rank == last ? 2 * n : n;
    giftResult_t rc = giftAllReduce(comm.c, x.data(), y.data(), count, GIFT_DTYPE_F32, nullptr);
    expect_failed_everywhere(rc, GIFT_ERROR_INVALID_ARGUMENT,
                             who + "bucket holds 1 tensors of 2000 elements, rank 0's 1 of 1000",
                             "counts that differ");
    const giftDType_t dtype = g_rank == last ? GIFT_DTYPE_BF16 : GIFT_DTYPE_F32;
    rc = giftAllReduce(comm.c, x.data(), y.data(), n, dtype, nullptr);
    expect_failed_everywhere(rc, GIFT_ERROR_INVALID_ARGUMENT, who + "bucket's tensors differ",
                             "dtypes that differ");
    int stream = 0;
    rc = giftAllReduce(comm.c, x.data(), y.data(), n, GIFT_DTYPE_F32,
                       g_rank == last ? &stream : nullptr);
    expect_failed_everywhere(rc, GIFT_ERROR_INVALID_ARGUMENT, "stream must be NULL",
                             "a stream on one rank");
    // The same dtypes and shapes under other names (two tensors in another order): their
    // whiteners, errors and dumps go by name, so the sum would add other tensors.
    const uint64_t half[] = {n};
    const char* names[] = {"a", "b"};
    if (g_rank == last) std::swap(names[0], names[1]);
    const giftBucketTensor pair[] = {{names[0], GIFT_DTYPE_F32, 1, half},
                                     {names[1], GIFT_DTYPE_F32, 1, half}};
    const void* sends[] = {x.data(), x.data() + n};
    void* recvs[] = {y.data(), y.data() + n};
    rc = giftAllReduceBucket(comm.c, pair, sends, recvs, 2);
    expect_failed_everywhere(rc, GIFT_ERROR_INVALID_ARGUMENT,
                             who + "bucket's tensors differ from rank 0's in their names",
                             "names that differ");
    rc = giftAllReduce(comm.c, x.data(), y.data(), n, GIFT_DTYPE_F32, nullptr);
    CHECK(rc == GIFT_OK, "after calls that differ: %s", giftGetLastErrorMessage());
    CHECK(std::fabs(y[0] - 1.5f * float(g_world)) <= 0.25f * float(g_world), "sum %g", y[0]);
  }
  struct Field {
    const char* name;
    void (*set)(giftAllReduceConfig*);
  };
  const Field fields[] = {
      {"block", [](giftAllReduceConfig* c) { c->block = 256; }},
      {"kind", [](giftAllReduceConfig* c) { c->kind = GIFT_FP8_E5M2; }},
      {"scale_dtype", [](giftAllReduceConfig* c) { c->scale_dtype = GIFT_SCALE_DTYPE_E8M0; }},
      {"op", [](giftAllReduceConfig* c) { c->op = GIFT_REDUCE_AVG; }},
      {"integrity", [](giftAllReduceConfig* c) { c->integrity = 0; }},
      {"coords", [](giftAllReduceConfig* c) { c->coords = GIFT_COORDS_MODE_EUCLIDEAN; }},
  };
  for (const Field& f : fields) {
    giftAllReduceConfig c = base_config();
    if (g_rank == last) f.set(&c);
    Comm comm(c);
    const giftResult_t rc = giftAllReduce(comm.c, x.data(), y.data(), n, GIFT_DTYPE_F32, nullptr);
    expect_failed_everywhere(rc, GIFT_ERROR_INVALID_ARGUMENT,
                             who + "config differs from rank 0's in " + f.name, f.name);
  }
}

// Bad descriptions fail on every rank with their reason, never read through a null pointer.
void test_bad_buckets_are_refused() {
  Comm comm(base_config());
  float x = 1.0f, y = 0.0f;
  const void* send = &x;
  void* recv = &y;
  giftResult_t rc = giftAllReduceBucket(comm.c, nullptr, &send, &recv, 1);
  expect_failed_everywhere(rc, GIFT_ERROR_INVALID_ARGUMENT, "tensors is NULL", "no tensors");
  const giftBucketTensor no_shape = {"t", GIFT_DTYPE_F32, 1, nullptr};
  rc = giftAllReduceBucket(comm.c, &no_shape, &send, &recv, 1);
  expect_failed_everywhere(rc, GIFT_ERROR_INVALID_ARGUMENT, "tensor 0: shape is NULL", "no shape");
  giftAllReduce(comm.c, &x, &y, 1, giftDType_t(9), nullptr);  // leaves another message
  rc = giftCommInitMpi(MPI_COMM_WORLD, nullptr, nullptr);
  CHECK(rc == GIFT_ERROR_INVALID_ARGUMENT &&
            std::string(giftGetLastErrorMessage()) == "giftCommInitMpi: out is NULL",
        "giftCommInitMpi(NULL): %d (%s)", int(rc), giftGetLastErrorMessage());
  // MPI_COMM_NULL ended the job (MPI_Comm_dup's fatal error); an intercommunicator was taken,
  // and its all-reduce wrote past its buffers (collectives exchange with the remote group).
  giftComm* none = nullptr;
  rc = giftCommInitMpi(MPI_COMM_NULL, nullptr, &none);
  CHECK(rc == GIFT_ERROR_INVALID_ARGUMENT && none == nullptr, "MPI_COMM_NULL: %d (%s)", int(rc),
        giftGetLastErrorMessage());
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (world >= 2) {
    MPI_Comm half, inter;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 ? 0 : 1, 7, &inter);
    giftComm* c = nullptr;
    rc = giftCommInitMpi(inter, nullptr, &c);
    CHECK(rc == GIFT_ERROR_INVALID_ARGUMENT && c == nullptr &&
              std::string(giftGetLastErrorMessage()).find("an intercommunicator") !=
                  std::string::npos,
          "intercommunicator: %d (%s)", int(rc), giftGetLastErrorMessage());
    MPI_Comm_free(&inter);
    MPI_Comm_free(&half);
  }
}

size_t frames_in(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    n += e.path().extension() == ".gift";
  }
  return n;
}

// A NaN on the last rank: under GIFT_NONFINITE_ERROR every rank fails naming it, and the
// communicator goes on; under GIFT_NONFINITE_KEEP every rank completes with NaN there and
// finite values elsewhere, the same bytes everywhere, and no dump of that call.
void test_nonfinite(const std::string& dir) {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  const Bucket in = gift::test::make_input(specs, 5, g_rank);
  Bucket bad = in;
  const uint64_t tensor = 5, element = 17, flat_at = 407 + element;  // big.fp32
  if (g_rank == g_world - 1) gift::test::store(specs[tensor].dtype, NAN, &bad[tensor][4 * element]);
  giftResult_t rc;
  {
    Comm comm(base_config());
    allreduce(comm.c, specs, bad, &rc);
    const std::string msg = giftGetLastErrorMessage();
    const std::string named = "rank " + std::to_string(g_world - 1) + " failed";
    CHECK(rc == GIFT_ERROR_NONFINITE_INPUT && msg.find(named) != std::string::npos,
          "error policy: got %d (%s)", int(rc), msg.c_str());
    allreduce(comm.c, specs, in, &rc);
    CHECK(rc == GIFT_OK, "after a non-finite call: %s", giftGetLastErrorMessage());
  }
  giftAllReduceConfig c = dumping_into(dir, 1);
  c.nonfinite = GIFT_NONFINITE_KEEP;
  Comm comm(c);
  const Bucket out = allreduce(comm.c, specs, bad, &rc);
  CHECK(rc == GIFT_OK, "keep policy: %s", giftGetLastErrorMessage());
  CHECK(same_on_every_rank(out), "keep policy: replicas differ");
  const std::vector<double> got = gift::test::flat(specs, out);
  size_t odd = 0;
  for (size_t i = 0; i < got.size(); ++i)
    odd += i == flat_at ? !std::isnan(got[i]) : !std::isfinite(got[i]);
  CHECK(odd == 0, "keep policy: %zu elements are not NaN where the input was, finite elsewhere",
        odd);
  // Rank 0 dumps; the calls end on every rank when its decode did.
  if (g_rank == 0) CHECK(frames_in(dir) == 0, "a non-finite result was dumped to %s", dir.c_str());
  allreduce(comm.c, specs, in, &rc);
  CHECK(rc == GIFT_OK, "keep policy, the next call: %s", giftGetLastErrorMessage());
  if (g_rank == 0) CHECK(frames_in(dir) == 1, "no dump in %s of a finite call", dir.c_str());
}

// A dim x dim second moment of a rank's activations: a shared low-rank part (so every rank's
// fit is alike) plus the rank's own diagonal, so the ranks' statistics differ.
std::vector<float> moment(uint32_t dim, int rank) {
  std::vector<float> a(uint64_t(dim) * dim);
  for (uint32_t i = 0; i < dim; ++i)
    for (uint32_t j = 0; j < dim; ++j)
      a[uint64_t(i) * dim + j] =
          float(std::cos(0.1 * i) * std::cos(0.1 * j) + (i == j ? 0.01 * (1 + rank) : 0.0));
  return a;
}

// A dim x dim moment under a name.
struct NamedMoment {
  const char* name;
  const std::vector<float>* m;
  uint32_t dim;
};

// A basis fitted here (rank 4) to the moments in their order, as giftCommRefreshBasis fits.
giftBasis* fit_basis(const std::vector<NamedMoment>& moments) {
  giftFitParams fp = GIFT_FIT_PARAMS_INIT;
  fp.rank = 4;
  giftBasisBuilder* b = nullptr;
  giftBasis* basis = nullptr;
  bool ok = giftBasisBuilderCreate(&fp, &b) == GIFT_OK;
  for (const NamedMoment& x : moments) {
    const std::vector<double> a(x.m->begin(), x.m->end());
    ok = ok && giftBasisBuilderAdd(b, x.name, a.data(), x.dim, "activations", nullptr, 0, nullptr,
                                   0, nullptr, nullptr) == GIFT_OK;
  }
  ok = ok && giftBasisBuilderFinish(b, &basis) == GIFT_OK;
  CHECK(ok, "fitting a local basis: %s", giftGetLastErrorMessage());
  giftBasisBuilderFree(b);
  return basis;
}

giftBasis* fit_basis(const std::vector<float>& m, uint32_t dim) {
  return fit_basis({{"w", &m, dim}});
}

// A basis fitted here, on this rank's statistics only.
giftBasis* local_basis(uint32_t dim, int rank) { return fit_basis(moment(dim, rank), dim); }

bool same_id_on_every_rank(giftBasisId id) {
  std::vector<giftBasisId> all(g_world);
  MPI_Allgather(&id, sizeof id, MPI_BYTE, all.data(), sizeof id, MPI_BYTE, MPI_COMM_WORLD);
  for (const giftBasisId& x : all)
    if (x.lo != id.lo || x.hi != id.hi) return false;
  return true;
}

void test_basis_agreement() {
  const uint32_t dim = 64;
  giftAllReduceConfig c = base_config();
  c.coords = GIFT_COORDS_MODE_GIFT;
  Comm comm(c);
  // The last rank fits on its own statistics: its id differs, and every rank says so.
  giftBasis* own = local_basis(dim, g_world > 1 && g_rank == g_world - 1 ? 1 : 0);
  giftResult_t rc = giftCommSetBasis(comm.c, own);
  const std::string msg = giftGetLastErrorMessage();
  if (g_world > 1) {
    const std::string named = "rank " + std::to_string(g_world - 1) + " holds";
    CHECK(rc == GIFT_ERROR_BASIS_MISSING && msg.find(named) != std::string::npos,
          "a rank with another basis: got %d (%s)", int(rc), msg.c_str());
  } else {
    CHECK(rc == GIFT_OK, "%s", msg.c_str());
  }
  giftBasisFree(own);

  // Statistics summed over the ranks, fitted on rank 0 and broadcast: one basis everywhere.
  const std::vector<float> m = moment(dim, g_rank);
  const char* names[] = {"w"};
  const float* moments[] = {m.data()};
  const uint32_t dims[] = {dim};
  giftFitParams fp = GIFT_FIT_PARAMS_INIT;
  fp.rank = 4;
  giftBasis* fitted = nullptr;
  rc = giftCommRefreshBasis(comm.c, 1, names, moments, dims, &fp, &fitted);
  CHECK(rc == GIFT_OK && fitted, "refresh: %s", giftGetLastErrorMessage());
  CHECK(same_id_on_every_rank(giftBasisGetId(fitted)), "ranks hold different refreshed bases");
  // A matrix in GIFT coordinates then all-reduces to the same bytes on every rank.
  // Gradients of the geometry the statistics describe: rows along the shared direction plus
  // a little of everything else.
  const uint64_t rows = 16;
  const std::vector<TensorSpec> specs = {{"w", GIFT_DTYPE_F32, {rows, dim}}};
  auto gradient = [&](int rank) {
    std::vector<float> w(rows * dim);
    for (uint64_t i = 0; i < rows; ++i)
      for (uint32_t j = 0; j < dim; ++j)
        w[i * dim + j] = float(std::sin(1.0 + i + 7.0 * rank) * std::cos(0.1 * j) +
                               0.05 * std::sin(3.7 * (i * dim + j) + rank));
    const uint8_t* p = reinterpret_cast<const uint8_t*>(w.data());
    return Bucket{std::vector<uint8_t>(p, p + w.size() * sizeof(float))};
  };
  const Bucket out = allreduce(comm.c, specs, gradient(g_rank), &rc);
  CHECK(rc == GIFT_OK, "all-reduce in GIFT coordinates: %s", giftGetLastErrorMessage());
  CHECK(same_on_every_rank(out), "results differ between ranks in GIFT coordinates");
  // Whitening moves the per-element bound; the result is still the sum to FP8 accuracy.
  std::vector<std::vector<double>> x;
  for (int r = 0; r < g_world; ++r) x.push_back(gift::test::flat(specs, gradient(r)));
  const std::vector<double> exact = gift::test::exact_reduce(x, c.op);
  const std::vector<double> got = gift::test::flat(specs, out);
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err += (got[i] - exact[i]) * (got[i] - exact[i]);
    ref += exact[i] * exact[i];
  }
  CHECK(std::sqrt(err / ref) < 0.05, "GIFT coordinates: relative error %g", std::sqrt(err / ref));
  giftBasisFree(fitted);
}

// A basis that one rank cannot take (its memory runs out making the work buffer of a plan that
// had none) leaves every rank in the old one: the ranks that could take it took it before, and
// every later all-reduce of the bucket then failed, its messages in other bases.
void test_set_basis_that_fails_on_one_rank_changes_no_rank() {
  const uint32_t dim = 64;
  giftAllReduceConfig c = base_config();
  c.coords = GIFT_COORDS_MODE_GIFT;
  c.error_feedback = 0;  // no residual: the plan holds no bucket-sized buffer until a basis
  Comm comm(c);
  const std::vector<TensorSpec> specs = {{"w", GIFT_DTYPE_F32, {uint64_t(1) << 17, dim}}};
  giftResult_t rc;
  const Bucket in = gift::test::make_input(specs, 3, g_rank);
  const Bucket before = allreduce(comm.c, specs, in, &rc);
  CHECK(rc == GIFT_OK, "the bucket before: %s", giftGetLastErrorMessage());
  giftBasis* basis = local_basis(dim, 0);
  const bool starved = g_rank == g_world - 1;
  rlimit was{};
  getrlimit(RLIMIT_AS, &was);
  if (starved) {  // 16 MiB more address space than the process holds: not the 32 MiB buffer
    long pages = 0;
    FILE* f = fopen("/proc/self/statm", "r");
    CHECK(f && fscanf(f, "%ld", &pages) == 1, "cannot read /proc/self/statm");
    if (f) fclose(f);
    rlimit tight = was;
    tight.rlim_cur = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + (rlim_t(16) << 20);
    setrlimit(RLIMIT_AS, &tight);
  }
  rc = giftCommSetBasis(comm.c, basis);
  const std::string msg = giftGetLastErrorMessage();
  if (starved) setrlimit(RLIMIT_AS, &was);
  const std::string named = "rank " + std::to_string(g_world - 1);
  CHECK(rc == GIFT_ERROR_OUT_OF_MEMORY && msg.find(named) != std::string::npos,
        "a basis one rank cannot take: %d (%s)", int(rc), msg.c_str());
  // Every rank still in no basis: the same bytes as before, on every rank.
  const Bucket after = allreduce(comm.c, specs, in, &rc);
  CHECK(rc == GIFT_OK, "the bucket after the failed basis: %s", giftGetLastErrorMessage());
  CHECK(after == before && same_on_every_rank(after), "the failed basis changed the result");
  rc = giftCommSetBasis(comm.c, basis);
  CHECK(rc == GIFT_OK, "the basis again: %s", giftGetLastErrorMessage());
  allreduce(comm.c, specs, in, &rc);
  CHECK(rc == GIFT_OK, "the bucket in the basis: %s", giftGetLastErrorMessage());
  giftBasisFree(basis);
}

// The refreshed basis is rank 0's fit of the ranks' moments summed in rank order in fp32 and
// divided by the world size, whatever parts they travel in (1100^2 elements: two), one tensor a
// refresh or several (the buffers sized for the largest, whatever its place). The
// ranks' moments differ off the diagonal too.
void test_refreshed_basis_is_the_fit_of_the_average() {
  giftAllReduceConfig c = base_config();
  c.coords = GIFT_COORDS_MODE_GIFT;
  Comm comm(c);
  const auto ranks_moment = [](uint32_t dim, int rank) {
    std::vector<float> m = moment(dim, rank);
    for (uint32_t i = 0; i < dim; ++i)
      for (uint32_t j = 0; j < dim; ++j)
        m[uint64_t(i) * dim + j] += float(0.01 * (rank + 1) * std::cos(0.3 * (i + j) + rank));
    return m;
  };
  const auto average = [&](uint32_t dim) {
    std::vector<float> avg = ranks_moment(dim, 0);
    for (int r = 1; r < g_world; ++r) {
      const std::vector<float> m = ranks_moment(dim, r);
      for (size_t i = 0; i < avg.size(); ++i) avg[i] += m[i];
    }
    for (float& x : avg) x /= float(g_world);
    return avg;
  };
  const char* names[] = {"w", "v", "u"};
  const std::vector<uint32_t> dims_of_refreshes[] = {{64}, {1100}, {96, 1100, 64}};
  for (const std::vector<uint32_t>& dims : dims_of_refreshes) {
    std::vector<std::vector<float>> avg, mine;
    std::vector<NamedMoment> wanted;
    std::vector<const float*> moments;
    for (size_t i = 0; i < dims.size(); ++i) {
      avg.push_back(average(dims[i]));
      mine.push_back(ranks_moment(dims[i], g_rank));
    }
    for (size_t i = 0; i < dims.size(); ++i) {
      wanted.push_back({names[i], &avg[i], dims[i]});
      moments.push_back(mine[i].data());
    }
    giftBasis* want = fit_basis(wanted);
    giftFitParams fp = GIFT_FIT_PARAMS_INIT;
    fp.rank = 4;
    giftBasis* fitted = nullptr;
    const giftResult_t rc =
        giftCommRefreshBasis(comm.c, dims.size(), names, moments.data(), dims.data(), &fp, &fitted);
    CHECK(rc == GIFT_OK && fitted, "refresh of %zu tensors, the first %u x %u: %s", dims.size(),
          dims[0], dims[0], giftGetLastErrorMessage());
    const giftBasisId got = giftBasisGetId(fitted), id = giftBasisGetId(want);
    CHECK(got.lo == id.lo && got.hi == id.hi,
          "%zu tensors, the first %u x %u: the refreshed basis is not the fit of the rank-order "
          "average",
          dims.size(), dims[0], dims[0]);
    giftBasisFree(fitted);
    giftBasisFree(want);
  }
}

// Buckets that differ get plans of their own, however their names and shapes are spelled:
// {"x": [2, 3]} and {"3,x": [2]} once shared a plan's key, so the second call encoded six
// elements of a two-element tensor and wrote four past it. Here the guards past the second
// tensor must stay, and its result must be its own reduction.
void test_buckets_apart_have_plans_apart() {
  giftAllReduceConfig c = base_config();
  Comm comm(c);
  const std::vector<TensorSpec> first = {{"x", GIFT_DTYPE_F32, {2, 3}}};
  const Bucket in = gift::test::make_input(first, 21, g_rank);
  giftResult_t rc;
  allreduce(comm.c, first, in, &rc);
  CHECK(rc == GIFT_OK, "%s", giftGetLastErrorMessage());
  const std::vector<TensorSpec> second = {{"3,x", GIFT_DTYPE_F32, {2}}};
  const Bucket in2 = gift::test::make_input(second, 22, g_rank);
  const float kGuard = 12345.0f;
  std::vector<float> send(6, kGuard), recv(6, kGuard);
  std::memcpy(send.data(), in2[0].data(), in2[0].size());
  const std::vector<giftBucketTensor> d = gift::test::describe(second);
  const void* s = send.data();
  void* r = recv.data();
  rc = giftAllReduceBucket(comm.c, d.data(), &s, &r, 1);
  CHECK(rc == GIFT_OK, "%s", giftGetLastErrorMessage());
  CHECK(std::all_of(recv.begin() + 2, recv.end(), [&](float v) { return v == kGuard; }),
        "the call wrote past its 2-element tensor");
  Bucket out = {std::vector<uint8_t>(in2[0].size())};
  std::memcpy(out[0].data(), recv.data(), out[0].size());
  check_bound("the second bucket", second, out, c, 22);
}

// Every bucket dumps to a file of its own: flat buffers of 4 and of 1000 elements (both named
// "buffer") once dumped to the same name, the second frame replacing the first.
void test_buckets_dump_apart(const std::string& dir) {
  Comm comm(dumping_into(dir, 1));
  std::vector<float> x(1000, 0.5f), y(1000);
  for (const uint64_t n : {uint64_t(4), uint64_t(1000)}) {
    const giftResult_t rc = giftAllReduce(comm.c, x.data(), y.data(), n, GIFT_DTYPE_F32, nullptr);
    CHECK(rc == GIFT_OK, "%s", giftGetLastErrorMessage());
  }
  if (g_rank == 0)
    CHECK(frames_in(dir) == 2, "%zu dumps in %s, expected 2", frames_in(dir), dir.c_str());
}

// With dumps on, a bucket whose names a frame cannot hold fails its first call on every rank,
// naming it, instead of every dump failing after its call.
void test_names_a_dump_cannot_hold_fail_first(const std::string& dir) {
  Comm comm(dumping_into(dir, 1));
  // Tensor 1 is unnamed: "t1", as tensor 0 is called.
  const uint64_t shape[] = {3};
  const giftBucketTensor d[] = {{"t1", GIFT_DTYPE_F32, 1, shape},
                                {nullptr, GIFT_DTYPE_F32, 1, shape}};
  std::vector<float> x(3, 1.0f), y(3), z(3);
  const void* send[] = {x.data(), x.data()};
  void* recv[] = {y.data(), z.data()};
  const giftResult_t rc = giftAllReduceBucket(comm.c, d, send, recv, 2);
  expect_failed_everywhere(rc, GIFT_ERROR_INVALID_ARGUMENT,
                           "rank 0 failed in checking its arguments: tensor 1: dumps every 1 "
                           "calls: tensor 't1' added twice",
                           "two tensors of one name");
  if (g_rank == 0) CHECK(frames_in(dir) == 0, "a dump of a refused call");
}

// A dump folder that cannot take dumps fails the first call on every rank, naming it.
void test_unwritable_dump_folder_fails_first() {
  giftAllReduceConfig c = base_config();
  c.dump_every = 1;
  c.dump_path = "/nonexistent/gift-dumps";
  Comm comm(c);
  float x = 1.0f, y = 0.0f;
  const giftResult_t rc = giftAllReduce(comm.c, &x, &y, 1, GIFT_DTYPE_F32, nullptr);
  expect_failed_everywhere(rc, GIFT_ERROR_IO,
                           "rank 0 failed in checking its arguments: dumps "
                           "every 1 calls into '/nonexistent/gift-dumps'",
                           "an unwritable dump folder");
}

// A dump that fails after its call completed says so on every rank: the result is written
// and the state committed, so the results are those of a run without dumps.
void test_failed_dump_reports_a_completed_call(const std::string& dir) {
  const std::vector<TensorSpec> specs = gift::test::mixed_bucket();
  const Bucket in = gift::test::make_input(specs, 13, g_rank);
  std::vector<Bucket> plain, dumped;
  {
    Comm comm(base_config());
    for (int i = 1; i <= 3; ++i) {
      giftResult_t rc;
      plain.push_back(allreduce(comm.c, specs, in, &rc));
      CHECK(rc == GIFT_OK, "%s", giftGetLastErrorMessage());
    }
  }
  Comm comm(dumping_into(dir, 2));
  for (int i = 1; i <= 3; ++i) {
    if (i == 2) {  // the folder goes away after the plan checked it
      if (g_rank == 0) std::filesystem::remove_all(dir);
      MPI_Barrier(MPI_COMM_WORLD);
    }
    giftResult_t rc;
    dumped.push_back(allreduce(comm.c, specs, in, &rc));
    if (i == 2) {
      expect_failed_everywhere(rc, GIFT_ERROR_IO,
                               "rank 0 failed in decoding the result: the call completed",
                               "a dump that failed");
    } else {
      CHECK(rc == GIFT_OK, "call %d: %s", i, giftGetLastErrorMessage());
    }
  }
  CHECK(dumped == plain, "the results of a run whose dump failed differ from a run without");
}

// A rank that gives other statistics (another dimension, another count) fails the refresh on
// every rank, named, before any moment moves; the communicator goes on.
void test_refresh_with_other_statistics_is_refused() {
  if (g_world < 2) return;
  giftAllReduceConfig c = base_config();
  c.coords = GIFT_COORDS_MODE_GIFT;
  Comm comm(c);
  const bool odd = g_rank == g_world - 1;
  const std::string named = "rank " + std::to_string(g_world - 1);
  giftFitParams fp = GIFT_FIT_PARAMS_INIT;
  fp.rank = 4;
  const char* names[] = {"w", "v"};
  const auto refresh = [&](size_t n, uint32_t dim) {
    const std::vector<float> m = moment(dim, g_rank);
    const float* moments[] = {m.data(), m.data()};
    const uint32_t dims[] = {dim, dim};
    return giftCommRefreshBasis(comm.c, n, names, moments, dims, &fp, nullptr);
  };
  giftResult_t rc = refresh(1, odd ? 48 : 64);
  std::string msg = giftGetLastErrorMessage();
  CHECK(rc == GIFT_ERROR_INVALID_ARGUMENT &&
            msg.find(named + "'s statistics differ from rank 0's") != std::string::npos,
        "another dimension on one rank: got %d (%s)", int(rc), msg.c_str());
  rc = refresh(odd ? 2 : 1, 64);
  msg = giftGetLastErrorMessage();
  CHECK(rc == GIFT_ERROR_INVALID_ARGUMENT &&
            msg.find(named + " gives statistics of 2 tensors, rank 0 of 1") != std::string::npos,
        "another count on one rank: got %d (%s)", int(rc), msg.c_str());
  rc = refresh(1, 64);
  CHECK(rc == GIFT_OK, "the same statistics after refused ones: %s", giftGetLastErrorMessage());
}

// A moment too large for any vector (2^31 x 2^31 elements) fails on every rank as memory that
// runs out does; it once ended the process with an uncaught std::length_error.
void test_refresh_of_a_moment_past_any_vector_fails() {
  Comm comm(base_config());
  const float m[1] = {1.0f};
  const float* moments[] = {m};
  const char* names[] = {"w"};
  const uint32_t dims[] = {uint32_t(1) << 31};
  const giftFitParams fp = GIFT_FIT_PARAMS_INIT;
  const giftResult_t rc = giftCommRefreshBasis(comm.c, 1, names, moments, dims, &fp, nullptr);
  expect_failed_everywhere(rc, GIFT_ERROR_OUT_OF_MEMORY,
                           "rank 0: no memory for a moment of 4611686018427387904 elements",
                           "a moment of 2^62 elements");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  const std::string dump_dir = argc > 1 ? argv[1] : "mpi_allreduce_dumps";
  if (g_rank == 0) std::filesystem::remove_all(dump_dir);
  test_buckets();
  test_flat_in_place();
  test_error_feedback();
  test_corruption_is_reported_everywhere();
  test_dump(dump_dir);
  test_nonfinite(dump_dir + "/nonfinite");
  test_basis_agreement();
  test_set_basis_that_fails_on_one_rank_changes_no_rank();
  test_refreshed_basis_is_the_fit_of_the_average();
  test_refresh_with_other_statistics_is_refused();
  test_refresh_of_a_moment_past_any_vector_fails();
  test_failed_calls_leave_no_trace();
  test_ranks_that_differ_are_named();
  test_bad_buckets_are_refused();
  test_unwritable_dump_folder_fails_first();
  test_buckets_apart_have_plans_apart();
  test_buckets_dump_apart(dump_dir + "/apart");
  test_names_a_dump_cannot_hold_fail_first(dump_dir + "/names");
  test_failed_dump_reports_a_completed_call(dump_dir + "/vanishing");
  int failures = 0;
  MPI_Allreduce(&g_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) printf("%d rank(s): %d failed check(s)\n", g_world, failures);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
