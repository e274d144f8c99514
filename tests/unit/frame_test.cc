// GIFT frames: round trips through the writer and reader, and rejection of every kind of
// damaged or hostile frame with its own error code and a message naming the field.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cfenv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "container/census.h"
#include "container/layout.h"
#include "gift/gift.h"
#include "gift/gift_basis.h"
#include "gift_generated.h"
#include "numerics/codec.h"
#include "numerics/elementwise.h"
#include "unit/cpu_limit.h"
#include "unit/edited.h"
#include "unit/finished_frame.h"
#include "unit/random_values.h"

namespace {

namespace fb = gift::fb;
using gift::container::kPreambleBytes;

giftQuantParams params(giftFp8Kind_t kind, giftScaleLayout_t layout) {
  giftQuantParams p;
  giftQuantParamsInit(&p);
  p.kind = kind;
  p.layout = layout;
  return p;
}

struct Built {
  std::vector<uint8_t> bytes;
};

// A frame with an FP8 tensor, a raw 1-D tensor, an empty tensor and a scalar.
std::vector<uint8_t> sample_frame(int zstd = 0) {
  giftFrameWriter* w = nullptr;
  EXPECT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  giftFrameWriterSetCompression(w, zstd);
  giftFrameWriterAddMetadata(w, "step", "100");
  const std::vector<float> a = values(40 * 300, 1), bias = values(300, 2), one = {3.5f};
  const uint64_t sa[] = {40, 300}, sb[] = {300}, se[] = {0, 7};
  giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "layers.0.weight", sa, 2, GIFT_DTYPE_F32, a.data(), &p),
            GIFT_OK);
  EXPECT_EQ(
      giftFrameWriterAddTensor(w, "layers.0.bias", sb, 1, GIFT_DTYPE_F32, bias.data(), nullptr),
      GIFT_OK);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "empty", se, 2, GIFT_DTYPE_F32, nullptr, &p), GIFT_OK);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "scalar", nullptr, 0, GIFT_DTYPE_F32, one.data(), &p),
            GIFT_OK);
  return finished_frame(w);
}

giftResult_t open_result(const std::vector<uint8_t>& f, std::string* message = nullptr) {
  giftFrame* frame = nullptr;
  const giftResult_t r = giftFrameOpen(f.data(), f.size(), &frame);
  if (message) *message = giftGetLastErrorMessage();
  giftFrameClose(frame);
  return r;
}

std::vector<float> decode(giftFrame* f, uint64_t i) {
  giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
  EXPECT_EQ(giftFrameTensorInfo(f, i, &info), GIFT_OK);
  std::vector<float> out(info.elements);
  EXPECT_EQ(giftFrameDecodeTensor(f, i, out.data(), out.size() * 4, GIFT_DTYPE_F32), GIFT_OK)
      << giftGetLastErrorMessage();
  return out;
}

TEST(Frame, RoundTripMatchesTheCodecAndKeepsRawDataExact) {
  for (int zstd : {0, 3}) {
    const std::vector<uint8_t> bytes = sample_frame(zstd);
    giftFrame* f = nullptr;
    ASSERT_EQ(giftFrameOpen(bytes.data(), bytes.size(), &f), GIFT_OK) << giftGetLastErrorMessage();
    ASSERT_EQ(giftFrameTensorCount(f), 4u);
    giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
    ASSERT_EQ(giftFrameTensorInfo(f, 0, &info), GIFT_OK);
    EXPECT_STREQ(info.name, "layers.0.weight");
    EXPECT_EQ(info.ndim, 2u);
    EXPECT_EQ(info.shape[1], 300u);
    EXPECT_EQ(info.params.block, 128u);
    EXPECT_EQ(info.raw_bytes, 40u * 300 + 40 * 3 * 4);
    if (zstd) {
      EXPECT_LT(info.stored_bytes, info.raw_bytes);
    }

    // FP8 tensor: the codec's own decode of the same encode.
    const std::vector<float> a = values(40 * 300, 1);
    giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK);
    std::vector<uint8_t> codes(a.size());
    std::vector<float> scales(120), want(a.size());
    ASSERT_EQ(giftEncode(nullptr, &p, a.data(), GIFT_DTYPE_F32, 40, 300, codes.data(),
                         scales.data(), 480, nullptr),
              GIFT_OK);
    ASSERT_EQ(giftDecode(nullptr, &p, codes.data(), scales.data(), 480, 40, 300, want.data(),
                         GIFT_DTYPE_F32),
              GIFT_OK);
    const std::vector<float> got = decode(f, 0);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4));

    uint64_t idx = 99;
    ASSERT_EQ(giftFrameFindTensor(f, "layers.0.bias", &idx), GIFT_OK);
    ASSERT_EQ(giftFrameTensorInfo(f, idx, &info), GIFT_OK);
    EXPECT_EQ(info.raw, 1);
    const std::vector<float> bias = values(300, 2);
    const std::vector<float> b = decode(f, idx);
    EXPECT_EQ(0, std::memcmp(b.data(), bias.data(), bias.size() * 4));

    EXPECT_EQ(decode(f, 2).size(), 0u);
    const std::vector<float> s = decode(f, 3);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0], 3.5f);  // 3.5 is exact in E4M3 with scale 3.5/448
    EXPECT_EQ(giftFrameFindTensor(f, "nope", &idx), GIFT_ERROR_NOT_FOUND);
    EXPECT_EQ(giftFrameVerify(f), GIFT_OK);
    giftFrameClose(f);
  }
}

// A 0-d tensor's shape is an empty vector, which FlatBuffers builders leave unaligned (its
// data pointer is where its length word ends): frames with one read back whatever the layout.
// Names of 1 to 16 bytes move the vector through every offset; the test checks that some
// frames had it off an 8-byte boundary, the case a reader once refused as misaligned.
// A FIFO is refused at once, not waited on: open(2) of one without a writer blocked until a
// writer came.
TEST(Frame, OpeningAFifoIsRefusedWithoutWaiting) {
  char dir[] = "/tmp/gift-fifo-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string fifo = std::string(dir) + "/f.gift";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  giftFrame* f = nullptr;
  EXPECT_EQ(giftFrameOpenFile(fifo.c_str(), &f), GIFT_ERROR_IO);
  EXPECT_EQ(std::string(giftGetLastErrorMessage()), fifo + ": not a regular file");
  giftBasis* b = nullptr;
  EXPECT_EQ(giftBasisLoad(fifo.c_str(), &b), GIFT_ERROR_IO);
  ::unlink(fifo.c_str());
  ::rmdir(dir);
}

TEST(Frame, ScalarsReadBackWhereverTheirEmptyShapeLands) {
  const std::vector<float> grad = values(20 * 15 * 5, 4);
  const uint64_t sg[] = {20, 15, 5};
  int unaligned = 0;
  for (size_t len = 1; len <= 16; ++len) {
    for (bool fp8 : {true, false}) {
      giftFrameWriter* w = nullptr;
      ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
      giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK);
      ASSERT_EQ(giftFrameWriterAddTensor(w, "grad", sg, 3, GIFT_DTYPE_F32, grad.data(), &p),
                GIFT_OK);
      const std::string name(len, 'l');
      const float one = 3.5f;
      ASSERT_EQ(giftFrameWriterAddTensor(w, name.c_str(), nullptr, 0, GIFT_DTYPE_F32, &one,
                                         fp8 ? &p : nullptr),
                GIFT_OK);
      const std::vector<uint8_t> bytes = finished_frame(w);
      const uint8_t* header = bytes.data() + kPreambleBytes;
      const fb::Tensor* t = fb::GetFrame(header)->tensors()->Get(1);
      ASSERT_EQ(t->name()->str(), name);
      ASSERT_EQ(t->shape()->size(), 0u);
      unaligned += (reinterpret_cast<const uint8_t*>(t->shape()->Data()) - header) % 8 != 0;

      giftFrame* f = nullptr;
      ASSERT_EQ(giftFrameOpen(bytes.data(), bytes.size(), &f), GIFT_OK)
          << "name of " << len << " bytes: " << giftGetLastErrorMessage();
      const std::vector<float> s = decode(f, 1);
      ASSERT_EQ(s.size(), 1u);
      EXPECT_EQ(s[0], 3.5f);
      EXPECT_EQ(giftFrameVerify(f), GIFT_OK);
      giftFrameClose(f);
    }
  }
  EXPECT_GT(unaligned, 0);
}

// The reader hashes sections in 4 MiB pieces, each mapped ahead: the same hash as one call
// at every size around the pieces' boundaries, from an unaligned start.
TEST(Frame, PiecewiseChecksumEqualsTheOneCallHash) {
  std::vector<uint8_t> bytes((uint64_t(9) << 20) + 3);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 2654435761u >> 13);
  for (uint64_t n :
       {uint64_t(0), uint64_t(1), uint64_t(4) << 20, (uint64_t(4) << 20) + 1, uint64_t(9) << 20}) {
    EXPECT_EQ(gift::container::checksum64_mapped(bytes.data() + 3, n),
              gift::container::checksum64(bytes.data() + 3, n))
        << n;
  }
}

TEST(Frame, SectionsAreAlignedAndTheLayoutIsAsSpecified) {
  const std::vector<uint8_t> bytes = sample_frame();
  EXPECT_EQ(0, std::memcmp(bytes.data(), "\x89GFT\r\n\x1a\n", 8));
  const gift::container::Preamble pre = gift::container::read_preamble(bytes.data());
  EXPECT_EQ(pre.major, GIFT_FORMAT_MAJOR);
  EXPECT_EQ(pre.minor, GIFT_FORMAT_MINOR);
  EXPECT_EQ(pre.frame_length, bytes.size());
  const fb::Frame* h = fb::GetFrame(bytes.data() + kPreambleBytes);
  ASSERT_TRUE(fb::FrameBufferHasIdentifier(bytes.data() + kPreambleBytes));
  for (const fb::Tensor* t : *h->tensors()) {
    for (const fb::Section* s : {t->codes(), t->scales()}) {
      if (!s) continue;
      EXPECT_EQ(s->offset() % 64, 0u);
      EXPECT_GE(s->offset(), kPreambleBytes + pre.header_length);
      EXPECT_LE(s->offset() + s->stored_length(), bytes.size());
    }
  }
}

TEST(Frame, FilesAreMappedAndWrittenAtomically) {
  char dir[] = "/tmp/gift_frame_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/t.gift";
  giftFrameWriter* w = nullptr;
  giftFrameWriterCreate(&w);
  const std::vector<float> a = values(1000, 3);
  const uint64_t shape[] = {1000};
  giftQuantParams p = params(GIFT_FP8_E5M2, GIFT_SCALE_TENSOR);
  ASSERT_EQ(giftFrameWriterAddTensor(w, "g", shape, 1, GIFT_DTYPE_F32, a.data(), &p), GIFT_OK);
  ASSERT_EQ(giftFrameWriterWriteFile(w, path.c_str()), GIFT_OK) << giftGetLastErrorMessage();
  // A folder that does not exist: an I/O error.
  const std::string bad = std::string(dir) + "/missing/t.gift";
  EXPECT_EQ(giftFrameWriterWriteFile(w, bad.c_str()), GIFT_ERROR_IO);
  // The final rename fails (the name is a folder): the temporary file is removed again.
  const std::string blocked = std::string(dir) + "/blocked.gift";
  ASSERT_EQ(mkdir(blocked.c_str(), 0700), 0);
  EXPECT_EQ(giftFrameWriterWriteFile(w, blocked.c_str()), GIFT_ERROR_IO);
  ASSERT_EQ(rmdir(blocked.c_str()), 0);
  giftFrameWriterFree(w);
  giftFrame* f = nullptr;
  ASSERT_EQ(giftFrameOpenFile(path.c_str(), &f), GIFT_OK) << giftGetLastErrorMessage();
  EXPECT_EQ(decode(f, 0).size(), 1000u);
  giftFrameClose(f);
  EXPECT_EQ(giftFrameOpenFile((std::string(dir) + "/none.gift").c_str(), &f), GIFT_ERROR_IO);
  std::remove(path.c_str());
  EXPECT_EQ(rmdir(dir), 0) << "a temporary file was left behind";
}

TEST(Frame, UncompressedCodesAreUsedInPlace) {
  const std::vector<uint8_t> bytes = sample_frame(0);
  giftFrame* f = nullptr;
  ASSERT_EQ(giftFrameOpen(bytes.data(), bytes.size(), &f), GIFT_OK);
  const uint8_t* codes = nullptr;
  const void* scales = nullptr;
  uint64_t scale_bytes = 0;
  ASSERT_EQ(giftFrameTensorData(f, 0, &codes, &scales, &scale_bytes), GIFT_OK);
  EXPECT_GE(codes, bytes.data());
  EXPECT_LT(codes, bytes.data() + bytes.size());
  EXPECT_EQ((codes - bytes.data()) % 64, 0);
  EXPECT_EQ(scale_bytes, 480u);
  // Decoding the in-place data gives the frame's decode.
  giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
  giftFrameTensorInfo(f, 0, &info);
  std::vector<float> direct(info.elements);
  ASSERT_EQ(giftDecode(nullptr, &info.params, codes, scales, scale_bytes, 40, 300, direct.data(),
                       GIFT_DTYPE_F32),
            GIFT_OK);
  const std::vector<float> via = decode(f, 0);
  EXPECT_EQ(0, std::memcmp(direct.data(), via.data(), via.size() * 4));
  EXPECT_EQ(giftFrameTensorData(f, 1, &codes, &scales, &scale_bytes), GIFT_ERROR_INVALID_ARGUMENT);
  giftFrameClose(f);
  const std::vector<uint8_t> z = sample_frame(3);
  ASSERT_EQ(giftFrameOpen(z.data(), z.size(), &f), GIFT_OK);
  EXPECT_EQ(giftFrameTensorData(f, 0, &codes, &scales, &scale_bytes), GIFT_ERROR_INVALID_ARGUMENT);
  giftFrameClose(f);
}

// One tensor per code path of the threaded codec (block runs, a tensor scale split across
// threads, groups spread over threads, tiles), large enough that each path has work for
// several threads; the ThreadSanitizer job runs this test too (scripts/sanitize.sh).
std::vector<uint8_t> threaded_frame(int threads) {
  giftFrameWriter* w = nullptr;
  EXPECT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  EXPECT_EQ(giftFrameWriterSetThreads(w, threads), GIFT_OK);
  const std::vector<float> a = values(512 * 1024, 5);
  const uint64_t shape[] = {512, 1024};
  int i = 0;
  for (const giftScaleLayout_t layout :
       {GIFT_SCALE_BLOCK, GIFT_SCALE_TENSOR, GIFT_SCALE_ROW, GIFT_SCALE_TILE}) {
    giftQuantParams p = params(GIFT_FP8_E4M3, layout);
    p.rounding = layout == GIFT_SCALE_ROW ? GIFT_ROUND_STOCHASTIC : GIFT_ROUND_NEAREST;
    const std::string name = "t" + std::to_string(i++);
    EXPECT_EQ(giftFrameWriterAddTensor(w, name.c_str(), shape, 2, GIFT_DTYPE_F32, a.data(), &p),
              GIFT_OK)
        << giftGetLastErrorMessage();
  }
  return finished_frame(w);
}

TEST(Frame, ThreadsChangeNeitherTheBytesNorTheDecodedValues) {
  const std::vector<uint8_t> one = threaded_frame(1);
  EXPECT_EQ(threaded_frame(2), one);
  EXPECT_EQ(threaded_frame(0), one);
  giftFrame* f = nullptr;
  ASSERT_EQ(giftFrameOpen(one.data(), one.size(), &f), GIFT_OK) << giftGetLastErrorMessage();
  ASSERT_EQ(giftFrameSetThreads(f, 1), GIFT_OK);
  std::vector<std::vector<float>> serial;
  for (uint64_t i = 0; i < giftFrameTensorCount(f); ++i) serial.push_back(decode(f, i));
  for (const int threads : {2, 0}) {
    ASSERT_EQ(giftFrameSetThreads(f, threads), GIFT_OK);
    for (uint64_t i = 0; i < giftFrameTensorCount(f); ++i) {
      EXPECT_EQ(0, std::memcmp(decode(f, i).data(), serial[i].data(), serial[i].size() * 4))
          << "tensor " << i << " threads " << threads;
    }
    EXPECT_EQ(giftFrameVerify(f), GIFT_OK) << giftGetLastErrorMessage();
  }
  giftFrameClose(f);
}

// The statistics in the header (rms, amax) are computed in the standard FP environment: a
// caller rounding otherwise writes the same bytes.
TEST(Frame, TheCallersRoundingModeDoesNotChangeTheBytes) {
  const std::vector<float> a = values(40 * 300, 1), bias = values(300, 2);
  const uint64_t sa[] = {40, 300}, sb[] = {300};
  const giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK);
  const auto frame = [&] {
    giftFrameWriter* w = nullptr;
    EXPECT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
    EXPECT_EQ(giftFrameWriterAddTensor(w, "a", sa, 2, GIFT_DTYPE_F32, a.data(), &p), GIFT_OK);
    EXPECT_EQ(giftFrameWriterAddTensor(w, "bias", sb, 1, GIFT_DTYPE_F32, bias.data(), nullptr),
              GIFT_OK);
    return finished_frame(w);
  };
  const std::vector<uint8_t> nearest = frame();
  for (int mode : {FE_DOWNWARD, FE_UPWARD, FE_TOWARDZERO}) {
    ASSERT_EQ(std::fesetround(mode), 0);
    const std::vector<uint8_t> other = frame();
    std::fesetround(FE_TONEAREST);
    EXPECT_TRUE(other == nearest) << "rounding mode " << mode;
  }
}

// FORMAT.md 2.2's statistics of values v, spelled out element by element: the squares of
// the finite ones in lane i mod 8, folded pairwise into the sum at every multiple of 4096
// (a last partial chunk's lanes left unfolded), their count and largest magnitude, and the
// non-finite ones' count and first index.
double fold(const double (&l)[8]) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

struct RuleSums {
  double lanes[8] = {}, sum = 0;
  uint64_t finite = 0, nonfinite = 0, first_nonfinite = UINT64_MAX;
  float amax = 0;
  // The header's rms: the chunks' folded sums and the last partial chunk's lanes, over the finite.
  float rms() const { return float(std::sqrt((sum + fold(lanes)) / double(finite))); }
};

RuleSums rule_sums(const std::vector<float>& v) {
  RuleSums r;
  for (uint64_t i = 0; i < v.size(); ++i) {
    if (std::isfinite(v[i])) {
      r.lanes[i % 8] += double(v[i]) * double(v[i]);
      ++r.finite;
      r.amax = std::max(r.amax, std::fabs(v[i]));
    } else if (r.nonfinite++ == 0) {
      r.first_nonfinite = i;
    }
    if ((i + 1) % 4096 == 0) {
      r.sum += fold(r.lanes);
      std::fill(r.lanes, r.lanes + 8, 0.0);
    }
  }
  return r;
}

// x as a tensor of `dtype`: the 16-bit patterns of bf16 and fp16 (rounded to nearest even),
// the values those hold, and the data to hand over (x itself for fp32).
struct AsStored {
  std::vector<uint16_t> half;
  std::vector<float> v;
  const void* data;
  AsStored(const std::vector<float>& x, giftDType_t dtype) : half(x.size()), v(x) {
    namespace num = gift::num;
    for (size_t i = 0; i < x.size() && dtype != GIFT_DTYPE_F32; ++i) {
      half[i] = dtype == GIFT_DTYPE_BF16 ? num::bf16_from_float(x[i]) : num::f16_from_float(x[i]);
      v[i] = dtype == GIFT_DTYPE_BF16 ? num::bf16_to_float(half[i]) : num::f16_to_float(half[i]);
    }
    data = dtype == GIFT_DTYPE_F32 ? static_cast<const void*>(x.data()) : half.data();
  }
};

// Tensor.stats by their rule (FORMAT.md 2.2), computed here independently (rule_sums, and
// the last chunk's lanes folded in); NaN and Inf counted apart wherever they fall (every
// lane, both ends of chunks, a whole chunk), for FP8 and lossless tensors of every input
// type, and for values all finite; written whole, and in bands through a scratch folder
// (where the statistics of all-finite pieces take the encoder's amax).
TEST(Frame, StatisticsFollowTheirRuleAroundNonFiniteValues) {
  const uint64_t rows = 4, cols = 5001, n = rows * cols, shape[] = {rows, cols};
  std::vector<float> x = values(n, 7);
  std::vector<uint64_t> bad = {0, 4095, 4096, 8191, 8192, n - 1};
  for (uint64_t i = 0; i < 8; ++i) bad.push_back(100 + 9 * i);
  for (uint64_t i = 12288; i < 16384; ++i) bad.push_back(i);
  const float specials[] = {std::nanf(""), INFINITY, -INFINITY};
  for (size_t k = 0; k < bad.size(); ++k) x[bad[k]] = specials[k % 3];
  giftQuantParams keep = params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK);
  keep.nonfinite = GIFT_NONFINITE_KEEP;
  const std::string scratch = ::testing::TempDir();
  const std::vector<float> with_bad = x, clean = values(n, 8);
  for (const bool banded : {false, true})
    for (const bool all_finite : {false, true})
      for (const giftDType_t dtype : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16}) {
        x = all_finite ? clean : with_bad;
        const AsStored stored(x, dtype);
        const void* data = stored.data;
        const RuleSums want = rule_sums(stored.v);
        giftFrameWriter* w = nullptr;
        ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
        if (banded) {
          ASSERT_EQ(giftFrameWriterSetScratchDir(w, scratch.c_str()), GIFT_OK);
        }
        ASSERT_EQ(giftFrameWriterAddTensor(w, "fp8", shape, 2, dtype, data, &keep), GIFT_OK)
            << giftGetLastErrorMessage();
        ASSERT_EQ(giftFrameWriterAddTensor(w, "raw", shape, 2, dtype, data, nullptr), GIFT_OK);
        const std::vector<uint8_t> bytes = finished_frame(w);
        giftFrame* f = nullptr;
        ASSERT_EQ(giftFrameOpen(bytes.data(), bytes.size(), &f), GIFT_OK);
        for (uint64_t t = 0; t < 2; ++t) {
          giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
          ASSERT_EQ(giftFrameTensorInfo(f, t, &info), GIFT_OK);
          ASSERT_TRUE(info.has_stats);
          const std::string at = "dtype " + std::to_string(dtype) + " tensor " + std::to_string(t) +
                                 (banded ? ", banded" : "") + (all_finite ? ", all finite" : "");
          EXPECT_EQ(info.rms, want.rms()) << at;
          EXPECT_EQ(info.amax, want.amax) << at;
          EXPECT_EQ(info.nonfinite_count, want.nonfinite) << at;
        }
        giftFrameClose(f);
      }
}

// The statistics whose census the encoder takes beside its codes (a frame written in bands,
// rows of whole blocks of 16-bit sources and of small fp32 blocks, on AVX-512; elsewhere the
// writer sums them after) against their rule: every block size the encoder batches, both
// scale types, blocks of zeros (a batch with a zero scale), under every instruction set, and
// written whole (the census on its own). Census.ChunksTakenWithTheCodesFollowTheRuleBitForBit
// checks the doubles.
TEST(Frame, StatisticsTakenWithTheCodesFollowTheirRule) {
  const uint64_t rows = 9, cols = 4096, n = rows * cols, shape[] = {rows, cols};
  std::vector<float> x = values(n, 11);
  std::fill(x.begin() + 5000, x.begin() + 5256, 0.0f);
  const std::string scratch = ::testing::TempDir();
  const CpuLimitLifted lifted;
  std::istringstream targets(giftCpuTargetNames());
  for (std::string target; targets >> target;) {
    ASSERT_EQ(giftCpuLimitTarget(target.c_str()), GIFT_OK);
    for (const giftDType_t dtype : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16}) {
      const AsStored stored(x, dtype);
      const void* data = stored.data;
      const RuleSums want = rule_sums(stored.v);
      for (const uint32_t block : {16u, 32u, 64u, 128u})
        for (const giftScaleDType_t scale_dtype : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0})
          for (const bool banded : {false, true}) {
            giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK);
            p.block = block;
            p.scale_dtype = scale_dtype;
            giftFrameWriter* w = nullptr;
            ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
            if (banded) {
              ASSERT_EQ(giftFrameWriterSetScratchDir(w, scratch.c_str()), GIFT_OK);
            }
            ASSERT_EQ(giftFrameWriterAddTensor(w, "t", shape, 2, dtype, data, &p), GIFT_OK)
                << giftGetLastErrorMessage();
            const std::vector<uint8_t> bytes = finished_frame(w);
            giftFrame* f = nullptr;
            ASSERT_EQ(giftFrameOpen(bytes.data(), bytes.size(), &f), GIFT_OK);
            giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
            ASSERT_EQ(giftFrameTensorInfo(f, 0, &info), GIFT_OK);
            giftFrameClose(f);
            ASSERT_TRUE(info.has_stats);
            EXPECT_EQ(info.rms, want.rms())
                << target << " dtype " << dtype << " block " << block << " scale dtype "
                << scale_dtype << (banded ? " banded" : "");
            EXPECT_EQ(info.amax, want.amax);
          }
    }
  }
}

// The census the encoder takes beside its codes (BandOrigin::census) against the rule on its
// doubles, bit for bit: each chunk's eight lanes from zero, element i into lane i mod 8 in
// order, lane 0's values 2^12 times the others' so that an order shows in the last bits. Two
// threads and several tasks, rows of whole blocks and rows that are not (a run per row, whose
// chunks are taken only where a row starts at a multiple of 4096), every block size the encoder
// batches, fp32 and 16-bit sources, both scale types, under every instruction set; where the
// AVX-512 encoder batches small blocks of rows that are whole blocks, it takes every chunk.
TEST(Census, ChunksTakenWithTheCodesFollowTheRuleBitForBit) {
  using gift::container::Census;
  const CpuLimitLifted lifted;
  giftCtx* raw = nullptr;
  ASSERT_EQ(giftCtxCreate(&raw), GIFT_OK);
  const std::unique_ptr<giftCtx, decltype(&giftCtxFree)> ctx(raw, giftCtxFree);
  ASSERT_EQ(giftCtxSetThreads(ctx.get(), 2), GIFT_OK);
  const uint64_t rows = 40;
  std::istringstream targets(giftCpuTargetNames());
  for (std::string target; targets >> target;) {
    ASSERT_EQ(giftCpuLimitTarget(target.c_str()), GIFT_OK);
    for (const uint64_t cols : {uint64_t(4096), uint64_t(4100)}) {
      const uint64_t n = rows * cols, chunks = n / Census::kChunk;
      std::vector<float> x = values(n, 5);
      for (uint64_t i = 0; i < n; i += 8) x[i] *= 4096.0f;
      for (const giftDType_t dtype : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16, GIFT_DTYPE_F16}) {
        const AsStored stored(x, dtype);
        const void* data = stored.data;
        std::vector<double> want(chunks * 8, 0.0);
        for (uint64_t i = 0; i < chunks * Census::kChunk; ++i)
          want[i / Census::kChunk * 8 + i % 8] += double(stored.v[i]) * double(stored.v[i]);
        for (const uint32_t block : {16u, 32u, 64u, 128u})
          for (const giftScaleDType_t scale_dtype : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
            giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
            p.block = block;
            p.scale_dtype = scale_dtype;
            uint64_t scale_bytes = 0;
            ASSERT_EQ(giftScaleBytes(&p, rows, cols, &scale_bytes), GIFT_OK);
            std::vector<uint8_t> codes(n), scales(scale_bytes), done(chunks, 0);
            std::vector<double> lanes(chunks * 8, -1.0);
            gift::BandOrigin origin;
            origin.census = reinterpret_cast<double(*)[8]>(lanes.data());
            origin.census_done = done.data();
            giftEncodeStats st;
            ASSERT_EQ(gift::encode_tensor(ctx.get(), p, data, dtype, rows, cols, codes.data(),
                                          scales.data(), &st, origin),
                      GIFT_OK);
            const std::string at = target + " cols " + std::to_string(cols) + " dtype " +
                                   std::to_string(dtype) + " block " + std::to_string(block) +
                                   " scale dtype " + std::to_string(scale_dtype);
            uint64_t taken = 0;
            for (uint64_t c = 0; c < chunks; ++c) {
              ASSERT_LE(done[c], 1) << at;
              if (!done[c]) continue;
              ++taken;
              for (int l = 0; l < 8; ++l)
                ASSERT_EQ(lanes[c * 8 + l], want[c * 8 + l])
                    << at << " chunk " << c << " lane " << l;
            }
            const bool small = block * (dtype == GIFT_DTYPE_F32 ? 4 : 2) <= 256;
            if (target == "AVX3" && small && cols % block == 0) {
              EXPECT_EQ(taken, chunks) << at;
            }
            if (cols % block) {
              EXPECT_LE(taken, 1u) << at;  // row 0's first chunk alone
            }
          }
      }
    }
  }
}

// The writer's census against FORMAT.md's rule spelled out element by element, compared bit
// for bit on its doubles (the header's float rms hides most errors of order): lanes of very
// different magnitudes (lane 0's values 2^12 times the others', so that the fold's order shows
// in the last bits), a NaN and an Inf, and the tensor cut into pieces at offsets that are not
// multiples of 8 and across chunk boundaries, with and without the encoder's amax.
TEST(Census, SumsFollowTheRuleBitForBitHoweverTheTensorIsCut) {
  namespace num = gift::num;
  using gift::container::Census;
  const size_t n = 3 * 4096 + 123;
  std::vector<float> x = values(n, 7);
  for (size_t i = 0; i < n; i += 8) x[i] *= 4096.0f;
  x[100] = std::nanf("");
  x[5000] = -INFINITY;
  std::vector<uint16_t> half(n);
  for (size_t i = 0; i < n; ++i) half[i] = num::bf16_from_float(x[i]);
  for (giftDType_t dtype : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16}) {
    const auto value = [&](size_t i) {
      return dtype == GIFT_DTYPE_F32 ? x[i] : num::bf16_to_float(half[i]);
    };
    const auto at = [&](size_t i) -> const void* {
      return dtype == GIFT_DTYPE_F32 ? static_cast<const void*>(&x[i]) : &half[i];
    };
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = value(i);
    const RuleSums want = rule_sums(v);
    ASSERT_NE(want.sum + want.lanes[0], 0.0);
    for (const std::vector<size_t>& cuts :
         {std::vector<size_t>{}, {4095, 4097}, {1, 4099, 4103, 8195}, {13, 2051, 6150, 12291}}) {
      for (bool with_amax : {false, true}) {
        Census got;
        size_t from = 0;
        for (size_t k = 0; k <= cuts.size(); ++k) {
          const size_t to = k < cuts.size() ? cuts[k] : n;
          float amax = 0.0f;
          bool finite = true;
          for (size_t i = from; i < to; ++i) {
            finite = finite && std::isfinite(value(i));
            amax = std::max(amax, std::fabs(value(i)));
          }
          got.add(at(from), dtype, from, to - from, with_amax && finite ? &amax : nullptr);
          from = to;
        }
        const std::string where = "dtype " + std::to_string(dtype) + ", " +
                                  std::to_string(cuts.size()) + " cuts" +
                                  (with_amax ? ", the encoder's amax" : "");
        EXPECT_EQ(got.sum, want.sum) << where;
        for (int j = 0; j < 8; ++j)
          EXPECT_EQ(got.lanes[j], want.lanes[j]) << where << " lane " << j;
        EXPECT_EQ(got.finite, want.finite) << where;
        EXPECT_EQ(got.stats.amax, want.amax) << where;
        EXPECT_EQ(got.stats.nonfinite_count, want.nonfinite) << where;
        EXPECT_EQ(got.stats.first_nonfinite, want.first_nonfinite) << where;
      }
    }
  }
}

// The header's 64 MiB (FORMAT.md 2.1) is counted as names and metadata are added: a string
// that cannot fit is refused when given, and the writer stays usable; one past the limit only
// with the tensors' records fails at the finish, as invalid, naming the limit (both were an
// internal error at the finish, with no way back).
TEST(Frame, AHeaderPastItsLimitIsRefusedWhenItsStringsAreAdded) {
  using gift::container::kMaxHeaderBytes;
  giftFrameWriter* w = nullptr;
  ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  const std::string big(kMaxHeaderBytes + 1, 'x'), half(kMaxHeaderBytes / 2, 'x');
  EXPECT_EQ(giftFrameWriterAddMetadata(w, "big", big.c_str()), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("pass the frame header's limit"),
            std::string::npos)
      << giftGetLastErrorMessage();
  const float x = 1.0f;
  const uint64_t one = 1;
  EXPECT_EQ(giftFrameWriterAddTensor(w, big.c_str(), &one, 1, GIFT_DTYPE_F32, &x, nullptr),
            GIFT_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(giftFrameWriterAddMetadata(w, "a", half.c_str()), GIFT_OK);
  EXPECT_EQ(giftFrameWriterAddMetadata(w, "b", half.c_str()), GIFT_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(giftFrameWriterAddTensor(w, "t", &one, 1, GIFT_DTYPE_F32, &x, nullptr), GIFT_OK);
  void* data = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(giftFrameWriterFinish(w, &data, &size), GIFT_OK) << giftGetLastErrorMessage();
  giftFree(data);
  giftFrameWriterFree(w);

  // Strings within the limit, records past it.
  ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  const std::string most(kMaxHeaderBytes - 200, 'x');
  ASSERT_EQ(giftFrameWriterAddMetadata(w, "m", most.c_str()), GIFT_OK);
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(giftFrameWriterAddTensor(w, ("t" + std::to_string(i)).c_str(), &one, 1,
                                       GIFT_DTYPE_F32, &x, nullptr),
              GIFT_OK);
  }
  EXPECT_EQ(giftFrameWriterFinish(w, &data, &size), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("past its limit of 67108864"),
            std::string::npos)
      << giftGetLastErrorMessage();
  giftFrameWriterFree(w);
}

TEST(Frame, EveryTruncationIsRejected) {
  const std::vector<uint8_t> bytes = sample_frame();
  for (size_t len = 0; len < bytes.size(); ++len) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + long(len));
    const giftResult_t r = open_result(cut);
    ASSERT_TRUE(r == GIFT_ERROR_FRAME_TRUNCATED || (len < 8 && r == GIFT_ERROR_FRAME_MAGIC)) << len;
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  std::string m;
  EXPECT_EQ(open_result(longer, &m), GIFT_ERROR_FRAME_TRUNCATED);
  EXPECT_NE(m.find("trailing bytes"), std::string::npos) << m;
}

TEST(Frame, DamageIsCaughtByMagicAndChecksums) {
  const std::vector<uint8_t> bytes = sample_frame();
  std::string m;
  std::vector<uint8_t> crlf = bytes;
  crlf.erase(crlf.begin() + 4);  // "\r\n" became "\n"
  EXPECT_EQ(open_result(crlf, &m), GIFT_ERROR_FRAME_MAGIC);
  EXPECT_EQ(m, "frame: damaged GIFT magic (line endings changed by a text-mode transfer?)");
  // Any flipped bit in the header fails its checksum.
  const uint32_t hlen = gift::container::read_preamble(bytes.data()).header_length;
  for (uint32_t i = 0; i < hlen; i += 7) {
    std::vector<uint8_t> d = bytes;
    d[kPreambleBytes + i] ^= 0x10;
    ASSERT_EQ(open_result(d), GIFT_ERROR_HEADER_CHECKSUM) << i;
  }
  // A flipped bit in a section opens, then fails when that section is read.
  std::vector<uint8_t> d = bytes;
  const fb::Frame* h = fb::GetFrame(bytes.data() + kPreambleBytes);
  d[h->tensors()->Get(0)->codes()->offset() + 5] ^= 1;
  giftFrame* f = nullptr;
  ASSERT_EQ(giftFrameOpen(d.data(), d.size(), &f), GIFT_OK);
  std::vector<float> out(12000);
  EXPECT_EQ(giftFrameDecodeTensor(f, 0, out.data(), out.size() * 4, GIFT_DTYPE_F32),
            GIFT_ERROR_SECTION_CHECKSUM);
  EXPECT_STREQ(
      giftGetLastErrorMessage(),
      "frame: tensor 'layers.0.weight': codes section: checksum mismatch (the data is damaged)");
  EXPECT_EQ(giftFrameVerify(f), GIFT_ERROR_SECTION_CHECKSUM);
  giftFrameClose(f);
}

TEST(Frame, NewerMajorVersionIsRefusedByName) {
  std::vector<uint8_t> bytes = sample_frame();
  bytes[8] = 2;
  std::string m;
  EXPECT_EQ(open_result(bytes, &m), GIFT_ERROR_FRAME_VERSION);
  EXPECT_EQ(m, "frame: unsupported GIFT format major version 2 (this build reads 1)");
}

struct HostileCase {
  const char* what;
  void (*edit)(fb::FrameT&);
  giftResult_t code;
  const char* message;
};

TEST(Frame, HostileHeadersFailWithTheirOwnCodeAndAPreciseMessage) {
  const std::vector<uint8_t> bytes = sample_frame();
  // The unedited re-pack must open: the helper itself is sound.
  ASSERT_EQ(open_result(gift::testing::edited(bytes, [](fb::FrameT&) {})), GIFT_OK);
  const std::vector<HostileCase> cases = {
      {"misaligned", [](fb::FrameT& f) { f.tensors[0]->codes->offset += 8; },
       GIFT_ERROR_SECTION_ALIGNMENT, "is not a multiple of 64"},
      {"past the end", [](fb::FrameT& f) { f.tensors[0]->codes->offset += uint64_t(1) << 40; },
       GIFT_ERROR_SECTION_BOUNDS, "lie outside the data area"},
      {"huge length", [](fb::FrameT& f) { f.tensors[0]->codes->stored_length = UINT64_MAX; },
       GIFT_ERROR_SECTION_BOUNDS, "tensor 'layers.0.weight': codes section"},
      {"inside the header", [](fb::FrameT& f) { f.tensors[0]->codes->offset = 0; },
       GIFT_ERROR_SECTION_BOUNDS, "lie outside the data area"},
      {"overlap",
       [](fb::FrameT& f) {
         *f.tensors[0]->scales = *f.tensors[0]->codes;
         f.tensors[0]->scales->raw_length = 480;
         f.tensors[0]->scales->stored_length = 480;
       },
       GIFT_ERROR_SECTION_BOUNDS, "overlap"},
      {"wrong length", [](fb::FrameT& f) { f.tensors[0]->scales->raw_length = 476; },
       GIFT_ERROR_SECTION_LENGTH, "scales section: holds 476 bytes, the tensor needs 480"},
      {"stored != raw", [](fb::FrameT& f) { f.tensors[0]->scales->stored_length = 400; },
       GIFT_ERROR_SECTION_LENGTH, "uncompressed but stored length 400 differs from 480"},
      {"zstd bomb",
       [](fb::FrameT& f) {
         f.tensors[1]->shape = {uint64_t(1) << 40};
         f.tensors[1]->codes->compression = fb::Compression::Zstd;
         f.tensors[1]->codes->raw_length = uint64_t(1) << 42;
       },
       GIFT_ERROR_SECTION_LENGTH, "compressed bytes cannot expand to"},
      {"bad enum", [](fb::FrameT& f) { f.tensors[0]->fp8 = static_cast<fb::Fp8Kind>(9); },
       GIFT_ERROR_FIELD_INVALID, "tensor 'layers.0.weight': unknown FP8 kind 9"},
      {"bad block", [](fb::FrameT& f) { f.tensors[0]->block = 100; }, GIFT_ERROR_FIELD_INVALID,
       "block size 100 is not a power of two"},
      {"bad dtype", [](fb::FrameT& f) { f.tensors[1]->dtype = static_cast<fb::DType>(3); },
       GIFT_ERROR_FIELD_INVALID, "unknown dtype, encoding or coordinates"},
      {"shape overflow",
       [](fb::FrameT& f) {
         f.tensors[0]->shape = {uint64_t(1) << 32, uint64_t(1) << 32};
       },
       GIFT_ERROR_FIELD_INVALID, "element count is 2^61 or more"},
      {"too many dims", [](fb::FrameT& f) { f.tensors[0]->shape.assign(33, 1); },
       GIFT_ERROR_FIELD_INVALID, "33 dimensions (at most 32)"},
      {"shape vs data",
       [](fb::FrameT& f) {
         f.tensors[0]->shape = {41, 300};
       },
       GIFT_ERROR_SECTION_LENGTH, "codes section: holds 12000 bytes, the tensor needs 12300"},
      {"duplicate name", [](fb::FrameT& f) { f.tensors[1]->name = f.tensors[0]->name; },
       GIFT_ERROR_FIELD_INVALID, "tensor name 'layers.0.weight' appears twice"},
      {"empty name", [](fb::FrameT& f) { f.tensors[1]->name = ""; }, GIFT_ERROR_FIELD_INVALID,
       "tensor 1 has an empty name"},
      {"missing codes", [](fb::FrameT& f) { f.tensors[0]->codes.reset(); },
       GIFT_ERROR_FIELD_INVALID, "tensor 'layers.0.weight': codes section is missing"},
      {"bad compression",
       [](fb::FrameT& f) { f.tensors[0]->codes->compression = static_cast<fb::Compression>(5); },
       GIFT_ERROR_FIELD_INVALID, "unknown compression 5"},
      {"bad kind", [](fb::FrameT& f) { f.kind = static_cast<fb::FrameKind>(4); },
       GIFT_ERROR_FIELD_INVALID, "unknown frame kind 4"},
      {"raw with scales",
       [](fb::FrameT& f) {
         f.tensors[1]->scales = std::make_unique<fb::SectionT>(*f.tensors[0]->scales);
       },
       GIFT_ERROR_FIELD_INVALID, "tensor 'layers.0.bias': a raw tensor has no scales section"},
      {"NUL in name", [](fb::FrameT& f) { f.tensors[1]->name = std::string("w\0b", 3); },
       GIFT_ERROR_FIELD_INVALID, "tensor 1: name is not UTF-8 without NUL"},
      {"bad UTF-8", [](fb::FrameT& f) { f.tensors[1]->name = "\xC0\xAF"; },
       GIFT_ERROR_FIELD_INVALID, "tensor 1: name is not UTF-8 without NUL"},
      {"bad UTF-8 producer", [](fb::FrameT& f) { f.producer = "giftc \xFF"; },
       GIFT_ERROR_FIELD_INVALID, "frame: producer is not UTF-8 without NUL"},
      {"NUL in metadata",
       [](fb::FrameT& f) {
         f.metadata[0]->value = std::string(
             "1\0"
             "0",
             3);
       },
       GIFT_ERROR_FIELD_INVALID, "metadata value of 'step' is not UTF-8 without NUL"},
      {"surrogate in metadata key", [](fb::FrameT& f) { f.metadata[0]->key = "\xED\xA0\x80"; },
       GIFT_ERROR_FIELD_INVALID, "metadata key 0 is not UTF-8 without NUL"},
      {"bad UTF-8 reason",
       [](fb::FrameT& f) {
         f.tensors[0]->selection = std::make_unique<fb::SelectionT>();
         f.tensors[0]->selection->reason = "\xE2\x82";
       },
       GIFT_ERROR_FIELD_INVALID, "tensor 'layers.0.weight': selection reason is not UTF-8"},
      {"fields before sections",
       [](fb::FrameT& f) {
         f.tensors[0]->codes->offset += 8;
         f.tensors[1]->dtype = static_cast<fb::DType>(7);
       },
       GIFT_ERROR_FIELD_INVALID, "unknown dtype, encoding or coordinates"},
      {"zstd ratio + 1",
       [](fb::FrameT& f) {
         f.tensors[1]->shape = {65536 * 1200 / 4 + 1};
         f.tensors[1]->codes->compression = fb::Compression::Zstd;
         f.tensors[1]->codes->raw_length = 65536 * 1200 + 4;
       },
       GIFT_ERROR_SECTION_LENGTH, "1200 compressed bytes cannot expand to 78643204"},
  };
  for (const HostileCase& c : cases) {
    std::string m;
    EXPECT_EQ(open_result(gift::testing::edited(bytes, c.edit), &m), c.code) << c.what << ": " << m;
    EXPECT_NE(m.find(c.message), std::string::npos) << c.what << ": " << m;
  }
}

TEST(Frame, AZstdSectionMustBeExactlyOneZstdFrame) {
  // One raw all-zero tensor: its zstd section is the frame's last; 64 zero bytes appended
  // leave room to extend it by a skippable zstd block of data (magic 0x184D2A50, empty).
  giftFrameWriter* w = nullptr;
  giftFrameWriterCreate(&w);
  giftFrameWriterSetCompression(w, 3);
  const std::vector<float> zeros(4096, 0.0f);
  const uint64_t shape[] = {4096};
  ASSERT_EQ(giftFrameWriterAddTensor(w, "z", shape, 1, GIFT_DTYPE_F32, zeros.data(), nullptr),
            GIFT_OK);
  void* data;
  uint64_t size;
  ASSERT_EQ(giftFrameWriterFinish(w, &data, &size), GIFT_OK);
  std::vector<uint8_t> bytes(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  giftFree(data);
  giftFrameWriterFree(w);
  bytes.resize(bytes.size() + 64, 0);
  const fb::Section* s = fb::GetFrame(bytes.data() + kPreambleBytes)->tensors()->Get(0)->codes();
  ASSERT_EQ(s->compression(), fb::Compression::Zstd);
  const uint64_t end = s->offset() + s->stored_length();
  const uint8_t skippable[8] = {0x50, 0x2A, 0x4D, 0x18, 0, 0, 0, 0};
  std::memcpy(bytes.data() + end, skippable, 8);
  const uint64_t sum =
      gift::container::checksum64(bytes.data() + s->offset(), s->stored_length() + 8);
  const std::vector<uint8_t> patched = gift::testing::edited(bytes, [sum](fb::FrameT& f) {
    f.tensors[0]->codes->stored_length += 8;
    f.tensors[0]->codes->checksum = sum;
  });
  giftFrame* f = nullptr;
  ASSERT_EQ(giftFrameOpen(patched.data(), patched.size(), &f), GIFT_OK)
      << giftGetLastErrorMessage();
  std::vector<float> out(4096);
  EXPECT_EQ(giftFrameDecodeTensor(f, 0, out.data(), out.size() * 4, GIFT_DTYPE_F32),
            GIFT_ERROR_DECOMPRESSION);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("not exactly one zstd stream"),
            std::string::npos)
      << giftGetLastErrorMessage();
  EXPECT_EQ(giftFrameVerify(f), GIFT_ERROR_DECOMPRESSION);
  giftFrameClose(f);
}

TEST(Frame, HeaderThatIsNotAFlatBufferIsRejected) {
  std::vector<uint8_t> bytes = sample_frame();
  gift::container::Preamble pre = gift::container::read_preamble(bytes.data());
  // Garbage with a correct checksum: only the FlatBuffers verifier can catch it.
  for (uint32_t i = 0; i < pre.header_length; ++i) bytes[kPreambleBytes + i] = uint8_t(i * 31 + 7);
  pre.header_checksum =
      gift::container::checksum64(bytes.data() + kPreambleBytes, pre.header_length);
  gift::container::write_preamble(pre, bytes.data());
  std::string m;
  EXPECT_EQ(open_result(bytes, &m), GIFT_ERROR_HEADER_INVALID);
  EXPECT_EQ(m, "frame: the header is not a valid gift.fbs Frame");
}

TEST(Frame, WriterRejectsBadTensors) {
  giftFrameWriter* w = nullptr;
  giftFrameWriterCreate(&w);
  const float x[2] = {1, std::nanf("")};
  const uint64_t shape[] = {2};
  giftQuantParams p = params(GIFT_FP8_E4M3, GIFT_SCALE_TENSOR);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "n", shape, 1, GIFT_DTYPE_F32, x, &p),
            GIFT_ERROR_NONFINITE_INPUT);
  EXPECT_STREQ(
      giftGetLastErrorMessage(),
      "tensor 'n': 1 non-finite value in the input, the first at index 1 (row 0, column 1)");
  EXPECT_EQ(giftFrameWriterAddTensor(w, "", shape, 1, GIFT_DTYPE_F32, x, nullptr),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "a", shape, 1, GIFT_DTYPE_F32, x, nullptr), GIFT_OK);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "a", shape, 1, GIFT_DTYPE_F32, x, nullptr),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "\xC3", shape, 1, GIFT_DTYPE_F32, x, nullptr),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftFrameWriterAddMetadata(w, "k", "\xF5\x80\x80\x80"), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftFrameWriterAddMetadata(w, "k", "caf\xC3\xA9"), GIFT_OK);
  EXPECT_EQ(giftFrameWriterAddMetadata(w, "k", "other"), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(giftGetLastErrorMessage(), "metadata 'k' is already set");
  EXPECT_EQ(giftFrameWriterSetCompression(w, 40), GIFT_ERROR_INVALID_ARGUMENT);
  giftFrameWriterFree(w);
}

}  // namespace
