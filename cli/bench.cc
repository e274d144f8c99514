// giftc bench: encode and decode throughput against memcpy, measured in the same run.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.h"
#include "device.h"
#include "json_output.h"

namespace giftc {
namespace {

struct BenchOptions {
  std::string size = "256M";
  std::string fp8 = "e4m3", scale = "block:128", scale_dtype = "f32", dtype = "f32";
  int threads = 0;
  bool json = false;
  std::string device = "cpu";
};

// Seconds of `reps` passes of f.
template <typename F>
double seconds_of(F& f, uint64_t reps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t r = 0; r < reps; ++r) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds of one pass: the best of several timings until about half a second has passed,
// each of as many passes as take a millisecond (a pass over a small size, a few microseconds,
// timed alone gave figures of the clock's and the scheduler's noise: decode at 213 times memcpy).
template <typename F>
double best_seconds(F&& f) {
  f();  // warm-up: page faults, caches, thread start
  uint64_t reps = 1;
  while (reps < (uint64_t(1) << 20) && seconds_of(f, reps) < 1e-3) reps *= 2;
  double best = 1e30, spent = 0;
  for (int i = 0; i < 30 && (i < 3 || spent < 0.5); ++i) {
    const double s = seconds_of(f, reps);
    best = std::min(best, s / double(reps));
    spent += s;
  }
  return best;
}

// Seconds of one run's three passes over the same rows x cols tensor, and what ran them.
struct Times {
  double copy, encode, decode;
  std::string where;     // "8 threads, AVX3" or the device's name
  std::string baseline;  // "memcpy" or "device copy"
  // On the CPU: the process's peak resident memory, and how much of it is the benchmark's
  // own buffers (both 0 on a device).
  uint64_t peak_rss = 0, buffers = 0;
};

// The process's peak resident set so far, in bytes (Linux counts ru_maxrss in KiB).
uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return uint64_t(u.ru_maxrss) * 1024;
}

// Effective bandwidth (bytes read + written per second) of each pass and its ratio to the
// copy of the input measured in the same run; printed or as JSON.
void report(const BenchOptions& o, const giftQuantParams& p, giftDType_t dt, uint64_t rows,
            uint64_t cols, const Times& t) {
  const uint64_t in_bytes = rows * cols * giftDTypeSize(dt);
  uint64_t scale_bytes = 0;
  check(giftScaleBytes(&p, rows, cols, &scale_bytes));
  const uint64_t codes = rows * cols, out = rows * cols * 4;
  const double copy_bw = 2.0 * double(in_bytes) / t.copy;
  const double enc_bw = double(in_bytes + codes + scale_bytes) / t.encode;
  const double dec_bw = double(codes + scale_bytes + out) / t.decode;
  // Memory is measured on the CPU only: null on a device.
  const auto on_cpu = [&](uint64_t v) {
    return t.peak_rss ? nlohmann::ordered_json(v) : nlohmann::ordered_json();
  };
  const nlohmann::ordered_json doc = {{"bytes", in_bytes},
                                      {"dtype", dtype_name(dt)},
                                      {"fp8", fp8_name(p.kind)},
                                      {"scale", scale_name(p)},
                                      {"scale_dtype", scale_dtype_name(p.scale_dtype)},
                                      {"device", o.device},
                                      {"ran_on", t.where},
                                      {"baseline", t.baseline},
                                      {"baseline_gbps", copy_bw / 1e9},
                                      {"encode_gbps", enc_bw / 1e9},
                                      {"decode_gbps", dec_bw / 1e9},
                                      {"encode_ratio", enc_bw / copy_bw},
                                      {"decode_ratio", dec_bw / copy_bw},
                                      {"peak_rss_bytes", on_cpu(t.peak_rss)},
                                      {"buffer_bytes", on_cpu(t.buffers)}};
  if (o.json) {
    std::printf("%s\n", json_text(doc).c_str());
    return;
  }
  std::printf("%s input, %s, %s %s scales, %s\n", human_bytes(in_bytes).c_str(),
              dtype_name(dt).c_str(), fp8_name(p.kind).c_str(),
              (scale_name(p) + " " + scale_dtype_name(p.scale_dtype)).c_str(), t.where.c_str());
  std::printf("effective bandwidth (bytes read + written per second):\n");
  std::printf("  %-7s %8.2f GB/s\n", t.baseline == "memcpy" ? "memcpy" : "copy", copy_bw / 1e9);
  std::printf("  encode  %8.2f GB/s  %.3f of %s\n", enc_bw / 1e9, enc_bw / copy_bw,
              t.baseline.c_str());
  std::printf("  decode  %8.2f GB/s  %.3f of %s\n", dec_bw / 1e9, dec_bw / copy_bw,
              t.baseline.c_str());
  if (t.peak_rss) {
    std::printf(
        "peak memory %s resident, of which %s the buffers (input, its copy, codes, "
        "scales, decoded output)\n",
        human_bytes(t.peak_rss).c_str(), human_bytes(t.buffers).c_str());
  }
}

void run_bench(const BenchOptions& o, const Verbosity&) {
  bound_threads(o.threads);
  giftQuantParams p;
  giftQuantParamsInit(&p);
  p.kind = parse_fp8(o.fp8);
  parse_scale(o.scale, &p);
  p.scale_dtype = parse_scale_dtype(o.scale_dtype);
  giftCtx* raw_ctx = nullptr;
  check(giftCtxCreate(&raw_ctx));
  const std::unique_ptr<giftCtx, decltype(&giftCtxFree)> ctx(raw_ctx, giftCtxFree);
  check(giftCtxSetThreads(ctx.get(), o.threads));
  const giftDType_t dt = parse_dtype(o.dtype);
  const int threads = giftCtxThreads(ctx.get());
  const uint64_t width = giftDTypeSize(dt);
  const uint64_t n = parse_bytes(o.size, "--size", 4096, uint64_t(1) << 40) / width;
  const uint64_t cols = std::min<uint64_t>(4096, n), rows = n / cols;
  const uint64_t elems = rows * cols;
  if (parse_device(o.device) == Device::kCuda) {
    const DeviceTimes d = time_on_device(p, dt, rows, cols);
    report(o, p, dt, rows, cols, {d.copy, d.encode, d.decode, d.device, "device copy"});
    return;
  }
  std::vector<uint8_t> src(elems * width), copy(elems * width), codes(elems);
  uint64_t scale_bytes = 0;
  check(giftScaleBytes(&p, rows, cols, &scale_bytes));
  std::vector<uint8_t> scales(scale_bytes), out(elems * 4);
  std::mt19937 gen(1);
  std::normal_distribution<float> d;
  for (uint64_t i = 0; i < elems; ++i) {
    const float x = d(gen) * 1e-3f;
    if (dt == GIFT_DTYPE_F32) {
      std::memcpy(&src[4 * i], &x, 4);
    } else {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      const uint16_t h = uint16_t(u >> 16);  // bf16 and, for the benchmark's purpose, f16 alike
      std::memcpy(&src[2 * i], &h, 2);
    }
  }
  std::fill(copy.begin(), copy.end(), 0);
  std::fill(out.begin(), out.end(), 0);
  // At least 1 MiB a thread, as the codec shares its work out: a copy of a small size on
  // every thread timed their wake-ups.
  const int copiers = int(std::clamp<uint64_t>(src.size() >> 20, 1, uint64_t(threads)));
  const double t_copy = best_seconds([&] {
    const uint64_t chunk = (src.size() / uint64_t(copiers) + 4095) & ~uint64_t(4095);
#pragma omp parallel for num_threads(copiers)
    for (int t = 0; t < copiers; ++t) {
      const uint64_t b = uint64_t(t) * chunk;
      if (b < src.size()) std::memcpy(&copy[b], &src[b], std::min(chunk, src.size() - b));
    }
  });
  const double t_enc = best_seconds([&] {
    check(giftEncode(ctx.get(), &p, src.data(), dt, rows, cols, codes.data(), scales.data(),
                     scale_bytes, nullptr));
  });
  const double t_dec = best_seconds([&] {
    check(giftDecode(ctx.get(), &p, codes.data(), scales.data(), scale_bytes, rows, cols,
                     out.data(), GIFT_DTYPE_F32));
  });
  const uint64_t buffers = src.size() + copy.size() + codes.size() + scales.size() + out.size();
  report(
      o, p, dt, rows, cols,
      {t_copy, t_enc, t_dec,
       std::to_string(threads) + (threads == 1 ? " thread, " : " threads, ") + giftCpuTargetName(),
       "memcpy", peak_rss_bytes(), buffers});
}

}  // namespace

void add_bench(CLI::App& app, Verbosity& v) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* c =
      app.add_subcommand("bench", "Encode/decode throughput against memcpy on this machine");
  c->add_option("--size", o->size,
                "Input size in bytes (suffixes K, M, G, T: powers of 1024), in rows of up to 4096 "
                "elements: rounded down to whole ones")
      ->capture_default_str();
  c->add_option("--dtype", o->dtype, "Input element type: f32, bf16 or f16")->capture_default_str();
  c->add_option("--fp8", o->fp8, "FP8 kind: e4m3 or e5m2")->capture_default_str();
  c->add_option("--scale", o->scale, "Scale groups: tensor, row, block:N or tile:RxC")
      ->capture_default_str();
  c->add_option("--scale-dtype", o->scale_dtype, "Scale type: f32 or e8m0")->capture_default_str();
  add_threads_option(c, &o->threads);
  c->add_option("--device", o->device,
                "cpu, or cuda: the device's kernels against a device-to-device copy")
      ->capture_default_str();
  c->add_flag("--json", o->json, "Print a JSON document");
  c->callback([o, &v] { run_bench(*o, v); });
}

}  // namespace giftc
