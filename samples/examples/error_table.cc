// Encodes one gradient tensor (.npy) to FP8 under a range of settings, decodes it back and
// prints the size and error of each: a small program embedding libcodec.
//
//   error_table GRAD.npy [--threads N]
//
// Exit codes as giftc's: 0 success, 1 usage error, 2 invalid input, 3 I/O error.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "failure.h"
#include "gift/gift.h"
#include "io/npy.h"

namespace {

struct Setting {
  giftFp8Kind_t kind;
  giftScaleLayout_t layout;
  uint32_t block, tile;
  giftScaleDType_t scale_dtype;
  giftRounding_t rounding;
};

std::string layout_name(const Setting& s) {
  switch (s.layout) {
    case GIFT_SCALE_TENSOR:
      return "tensor";
    case GIFT_SCALE_ROW:
      return "row";
    case GIFT_SCALE_BLOCK:
      return "block:" + std::to_string(s.block);
    default:
      return "tile:" + std::to_string(s.tile) + "x" + std::to_string(s.tile);
  }
}

std::vector<Setting> settings() {
  std::vector<Setting> out;
  for (auto kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
    for (auto sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
      out.push_back({kind, GIFT_SCALE_TENSOR, 0, 0, sd, GIFT_ROUND_NEAREST});
      out.push_back({kind, GIFT_SCALE_ROW, 0, 0, sd, GIFT_ROUND_NEAREST});
      out.push_back({kind, GIFT_SCALE_BLOCK, 32, 0, sd, GIFT_ROUND_NEAREST});
      out.push_back({kind, GIFT_SCALE_BLOCK, 128, 0, sd, GIFT_ROUND_NEAREST});
      out.push_back({kind, GIFT_SCALE_TILE, 0, 128, sd, GIFT_ROUND_NEAREST});
    }
    out.push_back({kind, GIFT_SCALE_BLOCK, 128, 0, GIFT_SCALE_DTYPE_F32, GIFT_ROUND_STOCHASTIC});
  }
  return out;
}

int exit_code(giftResult_t r) {
  return r == GIFT_ERROR_IO ? 3 : r == GIFT_ERROR_INVALID_ARGUMENT ? 1 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = nullptr;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (argv[i][0] == '-' || path) {
      std::fprintf(stderr, "usage: %s GRAD.npy [--threads N]\n", argv[0]);
      return 1;
    } else {
      path = argv[i];
    }
  }
  if (!path) {
    std::fprintf(stderr, "usage: %s GRAD.npy [--threads N]\n", argv[0]);
    return 1;
  }

  gift::io::NpyArray a;
  try {
    gift::io::read_npy(path, &a);
  } catch (const giftc::Failure& f) {  // giftc's reader, with giftc's exit codes
    std::fprintf(stderr, "error_table: %s\n", f.what());
    return f.code;
  }
  // rows x cols view: the last dimension is cols.
  const uint64_t cols = a.shape.empty() ? 1 : a.shape.back();
  const uint64_t rows = cols ? a.count() / cols : 0;
  const uint64_t n = a.count();
  // The reference: the input's exact fp32 values (widening fp16 is exact).
  std::vector<float> ref(n);
  if (const giftResult_t r = giftConvert(a.data.data(), a.dtype, ref.data(), GIFT_DTYPE_F32, n)) {
    std::fprintf(stderr, "error_table: %s: %s\n", path, giftGetLastErrorMessage());
    return exit_code(r);
  }
  const uint64_t in_bytes = a.data.size();
  std::printf("%s: %" PRIu64 " x %" PRIu64 " %s, %.2f MiB\n\n", path, rows, cols,
              a.dtype == GIFT_DTYPE_F32 ? "float32" : "float16", double(in_bytes) / (1 << 20));
  std::printf("%-5s %-12s %-5s %-10s %10s %6s %10s %10s %10s %11s\n", "fp8", "scales", "dtype",
              "rounding", "bytes", "ratio", "rel_l2", "cosine", "max_abs", "bias");

  std::vector<uint8_t> codes(n);
  std::vector<float> decoded(n);
  giftCtx* ctx = nullptr;
  if (giftCtxCreate(&ctx) || giftCtxSetThreads(ctx, threads)) {
    std::fprintf(stderr, "error_table: %s\n", giftGetLastErrorMessage());
    return 1;
  }
  const std::unique_ptr<giftCtx, decltype(&giftCtxFree)> ctx_owner(ctx, giftCtxFree);
  for (const Setting& s : settings()) {
    giftQuantParams p;
    giftQuantParamsInit(&p);
    p.kind = s.kind;
    p.layout = s.layout;
    if (s.block) p.block = s.block;
    if (s.tile) p.tile_rows = p.tile_cols = s.tile;
    p.scale_dtype = s.scale_dtype;
    p.rounding = s.rounding;
    p.seed = 1;
    uint64_t scale_bytes = 0;
    giftResult_t r = giftScaleBytes(&p, rows, cols, &scale_bytes);
    std::vector<uint8_t> scales(scale_bytes);
    if (!r)
      r = giftEncode(ctx, &p, a.data.data(), a.dtype, rows, cols, codes.data(), scales.data(),
                     scale_bytes, nullptr);
    if (!r)
      r = giftDecode(ctx, &p, codes.data(), scales.data(), scale_bytes, rows, cols, decoded.data(),
                     GIFT_DTYPE_F32);
    giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
    if (!r) r = giftComputeErrorMetrics(ref.data(), decoded.data(), rows, cols, nullptr, &m);
    if (r) {
      std::fprintf(stderr, "error_table: %s: %s\n", path, giftGetLastErrorMessage());
      return exit_code(r);
    }
    const uint64_t out_bytes = n + scale_bytes;
    std::printf("%-5s %-12s %-5s %-10s %10" PRIu64 " %6.2f %10.3e %10.6f %10.3e %11.3e\n",
                s.kind == GIFT_FP8_E4M3 ? "E4M3" : "E5M2", layout_name(s).c_str(),
                s.scale_dtype == GIFT_SCALE_DTYPE_F32 ? "f32" : "e8m0",
                s.rounding == GIFT_ROUND_NEAREST ? "nearest" : "stochastic", out_bytes,
                double(in_bytes) / double(out_bytes), m.rel_l2, m.cosine, m.max_abs, m.bias);
  }
  return 0;
}
