// CPU codec throughput against memcpy on the same machine in the same run.
//
// Effective bandwidth = (bytes read + bytes written) / time, for memcpy as for the codec,
// so a ratio of 1.0 means the codec streams as fast as a copy of its own traffic would.
// One 256 MiB fp32 buffer (GIFT_BENCH_BYTES overrides), E4M3, blocks of 128, fp32 scales,
// round to nearest; 1 thread and all threads; fp32 and bf16 input. GIFT_BENCH_TARGET names an
// instruction set to limit the codec to (AVX2, SSE4, SCALAR, ...: as giftCpuLimitTarget takes
// them), so that the narrower paths of a wide machine can be measured too.
#include <benchmark/benchmark.h>
#include <omp.h>
#include <strings.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gift/gift.h"
#include "numerics/simd.h"
#include "peak_rss.h"

namespace {

struct Buffers {
  size_t n = 0;
  std::vector<float> src, decoded;
  std::vector<uint16_t> src_bf16;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  giftQuantParams params;

  Buffers() {
    const char* env = std::getenv("GIFT_BENCH_BYTES");
    n = (env ? std::strtoull(env, nullptr, 10) : (size_t(256) << 20)) / sizeof(float);
    giftQuantParamsInit(&params);
    uint64_t ns = 0;
    giftScaleCount(&params, 1, n, &ns);
    src.resize(n);
    decoded.resize(n);  // resize writes every page, so no first-touch faults are timed
    src_bf16.resize(n);
    codes.resize(n);
    scales.resize(ns);
    std::mt19937 gen(1);
    std::normal_distribution<float> dist;
    for (size_t i = 0; i < n; ++i) {
      src[i] = dist(gen) * 1e-3f;
      uint32_t u;
      std::memcpy(&u, &src[i], 4);
      src_bf16[i] = static_cast<uint16_t>(u >> 16);
    }
  }
};

Buffers& buffers() {
  static Buffers b;
  return b;
}

int threads_of(const benchmark::State& s) {
  return s.range(0) == 0 ? omp_get_max_threads() : int(s.range(0));
}

// A codec context running the benchmark's thread count.
std::unique_ptr<giftCtx, decltype(&giftCtxFree)> ctx_for(const benchmark::State& s) {
  giftCtx* ctx = nullptr;
  giftCtxCreate(&ctx);
  giftCtxSetThreads(ctx, threads_of(s));
  return {ctx, giftCtxFree};
}

void parallel_memcpy(void* dst, const void* src, size_t bytes, int threads) {
  const size_t chunk = (bytes / size_t(threads) + 4095) & ~size_t(4095);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const size_t b = size_t(t) * chunk;
    if (b < bytes) {
      std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b,
                  std::min(chunk, bytes - b));
    }
  }
}

void BM_Memcpy(benchmark::State& state) {
  Buffers& b = buffers();
  const int t = threads_of(state);
  for (auto _ : state) {
    parallel_memcpy(b.decoded.data(), b.src.data(), b.n * 4, t);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(b.n * 4 * 2));
}

// The buffer as rows of `cols` elements (0: one row of them all). The encoder may read a row of
// 64 blocks or more otherwise than a shorter one (simd.cc, kReadStreams: on AVX-512 where
// ReadInParts), so both are timed.
void encode_loop(benchmark::State& state, const void* src, giftDType_t dt, size_t in_bytes,
                 size_t cols = 0) {
  Buffers& b = buffers();
  const giftQuantParams p = b.params;
  const auto ctx = ctx_for(state);
  if (cols == 0) cols = b.n;
  if (b.n % cols) return state.SkipWithError("GIFT_BENCH_BYTES: not a whole number of rows");
  for (auto _ : state) {
    const giftResult_t r = giftEncode(ctx.get(), &p, src, dt, b.n / cols, cols, b.codes.data(),
                                      b.scales.data(), b.scales.size() * 4, nullptr);
    if (r != GIFT_OK) state.SkipWithError(giftGetLastErrorMessage());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) *
                          int64_t(in_bytes + b.n + b.scales.size() * 4));
}

void BM_EncodeF32(benchmark::State& state) {
  encode_loop(state, buffers().src.data(), GIFT_DTYPE_F32, buffers().n * 4);
}

// Rows of 4096, as most tensors' rows are.
void BM_EncodeF32Rows(benchmark::State& state) {
  encode_loop(state, buffers().src.data(), GIFT_DTYPE_F32, buffers().n * 4, 4096);
}

void BM_EncodeBf16(benchmark::State& state) {
  encode_loop(state, buffers().src_bf16.data(), GIFT_DTYPE_BF16, buffers().n * 2);
}

void BM_DecodeF32(benchmark::State& state) {
  Buffers& b = buffers();
  const giftQuantParams p = b.params;
  const auto ctx = ctx_for(state);
  giftEncode(ctx.get(), &p, b.src.data(), GIFT_DTYPE_F32, 1, b.n, b.codes.data(), b.scales.data(),
             b.scales.size() * 4, nullptr);
  for (auto _ : state) {
    giftDecode(ctx.get(), &p, b.codes.data(), b.scales.data(), b.scales.size() * 4, 1, b.n,
               b.decoded.data(), GIFT_DTYPE_F32);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) *
                          int64_t(b.n + b.scales.size() * 4 + b.n * 4));
}

// Arg 1 is one thread, 0 all of them.
BENCHMARK(BM_Memcpy)->Arg(1)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeF32)->Arg(1)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeF32Rows)->Arg(1)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeF32)->Arg(1)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeBf16)->Arg(1)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);

// Prints the usual table, then each codec figure as a ratio to memcpy at the same thread
// count, measured in this run.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      auto it = r.counters.find("bytes_per_second");
      if (it != r.counters.end()) bw_[r.benchmark_name()] = it->second.value;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf(
        "\nEffective bandwidth, ratio to memcpy with the same threads (target >= 0.75 on 1 "
        "thread)\n");
    std::printf("%-26s %10s %12s %8s\n", "benchmark", "GB/s", "memcpy GB/s", "ratio");
    for (const auto& [name, bw] : bw_) {
      if (name.rfind("BM_Memcpy", 0) == 0) continue;
      const std::string arg = name.substr(name.find('/'));
      const auto base = bw_.find("BM_Memcpy" + arg);
      if (base == bw_.end()) continue;
      std::printf("%-26s %10.2f %12.2f %8.3f\n", name.c_str(), bw / 1e9, base->second / 1e9,
                  bw / base->second);
    }
    std::printf("(SIMD target: %s; threads: %d; buffer: %zu MiB fp32)\n", gift::simd::target_name(),
                omp_get_max_threads(), buffers().n * 4 >> 20);
    const Buffers& b = buffers();
    const size_t own = (b.src.size() + b.decoded.size() + b.scales.size()) * sizeof(float) +
                       b.src_bf16.size() * sizeof(uint16_t) + b.codes.size();
    std::printf("peak memory %.1f MiB resident, of which %.1f MiB the buffers\n",
                process_peak_rss_mib(), double(own) / double(1 << 20));
  }

 private:
  std::map<std::string, double> bw_;
};

// Restricts the codec to the instruction set named by GIFT_BENCH_TARGET, if any; false where
// this machine lacks it, as giftCpuLimitTarget would then measure a narrower one.
bool force_target() {
  const char* want = std::getenv("GIFT_BENCH_TARGET");
  if (!want) return true;
  if (giftCpuLimitTarget(want) != GIFT_OK) {
    std::fprintf(stderr, "GIFT_BENCH_TARGET: %s\n", giftGetLastErrorMessage());
    return false;
  }
  if (strcasecmp(giftCpuTargetName(), want) != 0) {
    std::fprintf(stderr, "GIFT_BENCH_TARGET=%s: this machine lacks it (its widest below is %s)\n",
                 want, giftCpuTargetName());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!force_target()) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
