// Golden frames of every released format version decode bit for bit to the values stored
// beside them, and together cover what a frame can hold.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "gift/gift.h"
#include "io/npy.h"
#include "numerics/elementwise.h"

namespace {

std::vector<std::string> frames_in(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".gift") == 0) out.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Golden, V1_0FramesDecodeBitForBit) {
  const std::string dir = std::string(GIFT_TESTDATA) + "/v1.0";
  const std::vector<std::string> frames = frames_in(dir);
  ASSERT_GE(frames.size(), 4u) << "no golden frames in " << dir;
  std::set<std::string> seen;  // features covered
  for (const std::string& path : frames) {
    giftFrame* f = nullptr;
    ASSERT_EQ(giftFrameOpenFile(path.c_str(), &f), GIFT_OK) << giftGetLastErrorMessage();
    ASSERT_EQ(giftFrameVerify(f), GIFT_OK) << path << ": " << giftGetLastErrorMessage();
    const std::string stem = path.substr(0, path.size() - 5);
    for (uint64_t i = 0; i < giftFrameTensorCount(f); ++i) {
      giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
      ASSERT_EQ(giftFrameTensorInfo(f, i, &info), GIFT_OK);
      std::vector<float> got(info.elements);
      ASSERT_EQ(giftFrameDecodeTensor(f, i, got.data(), got.size() * 4, GIFT_DTYPE_F32), GIFT_OK)
          << path << " tensor " << i << ": " << giftGetLastErrorMessage();
      gift::io::NpyArray want;
      gift::io::read_npy(stem + "." + std::to_string(i) + ".npy", &want);
      ASSERT_EQ(want.count(), info.elements) << path << " tensor " << i;
      if (info.coords == GIFT_COORDS_GIFT) {
        // Codes and scales decode bit for bit; mapping back through T^-1 runs BLAS GEMMs,
        // whose summation order may differ between machines: fp32 tolerance here.
        seen.insert("gift-coords");
        giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
        ASSERT_EQ(giftComputeErrorMetrics(reinterpret_cast<const float*>(want.data.data()),
                                          got.data(), 1, got.size(), nullptr, &m),
                  GIFT_OK);
        ASSERT_LT(m.rel_l2, 1e-5) << path << " tensor '" << info.name << "'";
        continue;
      }
      // (An empty tensor has no data pointer to compare, and none is needed.)
      ASSERT_TRUE(got.empty() || std::memcmp(want.data.data(), got.data(), got.size() * 4) == 0)
          << path << " tensor '" << info.name << "' differs from its golden values";
      // 16-bit outputs are the golden fp32 values rounded to nearest even.
      std::vector<uint16_t> b(info.elements), h(info.elements);
      ASSERT_EQ(giftFrameDecodeTensor(f, i, b.data(), b.size() * 2, GIFT_DTYPE_BF16), GIFT_OK);
      ASSERT_EQ(giftFrameDecodeTensor(f, i, h.data(), h.size() * 2, GIFT_DTYPE_F16), GIFT_OK);
      for (uint64_t k = 0; k < info.elements; ++k) {
        if (std::isnan(got[k])) continue;
        ASSERT_EQ(b[k], gift::num::bf16_from_float(got[k])) << path << " " << info.name << " " << k;
        ASSERT_EQ(h[k], gift::num::f16_from_float(got[k])) << path << " " << info.name << " " << k;
      }

      seen.insert(info.raw ? "raw" : "fp8");
      seen.insert(std::string("dtype") + std::to_string(info.dtype));
      if (info.ndim == 0) seen.insert("0-d");
      if (info.elements == 0) seen.insert("empty");
      if (std::any_of(info.name, info.name + std::strlen(info.name),
                      [](char c) { return c & 0x80; })) {
        seen.insert("non-ascii");
      }
      if (info.stored_bytes < info.raw_bytes) seen.insert("zstd");
      if (!info.raw) {
        if (info.stored_bytes == info.raw_bytes) seen.insert("uncompressed");
        seen.insert("kind" + std::to_string(info.params.kind));
        seen.insert("layout" + std::to_string(info.params.layout));
        seen.insert("scale_dtype" + std::to_string(info.params.scale_dtype));
        seen.insert("rounding" + std::to_string(info.params.rounding));
      }
      if (std::any_of(got.begin(), got.end(), [](float v) { return std::isnan(v); }))
        seen.insert("nan");
    }
    giftFrameClose(f);
  }
  for (const char* need :
       {"raw",       "fp8",       "dtype0",  "dtype1",       "dtype2",       "0-d",
        "empty",     "non-ascii", "zstd",    "uncompressed", "kind0",        "kind1",
        "layout0",   "layout1",   "layout2", "layout3",      "scale_dtype0", "scale_dtype1",
        "rounding0", "rounding1", "nan",     "gift-coords"}) {
    EXPECT_TRUE(seen.count(need)) << "the golden frames cover no '" << need << "' case";
  }
}

}  // namespace
