// Gradient-like test data: n normal values of scale 0.01, the same for the same seed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

inline std::vector<float> values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(gen) * 0.01f;
  return v;
}
