// Writes the golden frames of format version 1.0 and the values they decode to. Each is
// written once and committed; existing files are never overwritten, so running it again only
// adds frames introduced since. Usage: make_golden OUT_DIR
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "api/coords_frames.h"
#include "common/output_file.h"
#include "container/writer.h"
#include "coords/basis.h"
#include "coords/fit.h"
#include "coords/select.h"
#include "gift/gift.h"
#include "numerics/elementwise.h"

namespace {

// A fixed generator (not <random>'s distributions, whose output varies across libraries).
struct Lcg {
  uint64_t s;
  float next() {  // roughly normal, heavy-ish tails
    float sum = 0;
    for (int i = 0; i < 4; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      sum += float(uint32_t(s >> 40)) / float(1u << 24) - 0.5f;
    }
    return sum * sum * sum * 8.0f;
  }
};

std::vector<float> data(uint64_t n, uint64_t seed, float scale) {
  Lcg g{seed};
  std::vector<float> v(n);
  for (float& x : v) x = g.next() * scale;
  return v;
}

bool exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

void check(giftResult_t r) {
  if (r != GIFT_OK) {
    std::fprintf(stderr, "make_golden: %s\n", giftGetLastErrorMessage());
    std::exit(1);
  }
}

void write_npy(const std::string& path, const std::vector<float>& v) {
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(v.size()) + ",), }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  FILE* f = std::fopen(path.c_str(), "wb");
  const uint8_t pre[10] = {
      0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, uint8_t(header.size()), uint8_t(header.size() >> 8)};
  std::fwrite(pre, 1, 10, f);
  std::fwrite(header.data(), 1, header.size(), f);
  std::fwrite(v.data(), 4, v.size(), f);
  std::fclose(f);
}

struct Item {
  std::string name;
  std::vector<uint64_t> shape;
  giftDType_t dtype;
  bool raw;
  giftQuantParams p;
  float scale;
  std::vector<std::pair<uint64_t, float>> pokes;  // values to place (NaN, Inf)
};

giftQuantParams q(giftFp8Kind_t k, giftScaleLayout_t l, giftScaleDType_t sd, uint32_t block = 128,
                  uint32_t tr = 1, uint32_t tc = 1) {
  giftQuantParams p;
  giftQuantParamsInit(&p);
  p.kind = k;
  p.layout = l;
  p.scale_dtype = sd;
  p.block = block;
  p.tile_rows = tr;
  p.tile_cols = tc;
  return p;
}

void write_frame(const std::string& dir, const std::string& stem, const std::vector<Item>& items,
                 int zstd) {
  const std::string path = dir + "/" + stem + ".gift";
  if (exists(path)) {  // written once, never regenerated: existing frames are kept
    std::fprintf(stderr, "make_golden: %s exists, kept\n", path.c_str());
    return;
  }
  giftFrameWriter* w;
  check(giftFrameWriterCreate(&w));
  check(giftFrameWriterSetCompression(w, zstd));
  check(giftFrameWriterAddMetadata(w, "purpose", "golden frame of format 1.0"));
  uint64_t seed = 1;
  for (const Item& it : items) {
    uint64_t n = 1;
    for (uint64_t d : it.shape) n *= d;
    std::vector<float> f = data(n, seed++, it.scale);
    for (const auto& [i, v] : it.pokes) f[i] = v;
    std::vector<uint16_t> h(n);
    const void* src = f.data();
    if (it.dtype != GIFT_DTYPE_F32) {
      for (uint64_t i = 0; i < n; ++i) {
        h[i] = it.dtype == GIFT_DTYPE_BF16 ? gift::num::bf16_from_float(f[i])
                                           : gift::num::f16_from_float(f[i]);
      }
      src = h.data();
    }
    check(giftFrameWriterAddTensor(w, it.name.c_str(), it.shape.data(), uint32_t(it.shape.size()),
                                   it.dtype, src, it.raw ? nullptr : &it.p));
  }
  check(giftFrameWriterWriteFile(w, path.c_str()));
  giftFrameWriterFree(w);
  giftFrame* fr;
  check(giftFrameOpenFile(path.c_str(), &fr));
  for (uint64_t i = 0; i < giftFrameTensorCount(fr); ++i) {
    giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
    check(giftFrameTensorInfo(fr, i, &info));
    std::vector<float> out(info.elements);
    check(giftFrameDecodeTensor(fr, i, out.data(), out.size() * 4, GIFT_DTYPE_F32));
    write_npy(dir + "/" + stem + "." + std::to_string(i) + ".npy", out);
  }
  giftFrameClose(fr);
}

// A tensor in GIFT coordinates with its basis embedded: fitted on the tensor itself (rank 8),
// whitened, then encoded like any other. Added to v1.0 with the basis format.
void write_gift_coords(const std::string& dir) {
  const std::string stem = "gift_coords_embedded_basis";
  if (exists(dir + "/" + stem + ".gift")) return;  // written once, never regenerated
  const uint64_t rows = 48, cols = 96;
  Lcg g{99};
  std::vector<float> w(rows * cols);
  std::vector<float> dirs(4 * cols);
  for (float& x : dirs) x = g.next();
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t c = 0; c < cols; ++c) {
      float v = 0.01f * g.next();
      for (int k = 0; k < 4; ++k) v += float(8 >> k) * dirs[k * cols + c] * g.next() * 0.1f;
      w[r * cols + c] = v;
    }
  gift::coords::FitOptions fo;
  fo.rank = 8;
  gift::coords::LowRankPlusDiagonal fit;
  check(gift::coords::fit_low_rank(
      gift::coords::gradient_second_moment(w.data(), GIFT_DTYPE_F32, rows, uint32_t(cols)).data(),
      uint32_t(cols), fo, &fit));
  gift::coords::Basis basis;
  gift::coords::BasisEntry e;
  e.name = "mlp.down_proj.weight";
  e.damping = fo.damping;
  e.source = "gradients";
  check(gift::coords::make_whitener(fit.u, fit.l, fit.diag, uint32_t(cols), &e.whitener));
  basis.entries.push_back(e);
  gift::coords::finish_basis(&basis);
  std::vector<uint8_t> basis_bytes;
  check(gift::coords::serialize_basis(basis, 0, &basis_bytes));
  gift::container::FrameWriter fw;
  fw.add_metadata("purpose", "golden frame of format 1.0");
  fw.embed_basis(basis_bytes, basis.id.lo, basis.id.hi);
  giftQuantParams p = q(GIFT_FP8_E4M3, GIFT_SCALE_BLOCK, GIFT_SCALE_DTYPE_F32, 32);
  gift::coords::SelectOptions so;
  so.mode = gift::coords::CoordsMode::kGift;
  const gift::container::CoordsChoice coords = gift::coords::record(
      gift::coords::choose_coords(w.data(), rows, cols, &basis.entries[0].whitener, p, so),
      basis.id);
  std::vector<float> white = w;
  gift::coords::whiten(basis.entries[0].whitener, white.data(), rows);
  gift::container::TensorShape shape;
  const uint64_t dims[2] = {rows, cols};
  check(gift::container::make_shape(dims, 2, &shape));
  check(fw.add_tensor(e.name, shape, GIFT_DTYPE_F32, white.data(), &p, &coords, GIFT_DTYPE_F32));
  std::vector<uint8_t> bytes;
  check(fw.finish(&bytes));
  check(gift::write_file_atomically(dir + "/" + stem + ".gift", bytes));
  giftFrame* fr;
  check(giftFrameOpenFile((dir + "/" + stem + ".gift").c_str(), &fr));
  std::vector<float> out(rows * cols);
  check(giftFrameDecodeTensor(fr, 0, out.data(), out.size() * 4, GIFT_DTYPE_F32));
  write_npy(dir + "/" + stem + ".0.npy", out);
  giftFrameClose(fr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_golden OUT_DIR\n");
    return 1;
  }
  const std::string dir = argv[1];
  const auto E4 = GIFT_FP8_E4M3, E5 = GIFT_FP8_E5M2;
  const auto F32 = GIFT_SCALE_DTYPE_F32, E8 = GIFT_SCALE_DTYPE_E8M0;
  write_frame(
      dir, "e4m3_f32scales_layouts",
      {{"tensor_scale", {33, 70}, GIFT_DTYPE_F32, false, q(E4, GIFT_SCALE_TENSOR, F32), 1e-3f, {}},
       {"row_scales", {17, 129}, GIFT_DTYPE_F32, false, q(E4, GIFT_SCALE_ROW, F32), 1.0f, {}},
       {"block32", {9, 100}, GIFT_DTYPE_F32, false, q(E4, GIFT_SCALE_BLOCK, F32, 32), 5e-5f, {}},
       {"block128", {5, 300}, GIFT_DTYPE_F32, false, q(E4, GIFT_SCALE_BLOCK, F32, 128), 20.0f, {}},
       {"tile8x16",
        {20, 30},
        GIFT_DTYPE_F32,
        false,
        q(E4, GIFT_SCALE_TILE, F32, 128, 8, 16),
        0.1f,
        {}}},
      0);
  write_frame(
      dir, "e5m2_e8m0scales_bf16",
      {{"tensor_scale", {10, 10}, GIFT_DTYPE_BF16, false, q(E5, GIFT_SCALE_TENSOR, E8), 1e-2f, {}},
       {"row_scales", {12, 50}, GIFT_DTYPE_BF16, false, q(E5, GIFT_SCALE_ROW, E8), 3.0f, {}},
       {"block32", {6, 70}, GIFT_DTYPE_BF16, false, q(E5, GIFT_SCALE_BLOCK, E8, 32), 1e-6f, {}},
       {"tile4x4",
        {16, 16},
        GIFT_DTYPE_BF16,
        false,
        q(E5, GIFT_SCALE_TILE, E8, 128, 4, 4),
        1e3f,
        {}}},
      0);
  giftQuantParams mx = q(E4, GIFT_SCALE_BLOCK, E8, 32);
  mx.rounding = GIFT_ROUND_STOCHASTIC;
  mx.seed = 1234;
  mx.tensor_index = 3;
  giftQuantParams sr = q(E5, GIFT_SCALE_BLOCK, F32, 64);
  sr.rounding = GIFT_ROUND_STOCHASTIC;
  sr.seed = 0xFEEDFACECAFEBEEFull;
  write_frame(dir, "stochastic_fp16_zstd",
              {{"mxfp8_stochastic", {8, 96}, GIFT_DTYPE_F16, false, mx, 0.5f, {}},
               {"e5m2_stochastic", {4, 200}, GIFT_DTYPE_F16, false, sr, 2e-3f, {}},
               {"nearest_zstd",
                {64, 64},
                GIFT_DTYPE_F16,
                false,
                q(E4, GIFT_SCALE_BLOCK, F32, 128),
                1.0f,
                {}}},
              19);
  giftQuantParams keep = q(E5, GIFT_SCALE_ROW, F32);
  keep.nonfinite = GIFT_NONFINITE_KEEP;
  write_frame(
      dir, "edge_cases",
      {{"empty", {0, 8}, GIFT_DTYPE_F32, false, q(E4, GIFT_SCALE_BLOCK, F32), 1.0f, {}},
       {"scalar", {}, GIFT_DTYPE_F32, false, q(E4, GIFT_SCALE_TENSOR, F32), 7.0f, {}},
       {"層.0.重み", {4, 33}, GIFT_DTYPE_F32, false, q(E4, GIFT_SCALE_ROW, F32), 1e-2f, {}},
       {"bias_raw", {50}, GIFT_DTYPE_F32, true, {}, 0.3f, {}},
       {"norm_raw_bf16", {7}, GIFT_DTYPE_BF16, true, {}, 1.0f, {}},
       {"nonfinite_kept",
        {3, 40},
        GIFT_DTYPE_F32,
        false,
        keep,
        1.0f,
        {{5, NAN}, {41, INFINITY}, {99, -INFINITY}}},
       {"all_zero", {2, 64}, GIFT_DTYPE_F32, false, q(E4, GIFT_SCALE_BLOCK, E8, 32), 0.0f, {}}},
      0);
  write_gift_coords(dir);
  std::printf("golden frames written to %s\n", dir.c_str());
  return 0;
}
