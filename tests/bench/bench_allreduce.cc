// The compressed all-reduce (gift_mpi) against MPI_Allreduce on fp32: bytes sent per rank,
// median time in Euclidean and in GIFT coordinates (the bucket as one matrix of kCols
// columns, every row whitened with a rank-32 basis), peak memory, and the link bandwidth
// below which the compressed form wins given its measured local cost (Euclidean). Run by
// run_allreduce_bench.sh.
//   mpirun -np N bench_allreduce [MiB ...]   (GIFT_BENCH_REPS: repetitions, default 5)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gift/gift_mpi.h"
#include "peak_rss.h"

namespace {

int g_rank = 0, g_world = 1;
constexpr uint64_t kCols = 1024;

// One whitener for the matrix "w", fitted to a second moment with a decaying spectrum (the
// same on every rank, so every rank holds the same basis).
giftBasis* bench_basis() {
  std::vector<double> a(kCols * kCols);
  for (uint64_t i = 0; i < kCols; ++i)
    for (uint64_t j = 0; j < kCols; ++j)
      a[i * kCols + j] = (i == j ? 1.0 : 0.0) + 4.0 / (1.0 + double(i > j ? i - j : j - i));
  giftFitParams fp = GIFT_FIT_PARAMS_INIT;
  giftBasisBuilder* b = nullptr;
  giftBasis* basis = nullptr;
  if (giftBasisBuilderCreate(&fp, &b) != GIFT_OK ||
      giftBasisBuilderAdd(b, "w", a.data(), uint32_t(kCols), "activations", nullptr, 0, nullptr, 0,
                          nullptr, nullptr) != GIFT_OK ||
      giftBasisBuilderFinish(b, &basis) != GIFT_OK) {
    fprintf(stderr, "rank %d: %s\n", g_rank, giftGetLastErrorMessage());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  giftBasisBuilderFree(b);
  return basis;
}

// The slowest rank's time of `f`, after a barrier: what a synchronous step waits for.
template <class F>
double timed(F f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  f();
  double t = MPI_Wtime() - t0, slowest = 0;
  MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

template <class F>
double median_time(int reps, F f) {
  f();  // warm-up: plans, buffers, connections
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(timed(f));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The largest rank's.
double peak_rss_mib() {
  double mine = process_peak_rss_mib(), most = 0;
  MPI_Allreduce(&mine, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return most;
}

uint64_t message_bytes(uint64_t n) {
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.error_feedback = 0;
  const giftBucketTensor t = {"buffer", GIFT_DTYPE_F32, 1, &n};
  giftReducePlan* p = nullptr;
  if (giftReducePlanCreate(&c, g_world, g_rank, &t, 1, &p) != GIFT_OK) return 0;
  const uint64_t m = giftReducePlanMessageBytes(p);
  giftReducePlanDestroy(p);
  return m;
}

void bench(giftComm* comm, giftComm* gift_comm, uint64_t mib, int reps) {
  const uint64_t n = mib << 18;
  std::vector<float> in(n), out(n);
  std::mt19937 gen(static_cast<unsigned>(g_rank));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (float& v : in) v = d(gen);

  const double t_mpi = median_time(reps, [&] {
    MPI_Allreduce(in.data(), out.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  });
  const double t_gift = median_time(reps, [&] {
    if (giftAllReduce(comm, in.data(), out.data(), n, GIFT_DTYPE_F32, nullptr) != GIFT_OK) {
      fprintf(stderr, "rank %d: %s\n", g_rank, giftGetLastErrorMessage());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  });
  const uint64_t shape[2] = {n / kCols, kCols};
  const giftBucketTensor matrix = {"w", GIFT_DTYPE_F32, 2, shape};
  const void* send = in.data();
  void* recv = out.data();
  const double t_coords = median_time(reps, [&] {
    if (giftAllReduceBucket(gift_comm, &matrix, &send, &recv, 1) != GIFT_OK) {
      fprintf(stderr, "rank %d: %s\n", g_rank, giftGetLastErrorMessage());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  });
  // The two exchanges alone, on messages of the same size: the rest of t_gift is local work.
  const uint64_t m = message_bytes(n);
  std::vector<uint8_t> a(m * g_world), b(m * g_world);
  const double t_exchange = median_time(reps, [&] {
    MPI_Alltoall(a.data(), int(m), MPI_BYTE, b.data(), int(m), MPI_BYTE, MPI_COMM_WORLD);
    MPI_Allgather(a.data(), int(m), MPI_BYTE, b.data(), int(m), MPI_BYTE, MPI_COMM_WORLD);
  });
  const double rss = peak_rss_mib();

  const double w = g_world;
  const double sent_fp32 = 2.0 * (w - 1) / w * 4.0 * double(n);  // ring all-reduce
  const double sent_gift = 2.0 * (w - 1) * double(m);            // all-to-all + all-gather
  const double local = std::max(t_gift - t_exchange, 1e-9);
  // Bandwidth-bound links: fp32 takes sent_fp32 / B, ours local + sent_gift / B.
  const double breakeven = (sent_fp32 - sent_gift) / local;
  if (g_rank == 0) {
    printf("%-5s %2d %6llu %10.1f %10.1f %5.3f %9.1f %9.1f %9.1f %9.1f %9.1f %9.2f\n",
           getenv("GIFT_BENCH_LINK") ? getenv("GIFT_BENCH_LINK") : "?", g_world,
           static_cast<unsigned long long>(mib), sent_fp32 / 1048576.0, sent_gift / 1048576.0,
           sent_gift / sent_fp32, t_mpi * 1e3, t_gift * 1e3, t_coords * 1e3, local * 1e3, rss,
           breakeven * 8 / 1e9);
    fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  const int reps = getenv("GIFT_BENCH_REPS") ? atoi(getenv("GIFT_BENCH_REPS")) : 5;
  giftAllReduceConfig c = GIFT_ALLREDUCE_CONFIG_INITIALIZER;
  c.threads = 1;  // one rank per core
  giftComm* comm = nullptr;
  if (giftCommInitMpi(MPI_COMM_WORLD, &c, &comm) != GIFT_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  c.coords = GIFT_COORDS_MODE_GIFT;
  giftComm* gift_comm = nullptr;
  giftBasis* basis = bench_basis();
  if (giftCommInitMpi(MPI_COMM_WORLD, &c, &gift_comm) != GIFT_OK ||
      giftCommSetBasis(gift_comm, basis) != GIFT_OK) {
    fprintf(stderr, "rank %d: %s\n", g_rank, giftGetLastErrorMessage());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  giftBasisFree(basis);
  for (int i = 1; i < argc; ++i) bench(comm, gift_comm, strtoull(argv[i], nullptr, 10), reps);
  giftCommDestroy(gift_comm);
  giftCommDestroy(comm);
  MPI_Finalize();
  return 0;
}
