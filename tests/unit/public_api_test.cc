// The public C API as a program built against gift.h and gift_basis.h sees it: sized structs
// across header versions, the codec context, and GIFT coordinates from fitting to decoding.
// Only public headers: what these tests rely on, every embedder may rely on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gift/gift.h"
#include "gift/gift_basis.h"
#include "unit/cpu_limit.h"

namespace {

struct Encoded {
  std::vector<uint8_t> codes, scales;
  bool operator==(const Encoded& o) const { return codes == o.codes && scales == o.scales; }
};

Encoded encode(const giftCtx* ctx, const giftQuantParams& p, const std::vector<float>& w,
               uint64_t rows, uint64_t cols) {
  uint64_t sb = 0;
  EXPECT_EQ(giftScaleBytes(&p, rows, cols, &sb), GIFT_OK);
  Encoded e{std::vector<uint8_t>(w.size()), std::vector<uint8_t>(sb)};
  EXPECT_EQ(giftEncode(ctx, &p, w.data(), GIFT_DTYPE_F32, rows, cols, e.codes.data(),
                       e.scales.data(), sb, nullptr),
            GIFT_OK)
      << giftGetLastErrorMessage();
  return e;
}

std::vector<float> decode(const giftQuantParams& p, const Encoded& e, uint64_t rows,
                          uint64_t cols) {
  std::vector<float> out(rows * cols);
  EXPECT_EQ(giftDecode(nullptr, &p, e.codes.data(), e.scales.data(), e.scales.size(), rows, cols,
                       out.data(), GIFT_DTYPE_F32),
            GIFT_OK);
  return out;
}

std::vector<float> gaussian(uint64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& x : v) x = nd(gen);
  return v;
}

double rel_l2(const std::vector<float>& ref, const std::vector<float>& x) {
  giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
  EXPECT_EQ(giftComputeErrorMetrics(ref.data(), x.data(), 1, ref.size(), nullptr, &m), GIFT_OK);
  return m.rel_l2;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- Sized structs -------------------------------------------------------------------------

TEST(SizedStructs, UninitializedMagicIsRefusedNamingTheStruct) {
  giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
  p.magic = 0;
  EXPECT_EQ(giftQuantParamsValidate(&p), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(giftGetLastErrorMessage(), "giftQuantParams")) << giftGetLastErrorMessage();
  EXPECT_TRUE(contains(giftGetLastErrorMessage(), "not initialized"));

  giftErrorMetrics m = GIFT_ERROR_METRICS_INIT;
  m.magic = 0;
  const float x = 1;
  EXPECT_EQ(giftComputeErrorMetrics(&x, &x, 1, 1, nullptr, &m), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(giftGetLastErrorMessage(), "giftErrorMetrics"));
}

TEST(SizedStructs, SizeLargerThanTheLibrarysIsRefused) {
  giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
  p.size = sizeof(giftQuantParams) + 8;  // a newer gift.h with a field this library lacks
  EXPECT_EQ(giftQuantParamsValidate(&p), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(giftGetLastErrorMessage(), "giftQuantParams"));
  EXPECT_TRUE(contains(giftGetLastErrorMessage(), std::to_string(sizeof(giftQuantParams))));
}

TEST(SizedStructs, SizeSmallerThanTheHeaderIsCalledThat) {
  giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
  for (const size_t size : {size_t(0), size_t(8)}) {
    p.size = size;
    EXPECT_EQ(giftQuantParamsValidate(&p), GIFT_ERROR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(giftGetLastErrorMessage(), "less than its header")) << size;
  }
}

TEST(SizedStructs, OlderHeaderGetsDefaultsForTheFieldsItLacks) {
  const uint64_t rows = 64, cols = 300;
  const std::vector<float> w = gaussian(rows * cols, 1);
  for (const giftFp8Kind_t kind : {GIFT_FP8_E4M3, GIFT_FP8_E5M2}) {
    giftQuantParams full = GIFT_QUANT_PARAMS_INIT;
    full.kind = kind;
    // An older gift.h ended at `rounding`: what lies past it in memory is not the caller's,
    // so values the library would refuse or that would change the bytes must be ignored.
    giftQuantParams old = full;
    old.size = offsetof(giftQuantParams, seed);
    old.seed = 12345;
    old.tensor_index = 7;
    std::memset(&old.nonfinite, 0x5A, sizeof old.nonfinite);
    EXPECT_EQ(giftQuantParamsValidate(&old), GIFT_OK) << giftGetLastErrorMessage();
    EXPECT_EQ(encode(nullptr, old, w, rows, cols), encode(nullptr, full, w, rows, cols));
    // The missing non-finite policy is the default: an error.
    std::vector<float> bad = w;
    bad[5] = NAN;
    uint64_t sb = 0;
    ASSERT_EQ(giftScaleBytes(&old, rows, cols, &sb), GIFT_OK);
    std::vector<uint8_t> codes(bad.size()), scales(sb);
    EXPECT_EQ(giftEncode(nullptr, &old, bad.data(), GIFT_DTYPE_F32, rows, cols, codes.data(),
                         scales.data(), sb, nullptr),
              GIFT_ERROR_NONFINITE_INPUT);
  }
}

// Bytes of `s` from `from` on, all equal to `canary`.
template <class T>
bool untouched_past(const T& s, size_t from, unsigned char canary) {
  const auto* b = reinterpret_cast<const unsigned char*>(&s);
  for (size_t i = from; i < sizeof(T); ++i)
    if (b[i] != canary) return false;
  return true;
}

TEST(SizedStructs, OutputStructsAreWrittenOnlyUpToTheCallersSize) {
  constexpr unsigned char kCanary = 0xA5;
  const std::vector<float> ref = gaussian(256, 2), approx = gaussian(256, 3);

  giftErrorMetrics m;
  std::memset(&m, kCanary, sizeof m);
  m.size = offsetof(giftErrorMetrics, sum_ref_sq);
  m.magic = GIFT_STRUCT_MAGIC;
  m.version = GIFT_VERSION_NUMBER;
  ASSERT_EQ(giftComputeErrorMetrics(ref.data(), approx.data(), 16, 16, nullptr, &m), GIFT_OK);
  giftErrorMetrics full = GIFT_ERROR_METRICS_INIT;
  ASSERT_EQ(giftComputeErrorMetrics(ref.data(), approx.data(), 16, 16, nullptr, &full), GIFT_OK);
  EXPECT_EQ(m.rel_l2, full.rel_l2);
  EXPECT_EQ(m.rel_anorm, -1.0);
  EXPECT_TRUE(untouched_past(m, offsetof(giftErrorMetrics, sum_ref_sq), kCanary));

  giftFrameWriter* writer = nullptr;
  ASSERT_EQ(giftFrameWriterCreate(&writer), GIFT_OK);
  const uint64_t shape[2] = {16, 16};
  const giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
  ASSERT_EQ(giftFrameWriterAddTensor(writer, "t", shape, 2, GIFT_DTYPE_F32, ref.data(), &p),
            GIFT_OK);
  void* data = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(giftFrameWriterFinish(writer, &data, &size), GIFT_OK);
  giftFrameWriterFree(writer);
  giftFrame* frame = nullptr;
  ASSERT_EQ(giftFrameOpen(data, size, &frame), GIFT_OK);
  giftTensorInfo info;
  std::memset(&info, kCanary, sizeof info);
  info.size = offsetof(giftTensorInfo, params);
  info.magic = GIFT_STRUCT_MAGIC;
  info.version = GIFT_VERSION_NUMBER;
  ASSERT_EQ(giftFrameTensorInfo(frame, 0, &info), GIFT_OK);
  EXPECT_STREQ(info.name, "t");
  EXPECT_EQ(info.elements, 256u);
  EXPECT_EQ(info.coords, GIFT_COORDS_EUCLIDEAN);
  EXPECT_TRUE(untouched_past(info, offsetof(giftTensorInfo, params), kCanary));
  // Rows past the tensor are named as asked, not as a range whose end wrapped.
  std::vector<float> band(256);
  EXPECT_EQ(
      giftFrameDecodeRows(frame, 0, 1, UINT64_MAX, band.data(), band.size() * 4, GIFT_DTYPE_F32),
      GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(giftGetLastErrorMessage(), "18446744073709551615 rows from row 1"))
      << giftGetLastErrorMessage();
  EXPECT_EQ(giftFrameDecodeRows(nullptr, 0, 0, 1, band.data(), band.size() * 4, GIFT_DTYPE_F32),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(giftGetLastErrorMessage(), "frame is NULL");
  giftFrameClose(frame);
  giftFree(data);
}

// ---- giftCtx -------------------------------------------------------------------------------

TEST(Ctx, ThreadsDoNotChangeTheBytes) {
  const uint64_t rows = 256, cols = 2048;  // large enough to be split between threads
  const std::vector<float> w = gaussian(rows * cols, 4);
  giftCtx* ctx = nullptr;
  ASSERT_EQ(giftCtxCreate(&ctx), GIFT_OK);
  const std::unique_ptr<giftCtx, decltype(&giftCtxFree)> owned(ctx, giftCtxFree);
  for (const giftScaleLayout_t layout :
       {GIFT_SCALE_TENSOR, GIFT_SCALE_ROW, GIFT_SCALE_BLOCK, GIFT_SCALE_TILE})
    for (const giftRounding_t rounding : {GIFT_ROUND_NEAREST, GIFT_ROUND_STOCHASTIC}) {
      giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
      p.layout = layout;
      p.rounding = rounding;
      p.seed = 9;
      ASSERT_EQ(giftCtxSetThreads(ctx, 1), GIFT_OK);
      const Encoded one = encode(ctx, p, w, rows, cols);
      for (const int threads : {2, 0}) {
        ASSERT_EQ(giftCtxSetThreads(ctx, threads), GIFT_OK);
        EXPECT_EQ(encode(ctx, p, w, rows, cols), one)
            << "layout " << layout << " rounding " << rounding << " threads " << threads;
      }
      EXPECT_EQ(encode(nullptr, p, w, rows, cols), one);
    }
  EXPECT_EQ(giftCtxSetThreads(ctx, -1), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(giftGetLastErrorMessage(), "negative"));
}

// Every encode and decode of fp32, bf16 and fp16 sources under three settings, as bytes:
// codes, scales, statistics, and the values decoded to fp32 and to bf16.
std::vector<std::vector<uint8_t>> codec_bytes() {
  const uint64_t rows = 48, cols = 1000;  // blocks cut by the rows' ends
  std::vector<float> f32 = gaussian(rows * cols, 8);
  f32[77] = 0.0f;
  f32[500] = -1e-40f;  // subnormal
  std::vector<uint16_t> bf16(f32.size()), f16(f32.size());
  std::mt19937_64 gen(3);
  for (size_t i = 0; i < f32.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &f32[i], 4);
    bf16[i] = uint16_t(bits >> 16);
    do f16[i] = uint16_t(gen());
    while ((f16[i] & 0x7C00) == 0x7C00);  // any finite pattern
  }
  const std::pair<const void*, giftDType_t> sources[] = {
      {f32.data(), GIFT_DTYPE_F32}, {bf16.data(), GIFT_DTYPE_BF16}, {f16.data(), GIFT_DTYPE_F16}};
  giftQuantParams nearest = GIFT_QUANT_PARAMS_INIT, stochastic = GIFT_QUANT_PARAMS_INIT;
  stochastic.rounding = GIFT_ROUND_STOCHASTIC;
  stochastic.seed = 5;
  giftQuantParams e8m0 = GIFT_QUANT_PARAMS_INIT;
  e8m0.scale_dtype = GIFT_SCALE_DTYPE_E8M0;
  e8m0.block = 32;
  std::vector<std::vector<uint8_t>> out;
  for (const auto& [src, dtype] : sources)
    for (const giftQuantParams& p : {nearest, stochastic, e8m0}) {
      uint64_t sb = 0;
      EXPECT_EQ(giftScaleBytes(&p, rows, cols, &sb), GIFT_OK);
      std::vector<uint8_t> codes(rows * cols), scales(sb), f32_out(rows * cols * 4),
          bf16_out(rows * cols * 2), stats(20);
      giftEncodeStats st;
      EXPECT_EQ(
          giftEncode(nullptr, &p, src, dtype, rows, cols, codes.data(), scales.data(), sb, &st),
          GIFT_OK)
          << giftGetLastErrorMessage();
      std::memcpy(stats.data(), &st.amax, 4);  // field by field: the struct has padding
      std::memcpy(stats.data() + 4, &st.nonfinite_count, 8);
      std::memcpy(stats.data() + 12, &st.first_nonfinite, 8);
      for (auto& [dst, dst_dtype] :
           {std::pair(&f32_out, GIFT_DTYPE_F32), {&bf16_out, GIFT_DTYPE_BF16}})
        EXPECT_EQ(giftDecode(nullptr, &p, codes.data(), scales.data(), sb, rows, cols, dst->data(),
                             dst_dtype),
                  GIFT_OK);
      for (auto* v : {&codes, &scales, &stats, &f32_out, &bf16_out}) out.push_back(std::move(*v));
    }
  return out;
}

// Every instruction set this build has: the dispatcher takes it or, where the CPU lacks it, a
// narrower one, and the bytes are those of the widest.
TEST(CpuTarget, EveryInstructionSetGivesTheBytesOfTheWidest) {
  const CpuLimitLifted lifted;
  const std::string widest = giftCpuTargetName();
  ASSERT_EQ(giftCpuLimitTarget("no-such-set"), GIFT_ERROR_INVALID_ARGUMENT);
  const std::string message = giftGetLastErrorMessage();
  EXPECT_TRUE(contains(message, "'no-such-set'")) << message;
  EXPECT_TRUE(contains(message, std::string(": ") + giftCpuTargetNames())) << message;
  EXPECT_EQ(giftCpuTargetName(), widest);
  std::vector<std::string> names;
  std::istringstream list(giftCpuTargetNames());
  for (std::string name; list >> name;) names.push_back(name);
  const size_t at_widest = size_t(std::find(names.begin(), names.end(), widest) - names.begin());
  ASSERT_LT(at_widest, names.size()) << message;

  const std::vector<std::vector<uint8_t>> want = codec_bytes();
  for (size_t i = 0; i < names.size(); ++i) {
    // Lower case: the name is taken in any case.
    std::string lower = names[i];
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    ASSERT_EQ(giftCpuLimitTarget(lower.c_str()), GIFT_OK) << giftGetLastErrorMessage();
    // The sets nest, so the limit itself where the CPU has it, else the CPU's widest.
    EXPECT_EQ(giftCpuTargetName(), names[std::max(i, at_widest)]) << "limited to " << names[i];
    const std::vector<std::vector<uint8_t>> got = codec_bytes();
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k)
      EXPECT_TRUE(got[k] == want[k]) << "output " << k << " under " << giftCpuTargetName();
  }
  ASSERT_EQ(giftCpuLimitTarget(nullptr), GIFT_OK);
  EXPECT_EQ(giftCpuTargetName(), widest);
}

// ---- gift_basis.h --------------------------------------------------------------------------

// A layer whose inputs have four strong directions (strengths 10:5:2:1) over a weak isotropic
// floor: A = M^T diag(s^2) M + floor I, and a gradient W (rows x dim) in the same directions
// with 1% isotropic noise. Its columns are strongly anisotropic, so whitening lowers the FP8
// error (tests/unit/whitener_test.cc measures the same case inside the library).
struct Layer {
  uint32_t rows = 256, dim = 512;
  std::vector<double> a;
  std::vector<float> w;
};

Layer make_layer(uint64_t seed) {
  Layer l;
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> nd;
  const double strength[4] = {10, 5, 2, 1};
  std::vector<double> mt(4 * uint64_t(l.dim));
  for (double& x : mt) x = nd(gen) / std::sqrt(double(l.dim));
  l.w.resize(uint64_t(l.rows) * l.dim);
  double ss = 0;
  for (uint32_t i = 0; i < l.rows; ++i) {
    double s4[4];
    for (int k = 0; k < 4; ++k) s4[k] = nd(gen) * strength[k];
    for (uint32_t j = 0; j < l.dim; ++j) {
      double v = 0;
      for (int k = 0; k < 4; ++k) v += s4[k] * mt[k * uint64_t(l.dim) + j];
      l.w[uint64_t(i) * l.dim + j] = float(v);
      ss += v * v;
    }
  }
  const double rms = std::sqrt(ss / double(l.w.size()));
  for (float& x : l.w) x += float(0.01 * rms * nd(gen));
  l.a.assign(uint64_t(l.dim) * l.dim, 0.0);
  for (uint32_t i = 0; i < l.dim; ++i)
    for (uint32_t j = 0; j < l.dim; ++j) {
      double v = i == j ? 1e-2 / l.dim : 0.0;
      for (int k = 0; k < 4; ++k)
        v += strength[k] * strength[k] * mt[k * uint64_t(l.dim) + i] * mt[k * uint64_t(l.dim) + j];
      l.a[uint64_t(i) * l.dim + j] = v;
    }
  return l;
}

using BasisPtr = std::unique_ptr<giftBasis, decltype(&giftBasisFree)>;

BasisPtr fit(const Layer& l, const char* name) {
  const giftFitParams fp = GIFT_FIT_PARAMS_INIT;
  giftBasisBuilder* b = nullptr;
  EXPECT_EQ(giftBasisBuilderCreate(&fp, &b), GIFT_OK);
  EXPECT_EQ(giftBasisBuilderAdd(b, name, l.a.data(), l.dim, "activations", nullptr, 0, nullptr, 0,
                                nullptr, nullptr),
            GIFT_OK)
      << giftGetLastErrorMessage();
  giftBasis* basis = nullptr;
  EXPECT_EQ(giftBasisBuilderFinish(b, &basis), GIFT_OK);
  giftBasisBuilderFree(b);
  return BasisPtr(basis, giftBasisFree);
}

bool same_id(giftBasisId x, giftBasisId y) { return x.lo == y.lo && x.hi == y.hi; }

std::string hex(giftBasisId id) {
  char s[33];
  giftBasisIdFormat(id, s);
  return s;
}

void expect_same_entries(const giftBasis* x, const giftBasis* y) {
  ASSERT_EQ(giftBasisEntryCount(x), giftBasisEntryCount(y));
  for (uint64_t i = 0; i < giftBasisEntryCount(x); ++i) {
    giftBasisEntryInfo a = GIFT_BASIS_ENTRY_INFO_INIT, b = GIFT_BASIS_ENTRY_INFO_INIT;
    ASSERT_EQ(giftBasisGetEntry(x, i, &a), GIFT_OK);
    ASSERT_EQ(giftBasisGetEntry(y, i, &b), GIFT_OK);
    EXPECT_STREQ(a.name, b.name);
    EXPECT_EQ(a.dim, b.dim);
    EXPECT_EQ(a.rank, b.rank);
    EXPECT_EQ(a.damping, b.damping);
    EXPECT_STREQ(a.source, b.source);
  }
}

class BasisApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { layer_ = new Layer(make_layer(21)); }
  static void TearDownTestSuite() { delete layer_; }
  static Layer* layer_;
};
Layer* BasisApi::layer_ = nullptr;

TEST_F(BasisApi, FitsAndRoundTripsThroughBytesAndFiles) {
  const Layer& l = *layer_;
  const BasisPtr basis = fit(l, "layer.w");
  ASSERT_TRUE(basis);
  const giftBasisId id = giftBasisGetId(basis.get());
  EXPECT_FALSE(id.lo == 0 && id.hi == 0);
  ASSERT_EQ(giftBasisEntryCount(basis.get()), 1u);
  giftBasisEntryInfo e = GIFT_BASIS_ENTRY_INFO_INIT;
  ASSERT_EQ(giftBasisGetEntry(basis.get(), 0, &e), GIFT_OK);
  EXPECT_STREQ(e.name, "layer.w");
  EXPECT_EQ(e.dim, l.dim);
  EXPECT_EQ(e.rank, 32u);
  EXPECT_STREQ(e.source, "activations");

  void* bytes = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(giftBasisSerialize(basis.get(), 3, &bytes, &size), GIFT_OK);
  giftBasis* copy = nullptr;
  ASSERT_EQ(giftBasisFromBytes(bytes, size, &copy), GIFT_OK);
  giftFree(bytes);
  const BasisPtr from_bytes(copy, giftBasisFree);
  EXPECT_TRUE(same_id(giftBasisGetId(from_bytes.get()), id));
  expect_same_entries(basis.get(), from_bytes.get());

  const std::string path = ::testing::TempDir() + "public_api_test.giftb";
  ASSERT_EQ(giftBasisSave(basis.get(), path.c_str(), 0), GIFT_OK);
  giftBasis* loaded = nullptr;
  ASSERT_EQ(giftBasisLoad(path.c_str(), &loaded), GIFT_OK);
  const BasisPtr from_file(loaded, giftBasisFree);
  std::remove(path.c_str());
  EXPECT_TRUE(same_id(giftBasisGetId(from_file.get()), id));
  expect_same_entries(basis.get(), from_file.get());
}

// A matrix whose second moment is zero (a frozen or dead layer: no input reached it) is left
// out of the basis, so that the others are still fitted; it failed the whole fit before.
TEST_F(BasisApi, AZeroMomentIsLeftOutAndTheOthersFitted) {
  const Layer& l = *layer_;
  for (const int relative : {1, 0}) {
    giftFitParams fp = GIFT_FIT_PARAMS_INIT;
    fp.damping_relative = relative;
    giftBasisBuilder* raw = nullptr;
    ASSERT_EQ(giftBasisBuilderCreate(&fp, &raw), GIFT_OK);
    const std::unique_ptr<giftBasisBuilder, decltype(&giftBasisBuilderFree)> b(
        raw, giftBasisBuilderFree);
    std::vector<double> zero(l.a.size(), 0.0);
    double chosen = -1;
    ASSERT_EQ(giftBasisBuilderAdd(b.get(), "frozen", zero.data(), l.dim, "gradients", nullptr, 0,
                                  nullptr, 0, nullptr, &chosen),
              GIFT_OK)
        << giftGetLastErrorMessage();
    EXPECT_EQ(chosen, 0.0);
    ASSERT_EQ(giftBasisBuilderAdd(b.get(), "live", l.a.data(), l.dim, "gradients", nullptr, 0,
                                  nullptr, 0, nullptr, &chosen),
              GIFT_OK);
    EXPECT_EQ(chosen, fp.damping);
    EXPECT_EQ(giftBasisBuilderAdd(b.get(), "frozen", zero.data(), l.dim, "gradients", nullptr, 0,
                                  nullptr, 0, nullptr, nullptr),
              GIFT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(giftGetLastErrorMessage()).find("'frozen' added twice"),
              std::string::npos);
    // A zero diagonal with something off it is no second moment at all.
    zero[1] = zero[l.dim] = 1.0;
    EXPECT_EQ(giftBasisBuilderAdd(b.get(), "odd", zero.data(), l.dim, "gradients", nullptr, 0,
                                  nullptr, 0, nullptr, nullptr),
              GIFT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(giftGetLastErrorMessage()).find("not positive semi-definite"),
              std::string::npos);
    giftBasis* basis = nullptr;
    ASSERT_EQ(giftBasisBuilderFinish(b.get(), &basis), GIFT_OK);
    const BasisPtr owned(basis, giftBasisFree);
    ASSERT_EQ(giftBasisEntryCount(basis), 1u);
    uint64_t index = 0;
    EXPECT_EQ(giftBasisFindEntry(basis, "live", &index), GIFT_OK);
    EXPECT_EQ(giftBasisFindEntry(basis, "frozen", &index), GIFT_ERROR_NOT_FOUND);
    std::vector<float> w(l.w.begin(), l.w.begin() + 4 * l.dim);
    EXPECT_EQ(giftBasisWhiten(basis, "frozen", w.data(), 4, l.dim), GIFT_ERROR_BASIS_MISSING);
  }
}

TEST_F(BasisApi, WhitenThenUnwhitenIsTheIdentity) {
  const Layer& l = *layer_;
  const BasisPtr basis = fit(l, "layer.w");
  std::vector<float> w = l.w;
  ASSERT_EQ(giftBasisWhiten(basis.get(), "layer.w", w.data(), l.rows, l.dim), GIFT_OK);
  EXPECT_GT(rel_l2(l.w, w), 0.5);  // it did move the values
  ASSERT_EQ(giftBasisUnwhiten(basis.get(), "layer.w", w.data(), l.rows, l.dim), GIFT_OK);
  // fp32 round-off times T's condition number: sqrt(largest eigenvalue / damping), about 600.
  EXPECT_LT(rel_l2(l.w, w), 1e-3);
}

TEST_F(BasisApi, UnknownNameOrWidthIsBasisMissing) {
  const Layer& l = *layer_;
  const BasisPtr basis = fit(l, "layer.w");
  std::vector<float> w = l.w;
  EXPECT_EQ(giftBasisWhiten(basis.get(), "other.w", w.data(), l.rows, l.dim),
            GIFT_ERROR_BASIS_MISSING);
  EXPECT_TRUE(contains(giftGetLastErrorMessage(), "other.w"));
  EXPECT_EQ(giftBasisUnwhiten(basis.get(), "layer.w", w.data(), l.rows * 2, l.dim / 2),
            GIFT_ERROR_BASIS_MISSING);
  EXPECT_EQ(w, l.w);  // refused before touching the data
}

TEST_F(BasisApi, ChoiceOfCoordinatesPicksGiftWhereItHelps) {
  const Layer& l = *layer_;
  const BasisPtr basis = fit(l, "layer.w");
  const giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
  for (const giftCoordsMode_t mode : {GIFT_COORDS_MODE_GIFT, GIFT_COORDS_MODE_AUTO}) {
    giftSelectParams s = GIFT_SELECT_PARAMS_INIT;
    s.mode = mode;
    giftSelection sel = GIFT_SELECTION_INIT;
    ASSERT_EQ(giftChooseCoords(basis.get(), "layer.w", l.w.data(), l.rows, l.dim, &p, &s, &sel),
              GIFT_OK)
        << giftGetLastErrorMessage();
    EXPECT_EQ(sel.made, 1);
    EXPECT_EQ(sel.chosen, GIFT_COORDS_GIFT) << "mode " << mode << ": " << sel.reason;
    EXPECT_LT(sel.gift_error, sel.euclidean_error) << "mode " << mode;
    EXPECT_GT(sel.transform_flops, 0.0);
    EXPECT_STRNE(sel.reason, "");
  }
  // NULL select params are the defaults (AUTO), as a NULL context is (they were refused).
  giftSelection sel = GIFT_SELECTION_INIT;
  ASSERT_EQ(giftChooseCoords(basis.get(), "layer.w", l.w.data(), l.rows, l.dim, &p, nullptr, &sel),
            GIFT_OK)
      << giftGetLastErrorMessage();
  EXPECT_EQ(sel.chosen, GIFT_COORDS_GIFT);
  EXPECT_STREQ(sel.reason, "lower estimated error");
}

struct Frame {
  std::vector<uint8_t> bytes;
  giftSelection selection = GIFT_SELECTION_INIT;
  std::string reason;  // selection.reason dies with the writer
};

// "layer.w" in the coordinates AUTO picks, a 1-d "layer.b" (always Euclidean), the basis
// embedded when `embed`.
Frame write_frame(const Layer& l, const giftBasis* basis, bool embed) {
  giftFrameWriter* writer = nullptr;
  EXPECT_EQ(giftFrameWriterCreate(&writer), GIFT_OK);
  const giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
  const giftSelectParams s = GIFT_SELECT_PARAMS_INIT;
  Frame f;
  const uint64_t shape[2] = {l.rows, l.dim};
  EXPECT_EQ(giftFrameWriterAddTensorInBasis(writer, "layer.w", shape, 2, GIFT_DTYPE_F32, l.w.data(),
                                            &p, basis, &s, &f.selection),
            GIFT_OK)
      << giftGetLastErrorMessage();
  EXPECT_EQ(giftFrameWriterAddTensorInBasis(writer, "layer.b", &shape[1], 1, GIFT_DTYPE_F32,
                                            l.w.data(), &p, basis, &s, nullptr),
            GIFT_OK);
  if (embed) {
    EXPECT_EQ(giftFrameWriterEmbedBasis(writer, basis), GIFT_OK);
  }
  void* data = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(giftFrameWriterFinish(writer, &data, &size), GIFT_OK);
  f.reason = f.selection.reason;
  giftFrameWriterFree(writer);
  f.bytes.assign(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  giftFree(data);
  return f;
}

using FramePtr = std::unique_ptr<giftFrame, decltype(&giftFrameClose)>;

FramePtr open(const std::vector<uint8_t>& bytes) {
  giftFrame* f = nullptr;
  EXPECT_EQ(giftFrameOpen(bytes.data(), bytes.size(), &f), GIFT_OK) << giftGetLastErrorMessage();
  return FramePtr(f, giftFrameClose);
}

TEST_F(BasisApi, FrameInBasisDecodesWithTheEmbeddedOrAnExplicitBasis) {
  const Layer& l = *layer_;
  const BasisPtr basis = fit(l, "layer.w");
  const giftBasisId id = giftBasisGetId(basis.get());
  const Frame written = write_frame(l, basis.get(), true);
  EXPECT_EQ(written.selection.chosen, GIFT_COORDS_GIFT);
  const FramePtr frame = open(written.bytes);
  ASSERT_TRUE(frame);

  giftFrameInfo fi = GIFT_FRAME_INFO_INIT;
  ASSERT_EQ(giftFrameGetInfo(frame.get(), &fi), GIFT_OK);
  EXPECT_EQ(fi.kind, GIFT_FRAME_TENSORS);
  EXPECT_EQ(fi.tensor_count, 2u);
  EXPECT_EQ(fi.has_basis, 1);
  EXPECT_TRUE(same_id(fi.basis_id, id));
  EXPECT_EQ(fi.bytes, written.bytes.size());

  giftTensorInfo ti = GIFT_TENSOR_INFO_INIT;
  ASSERT_EQ(giftFrameTensorInfo(frame.get(), 0, &ti), GIFT_OK);
  EXPECT_STREQ(ti.name, "layer.w");
  EXPECT_EQ(ti.coords, GIFT_COORDS_GIFT);
  EXPECT_TRUE(same_id(ti.basis_id, id));
  EXPECT_EQ(ti.selection.made, 1);
  EXPECT_EQ(ti.selection.chosen, GIFT_COORDS_GIFT);
  EXPECT_EQ(ti.selection.gift_error, written.selection.gift_error);
  EXPECT_EQ(ti.selection.euclidean_error, written.selection.euclidean_error);
  EXPECT_EQ(ti.selection.reason, written.reason);
  EXPECT_EQ(ti.has_stats, 1);
  EXPECT_GT(ti.amax, 0.0f);
  EXPECT_GT(ti.rms, 0.0f);
  EXPECT_LE(ti.rms, ti.amax);
  EXPECT_EQ(ti.nonfinite_count, 0u);
  ASSERT_EQ(giftFrameTensorInfo(frame.get(), 1, &ti), GIFT_OK);
  EXPECT_EQ(ti.coords, GIFT_COORDS_EUCLIDEAN);
  EXPECT_TRUE(same_id(ti.basis_id, giftBasisId{0, 0}));

  const giftBasis* embedded = nullptr;
  ASSERT_EQ(giftFrameEmbeddedBasis(frame.get(), &embedded), GIFT_OK);
  ASSERT_NE(embedded, nullptr);
  EXPECT_TRUE(same_id(giftBasisGetId(embedded), id));

  const uint64_t bytes = l.w.size() * sizeof(float);
  std::vector<float> with_embedded(l.w.size()), with_explicit(l.w.size());
  ASSERT_EQ(giftFrameDecodeTensor(frame.get(), 0, with_embedded.data(), bytes, GIFT_DTYPE_F32),
            GIFT_OK);
  ASSERT_EQ(giftFrameDecodeTensorWithBasis(frame.get(), 0, basis.get(), with_explicit.data(), bytes,
                                           GIFT_DTYPE_F32),
            GIFT_OK);
  EXPECT_EQ(with_embedded, with_explicit);
  // Close to the input, and closer than plain FP8 of the same tensor.
  const giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
  const double euclidean =
      rel_l2(l.w, decode(p, encode(nullptr, p, l.w, l.rows, l.dim), l.rows, l.dim));
  const double error = rel_l2(l.w, with_embedded);
  EXPECT_LT(error, 0.05);
  EXPECT_LT(error, euclidean);

  EXPECT_EQ(giftFrameVerify(frame.get()), GIFT_OK) << giftGetLastErrorMessage();
}

// Whole-tensor decodes of one frame on several threads at once, the first of them parsing
// the embedded basis (which each thread once parsed into the same place: TSan's run of this
// test, scripts/sanitize.sh, saw the race).
TEST_F(BasisApi, FrameDecodesOnSeveralThreadsAtOnce) {
  const Layer& l = *layer_;
  const BasisPtr basis = fit(l, "layer.w");
  const Frame written = write_frame(l, basis.get(), true);
  ASSERT_EQ(written.selection.chosen, GIFT_COORDS_GIFT);
  const uint64_t bytes = l.w.size() * sizeof(float);
  std::vector<float> alone(l.w.size());
  ASSERT_EQ(
      giftFrameDecodeTensor(open(written.bytes).get(), 0, alone.data(), bytes, GIFT_DTYPE_F32),
      GIFT_OK);
  for (int round = 0; round < 4; ++round) {
    const FramePtr frame = open(written.bytes);
    std::vector<std::vector<float>> out(3, std::vector<float>(l.w.size()));
    std::vector<giftResult_t> results(out.size(), GIFT_ERROR_INTERNAL);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < out.size(); ++t) {
      threads.emplace_back([&, t] {
        results[t] = giftFrameDecodeTensor(frame.get(), 0, out[t].data(), bytes, GIFT_DTYPE_F32);
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t t = 0; t < out.size(); ++t) {
      EXPECT_EQ(results[t], GIFT_OK);
      EXPECT_EQ(out[t], alone);
    }
  }
}

// Rows past a tensor in GIFT coordinates are refused as past the Euclidean ones are, before
// the fp32 buffer of the band is made (which failed as out of memory for 2^40 rows).
TEST_F(BasisApi, RowsPastATensorInBasisAreRefusedBeforeAnyBuffer) {
  const Layer& l = *layer_;
  const BasisPtr basis = fit(l, "layer.w");
  const Frame written = write_frame(l, basis.get(), true);
  ASSERT_EQ(written.selection.chosen, GIFT_COORDS_GIFT);
  const FramePtr frame = open(written.bytes);
  // With room for the whole tensor (the buffer was made before the rows were checked), and
  // with room for one row (the rows were checked after the room, as rows * cols, which wraps).
  for (const uint64_t room : {uint64_t(l.w.size()), uint64_t(l.dim)}) {
    std::vector<uint16_t> band(room);
    for (const uint64_t rows : {uint64_t(1) << 40, uint64_t(l.rows), uint64_t(1) << 63}) {
      EXPECT_EQ(giftFrameDecodeRowsWithBasis(frame.get(), 0, 1, rows, basis.get(), band.data(),
                                             band.size() * 2, GIFT_DTYPE_BF16),
                GIFT_ERROR_INVALID_ARGUMENT);
      EXPECT_NE(
          std::string(giftGetLastErrorMessage()).find(std::to_string(rows) + " rows from row 1"),
          std::string::npos)
          << giftGetLastErrorMessage();
    }
  }
}

// The basis a frame embeds must be the one its tensors in GIFT coordinates are in: another
// one was written without an error into a frame that then failed to decode (BASIS_MISSING).
// Refused both ways round, naming the tensor and both ids; the writer stays usable.
TEST_F(BasisApi, EmbeddingAnotherBasisThanTheTensorsIsRefused) {
  const Layer& l = *layer_;
  const BasisPtr a = fit(l, "layer.w"), b = fit(make_layer(5), "layer.w");
  const std::string a_hex = hex(giftBasisGetId(a.get())), b_hex = hex(giftBasisGetId(b.get()));
  const giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
  giftSelectParams s = GIFT_SELECT_PARAMS_INIT;
  s.mode = GIFT_COORDS_MODE_GIFT;
  const uint64_t shape[2] = {l.rows, l.dim};
  const auto add = [&](giftFrameWriter* w, const char* name, const giftBasis* basis) {
    return giftFrameWriterAddTensorInBasis(w, name, shape, 2, GIFT_DTYPE_F32, l.w.data(), &p, basis,
                                           &s, nullptr);
  };
  const std::string refused = "is in basis " + a_hex + ", and the basis embedded is " + b_hex;
  for (const bool embed_first : {false, true}) {
    SCOPED_TRACE(embed_first ? "embedded first" : "tensor first");
    giftFrameWriter* w = nullptr;
    ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
    if (embed_first) {
      ASSERT_EQ(giftFrameWriterEmbedBasis(w, b.get()), GIFT_OK);
      EXPECT_EQ(add(w, "layer.w", a.get()), GIFT_ERROR_INVALID_ARGUMENT);
      ASSERT_EQ(giftFrameWriterEmbedBasis(w, a.get()), GIFT_OK);
      ASSERT_EQ(add(w, "layer.w", a.get()), GIFT_OK) << giftGetLastErrorMessage();
    } else {
      ASSERT_EQ(add(w, "layer.w", a.get()), GIFT_OK) << giftGetLastErrorMessage();
      EXPECT_EQ(giftFrameWriterEmbedBasis(w, b.get()), GIFT_ERROR_INVALID_ARGUMENT);
      ASSERT_EQ(giftFrameWriterEmbedBasis(w, a.get()), GIFT_OK);
    }
    void* data = nullptr;
    uint64_t size = 0;
    ASSERT_EQ(giftFrameWriterFinish(w, &data, &size), GIFT_OK);
    giftFrameWriterFree(w);
    const std::vector<uint8_t> bytes(static_cast<uint8_t*>(data),
                                     static_cast<uint8_t*>(data) + size);
    giftFree(data);
    std::vector<float> out(l.w.size());
    EXPECT_EQ(
        giftFrameDecodeTensor(open(bytes).get(), 0, out.data(), out.size() * 4, GIFT_DTYPE_F32),
        GIFT_OK)
        << giftGetLastErrorMessage();
  }
  giftFrameWriter* w = nullptr;
  ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  ASSERT_EQ(add(w, "layer.w", a.get()), GIFT_OK);
  EXPECT_EQ(giftFrameWriterEmbedBasis(w, b.get()), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("tensor 'layer.w' " + refused),
            std::string::npos)
      << giftGetLastErrorMessage();
  giftFrameWriterFree(w);
}

// One alignment rule for every decode of a frame, as giftDecode's: only FP8 tensors in
// Euclidean coordinates refused a misaligned dst (with giftDecode's message, naming neither
// frame nor tensor); raw and whitened ones took it.
TEST_F(BasisApi, AMisalignedOutputIsRefusedForEveryTensorAlike) {
  const Layer& l = *layer_;
  const BasisPtr basis = fit(l, "layer.w");
  const Frame written = write_frame(l, basis.get(), true);  // layer.w whitened, layer.b raw
  const FramePtr frame = open(written.bytes);
  std::vector<float> room(l.w.size() + 1);
  char* odd = reinterpret_cast<char*>(room.data()) + 2;
  for (const uint64_t index : {0, 1}) {
    giftTensorInfo ti = GIFT_TENSOR_INFO_INIT;
    ASSERT_EQ(giftFrameTensorInfo(frame.get(), index, &ti), GIFT_OK);
    EXPECT_EQ(giftFrameDecodeTensor(frame.get(), index, odd, ti.elements * 4, GIFT_DTYPE_F32),
              GIFT_ERROR_INVALID_ARGUMENT)
        << ti.name;
    EXPECT_NE(std::string(giftGetLastErrorMessage())
                  .find("tensor '" + std::string(ti.name) +
                        "': dst is not aligned to its 4-byte elements"),
              std::string::npos)
        << giftGetLastErrorMessage();
    EXPECT_EQ(giftFrameDecodeTensor(frame.get(), index, odd, ti.elements * 2, GIFT_DTYPE_BF16),
              GIFT_OK)
        << ti.name << ": 2-byte elements at an even address";
  }
}

TEST_F(BasisApi, AnotherBasisIsRefusedNamingBothIds) {
  const Layer& l = *layer_;
  const BasisPtr basis = fit(l, "layer.w");
  const BasisPtr other = fit(make_layer(22), "layer.w");
  ASSERT_FALSE(same_id(giftBasisGetId(basis.get()), giftBasisGetId(other.get())));
  const Frame written = write_frame(l, basis.get(), false);
  const FramePtr frame = open(written.bytes);
  std::vector<float> out(l.w.size());
  const uint64_t bytes = out.size() * sizeof(float);
  EXPECT_EQ(giftFrameDecodeTensor(frame.get(), 0, out.data(), bytes, GIFT_DTYPE_F32),
            GIFT_ERROR_BASIS_MISSING);  // not embedded, none given
  EXPECT_EQ(giftFrameDecodeTensorWithBasis(frame.get(), 0, other.get(), out.data(), bytes,
                                           GIFT_DTYPE_F32),
            GIFT_ERROR_BASIS_MISSING);
  const std::string message = giftGetLastErrorMessage();
  EXPECT_TRUE(contains(message, hex(giftBasisGetId(basis.get())))) << message;
  EXPECT_TRUE(contains(message, hex(giftBasisGetId(other.get())))) << message;
  // The Euclidean tensor needs no basis.
  EXPECT_EQ(giftFrameDecodeTensorWithBasis(frame.get(), 1, other.get(), out.data(),
                                           l.dim * sizeof(float), GIFT_DTYPE_F32),
            GIFT_OK);
}

TEST_F(BasisApi, VerifyAgreesWithDecode) {
  const Layer& l = *layer_;
  const BasisPtr basis = fit(l, "layer.w");
  std::vector<uint8_t> bytes = write_frame(l, basis.get(), true).bytes;
  uint64_t codes_at = 0;
  {
    const FramePtr frame = open(bytes);
    const uint8_t* codes = nullptr;
    const void* scales = nullptr;
    uint64_t scale_bytes = 0;
    ASSERT_EQ(giftFrameTensorData(frame.get(), 0, &codes, &scales, &scale_bytes), GIFT_OK);
    codes_at = uint64_t(codes - bytes.data());
  }
  bytes[codes_at + 100] ^= 1;  // one code of layer.w, which its checksum must catch
  const FramePtr frame = open(bytes);
  std::vector<float> out(l.w.size());
  const giftResult_t decoded =
      giftFrameDecodeTensor(frame.get(), 0, out.data(), out.size() * sizeof(float), GIFT_DTYPE_F32);
  EXPECT_EQ(decoded, GIFT_ERROR_SECTION_CHECKSUM);
  EXPECT_EQ(giftFrameVerify(frame.get()), decoded);
}

}  // namespace
