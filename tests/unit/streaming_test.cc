// Bounded-memory paths: a writer keeping its sections in a scratch file (and encoding in
// bands of rows) writes the same bytes as one holding them in memory; outputs appear under
// their name only when committed.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/background.h"
#include "common/output_file.h"
#include "common/temporaries.h"
#include "container/layout.h"
#include "container/sections.h"
#include "container/writer.h"
#include "gift/gift.h"
#include "gift/gift_basis.h"
#include "gift_generated.h"
#include "unit/finished_frame.h"
#include "unit/random_values.h"

namespace {

namespace fb = gift::fb;

std::string temp_dir() {
  char tmpl[] = "/tmp/gift-stream-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  return out;
}

// In one read: byte by byte, the frames of these tests took seconds under the sanitizers.
std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return {};
  std::vector<uint8_t> bytes(static_cast<size_t>(f.tellg()));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size()));
  return f ? bytes : std::vector<uint8_t>();
}

struct Case {
  const char* name;
  giftScaleLayout_t layout;
  giftRounding_t rounding;
  int zstd;
};

// Inodes of the unnamed files (O_TMPFILE) this process holds open in `dir`.
std::vector<ino_t> unnamed_files_in(const std::string& dir) {
  std::vector<ino_t> out;
  for (const std::string& fd : entries("/proc/self/fd")) {
    const std::string link = "/proc/self/fd/" + fd;
    char target[4096];
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    struct stat st;
    if (n <= 0 || ::stat(link.c_str(), &st) != 0) continue;
    if (std::string(target, size_t(n)).rfind(dir + "/#", 0) == 0) out.push_back(st.st_ino);
  }
  return out;
}

// How frame_of hands its frame over.
enum class Sink {
  kFinish,      // giftFrameWriterFinish (to memory)
  kWriteFile,   // giftFrameWriterWriteFile
  kStream,      // giftFrameWriterStreamTo with the frame's tensors declared
  kMisdeclared  // giftFrameWriterStreamTo with one name declared much longer
};

// Tensors larger than the writer's bands (several million elements, rows not a multiple of
// a band nor of the tile height), a raw vector and an empty tensor, as one frame. For the
// streamed sinks, *in_place says whether the file streamed to became the frame.
// `threads`: the writer's (0, its default: every processor, so none free to write behind).
std::vector<uint8_t> frame_of(const Case& c, const std::string& scratch, const std::string& file,
                              Sink sink = Sink::kFinish, bool* in_place = nullptr,
                              int threads = 0) {
  giftFrameWriter* w = nullptr;
  EXPECT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  EXPECT_EQ(giftFrameWriterSetThreads(w, threads), GIFT_OK);
  EXPECT_EQ(giftFrameWriterSetCompression(w, c.zstd), GIFT_OK);
  if (!scratch.empty()) {
    EXPECT_EQ(giftFrameWriterSetScratchDir(w, scratch.c_str()), GIFT_OK);
  }
  giftFrameWriterAddMetadata(w, "case", c.name);
  giftOutput* out = nullptr;
  std::vector<ino_t> streamed_to;
  if (sink == Sink::kStream || sink == Sink::kMisdeclared) {
    const std::string folder = file.substr(0, file.rfind('/'));
    const std::vector<ino_t> before = unnamed_files_in(folder);
    EXPECT_EQ(giftOutputOpenFile(file.c_str(), &out), GIFT_OK);
    for (ino_t i : unnamed_files_in(folder)) {
      if (std::find(before.begin(), before.end(), i) == before.end()) streamed_to.push_back(i);
    }
    EXPECT_EQ(streamed_to.size(), 1u) << "the output's unnamed file";
    // A name 200 bytes longer moves the sections (a few bytes might not, after alignment).
    const std::string wrong = "bias" + std::string(200, '_');
    const char* names[] = {"big", sink == Sink::kStream ? "bias" : wrong.c_str(), "half", "empty",
                           "noise"};
    const uint32_t ndims[] = {2, 1, 2, 2, 2};
    const int lossless[] = {0, 1, 0, 0, 0};
    EXPECT_EQ(giftFrameWriterStreamTo(w, out, 5, names, ndims, lossless), GIFT_OK)
        << giftGetLastErrorMessage();
  }
  giftQuantParams p;
  giftQuantParamsInit(&p);
  p.layout = c.layout;
  p.rounding = c.rounding;
  p.tile_rows = 3;
  p.tile_cols = 5;
  static const std::vector<float> big = values(4099 * 1100, 1), bias = values(1100, 2);
  std::vector<uint16_t> half(2050 * 2100);
  for (size_t i = 0; i < half.size(); ++i) half[i] = uint16_t(0x3c00 + (i * 7919) % 0x0800);
  const uint64_t sb[] = {4099, 1100}, sv[] = {1100}, sh[] = {2050, 2100}, se[] = {0, 9};
  EXPECT_EQ(giftFrameWriterAddTensor(w, "big", sb, 2, GIFT_DTYPE_F32, big.data(), &p), GIFT_OK);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "bias", sv, 1, GIFT_DTYPE_F32, bias.data(), nullptr),
            GIFT_OK);
  p.tensor_index = 2;
  EXPECT_EQ(giftFrameWriterAddTensor(w, "half", sh, 2, GIFT_DTYPE_BF16, half.data(), &p), GIFT_OK);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "empty", se, 2, GIFT_DTYPE_F32, nullptr, &p), GIFT_OK);
  // Every E4M3 value but NaN, uniformly, with 448 (the largest) opening each block of 128 so
  // that block scales are 1: codes of uniform bytes, which zstd cannot make smaller (so they
  // are stored raw after all).
  static const std::vector<float> noise = [] {
    std::vector<float> v(2051 * 1030);
    std::mt19937 gen(4);
    std::uniform_int_distribution<int> code(0, 253);
    for (size_t i = 0; i < v.size(); ++i) {
      int c = code(gen);
      c += c >= 0x7F;  // skip +NaN (0x7F); 0xFF, -NaN, is past the range
      const int e = (c >> 3) & 15, m = c & 7;
      const float x = e ? std::ldexp(1.0f + m / 8.0f, e - 7) : std::ldexp(m / 8.0f, -6);
      v[i] = i % 1030 % 128 == 0 ? 448.0f : (c & 0x80 ? -x : x);
    }
    return v;
  }();
  const uint64_t sn[] = {2051, 1030};
  EXPECT_EQ(giftFrameWriterAddTensor(w, "noise", sn, 2, GIFT_DTYPE_F32, noise.data(), &p), GIFT_OK);
  if (sink == Sink::kFinish) return finished_frame(w);
  if (out) {
    EXPECT_EQ(giftFrameWriterWriteOutput(w, out), GIFT_OK) << giftGetLastErrorMessage();
    EXPECT_EQ(giftOutputCommit(out), GIFT_OK) << giftGetLastErrorMessage();
    giftOutputFree(out);
    struct stat st;
    EXPECT_EQ(::stat(file.c_str(), &st), 0);
    if (in_place) *in_place = !streamed_to.empty() && st.st_ino == streamed_to[0];
  } else {
    EXPECT_EQ(giftFrameWriterWriteFile(w, file.c_str()), GIFT_OK) << giftGetLastErrorMessage();
  }
  giftFrameWriterFree(w);
  return file_bytes(file);
}

TEST(Streaming, ScratchWriterWritesTheSameBytes) {
  const std::string dir = temp_dir();
  for (const Case& c : {Case{"block", GIFT_SCALE_BLOCK, GIFT_ROUND_NEAREST, 0},
                        Case{"row", GIFT_SCALE_ROW, GIFT_ROUND_NEAREST, 0},
                        Case{"tile", GIFT_SCALE_TILE, GIFT_ROUND_NEAREST, 0},
                        Case{"tensor", GIFT_SCALE_TENSOR, GIFT_ROUND_NEAREST, 0},
                        Case{"stochastic", GIFT_SCALE_BLOCK, GIFT_ROUND_STOCHASTIC, 0},
                        Case{"zstd", GIFT_SCALE_BLOCK, GIFT_ROUND_NEAREST, 3}}) {
    SCOPED_TRACE(c.name);
    const std::vector<uint8_t> in_memory = frame_of(c, "", "");
    ASSERT_GT(in_memory.size(), 1u << 20);
    EXPECT_EQ(frame_of(c, dir, ""), in_memory);
    const std::string path = dir + "/out.gift";
    EXPECT_EQ(frame_of(c, dir, path, Sink::kWriteFile), in_memory);
    // Streamed into the output: in place when declared right, moved once when not.
    for (const std::string& scratch : {std::string(), dir}) {
      bool in_place = false;
      EXPECT_EQ(frame_of(c, scratch, path, Sink::kStream, &in_place), in_memory);
      EXPECT_TRUE(in_place) << "sections copied although the header was declared";
      EXPECT_EQ(frame_of(c, scratch, path, Sink::kMisdeclared, &in_place), in_memory);
      EXPECT_FALSE(in_place);
    }
    // On one thread, with a processor free, the codes are written behind (OutputFile).
    bool in_place = false;
    EXPECT_EQ(frame_of(c, "", path, Sink::kStream, &in_place, 1), in_memory);
    EXPECT_TRUE(in_place);
    // Scales spilled to a scratch file band by band (all of them: held up to 0 bytes), into
    // a scratch folder's file and into the output, on one thread and on all.
    const uint64_t held = gift::container::set_held_scale_bytes_for_test(0);
    EXPECT_EQ(frame_of(c, dir, ""), in_memory);
    EXPECT_EQ(frame_of(c, "", path, Sink::kStream, &in_place), in_memory);
    EXPECT_EQ(frame_of(c, "", path, Sink::kStream, &in_place, 1), in_memory);
    gift::container::set_held_scale_bytes_for_test(held);
    giftFrame* f = nullptr;
    ASSERT_EQ(giftFrameOpenFile(path.c_str(), &f), GIFT_OK);
    EXPECT_EQ(giftFrameVerify(f), GIFT_OK);
    if (c.zstd) {  // both outcomes of compressing a section as it is made
      const fb::Frame* h = fb::GetFrame(in_memory.data() + gift::container::kPreambleBytes);
      EXPECT_EQ(h->tensors()->Get(0)->codes()->compression(), fb::Compression::Zstd);
      EXPECT_EQ(h->tensors()->Get(4)->name()->str(), "noise");
      EXPECT_EQ(h->tensors()->Get(4)->codes()->compression(), fb::Compression::None);
    }
    giftFrameClose(f);
    ::unlink(path.c_str());
  }
  EXPECT_TRUE(entries(dir).empty()) << "scratch or temporary files left behind";
  ::rmdir(dir.c_str());
}

// The writer keeps its band buffers from tensor to tensor: a tensor written behind after a
// larger one that was not (the second buffer made then) and before one as large (which uses
// it) writes the same frame as one held in memory. The second buffer was made of the smaller
// tensor's size, and the last tensor's bands overran it (heap overflow; ASan's build says so).
TEST(Streaming, KeptBandBuffersFitEveryLaterTensor) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "writes behind need 2 processors";
  const std::string dir = temp_dir();
  const std::string path = dir + "/kept.gift";
  const std::vector<float> wide = values(16 * 65536, 3), row = values(65536, 4);
  const uint64_t sw[] = {16, 65536}, sr[] = {1, 65536};
  giftQuantParams p;
  giftQuantParamsInit(&p);
  const auto frame = [&](bool streamed) {
    giftFrameWriter* w = nullptr;
    EXPECT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
    giftOutput* out = nullptr;
    if (streamed) {
      EXPECT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
      const char* names[] = {"first", "row", "last"};
      const uint32_t ndims[] = {2, 2, 2};
      const int lossless[] = {0, 0, 0};
      EXPECT_EQ(giftFrameWriterStreamTo(w, out, 3, names, ndims, lossless), GIFT_OK);
    }
    EXPECT_EQ(giftFrameWriterSetThreads(w, 0), GIFT_OK);  // every processor: none behind
    EXPECT_EQ(giftFrameWriterAddTensor(w, "first", sw, 2, GIFT_DTYPE_F32, wide.data(), &p),
              GIFT_OK);
    EXPECT_EQ(giftFrameWriterSetThreads(w, 1), GIFT_OK);  // one: the codes written behind
    EXPECT_EQ(giftFrameWriterAddTensor(w, "row", sr, 2, GIFT_DTYPE_F32, row.data(), &p), GIFT_OK);
    EXPECT_EQ(giftFrameWriterAddTensor(w, "last", sw, 2, GIFT_DTYPE_F32, wide.data(), &p), GIFT_OK);
    if (!streamed) return finished_frame(w);
    EXPECT_EQ(giftFrameWriterWriteOutput(w, out), GIFT_OK) << giftGetLastErrorMessage();
    EXPECT_EQ(giftOutputCommit(out), GIFT_OK) << giftGetLastErrorMessage();
    giftOutputFree(out);
    giftFrameWriterFree(w);
    return file_bytes(path);
  };
  EXPECT_EQ(frame(true), frame(false));
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

// `words` fp32 words whose first `noise` bytes are random and the rest 0.
std::vector<uint8_t> part_noise(uint64_t words, uint64_t noise) {
  std::vector<uint8_t> bytes(words * 4, 0);
  std::mt19937 gen(7);
  for (uint64_t i = 0; i < noise; ++i) bytes[i] = uint8_t(gen());
  return bytes;
}

// part_noise as a lossless tensor in a frame compressed at level 3, made in memory or with a
// scratch folder (whose sections are compressed as they are made).
std::vector<uint8_t> lossless_frame(uint64_t words, uint64_t noise, const std::string& scratch) {
  giftFrameWriter* w = nullptr;
  EXPECT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  EXPECT_EQ(giftFrameWriterSetCompression(w, 3), GIFT_OK);
  if (!scratch.empty()) {
    EXPECT_EQ(giftFrameWriterSetScratchDir(w, scratch.c_str()), GIFT_OK);
  }
  const uint64_t shape[] = {words};
  EXPECT_EQ(giftFrameWriterAddTensor(w, "t", shape, 1, GIFT_DTYPE_F32,
                                     part_noise(words, noise).data(), nullptr),
            GIFT_OK);
  return finished_frame(w);
}

// zstd's bytes are kept only where they are fewer than the raw ones: at equal sizes the section
// is stored raw, by the writer holding sections in memory and by the one compressing them into
// a scratch file as they come alike.
TEST(Streaming, ZstdIsKeptOnlyWhereItIsSmaller) {
  const std::string dir = temp_dir();
  const auto codes_of = [](const std::vector<uint8_t>& frame) {
    return fb::GetFrame(frame.data() + gift::container::kPreambleBytes)->tensors()->Get(0)->codes();
  };
  // zstd keeps a block compressed only if that saves (size >> 6) + 2 bytes (at this level),
  // which for sections of up to a few hundred bytes is no more than its frame and block
  // headers take: there some tensors compress to exactly their raw size, and others to a byte
  // or two less (107 and 162 of the tensors below).
  int equal = 0, smaller = 0;
  for (uint64_t words = 16; words <= 96; ++words) {
    for (uint64_t noise = words * 4 - 24; noise < words * 4; ++noise) {
      const std::vector<uint8_t> bytes = part_noise(words, noise);
      std::vector<uint8_t> z;
      gift::container::SectionCompressor c(3, bytes.size());
      const gift::container::SectionCompressor::Out keep = [&](const uint8_t* p, uint64_t n) {
        z.insert(z.end(), p, p + n);
        return GIFT_OK;
      };
      ASSERT_EQ(c.add(bytes.data(), bytes.size(), keep), GIFT_OK);
      ASSERT_EQ(c.end(keep), GIFT_OK);
      if (z.size() > bytes.size() || z.size() + 2 < bytes.size()) continue;
      SCOPED_TRACE(std::to_string(words) + " words, " + std::to_string(noise) +
                   " random bytes: zstd's size " + std::to_string(z.size()));
      const std::vector<uint8_t> in_memory = lossless_frame(words, noise, "");
      EXPECT_EQ(lossless_frame(words, noise, dir), in_memory);
      const fb::Section* codes = codes_of(in_memory);
      const bool raw = z.size() == bytes.size();
      (raw ? equal : smaller) += 1;
      EXPECT_EQ(codes->compression(), raw ? fb::Compression::None : fb::Compression::Zstd);
      EXPECT_EQ(codes->stored_length(), z.size());
    }
  }
  EXPECT_GT(equal, 0) << "no tensor made zstd's size equal its raw size";
  EXPECT_GT(smaller, 0);
  EXPECT_TRUE(entries(dir).empty());
  ::rmdir(dir.c_str());
}

TEST(Streaming, BandedEncodeReportsNonFiniteInputOverTheWholeTensor) {
  std::vector<float> v = values(4099 * 1100, 3);
  v[4099 * 1100 - 5] = NAN;  // the last band
  v[1100 * 3000 + 7] = INFINITY;
  const uint64_t shape[] = {4099, 1100};
  giftQuantParams p;
  giftQuantParamsInit(&p);
  std::string messages[2];
  const std::string dir = temp_dir();
  for (int scratch = 0; scratch < 2; ++scratch) {
    giftFrameWriter* w = nullptr;
    ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
    if (scratch) {
      ASSERT_EQ(giftFrameWriterSetScratchDir(w, dir.c_str()), GIFT_OK);
    }
    EXPECT_EQ(giftFrameWriterAddTensor(w, "w", shape, 2, GIFT_DTYPE_F32, v.data(), &p),
              GIFT_ERROR_NONFINITE_INPUT);
    messages[scratch] = giftGetLastErrorMessage();
    giftFrameWriterFree(w);
  }
  EXPECT_NE(messages[1].find("2 non-finite values"), std::string::npos) << messages[1];
  EXPECT_NE(messages[1].find("index 3300007 (row 3000, column 7)"), std::string::npos)
      << messages[1];
  EXPECT_EQ(messages[0], messages[1]);
  ::rmdir(dir.c_str());
}

// Activations along three strong directions u plus a little of every other: the basis for
// "w" (dim columns) fitted to their second moment, and a rows x dim gradient whose rows are
// mostly in the span of u (where GIFT coordinates pay off).
giftBasis* basis_for(uint32_t dim, uint64_t rows, std::vector<float>* w) {
  std::mt19937_64 gen(11);
  std::normal_distribution<double> nd;
  std::vector<double> u(3 * uint64_t(dim)), a(uint64_t(dim) * dim, 0.0);
  for (double& x : u) x = nd(gen);
  w->resize(rows * dim);
  for (uint64_t r = 0; r < rows; ++r) {
    const double s[3] = {1e-2 * nd(gen), 5e-3 * nd(gen), 2e-3 * nd(gen)};
    for (uint32_t j = 0; j < dim; ++j) {
      (*w)[r * dim + j] =
          float(s[0] * u[j] + s[1] * u[dim + j] + s[2] * u[2 * dim + j] + 1e-4 * nd(gen));
    }
  }
  for (uint32_t i = 0; i < dim; ++i) {
    for (uint32_t j = 0; j < dim; ++j) {
      double v = i == j ? 1.0 : 0.0;
      for (int k = 0; k < 3; ++k) v += 20.0 * u[k * uint64_t(dim) + i] * u[k * uint64_t(dim) + j];
      a[uint64_t(i) * dim + j] = v;
    }
  }
  const giftFitParams fp = GIFT_FIT_PARAMS_INIT;
  giftBasisBuilder* b = nullptr;
  giftBasis* basis = nullptr;
  EXPECT_EQ(giftBasisBuilderCreate(&fp, &b), GIFT_OK);
  EXPECT_EQ(giftBasisBuilderAdd(b, "w", a.data(), dim, "activations", nullptr, 0, nullptr, 0,
                                nullptr, nullptr),
            GIFT_OK)
      << giftGetLastErrorMessage();
  EXPECT_EQ(giftBasisBuilderFinish(b, &basis), GIFT_OK);
  giftBasisBuilderFree(b);
  return basis;
}

// In GIFT coordinates too, the scratch writer (which whitens band by band, never holding the
// tensor in fp32) writes the in-memory writer's bytes: fp32 and bf16 input, forced and
// measured choices, and a tensor whose last band is too large to whiten safely, which falls
// back to Euclidean coordinates after its first bands went to the scratch file.
TEST(Streaming, GiftCoordinatesEncodeInBandsWithTheSameBytes) {
  const uint32_t dim = 600;
  const uint64_t rows = 4099;  // several bands of whole rows, the last one short
  std::vector<float> w;
  giftBasis* basis = basis_for(dim, rows, &w);
  ASSERT_NE(basis, nullptr);
  std::vector<float> huge = w;
  for (uint64_t i = (rows - 3) * dim; i < rows * dim; ++i) huge[i] = 1e37f;
  std::vector<uint16_t> half(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &w[i], 4);
    half[i] = uint16_t(bits >> 16);
  }
  const uint64_t shape[] = {rows, dim};
  const std::string dir = temp_dir();
  // In memory, with a scratch file, and streamed into a file (selections make the header
  // longer than declared: the sections move once, at the end).
  std::string reasons[3][4];
  std::vector<uint8_t> frames[3];
  for (int scratch = 0; scratch < 3; ++scratch) {
    giftQuantParams p;
    giftQuantParamsInit(&p);
    giftSelectParams gift = GIFT_SELECT_PARAMS_INIT, automatic = GIFT_SELECT_PARAMS_INIT;
    gift.mode = GIFT_COORDS_MODE_GIFT;
    struct Add {
      const void* data;
      giftDType_t dtype;
      const giftSelectParams* select;
    } adds[] = {{w.data(), GIFT_DTYPE_F32, &gift},
                {half.data(), GIFT_DTYPE_BF16, &automatic},
                {huge.data(), GIFT_DTYPE_F32, &gift},
                {w.data(), GIFT_DTYPE_F32, &automatic}};
    // The basis has one whitener, for "w": a frame per case, each with a vector after "w".
    for (int i = 0; i < 4; ++i) {
      giftFrameWriter* one = nullptr;
      ASSERT_EQ(giftFrameWriterCreate(&one), GIFT_OK);
      if (scratch) {
        ASSERT_EQ(giftFrameWriterSetScratchDir(one, dir.c_str()), GIFT_OK);
      }
      ASSERT_EQ(giftFrameWriterEmbedBasis(one, basis), GIFT_OK);
      const std::string path = dir + "/streamed.gift";
      giftOutput* out = nullptr;
      if (scratch == 2) {
        const char* names[] = {"w", "bias"};
        const uint32_t ndims[] = {2, 1};
        ASSERT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
        ASSERT_EQ(giftFrameWriterStreamTo(one, out, 2, names, ndims, nullptr), GIFT_OK);
      }
      giftSelection sel = GIFT_SELECTION_INIT;
      ASSERT_EQ(giftFrameWriterAddTensorInBasis(one, "w", shape, 2, adds[i].dtype, adds[i].data, &p,
                                                basis, adds[i].select, &sel),
                GIFT_OK)
          << giftGetLastErrorMessage();
      reasons[scratch][i] = sel.reason;
      // A tensor after a refused one lands where it belongs in the scratch file.
      const uint64_t bias_shape[] = {dim};
      ASSERT_EQ(giftFrameWriterAddTensor(one, "bias", bias_shape, 1, GIFT_DTYPE_F32, w.data(), &p),
                GIFT_OK);
      std::vector<uint8_t> frame;
      if (out) {
        ASSERT_EQ(giftFrameWriterWriteOutput(one, out), GIFT_OK) << giftGetLastErrorMessage();
        ASSERT_EQ(giftOutputCommit(out), GIFT_OK);
        giftOutputFree(out);
        giftFrameWriterFree(one);
        frame = file_bytes(path);
        ::unlink(path.c_str());
      } else {
        frame = finished_frame(one);
      }
      giftFrame* f = nullptr;
      ASSERT_EQ(giftFrameOpen(frame.data(), frame.size(), &f), GIFT_OK);
      EXPECT_EQ(giftFrameVerify(f), GIFT_OK) << giftGetLastErrorMessage();
      giftFrameClose(f);
      frames[scratch].insert(frames[scratch].end(), frame.begin(), frame.end());
    }
  }
  EXPECT_EQ(frames[1], frames[0]);
  EXPECT_EQ(frames[2], frames[0]);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(reasons[1][i], reasons[0][i]);
    EXPECT_EQ(reasons[2][i], reasons[0][i]);
  }
  EXPECT_EQ(reasons[1][0], "forced (--coords gift)");
  EXPECT_EQ(reasons[1][2], "values too large: decoding in GIFT coordinates could overflow fp32");
  EXPECT_EQ(reasons[1][3], "lower estimated error") << "the test data should favour GIFT";
  EXPECT_TRUE(entries(dir).empty()) << "scratch files left behind";
  ::rmdir(dir.c_str());
  giftBasisFree(basis);
}

// A streamed frame with an embedded basis (its last section, kept aside until the end: in the
// scratch file or in memory) and tensors in Euclidean coordinates is written in place.
TEST(Streaming, StreamedFrameKeepsItsBasisForTheEnd) {
  const uint32_t dim = 64;
  std::vector<float> w;
  giftBasis* basis = basis_for(dim, 300, &w);
  ASSERT_NE(basis, nullptr);
  const std::string dir = temp_dir(), path = dir + "/out.gift";
  const uint64_t shape[] = {300, dim};
  giftQuantParams p;
  giftQuantParamsInit(&p);
  const auto frame = [&](bool scratch, bool stream, bool* in_place) {
    giftFrameWriter* one = nullptr;
    EXPECT_EQ(giftFrameWriterCreate(&one), GIFT_OK);
    if (scratch) {
      EXPECT_EQ(giftFrameWriterSetScratchDir(one, dir.c_str()), GIFT_OK);
    }
    EXPECT_EQ(giftFrameWriterEmbedBasis(one, basis), GIFT_OK);
    if (!stream) {
      EXPECT_EQ(giftFrameWriterAddTensor(one, "w", shape, 2, GIFT_DTYPE_F32, w.data(), &p),
                GIFT_OK);
      return finished_frame(one);
    }
    giftOutput* out = nullptr;
    EXPECT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
    const std::vector<ino_t> files = unnamed_files_in(dir);
    const char* names[] = {"w"};
    const uint32_t ndims[] = {2};
    EXPECT_EQ(giftFrameWriterStreamTo(one, out, 1, names, ndims, nullptr), GIFT_OK);
    EXPECT_GT(giftOutputBytes(out), 32u) << "room for the header, written ahead";
    EXPECT_EQ(giftFrameWriterAddTensor(one, "w", shape, 2, GIFT_DTYPE_F32, w.data(), &p), GIFT_OK);
    EXPECT_GT(giftOutputBytes(out), w.size()) << "the codes went straight to the output";
    EXPECT_EQ(giftFrameWriterWriteOutput(one, out), GIFT_OK) << giftGetLastErrorMessage();
    EXPECT_EQ(giftOutputCommit(out), GIFT_OK);
    giftOutputFree(out);
    giftFrameWriterFree(one);
    struct stat st;
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    *in_place = std::find(files.begin(), files.end(), st.st_ino) != files.end();
    std::vector<uint8_t> bytes = file_bytes(path);
    ::unlink(path.c_str());
    return bytes;
  };
  bool in_place = false;
  const std::vector<uint8_t> want = frame(false, false, &in_place);
  for (bool scratch : {false, true}) {
    EXPECT_EQ(frame(scratch, true, &in_place), want) << "scratch " << scratch;
    EXPECT_TRUE(in_place) << "scratch " << scratch;
  }
  EXPECT_TRUE(entries(dir).empty()) << "scratch or temporary files left behind";
  ::rmdir(dir.c_str());
  giftBasisFree(basis);
}

// A tensor that fails (non-finite values) leaves nothing in the output: the tensors after it
// still land where the declared header puts them.
TEST(Streaming, FailedTensorLeavesTheStreamInPlace) {
  const std::string dir = temp_dir(), path = dir + "/out.gift";
  std::vector<float> good(300 * 70), bad;
  for (size_t i = 0; i < good.size(); ++i) good[i] = std::sin(float(i));
  bad = good;
  bad[5000] = NAN;
  const uint64_t shape[] = {300, 70};
  giftQuantParams p;
  giftQuantParamsInit(&p);
  giftFrameWriter* w = nullptr;
  ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  giftOutput* out = nullptr;
  ASSERT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
  const std::vector<ino_t> files = unnamed_files_in(dir);
  const char* names[] = {"a", "b"};
  const uint32_t ndims[] = {2, 2};
  ASSERT_EQ(giftFrameWriterStreamTo(w, out, 2, names, ndims, nullptr), GIFT_OK);
  ASSERT_EQ(giftFrameWriterAddTensor(w, "a", shape, 2, GIFT_DTYPE_F32, good.data(), &p), GIFT_OK);
  const uint64_t after_a = giftOutputBytes(out);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "b", shape, 2, GIFT_DTYPE_F32, bad.data(), &p),
            GIFT_ERROR_NONFINITE_INPUT);
  EXPECT_EQ(giftOutputBytes(out), after_a) << "the failed tensor's codes were dropped";
  ASSERT_EQ(giftFrameWriterAddTensor(w, "b", shape, 2, GIFT_DTYPE_F32, good.data(), &p), GIFT_OK);
  ASSERT_EQ(giftFrameWriterWriteOutput(w, out), GIFT_OK);
  ASSERT_EQ(giftOutputCommit(out), GIFT_OK);
  giftOutputFree(out);
  giftFrameWriterFree(w);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_NE(std::find(files.begin(), files.end(), st.st_ino), files.end()) << "moved";

  giftFrameWriter* mem = nullptr;
  ASSERT_EQ(giftFrameWriterCreate(&mem), GIFT_OK);
  ASSERT_EQ(giftFrameWriterAddTensor(mem, "a", shape, 2, GIFT_DTYPE_F32, good.data(), &p), GIFT_OK);
  ASSERT_EQ(giftFrameWriterAddTensor(mem, "b", shape, 2, GIFT_DTYPE_F32, good.data(), &p), GIFT_OK);
  EXPECT_EQ(file_bytes(path), finished_frame(mem));
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

// Streaming is for a new file output, declared before the first tensor; a streamed frame is
// finished only there, and one abandoned leaves nothing.
TEST(Streaming, StreamToRefusesWhatItCannotDo) {
  const std::string dir = temp_dir(), path = dir + "/out.gift";
  const float x[4] = {1, 2, 3, 4};
  const uint64_t shape[] = {2, 2};
  giftQuantParams p;
  giftQuantParamsInit(&p);
  const char* names[] = {"x"};
  const uint32_t ndims[] = {2};
  giftFrameWriter* w = nullptr;
  ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  giftOutput* out = nullptr;
  ASSERT_EQ(giftOutputOpenFd(STDERR_FILENO, "standard error", &out), GIFT_OK);
  EXPECT_EQ(giftFrameWriterStreamTo(w, out, 1, names, ndims, nullptr), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("only to a new file"), std::string::npos);
  giftOutputFree(out);
  ASSERT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
  ASSERT_EQ(giftOutputWrite(out, "x", 1), GIFT_OK);
  EXPECT_EQ(giftFrameWriterStreamTo(w, out, 1, names, ndims, nullptr), GIFT_ERROR_INVALID_ARGUMENT);
  giftOutputFree(out);
  EXPECT_EQ(giftFrameWriterStreamTo(w, nullptr, 1, names, ndims, nullptr),
            GIFT_ERROR_INVALID_ARGUMENT);

  ASSERT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
  ASSERT_EQ(giftFrameWriterStreamTo(w, out, 1, names, ndims, nullptr), GIFT_OK);
  EXPECT_EQ(giftFrameWriterStreamTo(w, out, 1, names, ndims, nullptr), GIFT_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(giftFrameWriterAddTensor(w, "x", shape, 2, GIFT_DTYPE_F32, x, &p), GIFT_OK);
  giftFrameWriter* intruder = nullptr;  // another writer's frame into the streamed output
  ASSERT_EQ(giftFrameWriterCreate(&intruder), GIFT_OK);
  ASSERT_EQ(giftFrameWriterAddTensor(intruder, "y", shape, 2, GIFT_DTYPE_F32, x, &p), GIFT_OK);
  EXPECT_EQ(giftFrameWriterWriteOutput(intruder, out), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("another frame"), std::string::npos);
  giftFrameWriterFree(intruder);
  void* data = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(giftFrameWriterFinish(w, &data, &size), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("streams to"), std::string::npos);
  giftOutput* other = nullptr;
  ASSERT_EQ(giftOutputOpenFile((dir + "/other.gift").c_str(), &other), GIFT_OK);
  EXPECT_EQ(giftFrameWriterWriteOutput(w, other), GIFT_ERROR_INVALID_ARGUMENT);
  giftOutputFree(other);
  EXPECT_EQ(giftOutputCommit(out), GIFT_ERROR_INVALID_ARGUMENT) << "the header is not written";
  EXPECT_EQ(giftOutputWrite(out, "x", 1), GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(giftOutputReserve(out, 1000), GIFT_ERROR_INVALID_ARGUMENT);
  giftOutputFree(out);  // abandoned before its header: nothing under any name
  EXPECT_TRUE(entries(dir).empty());
  // The writer outlives its output: it refuses everything, and does not touch the output.
  EXPECT_EQ(giftFrameWriterAddTensor(w, "y", shape, 2, GIFT_DTYPE_F32, x, &p),
            GIFT_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("was freed"), std::string::npos);
  giftFrameWriterFree(w);

  // Finished once: a second finish or another tensor is refused (the sections' places in
  // the file are final); an output whose writer went first still refuses to commit.
  for (bool declared_right : {true, false}) {
    ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
    ASSERT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
    const char* wrong[] = {"a much longer name than the tensor will have, so the frame moves"};
    ASSERT_EQ(giftFrameWriterStreamTo(w, out, 1, declared_right ? names : wrong, ndims, nullptr),
              GIFT_OK);
    ASSERT_EQ(giftFrameWriterAddTensor(w, "x", shape, 2, GIFT_DTYPE_F32, x, &p), GIFT_OK);
    ASSERT_EQ(giftFrameWriterWriteOutput(w, out), GIFT_OK) << giftGetLastErrorMessage();
    EXPECT_EQ(giftFrameWriterWriteOutput(w, out), GIFT_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(giftGetLastErrorMessage()).find("finished"), std::string::npos);
    EXPECT_EQ(giftFrameWriterAddTensor(w, "y", shape, 2, GIFT_DTYPE_F32, x, &p),
              GIFT_ERROR_INVALID_ARGUMENT);
    giftFrameWriterFree(w);
    ASSERT_EQ(giftOutputCommit(out), GIFT_OK);
    giftOutputFree(out);
    giftFrame* f = nullptr;
    ASSERT_EQ(giftFrameOpenFile(path.c_str(), &f), GIFT_OK);
    EXPECT_EQ(giftFrameVerify(f), GIFT_OK);
    EXPECT_EQ(giftFrameTensorCount(f), 1u);
    giftFrameClose(f);
    ::unlink(path.c_str());
  }
  ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  ASSERT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
  ASSERT_EQ(giftFrameWriterStreamTo(w, out, 1, names, ndims, nullptr), GIFT_OK);
  giftFrameWriterFree(w);
  EXPECT_EQ(giftOutputCommit(out), GIFT_ERROR_INVALID_ARGUMENT);
  giftOutputFree(out);
  EXPECT_TRUE(entries(dir).empty());

  ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  ASSERT_EQ(giftFrameWriterSetScratchDir(w, dir.c_str()), GIFT_OK);
  EXPECT_EQ(giftFrameWriterSetScratchDir(w, dir.c_str()), GIFT_ERROR_INVALID_ARGUMENT);
  giftFrameWriterFree(w);

  const uint32_t too_many[] = {33};
  ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  ASSERT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
  EXPECT_EQ(giftFrameWriterStreamTo(w, out, 1, names, too_many, nullptr),
            GIFT_ERROR_INVALID_ARGUMENT);
  giftOutputFree(out);
  giftFrameWriterFree(w);

  ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  ASSERT_EQ(giftFrameWriterAddTensor(w, "x", shape, 2, GIFT_DTYPE_F32, x, &p), GIFT_OK);
  ASSERT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
  EXPECT_EQ(giftFrameWriterStreamTo(w, out, 1, names, ndims, nullptr), GIFT_ERROR_INVALID_ARGUMENT)
      << "a tensor was added before";
  giftOutputFree(out);
  giftFrameWriterFree(w);
  ::rmdir(dir.c_str());
}

// A case's frame opened twice, checksums first and late: `tensor(f, i, info)` for each of its
// tensors, then `frame(f)`, the frame still open.
template <typename PerTensor, typename PerFrame>
void with_each_tensor(const Case& c, PerTensor tensor, PerFrame frame) {
  SCOPED_TRACE(c.name);
  const std::vector<uint8_t> bytes = frame_of(c, "", "");
  for (const int late : {0, 1}) {
    SCOPED_TRACE(late ? "late checksums" : "checksums first");
    giftFrame* f = nullptr;
    ASSERT_EQ(giftFrameOpen(bytes.data(), bytes.size(), &f), GIFT_OK);
    ASSERT_EQ(giftFrameSetLateChecksums(f, late), GIFT_OK);
    for (uint64_t i = 0; i < giftFrameTensorCount(f) && !::testing::Test::HasFatalFailure(); ++i) {
      giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
      ASSERT_EQ(giftFrameTensorInfo(f, i, &info), GIFT_OK);
      tensor(f, i, info);
    }
    if (!::testing::Test::HasFatalFailure()) frame(f);
    giftFrameClose(f);
  }
}

// Decoding a tensor in bands of rows gives the bytes of the whole decode, for every layout,
// output type and compression, with bands cut where the tensor allows.
TEST(Streaming, BandsDecodeAsTheWholeTensor) {
  for (const Case& c : {Case{"tile", GIFT_SCALE_TILE, GIFT_ROUND_NEAREST, 0},
                        Case{"tensor", GIFT_SCALE_TENSOR, GIFT_ROUND_STOCHASTIC, 0},
                        Case{"zstd", GIFT_SCALE_BLOCK, GIFT_ROUND_NEAREST, 3}}) {
    with_each_tensor(
        c,
        [&](giftFrame* f, uint64_t i, const giftTensorInfo& info) {
          ASSERT_EQ(info.rows * info.cols, info.elements);
          EXPECT_EQ(info.row_align, c.layout == GIFT_SCALE_TILE && !info.raw ? 3u : 1u);
          for (const giftDType_t dt : {GIFT_DTYPE_F32, GIFT_DTYPE_BF16}) {
            const size_t w = giftDTypeSize(dt);
            std::vector<uint8_t> whole(info.elements * w), bands(whole.size());
            ASSERT_EQ(giftFrameDecodeTensor(f, i, whole.data(), whole.size(), dt), GIFT_OK);
            // In order, then (bf16) from the last band back to the first: a compressed section
            // read backwards starts again from its beginning for each band, and with late
            // checksums the first band, out of order, checks the whole section (the call for no
            // rows of another tensor before makes the pass start this tensor afresh).
            ASSERT_EQ(
                giftFrameDecodeRows(f, (i + 1) % giftFrameTensorCount(f), 0, 0, nullptr, 0, dt),
                GIFT_OK);
            const uint64_t step = info.row_align * 337, count = (info.rows + step - 1) / step;
            for (uint64_t k = 0; k < count; ++k) {
              const uint64_t r0 = (dt == GIFT_DTYPE_F32 ? k : count - 1 - k) * step;
              const uint64_t n = std::min(step, info.rows - r0);
              ASSERT_EQ(giftFrameDecodeRows(f, i, r0, n, bands.data() + r0 * info.cols * w,
                                            n * info.cols * w, dt),
                        GIFT_OK)
                  << giftGetLastErrorMessage();
            }
            EXPECT_EQ(bands, whole) << info.name;
          }
        },
        [&](giftFrame* f) {
          float one[5000];
          EXPECT_EQ(giftFrameDecodeRows(f, 0, 4098, 2, one, sizeof one, GIFT_DTYPE_F32),
                    GIFT_ERROR_INVALID_ARGUMENT);
          EXPECT_NE(std::string(giftGetLastErrorMessage()).find("has 4099 rows"),
                    std::string::npos);
          EXPECT_EQ(giftFrameDecodeRows(f, 0, 1, 3, one, 4, GIFT_DTYPE_F32),
                    c.layout == GIFT_SCALE_TILE ? GIFT_ERROR_INVALID_ARGUMENT
                                                : GIFT_ERROR_BUFFER_TOO_SMALL);
          if (c.layout == GIFT_SCALE_TILE) {
            EXPECT_NE(
                std::string(giftGetLastErrorMessage()).find("rows 1 to 3 cross a tile's edge"),
                std::string::npos)
                << giftGetLastErrorMessage();
          }
        });
  }
}

// Rows decoded one at a time (within a tile's rows too) and in parts of a row, in order and
// with late checksums or not, give the bytes of the whole decode: the parts that bound a
// decode's memory where a tile's rows, or a single row, are longer than its buffer.
TEST(Streaming, SingleRowsAndPartsOfRowsDecodeAsTheWholeTensor) {
  for (const Case& c : {Case{"tile", GIFT_SCALE_TILE, GIFT_ROUND_NEAREST, 0},
                        Case{"block", GIFT_SCALE_BLOCK, GIFT_ROUND_STOCHASTIC, 0},
                        Case{"row", GIFT_SCALE_ROW, GIFT_ROUND_NEAREST, 0},
                        Case{"tensor", GIFT_SCALE_TENSOR, GIFT_ROUND_NEAREST, 0},
                        Case{"zstd", GIFT_SCALE_BLOCK, GIFT_ROUND_NEAREST, 3}}) {
    with_each_tensor(
        c,
        [&](giftFrame* f, uint64_t i, const giftTensorInfo& info) {
          const uint64_t group = info.raw                       ? 1
                                 : c.layout == GIFT_SCALE_TILE  ? 5
                                 : c.layout == GIFT_SCALE_BLOCK ? info.params.block
                                                                : 1;
          EXPECT_EQ(info.col_align, group) << info.name;
          const giftDType_t dt = i % 2 ? GIFT_DTYPE_BF16 : GIFT_DTYPE_F32;
          const size_t w = giftDTypeSize(dt);
          std::vector<uint8_t> whole(info.elements * w), rows(whole.size()), parts(whole.size());
          ASSERT_EQ(giftFrameDecodeTensor(f, i, whole.data(), whole.size(), dt), GIFT_OK);
          // Parts of whole groups, about 300 columns, and a shorter one at the row's end (its
          // last group cut short, that group's scale kept).
          const uint64_t part = (300 + info.col_align - 1) / info.col_align * info.col_align;
          for (uint64_t r = 0; r < info.rows; ++r) {
            uint8_t* row = rows.data() + r * info.cols * w;
            ASSERT_EQ(giftFrameDecodeRows(f, i, r, 1, row, info.cols * w, dt), GIFT_OK)
                << giftGetLastErrorMessage();
          }
          EXPECT_EQ(rows, whole) << info.name << ": single rows";
          for (uint64_t r = 0; r < info.rows; ++r) {
            for (uint64_t c0 = 0; c0 < info.cols; c0 += part) {
              const uint64_t n = std::min(part, info.cols - c0);
              ASSERT_EQ(giftFrameDecodeRowPart(f, i, r, c0, n,
                                               parts.data() + (r * info.cols + c0) * w, n * w, dt),
                        GIFT_OK)
                  << giftGetLastErrorMessage() << " (row " << r << ", column " << c0 << ")";
            }
          }
          EXPECT_EQ(parts, whole) << info.name << ": parts of rows";
          // Parts that start inside a group and end at its edge (a group wider than a buffer),
          // on the first rows.
          if (info.col_align > 1) {
            std::fill(parts.begin(), parts.end(), 0);
            const uint64_t first = info.col_align / 2 + 1, rows = std::min<uint64_t>(info.rows, 40);
            for (uint64_t r = 0; r < rows; ++r) {
              for (uint64_t g0 = 0; g0 < info.cols; g0 += info.col_align) {
                const uint64_t end = std::min(g0 + info.col_align, info.cols);
                for (uint64_t c0 = g0; c0 < end; c0 = std::min(c0 == g0 ? g0 + first : end, end)) {
                  const uint64_t n = std::min(c0 == g0 ? first : end - c0, end - c0);
                  ASSERT_EQ(giftFrameDecodeRowPart(
                                f, i, r, c0, n, parts.data() + (r * info.cols + c0) * w, n * w, dt),
                            GIFT_OK)
                      << giftGetLastErrorMessage() << " (row " << r << ", column " << c0 << ")";
                }
              }
            }
            const ptrdiff_t checked = ptrdiff_t(rows * info.cols * w);
            EXPECT_TRUE(std::equal(parts.begin(), parts.begin() + checked, whole.begin()))
                << info.name << ": parts within groups";
          }
        },
        [&](giftFrame* f) {
          float one[64];
          const uint64_t big = 0;  // 4099 x 1100 fp32, FP8
          giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
          ASSERT_EQ(giftFrameTensorInfo(f, big, &info), GIFT_OK);
          if (info.col_align > 1) {  // across a group's edge, not starting at one
            const uint64_t c0 = info.col_align - 1;
            EXPECT_EQ(giftFrameDecodeRowPart(f, big, 0, c0, 2, one, sizeof one, GIFT_DTYPE_F32),
                      GIFT_ERROR_INVALID_ARGUMENT);
            EXPECT_NE(std::string(giftGetLastErrorMessage())
                          .find("columns " + std::to_string(c0) + " to " + std::to_string(c0 + 1) +
                                " cross the edge of a scale group"),
                      std::string::npos)
                << giftGetLastErrorMessage();
          }
          EXPECT_EQ(giftFrameDecodeRowPart(f, big, 4099, 0, 1, one, sizeof one, GIFT_DTYPE_F32),
                    GIFT_ERROR_INVALID_ARGUMENT);
          EXPECT_EQ(giftFrameDecodeRowPart(f, big, 0, 1095, 10, one, sizeof one, GIFT_DTYPE_F32),
                    GIFT_ERROR_INVALID_ARGUMENT);
          EXPECT_NE(std::string(giftGetLastErrorMessage()).find("10 columns from column 1095"),
                    std::string::npos)
              << giftGetLastErrorMessage();
          EXPECT_EQ(giftFrameDecodeRowPart(f, big, 0, 0, 64, one, 4, GIFT_DTYPE_F32),
                    GIFT_ERROR_BUFFER_TOO_SMALL);
          EXPECT_EQ(giftFrameDecodeRowPart(nullptr, big, 0, 0, 1, one, 4, GIFT_DTYPE_F32),
                    GIFT_ERROR_INVALID_ARGUMENT);
        });
  }
}

// A frame writer with a scratch folder, which encodes in bands, gives x's tensor these codes
// and scales.
void expect_frame_has(const std::vector<float>& x, uint64_t rows, uint64_t cols,
                      const giftQuantParams& p, const std::string& dir,
                      const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales) {
  const uint64_t scale_bytes = scales.size();
  giftFrameWriter* w = nullptr;
  ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  ASSERT_EQ(giftFrameWriterSetScratchDir(w, dir.c_str()), GIFT_OK);
  const uint64_t shape[] = {rows, cols};
  ASSERT_EQ(giftFrameWriterAddTensor(w, "w", shape, 2, GIFT_DTYPE_F32, x.data(), &p), GIFT_OK)
      << giftGetLastErrorMessage();
  void* bytes = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(giftFrameWriterFinish(w, &bytes, &size), GIFT_OK) << giftGetLastErrorMessage();
  giftFrameWriterFree(w);
  giftFrame* f = nullptr;
  ASSERT_EQ(giftFrameOpen(bytes, size, &f), GIFT_OK);
  const uint8_t* fc = nullptr;
  const void* fs = nullptr;
  uint64_t fs_bytes = 0;
  ASSERT_EQ(giftFrameTensorData(f, 0, &fc, &fs, &fs_bytes), GIFT_OK);
  ASSERT_EQ(fs_bytes, scale_bytes);
  EXPECT_EQ(std::memcmp(fc, codes.data(), codes.size()), 0);
  EXPECT_EQ(std::memcmp(fs, scales.data(), scale_bytes), 0);
  giftFrameClose(f);
  giftFree(bytes);
}

// A frame writer with a scratch folder, which encodes in bands, gives a tensor the codes and
// scales of giftEncode of the whole tensor, with its scales held and spilled (ScalesBuffer).
void expect_banded_as_whole(const std::vector<float>& x, uint64_t rows, uint64_t cols,
                            const giftQuantParams& p, const std::string& dir) {
  uint64_t scale_bytes = 0;
  ASSERT_EQ(giftScaleBytes(&p, rows, cols, &scale_bytes), GIFT_OK);
  std::vector<uint8_t> codes(rows * cols), scales(scale_bytes);
  ASSERT_EQ(giftEncode(nullptr, &p, x.data(), GIFT_DTYPE_F32, rows, cols, codes.data(),
                       scales.data(), scale_bytes, nullptr),
            GIFT_OK);
  const uint64_t held = gift::container::set_held_scale_bytes_for_test(0);
  for (const uint64_t bound : {held, uint64_t(0)}) {
    SCOPED_TRACE(bound ? "scales held" : "scales spilled");
    gift::container::set_held_scale_bytes_for_test(bound);
    expect_frame_has(x, rows, cols, p, dir, codes, scales);
  }
  gift::container::set_held_scale_bytes_for_test(held);
}

// A row longer than the writer's band (2^20 elements) goes through the encoder in parts; its
// codes and scales are the in-memory encoder's for the whole tensor, blocks cut short at
// the row's end, one scale for the tensor, and stochastic rounding (counted by element)
// included; and the frame decodes to giftDecode's values.
TEST(Streaming, RowsLongerThanABandEncodeAsTheWholeTensor) {
  const uint64_t rows = 2, cols = (uint64_t(1) << 20) + 1000;
  std::vector<float> x = values(rows * cols, 8);
  x[rows * cols - 5] = 0.5f;                        // the second row's amax, in its last part
  x[100] = std::numeric_limits<float>::infinity();  // left out of the first row's amax
  const std::string dir = temp_dir();
  // Tiles: whole ones in each part (1 x 50000: parts of 1000000 columns), one part over two
  // rows of tiles (2 x 64), and tiles wider than a part, the second cut at the row's end
  // (1 x 1049000: parts of 2^20 and 424 columns, then one of 576).
  struct Tile {
    uint32_t rows, cols;
  };
  for (const giftScaleLayout_t layout :
       {GIFT_SCALE_BLOCK, GIFT_SCALE_ROW, GIFT_SCALE_TENSOR, GIFT_SCALE_TILE}) {
    for (const Tile tile : layout == GIFT_SCALE_TILE
                               ? std::vector<Tile>{{1, 50000}, {2, 64}, {1, 1049000}}
                               : std::vector<Tile>{{1, 1}}) {
      for (const giftRounding_t rounding : {GIFT_ROUND_NEAREST, GIFT_ROUND_STOCHASTIC}) {
        SCOPED_TRACE(
            std::string(layout == GIFT_SCALE_BLOCK ? "blocks"
                        : layout == GIFT_SCALE_ROW ? "rows"
                        : layout == GIFT_SCALE_TILE
                            ? "tiles " + std::to_string(tile.rows) + "x" + std::to_string(tile.cols)
                            : "tensor") +
            (rounding == GIFT_ROUND_NEAREST ? ", nearest" : ", stochastic"));
        giftQuantParams p;
        giftQuantParamsInit(&p);
        p.layout = layout;
        p.tile_rows = tile.rows;
        p.tile_cols = tile.cols;
        p.rounding = rounding;
        p.block = 32;
        p.nonfinite = GIFT_NONFINITE_KEEP;
        expect_banded_as_whole(x, rows, cols, p, dir);
      }
    }
  }
  ::rmdir(dir.c_str());
}

// A row of tiles larger than the writer takes as one band (8M elements) is encoded in bands
// inside it (here of 61 rows: 9 in the first row of tiles), the tiles' scales from a first pass.
TEST(Streaming, TilesTallerThanABandEncodeAsTheWholeTensor) {
  const uint64_t rows = 600, cols = 17000;
  std::vector<float> x = values(rows * cols, 9);
  x[400 * cols + 2100] = 0.5f;     // tile (0, 3)'s amax, in the tile row's seventh band
  x[599 * cols + 16999] = -0.75f;  // tile (1, 24)'s, in the last row
  x[10 * cols + 20] = std::numeric_limits<float>::quiet_NaN();  // left out of tile (0, 0)'s
  const std::string dir = temp_dir();
  for (const giftScaleDType_t scale_dtype : {GIFT_SCALE_DTYPE_F32, GIFT_SCALE_DTYPE_E8M0}) {
    for (const giftRounding_t rounding : {GIFT_ROUND_NEAREST, GIFT_ROUND_STOCHASTIC}) {
      SCOPED_TRACE(std::string(scale_dtype == GIFT_SCALE_DTYPE_F32 ? "f32" : "e8m0") +
                   (rounding == GIFT_ROUND_NEAREST ? ", nearest" : ", stochastic"));
      giftQuantParams p;
      giftQuantParamsInit(&p);
      p.layout = GIFT_SCALE_TILE;
      p.tile_rows = 500;
      p.tile_cols = 700;
      p.scale_dtype = scale_dtype;
      p.rounding = rounding;
      p.nonfinite = GIFT_NONFINITE_KEEP;
      expect_banded_as_whole(x, rows, cols, p, dir);
    }
  }
  ::rmdir(dir.c_str());
}

// Decodes rows [r0, r0 + n) of tensor i of f into a scratch buffer.
giftResult_t decode_band(giftFrame* f, uint64_t i, uint64_t r0, uint64_t n, uint64_t cols) {
  std::vector<float> band(n * cols);
  return giftFrameDecodeRows(f, i, r0, n, band.data(), band.size() * 4, GIFT_DTYPE_F32);
}

// With late checksums, damaged codes decoded in order are reported by the last band's call
// wherever the damage lies, and every call for the tensor after it fails too; a band out of
// order, and a compressed section, are checked whole at once, as without them. Block and
// tile layouts (bands of whole tiles), FP8 codes and raw data.
TEST(Streaming, LateChecksumsReportDamageByTheLastBand) {
  EXPECT_EQ(giftFrameSetLateChecksums(nullptr, 1), GIFT_ERROR_INVALID_ARGUMENT);
  for (const Case& c : {Case{"block", GIFT_SCALE_BLOCK, GIFT_ROUND_NEAREST, 0},
                        Case{"tile", GIFT_SCALE_TILE, GIFT_ROUND_NEAREST, 0}}) {
    SCOPED_TRACE(c.name);
    const std::vector<uint8_t> good = frame_of(c, "", "");
    const fb::Frame* h = fb::GetFrame(good.data() + gift::container::kPreambleBytes);
    // "big", 4099 x 1100 in 11 bands of 402 rows (134 tiles), and "bias", raw data of one
    // row (one band).
    for (const uint64_t i : {0, 1}) {
      const fb::Section* codes = h->tensors()->Get(flatbuffers::uoffset_t(i))->codes();
      ASSERT_EQ(codes->compression(), fb::Compression::None);
      const uint64_t rows = i == 0 ? 4099 : 1, cols = 1100, step = 402;
      const uint64_t last = (rows - 1) / step * step;
      const std::string message = std::string("frame: tensor '") + (i == 0 ? "big" : "bias") +
                                  "': " + (i == 0 ? "codes" : "raw data") +
                                  " section: checksum mismatch (the data is damaged)";
      // Undamaged, with the first band decoded twice (the second time out of order).
      giftFrame* g = nullptr;
      ASSERT_EQ(giftFrameOpen(good.data(), good.size(), &g), GIFT_OK);
      ASSERT_EQ(giftFrameSetLateChecksums(g, 1), GIFT_OK);
      ASSERT_EQ(decode_band(g, i, 0, std::min(step, rows), cols), GIFT_OK);
      for (uint64_t r0 = 0; r0 < rows; r0 += step) {
        ASSERT_EQ(decode_band(g, i, r0, std::min(step, rows - r0), cols), GIFT_OK) << r0;
      }
      giftFrameClose(g);
      for (const uint64_t at :
           {uint64_t(5), codes->stored_length() / 2, codes->stored_length() - 1}) {
        SCOPED_TRACE(std::to_string(i) + " damaged at " + std::to_string(at));
        std::vector<uint8_t> bad = good;
        bad[codes->offset() + at] ^= 1;
        giftFrame* f = nullptr;
        ASSERT_EQ(giftFrameOpen(bad.data(), bad.size(), &f), GIFT_OK);
        ASSERT_EQ(giftFrameSetLateChecksums(f, 1), GIFT_OK);
        for (uint64_t r0 = 0; r0 < last; r0 += step) {
          ASSERT_EQ(decode_band(f, i, r0, step, cols), GIFT_OK) << r0;
        }
        EXPECT_EQ(decode_band(f, i, last, rows - last, cols), GIFT_ERROR_SECTION_CHECKSUM);
        EXPECT_EQ(giftGetLastErrorMessage(), message);
        // The last band again (out of order), or the tensor again from its first band: the
        // whole section is checked first.
        EXPECT_EQ(decode_band(f, i, last, rows - last, cols), GIFT_ERROR_SECTION_CHECKSUM);
        EXPECT_EQ(decode_band(f, i, 0, std::min(step, rows), cols), GIFT_ERROR_SECTION_CHECKSUM);
        giftFrameClose(f);
        for (const int late : {0, 1}) {  // the first call out of order, or checks first
          ASSERT_EQ(giftFrameOpen(bad.data(), bad.size(), &f), GIFT_OK);
          ASSERT_EQ(giftFrameSetLateChecksums(f, late), GIFT_OK);
          EXPECT_EQ(
              decode_band(f, i, late ? last : 0, late ? rows - last : std::min(step, rows), cols),
              GIFT_ERROR_SECTION_CHECKSUM);
          giftFrameClose(f);
        }
        if (i == 1) continue;
        // Late checksums turned off after the first band: this tensor is still checked to
        // its last band; back from another tensor, it is checked whole first.
        ASSERT_EQ(giftFrameOpen(bad.data(), bad.size(), &f), GIFT_OK);
        ASSERT_EQ(giftFrameSetLateChecksums(f, 1), GIFT_OK);
        ASSERT_EQ(decode_band(f, i, 0, step, cols), GIFT_OK);
        ASSERT_EQ(giftFrameSetLateChecksums(f, 0), GIFT_OK);
        for (uint64_t r0 = step; r0 < last; r0 += step) {
          ASSERT_EQ(decode_band(f, i, r0, step, cols), GIFT_OK) << r0;
        }
        EXPECT_EQ(decode_band(f, i, last, rows - last, cols), GIFT_ERROR_SECTION_CHECKSUM);
        giftFrameClose(f);
        ASSERT_EQ(giftFrameOpen(bad.data(), bad.size(), &f), GIFT_OK);
        ASSERT_EQ(giftFrameSetLateChecksums(f, 1), GIFT_OK);
        ASSERT_EQ(decode_band(f, i, 0, step, cols), GIFT_OK);
        ASSERT_EQ(decode_band(f, 4, 0, 10, 1030), GIFT_OK);  // "noise"
        EXPECT_EQ(decode_band(f, i, step, step, cols), GIFT_ERROR_SECTION_CHECKSUM);
        giftFrameClose(f);
      }
    }
  }
  // A compressed section: checked whole by the first band's call.
  const std::vector<uint8_t> packed =
      frame_of(Case{"zstd", GIFT_SCALE_BLOCK, GIFT_ROUND_NEAREST, 3}, "", "");
  const fb::Frame* hp = fb::GetFrame(packed.data() + gift::container::kPreambleBytes);
  const fb::Section* half = hp->tensors()->Get(2)->codes();  // "half", 2050 x 2100
  ASSERT_EQ(half->compression(), fb::Compression::Zstd);
  std::vector<uint8_t> bad = packed;
  bad[half->offset() + half->stored_length() - 1] ^= 1;
  giftFrame* f = nullptr;
  ASSERT_EQ(giftFrameOpen(bad.data(), bad.size(), &f), GIFT_OK);
  ASSERT_EQ(giftFrameSetLateChecksums(f, 1), GIFT_OK);
  EXPECT_EQ(decode_band(f, 2, 0, 100, 2100), GIFT_ERROR_SECTION_CHECKSUM);
  giftFrameClose(f);
}

TEST(Streaming, OutputAppearsOnlyWhenCommitted) {
  const std::string dir = temp_dir(), path = dir + "/out.bin";
  { std::ofstream(path) << "old"; }
  giftOutput* o = nullptr;
  ASSERT_EQ(giftOutputOpenFile(path.c_str(), &o), GIFT_OK);
  ASSERT_EQ(giftOutputWrite(o, "new bytes", 9), GIFT_OK);
  EXPECT_EQ(file_bytes(path), std::vector<uint8_t>({'o', 'l', 'd'}));
  EXPECT_EQ(entries(dir).size(), 1u) << "the unfinished output has no name";
  giftOutputFree(o);  // not committed: discarded
  EXPECT_EQ(file_bytes(path), std::vector<uint8_t>({'o', 'l', 'd'}));
  EXPECT_EQ(entries(dir).size(), 1u);

  ASSERT_EQ(giftOutputOpenFile(path.c_str(), &o), GIFT_OK);
  ASSERT_EQ(giftOutputWrite(o, "new", 3), GIFT_OK);
  ASSERT_EQ(giftOutputWrite(o, " bytes", 6), GIFT_OK);
  ASSERT_EQ(giftOutputCommit(o), GIFT_OK);
  giftOutputFree(o);
  const std::string got(reinterpret_cast<const char*>(file_bytes(path).data()), 9);
  EXPECT_EQ(got, "new bytes");
  EXPECT_EQ(entries(dir), std::vector<std::string>({"out.bin"}));

  // Without the sync (as giftc without --fsync): unnamed all the same until committed.
  ASSERT_EQ(giftOutputOpenFile(path.c_str(), &o), GIFT_OK);
  ASSERT_EQ(giftOutputSetSync(o, 0), GIFT_OK);
  ASSERT_EQ(giftOutputWrite(o, "unsynced", 8), GIFT_OK);
  EXPECT_EQ(entries(dir), std::vector<std::string>({"out.bin"}));
  EXPECT_EQ(file_bytes(path).size(), 9u) << "the committed output is still there";
  ASSERT_EQ(giftOutputCommit(o), GIFT_OK);
  giftOutputFree(o);
  EXPECT_EQ(file_bytes(path), std::vector<uint8_t>({'u', 'n', 's', 'y', 'n', 'c', 'e', 'd'}));
  EXPECT_EQ(entries(dir), std::vector<std::string>({"out.bin"}));
  EXPECT_EQ(giftOutputSetSync(nullptr, 0), GIFT_ERROR_INVALID_ARGUMENT);

  EXPECT_EQ(giftOutputOpenFile((dir + "/no/such/folder/x").c_str(), &o), GIFT_ERROR_IO);
  EXPECT_NE(std::string(giftGetLastErrorMessage()).find("no/such/folder/x"), std::string::npos);
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

// Without replacing (giftc without -f), a file made under the output's name while it was
// written is kept and the commit fails, leaving nothing else; a free name is taken. Names
// up to NAME_MAX work either way, though the temporary beside one needs a suffix. Both with
// unnamed files and with the named temporaries of file systems that have none.
TEST(Streaming, WithoutReplacingAFileMadeMeanwhileIsKept) {
  const std::string dir = temp_dir();
  const auto text = [](const std::string& path) {
    const std::vector<uint8_t> b = file_bytes(path);
    return std::string(b.begin(), b.end());
  };
  const auto write = [](const std::string& path, int replace, const char* bytes) {
    giftOutput* o = nullptr;
    EXPECT_EQ(giftOutputOpenFile(path.c_str(), &o), GIFT_OK);
    EXPECT_EQ(giftOutputSetSync(o, 0), GIFT_OK);
    EXPECT_EQ(giftOutputSetReplace(o, replace), GIFT_OK);
    EXPECT_EQ(giftOutputWrite(o, bytes, std::strlen(bytes)), GIFT_OK);
    return o;
  };
  struct Restore {  // unnamed files again, however the test ends
    ~Restore() { gift::set_unnamed_files_for_test(true); }
  } restore;
  for (bool unnamed : {true, false}) {
    gift::set_unnamed_files_for_test(unnamed);
    for (const std::string& name : {std::string("out.bin"), std::string(255, 'n')}) {
      SCOPED_TRACE(std::string(unnamed ? "unnamed" : "named temporary") + ", name of " +
                   std::to_string(name.size()) + " bytes");
      const std::string path = dir + "/" + name;
      giftOutput* o = write(path, 0, "new");
      { std::ofstream(path) << "made meanwhile"; }
      EXPECT_EQ(giftOutputCommit(o), GIFT_ERROR_IO);
      EXPECT_NE(std::string(giftGetLastErrorMessage()).find("already exists"), std::string::npos)
          << giftGetLastErrorMessage();
      // Discarded, as the header says: nothing more can be written or committed.
      EXPECT_EQ(giftOutputWrite(o, "more", 4), GIFT_ERROR_IO);
      ::unlink(path.c_str());
      EXPECT_EQ(giftOutputCommit(o), GIFT_ERROR_IO);
      EXPECT_NE(std::string(giftGetLastErrorMessage()).find("already exists"), std::string::npos)
          << giftGetLastErrorMessage();
      EXPECT_EQ(entries(dir), std::vector<std::string>()) << "a temporary left behind";
      { std::ofstream(path) << "made meanwhile"; }
      giftOutputFree(o);
      EXPECT_EQ(text(path), "made meanwhile");
      EXPECT_EQ(entries(dir), std::vector<std::string>({name})) << "a temporary left behind";

      o = write(path, 1, "replaced");  // the default, as with -f
      ASSERT_EQ(giftOutputCommit(o), GIFT_OK) << giftGetLastErrorMessage();
      giftOutputFree(o);
      EXPECT_EQ(text(path), "replaced");
      ::unlink(path.c_str());

      o = write(path, 0, "free name");
      ASSERT_EQ(giftOutputCommit(o), GIFT_OK) << giftGetLastErrorMessage();
      giftOutputFree(o);
      EXPECT_EQ(text(path), "free name");
      EXPECT_EQ(entries(dir), std::vector<std::string>({name}));
      ::unlink(path.c_str());
    }
  }
  EXPECT_EQ(giftOutputSetReplace(nullptr, 0), GIFT_ERROR_INVALID_ARGUMENT);
  ::rmdir(dir.c_str());
}

// giftOutputSetMode's bits are the committed file's, whatever the umask, with unnamed files
// and named temporaries alike; without it the file has open(2)'s 0666 less the umask.
TEST(Streaming, ACommittedFileTakesTheModeItWasGiven) {
  const std::string dir = temp_dir();
  struct Restore {  // unnamed files and the umask again, however the test ends
    mode_t mask = ::umask(022);
    ~Restore() {
      gift::set_unnamed_files_for_test(true);
      ::umask(mask);
    }
  } restore;
  const auto mode_of = [](const std::string& path) {
    struct stat st;
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return unsigned(st.st_mode & 07777);
  };
  for (bool unnamed : {true, false}) {
    gift::set_unnamed_files_for_test(unnamed);
    for (const int mode : {-1, 0600, 0640, 0777}) {
      SCOPED_TRACE(std::string(unnamed ? "unnamed" : "named temporary") + ", mode " +
                   std::to_string(mode));
      const std::string path = dir + "/out.bin";
      giftOutput* o = nullptr;
      ASSERT_EQ(giftOutputOpenFile(path.c_str(), &o), GIFT_OK);
      EXPECT_EQ(giftOutputSetSync(o, 0), GIFT_OK);
      if (mode >= 0) {
        EXPECT_EQ(giftOutputSetMode(o, unsigned(mode)), GIFT_OK);
      }
      EXPECT_EQ(giftOutputWrite(o, "x", 1), GIFT_OK);
      ASSERT_EQ(giftOutputCommit(o), GIFT_OK) << giftGetLastErrorMessage();
      giftOutputFree(o);
      EXPECT_EQ(mode_of(path), mode >= 0 ? unsigned(mode) : 0644u);
      ::unlink(path.c_str());
    }
  }
  giftOutput* o = nullptr;
  ASSERT_EQ(giftOutputOpenFile((dir + "/x").c_str(), &o), GIFT_OK);
  EXPECT_EQ(giftOutputSetMode(o, 04755), GIFT_ERROR_INVALID_ARGUMENT);  // no set-user-ID
  giftOutputFree(o);
  EXPECT_EQ(giftOutputSetMode(nullptr, 0600), GIFT_ERROR_INVALID_ARGUMENT);
  ::rmdir(dir.c_str());
}

// What giftRemoveTemporaryFiles (a signal handler's call) removes: the names recorded and
// not forgotten, never a committed output; a full registry only loses the clean-up.
TEST(Streaming, RecordedTemporariesAreRemovedOnRequest) {
  const std::string dir = temp_dir();
  const auto make = [&](const std::string& name) {
    std::ofstream(dir + "/" + name) << "x";
    return dir + "/" + name;
  };
  std::vector<int> many;
  for (int i = 0; i < 100; ++i) many.push_back(gift::temporary_add(dir + "/absent"));
  EXPECT_EQ(many.back(), -1) << "a registry of fixed size";
  for (const int slot : many) gift::temporary_remove(slot);
  EXPECT_EQ(gift::temporary_add(dir + "/" + std::string(5000, 'x')), -1) << "a name too long";
  giftOutput* o = nullptr;
  ASSERT_EQ(giftOutputOpenFile((dir + "/out.bin").c_str(), &o), GIFT_OK);
  ASSERT_EQ(giftOutputWrite(o, "bytes", 5), GIFT_OK);
  ASSERT_EQ(giftOutputCommit(o), GIFT_OK);
  giftOutputFree(o);
  const int a = gift::temporary_add(make("a.tmp")), b = gift::temporary_add(make("b.tmp"));
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_NE(a, b);
  gift::temporary_remove(b);

  giftRemoveTemporaryFiles();
  std::vector<std::string> left = entries(dir);
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, std::vector<std::string>({"b.tmp", "out.bin"}));
  gift::temporary_remove(a);
  for (const std::string& n : entries(dir)) ::unlink((dir + "/" + n).c_str());
  ::rmdir(dir.c_str());
}

// Small writes into a file are gathered and written as one: every other way of writing or
// moving the file's end (a large write, a write behind, truncate, write_at, append_from,
// commit) comes after them, in order, and the size counts them all along; a small write waits
// for a write behind as every call does.
TEST(Streaming, SmallWritesIntoAFileKeepTheirOrder) {
  const std::string dir = temp_dir(), path = dir + "/small.bin", from = dir + "/from.bin";
  {
    std::ofstream f(from, std::ios::binary);
    f << "0123456789";
  }
  const int src = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(src, 0);
  std::string expected;
  gift::OutputFile out;
  ASSERT_EQ(out.open(path), GIFT_OK);
  const auto put = [&](const std::string& bytes) {
    ASSERT_EQ(out.write(bytes.data(), bytes.size()), GIFT_OK);
    expected += bytes;
    EXPECT_EQ(out.size(), expected.size());
  };
  put("ab");
  put(std::string(70000, 'L'));  // past the gathering: written after "ab"
  put("cd");
  ASSERT_EQ(out.truncate(expected.size() - 1), GIFT_OK);  // drops the "d" still gathered
  expected.pop_back();
  put("ef");
  ASSERT_EQ(out.write_at(1, "X", 1), GIFT_OK);  // over bytes written, not gathered ones
  expected[1] = 'X';
  // A write behind's buffer is the caller's again once the next call returns, a small one
  // (gathered) included.
  // The buffers are changed at their tails, which write(2) reaches last, at once: no other
  // work in between.
  std::string behind(32 << 20, 'B'), again(32 << 20, 'C');
  const std::string behind_was = behind, again_was = again, small = "gh";
  ASSERT_EQ(out.write_behind(behind.data(), behind.size(), nullptr), GIFT_OK);
  ASSERT_EQ(out.write("x", 1), GIFT_OK);
  std::fill(behind.end() - 4096, behind.end(), 'Z');
  ASSERT_EQ(out.write_behind(again.data(), again.size(), nullptr), GIFT_OK);
  ASSERT_EQ(out.write_behind(small.data(), small.size(), nullptr), GIFT_OK);
  std::fill(again.end() - 4096, again.end(), 'Z');
  expected += behind_was + "x" + again_was + small;
  EXPECT_EQ(out.size(), expected.size());
  put("ij");
  ASSERT_EQ(out.append_from(src, 2, 3), GIFT_OK);
  expected += "234";
  for (int k = 0; k < 5000; ++k) put(std::to_string(k));  // many times the gathering's room
  ASSERT_EQ(out.commit(), GIFT_OK) << giftGetLastErrorMessage();
  ::close(src);
  const std::vector<uint8_t> got = file_bytes(path);
  EXPECT_TRUE(std::string(got.begin(), got.end()) == expected);
  ::unlink(path.c_str());
  ::unlink(from.c_str());
  ::rmdir(dir.c_str());
}

TEST(Streaming, OutputToADescriptorWritesAsItComes) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  giftOutput* o = nullptr;
  ASSERT_EQ(giftOutputOpenFd(fds[1], "pipe", &o), GIFT_OK);
  ASSERT_EQ(giftOutputWrite(o, "abc", 3), GIFT_OK);
  char buf[4] = {};
  ASSERT_EQ(::read(fds[0], buf, 3), 3);
  EXPECT_STREQ(buf, "abc");
  ASSERT_EQ(giftOutputCommit(o), GIFT_OK);
  giftOutputFree(o);
  EXPECT_EQ(::write(fds[1], "d", 1), 1) << "the caller's descriptor stays open";
  ::close(fds[0]);
  ::close(fds[1]);
}

// Buffers in turn through giftOutputWriteBehind, each refilled as soon as the write of the next
// one has started: the file holds what each held when it was handed over only if every write
// behind waited for the one before, and each call reports the failure of a write behind it,
// every time.
void expect_writes_behind_keep_their_bytes_and_report_their_failures() {
  const std::string dir = temp_dir(), path = dir + "/behind.bin";
  std::vector<uint8_t> buffers[2], expected;
  for (std::vector<uint8_t>& b : buffers) b.resize(3 << 20);
  giftOutput* out = nullptr;
  ASSERT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
  for (int k = 0; k < 24; ++k) {
    std::vector<uint8_t>& b = buffers[k % 2];
    std::fill(b.begin(), b.end(), uint8_t(k + 1));
    const uint64_t size = b.size() - uint64_t(k) * 4099;
    expected.insert(expected.end(), b.begin(), b.begin() + int64_t(size));
    ASSERT_EQ(giftOutputWriteBehind(out, b.data(), size), GIFT_OK) << giftGetLastErrorMessage();
    EXPECT_EQ(giftOutputBytes(out), expected.size());
  }
  ASSERT_EQ(giftOutputWrite(out, "end", 3), GIFT_OK);
  expected.insert(expected.end(), {'e', 'n', 'd'});
  ASSERT_EQ(giftOutputCommit(out), GIFT_OK) << giftGetLastErrorMessage();
  giftOutputFree(out);
  EXPECT_TRUE(file_bytes(path) == expected);
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
  EXPECT_EQ(giftOutputWriteBehind(nullptr, "x", 1), GIFT_ERROR_INVALID_ARGUMENT);

  if (::access("/dev/full", W_OK) != 0) return;  // no /dev/full
  const int fd = ::open("/dev/full", O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(giftOutputOpenFd(fd, "/dev/full", &out), GIFT_OK);
  EXPECT_EQ(giftOutputWriteBehind(out, "x", 1), GIFT_OK);  // under way: its failure comes next
  for (int call = 0; call < 2; ++call) {
    EXPECT_EQ(call ? giftOutputCommit(out) : giftOutputWriteBehind(out, "y", 1), GIFT_ERROR_IO);
    EXPECT_NE(std::string(giftGetLastErrorMessage()).find("/dev/full: write failed: No space"),
              std::string::npos)
        << giftGetLastErrorMessage();
  }
  giftOutputFree(out);
  ::close(fd);
}

TEST(Streaming, WritesBehindKeepTheirBytesAndReportTheirFailures) {
  // With a thread, and where none can be had (the writes then run in the calls themselves).
  for (const bool threads : {true, false}) {
    SCOPED_TRACE(threads ? "a background thread" : "no thread");
    gift::set_background_threads_for_test(threads);
    expect_writes_behind_keep_their_bytes_and_report_their_failures();
  }
  gift::set_background_threads_for_test(true);
}

// Writes behind handed over at gaps meant to fall in each way the thread waits for its next job
// on two processors or more (its poll, its naps, the condition variable; which one a gap meets
// is the scheduler's call; on one processor, the condition variable only) keep their bytes and
// their order, each buffer refilled once the write of the next one has started.
TEST(Streaming, WritesBehindAtAnyPaceKeepTheirBytes) {
  const std::string dir = temp_dir(), path = dir + "/paced.bin";
  giftOutput* out = nullptr;
  ASSERT_EQ(giftOutputOpenFile(path.c_str(), &out), GIFT_OK);
  std::vector<uint8_t> buffers[2], expected;
  constexpr useconds_t kGaps[] = {0, 300, 700, 2500};  // us
  for (int k = 0; k < 200; ++k) {
    std::vector<uint8_t>& b = buffers[k % 2];
    b.assign(size_t(8 << 10) + size_t(k), uint8_t(k * 7 + 1));
    expected.insert(expected.end(), b.begin(), b.end());
    ASSERT_EQ(giftOutputWriteBehind(out, b.data(), b.size()), GIFT_OK) << giftGetLastErrorMessage();
    ::usleep(kGaps[(k / 10) % 4]);
  }
  ASSERT_EQ(giftOutputCommit(out), GIFT_OK) << giftGetLastErrorMessage();
  giftOutputFree(out);
  EXPECT_TRUE(file_bytes(path) == expected);
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

// Every call that takes an output waits for its write behind before it returns, after which
// the caller may refill the buffer: a pipe whose reader starts late gets none of the refill.
TEST(Streaming, CallsOnAnOutputWaitForItsWriteBehind) {
  giftFrameWriter* w = nullptr;
  ASSERT_EQ(giftFrameWriterCreate(&w), GIFT_OK);
  const std::pair<const char*, std::function<giftResult_t(giftOutput*)>> calls[] = {
      {"giftOutputWait", giftOutputWait},
      {"giftOutputSetSync", [](giftOutput* o) { return giftOutputSetSync(o, 0); }},
      {"giftOutputSetReplace", [](giftOutput* o) { return giftOutputSetReplace(o, 0); }},
      {"giftOutputSetMode", [](giftOutput* o) { return giftOutputSetMode(o, 0600); }},
      {"giftFrameWriterStreamTo",  // refused (a descriptor), but only after the write
       [w](giftOutput* o) {
         return giftFrameWriterStreamTo(w, o, 0, nullptr, nullptr, nullptr) ==
                        GIFT_ERROR_INVALID_ARGUMENT
                    ? GIFT_OK
                    : GIFT_ERROR_INTERNAL;
       }},
      {"giftOutputFree", [](giftOutput* o) {
         giftOutputFree(o);
         return GIFT_OK;
       }}};
  for (const auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    std::vector<uint8_t> buffer(4 << 20, 'a'), got;
    std::thread reader([&] {
      ::usleep(200000);
      uint8_t chunk[65536];
      for (ssize_t r; (r = ::read(fds[0], chunk, sizeof chunk)) > 0;)
        got.insert(got.end(), chunk, chunk + r);
    });
    giftOutput* o = nullptr;
    ASSERT_EQ(giftOutputOpenFd(fds[1], "the pipe", &o), GIFT_OK);
    EXPECT_EQ(giftOutputWriteBehind(o, buffer.data(), buffer.size()), GIFT_OK);
    EXPECT_EQ(call(o), GIFT_OK) << giftGetLastErrorMessage();
    std::fill(buffer.begin(), buffer.end(), uint8_t('X'));
    if (std::string(name) != "giftOutputFree") giftOutputFree(o);
    ::close(fds[1]);
    reader.join();
    ::close(fds[0]);
    EXPECT_EQ(got.size(), buffer.size());
    EXPECT_EQ(std::count(got.begin(), got.end(), uint8_t('X')), 0);
  }
  giftFrameWriterFree(w);
}

// Where SIGPIPE came, and how often: a handler instead of the default, which ends the process.
std::atomic<int> pipe_signals{0};
pthread_t pipe_signal_thread;

// A write behind into a pipe whose reader has gone meets EPIPE on the writing thread, where
// every signal is blocked; the caller's next call raises SIGPIPE on the caller's thread, once,
// as a write made there would have (so `giftc decode -c | head` ends as gzip -dc does), and
// still reports the failure where the signal is handled.
TEST(Streaming, BrokenPipeBehindRaisesSigpipeOnTheCaller) {
  for (const bool threads : {true, false}) {
    SCOPED_TRACE(threads ? "a background thread" : "no thread");
    gift::set_background_threads_for_test(threads);
    struct sigaction count = {}, before = {};
    count.sa_handler = [](int) {
      pipe_signal_thread = pthread_self();
      pipe_signals.fetch_add(1);
    };
    ASSERT_EQ(::sigaction(SIGPIPE, &count, &before), 0);
    pipe_signals = 0;
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    ::close(fds[0]);
    giftOutput* o = nullptr;
    ASSERT_EQ(giftOutputOpenFd(fds[1], "the pipe", &o), GIFT_OK);
    EXPECT_EQ(giftOutputWriteBehind(o, "bytes", 5), GIFT_OK);
    EXPECT_EQ(giftOutputCommit(o), GIFT_ERROR_IO);
    EXPECT_NE(std::string(giftGetLastErrorMessage()).find("the pipe: write failed: Broken pipe"),
              std::string::npos)
        << giftGetLastErrorMessage();
    EXPECT_EQ(giftOutputCommit(o), GIFT_ERROR_IO);  // reported again, the signal not
    EXPECT_EQ(pipe_signals.load(), 1);
    EXPECT_TRUE(pthread_equal(pipe_signal_thread, pthread_self()));
    giftOutputFree(o);
    ::close(fds[1]);
    ASSERT_EQ(::sigaction(SIGPIPE, &before, nullptr), 0);
  }
  gift::set_background_threads_for_test(true);
}

// A failed write ends the output: every later call reports the same failure (as after a
// write behind; they said "not open", an invalid argument), and the bytes that failed are
// not counted as written.
TEST(Streaming, FullDiskFailsAndLeavesNothing) {
  giftOutput* o = nullptr;
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  const int fd = ::open("/dev/full", O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(giftOutputOpenFd(fd, "/dev/full", &o), GIFT_OK);
  for (int call = 0; call < 3; ++call) {
    EXPECT_EQ(call == 2 ? giftOutputCommit(o) : giftOutputWrite(o, "x", 1), GIFT_ERROR_IO);
    EXPECT_NE(std::string(giftGetLastErrorMessage()).find("/dev/full: write failed: No space"),
              std::string::npos)
        << giftGetLastErrorMessage();
  }
  EXPECT_EQ(giftOutputBytes(o), 0u);
  giftOutputFree(o);
  ::close(fd);
}

}  // namespace
