// Writes the fuzzer's seed corpus: small valid frames that between them use every scale
// layout, scale dtype, FP8 kind, rounding mode, input dtype, raw tensors, zstd on and off,
// empty and 0-d tensors and metadata. Usage: make_seeds OUT_DIR
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gift/gift.h"

namespace {

int failures = 0;

bool ok(giftResult_t r, const std::string& what) {
  if (r == GIFT_OK) return true;
  std::fprintf(stderr, "make_seeds: %s: %s: %s\n", what.c_str(), giftGetErrorString(r),
               giftGetLastErrorMessage());
  ++failures;
  return false;
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

uint16_t to_f16(float f) {  // small normal values only, enough for seeds
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000;
  const int exp = int((u >> 23) & 0xFF) - 127 + 15;
  if (exp <= 0) return uint16_t(sign);
  return uint16_t(sign | uint32_t(exp) << 10 | ((u >> 13) & 0x3FF));
}

// Values of `n` elements in `dtype`; `smooth` makes them compressible.
std::vector<uint8_t> values(uint64_t n, giftDType_t dtype, bool smooth, unsigned salt) {
  std::vector<uint8_t> out(n * giftDTypeSize(dtype));
  uint32_t x = 2463534242u + salt;
  for (uint64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    const float v = smooth
                        ? float(i % 7) * 0.25f
                        : (float(x % 20001) / 10000.0f - 1.0f) * std::ldexp(1.0f, int(i % 9) - 4);
    if (dtype == GIFT_DTYPE_F32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == GIFT_DTYPE_BF16 ? to_bf16(v) : to_f16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

struct Seed {
  giftFrameWriter* w = nullptr;
  std::string name;
  int tensors = 0;

  Seed(std::string n, int zstd) : name(std::move(n)) {
    ok(giftFrameWriterCreate(&w), name);
    ok(giftFrameWriterSetCompression(w, zstd), name);
  }
  ~Seed() { giftFrameWriterFree(w); }

  void add(std::vector<uint64_t> shape, giftDType_t dtype, const giftQuantParams* p, bool smooth) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    const std::vector<uint8_t> data = values(n, dtype, smooth, unsigned(tensors));
    const std::string t = "t" + std::to_string(tensors++);
    ok(giftFrameWriterAddTensor(w, t.c_str(), shape.data(), uint32_t(shape.size()), dtype,
                                data.empty() ? nullptr : data.data(), p),
       name + ": " + t);
  }

  void write(const std::string& dir) {
    ok(giftFrameWriterWriteFile(w, (dir + "/" + name + ".gift").c_str()), name);
  }
};

giftQuantParams params(giftScaleLayout_t layout, giftScaleDType_t sd, giftFp8Kind_t kind) {
  giftQuantParams p;
  giftQuantParamsInit(&p);
  p.layout = layout;
  p.scale_dtype = sd;
  p.kind = kind;
  p.block = 16;
  p.tile_rows = 3;
  p.tile_cols = 5;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const giftScaleLayout_t layouts[] = {GIFT_SCALE_TENSOR, GIFT_SCALE_ROW, GIFT_SCALE_BLOCK,
                                       GIFT_SCALE_TILE};
  const char* layout_names[] = {"tensor", "row", "block", "tile"};
  const giftDType_t dtypes[] = {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16};

  // One frame per layout, scale dtype and compression; FP8 kind and input dtype vary with them.
  int k = 0;
  for (int l = 0; l < 4; ++l) {
    for (giftScaleDType_t sd : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
      for (int zstd : {0, 3}) {
        const giftFp8Kind_t kind = (k + k / 2) % 2 ? GIFT_FP8_E5M2 : GIFT_FP8_E4M3;
        Seed s(std::string("fp8_") + layout_names[l] + (sd ? "_e8m0" : "_f32") +
                   (kind ? "_e5m2" : "_e4m3") + (zstd ? "_zstd" : ""),
               zstd);
        const giftQuantParams p = params(layouts[l], sd, kind);
        s.add({7, 37}, dtypes[k % 3], &p, zstd != 0);
        s.add({40}, dtypes[(k + 1) % 3], &p, false);
        s.write(dir);
        ++k;
      }
    }
  }

  // Stochastic rounding with a seed and tensor index, block sizes at both ends.
  {
    Seed s("fp8_stochastic_blocks", 0);
    giftQuantParams p = params(GIFT_SCALE_BLOCK, GIFT_SCALE_DTYPE_F32, GIFT_FP8_E4M3);
    p.rounding = GIFT_ROUND_STOCHASTIC;
    p.seed = 0x0123456789abcdefull;
    p.tensor_index = 7;
    s.add({2, 3, 50}, GIFT_DTYPE_F32, &p, false);
    p.block = GIFT_BLOCK_MAX;
    p.rounding = GIFT_ROUND_NEAREST;
    s.add({4, 33}, GIFT_DTYPE_BF16, &p, false);
    s.write(dir);
  }

  // Raw (lossless) tensors of each dtype, plain and compressed.
  for (int zstd : {0, 5}) {
    Seed s(zstd ? "raw_zstd" : "raw", zstd);
    for (giftDType_t d : dtypes) s.add({6, 10}, d, nullptr, zstd != 0);
    s.write(dir);
  }

  // Empty and 0-d tensors, raw and FP8 in each layout, and metadata.
  {
    Seed s("empty_and_scalar", 0);
    const giftQuantParams p = params(GIFT_SCALE_TILE, GIFT_SCALE_DTYPE_E8M0, GIFT_FP8_E5M2);
    s.add({}, GIFT_DTYPE_F32, &p, false);  // 0-d
    s.add({}, GIFT_DTYPE_BF16, nullptr, false);
    for (int l = 0; l < 4; ++l) {
      const giftQuantParams e = params(layouts[l], giftScaleDType_t(l % 2), GIFT_FP8_E4M3);
      s.add({0}, dtypes[l % 3], &e, false);
      s.add({3, 0}, GIFT_DTYPE_F32, &e, false);
      s.add({0, 5}, GIFT_DTYPE_BF16, &e, false);
    }
    s.add({0, 5}, GIFT_DTYPE_F32, nullptr, false);
    s.add({1, 1, 1, 1}, GIFT_DTYPE_F16, &p, false);
    ok(giftFrameWriterAddMetadata(s.w, "step", "1234"), s.name);
    ok(giftFrameWriterAddMetadata(s.w, "", ""), s.name);
    s.write(dir);
  }

  // A frame with no tensor at all.
  {
    Seed s("no_tensors", 0);
    ok(giftFrameWriterAddMetadata(s.w, "producer", "make_seeds"), s.name);
    s.write(dir);
  }

  // Many small tensors under zstd: a longer header with many sections.
  {
    Seed s("many_tensors_zstd", 1);
    for (int i = 0; i < 12; ++i) {
      const giftQuantParams p =
          params(layouts[i % 4], giftScaleDType_t(i % 2), giftFp8Kind_t((i / 2) % 2));
      s.add({uint64_t(1 + i), uint64_t(17 + 3 * i)}, dtypes[i % 3], i % 5 ? &p : nullptr, i % 3);
    }
    s.write(dir);
  }

  return failures ? 1 : 0;
}
