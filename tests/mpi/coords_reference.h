// The all-reduce tests of GIFT coordinates share these (CPU plans in tests/mpi, device plans
// in tests/cuda): a bucket with an anisotropic matrix, an isotropic one and a vector, each
// rank's input, and a basis fitted to rank 0's matrices.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "allreduce_reference.h"
#include "gift/gift_basis.h"

namespace gift::test {

using BasisPtr = std::unique_ptr<giftBasis, decltype(&giftBasisFree)>;

// A matrix whose rows mix four shared directions with strengths 10:5:2:1 plus 1% noise, the
// geometry where whitening its input side lowers the FP8 error (as in the whitener's unit
// tests); an isotropic one, where it gains nothing; and a vector.
inline const std::vector<TensorSpec> kCoordsBucket = {{"aniso", GIFT_DTYPE_F32, {64, 256}},
                                                      {"iso", GIFT_DTYPE_F32, {32, 256}},
                                                      {"bias", GIFT_DTYPE_F32, {256}}};

inline std::vector<float> low_rank_rows(uint64_t rows, uint64_t cols, int rank) {
  std::mt19937_64 shared(7), own(100 + uint64_t(rank));
  std::normal_distribution<float> n;
  const float strength[4] = {10, 5, 2, 1};
  std::vector<float> m(4 * cols);
  for (float& x : m) x = n(shared) / std::sqrt(float(cols));
  std::vector<float> w(rows * cols);
  for (uint64_t i = 0; i < rows; ++i) {
    float s[4];
    for (int k = 0; k < 4; ++k) s[k] = n(own) * strength[k];
    for (uint64_t j = 0; j < cols; ++j) {
      float v = 0.01f * n(own);
      for (int k = 0; k < 4; ++k) v += s[k] * m[k * cols + j];
      w[i * cols + j] = v;
    }
  }
  return w;
}

inline std::vector<float> isotropic(uint64_t count, int rank) {
  std::mt19937_64 gen(200 + uint64_t(rank));
  std::normal_distribution<float> n;
  std::vector<float> w(count);
  for (float& x : w) x = n(gen);
  return w;
}

inline Bucket coords_input(int rank) {
  Bucket b;
  for (const TensorSpec& t : kCoordsBucket) {
    const std::vector<float> v =
        t.name == "aniso" ? low_rank_rows(t.elements() / t.shape.back(), t.shape.back(), rank)
                          : isotropic(t.elements(), rank);
    b.emplace_back(reinterpret_cast<const uint8_t*>(v.data()),
                   reinterpret_cast<const uint8_t*>(v.data() + v.size()));
  }
  return b;
}

// A basis fitted (rank r) to the gradients' own second moments of rank 0's matrices.
inline BasisPtr fit_basis(uint32_t rank) {
  giftFitParams fp = GIFT_FIT_PARAMS_INIT;
  fp.rank = rank;
  giftBasisBuilder* b = nullptr;
  EXPECT_EQ(giftBasisBuilderCreate(&fp, &b), GIFT_OK);
  const Bucket in = coords_input(0);
  for (size_t i = 0; i < 2; ++i) {
    const TensorSpec& t = kCoordsBucket[i];
    const uint64_t cols = t.shape.back(), rows = t.elements() / cols;
    std::vector<double> a(cols * cols);
    EXPECT_EQ(giftGradientSecondMoment(in[i].data(), GIFT_DTYPE_F32, rows, cols, a.data()),
              GIFT_OK);
    EXPECT_EQ(giftBasisBuilderAdd(b, t.name.c_str(), a.data(), uint32_t(cols), "gradients", nullptr,
                                  0, nullptr, 0, nullptr, nullptr),
              GIFT_OK)
        << giftGetLastErrorMessage();
  }
  giftBasis* basis = nullptr;
  EXPECT_EQ(giftBasisBuilderFinish(b, &basis), GIFT_OK);
  giftBasisBuilderFree(b);
  return BasisPtr(basis, giftBasisFree);
}

}  // namespace gift::test
