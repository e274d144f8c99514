// format/FORMAT.md is normative: the constants it states must be the code's.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "container/layout.h"
#include "gift/gift.h"
#include "numerics/elementwise.h"

namespace gift::num {
namespace {

std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string c;
  std::getline(ss, c, '|');  // text before the first bar
  while (std::getline(ss, c, '|')) {
    const size_t b = c.find_first_not_of(' '), e = c.find_last_not_of(' ');
    out.push_back(b == std::string::npos ? "" : c.substr(b, e - b + 1));
  }
  return out;
}

double pow2_cell(const std::string& s) {  // "2^-6"
  return std::ldexp(1.0, std::stoi(s.substr(2)));
}

template <Fp8 K>
void check_row(const std::vector<std::string>& c) {
  using T = Fp8Traits<K>;
  EXPECT_EQ(std::stoi(c[2]), T::kMantBits);
  EXPECT_EQ(std::stoi(c[1]), 7 - T::kMantBits);
  EXPECT_EQ(std::stoi(c[3]), T::kBias);
  EXPECT_EQ(std::stod(c[4]), double(float_of(T::kMaxBits)));
  EXPECT_EQ(std::stod(c[4]), double(fp8_max(K)));
  EXPECT_EQ(std::stoi(c[5], nullptr, 16), T::kMaxCode);
  EXPECT_EQ(std::stoi(c[6]), T::kEmax);
  EXPECT_EQ(std::stoi(c[6]), fp8_emax(K));
  EXPECT_EQ(pow2_cell(c[7]), double(float_of(T::kMinNormalBits)));
  EXPECT_EQ(pow2_cell(c[8]), std::ldexp(1.0, T::kSubnormalStepExp));
  EXPECT_EQ(double(fp8_to_float<K>(1)), pow2_cell(c[8]));
  EXPECT_TRUE(
      std::isnan(fp8_to_float<K>(static_cast<uint8_t>(std::stoi(c[9].substr(0, 4), nullptr, 16)))));
}

TEST(FormatDoc, KindTableMatchesTheCode) {
  std::ifstream f(GIFT_FORMAT_MD);
  ASSERT_TRUE(f) << "cannot open " << GIFT_FORMAT_MD;
  std::string line;
  int rows = 0;
  while (std::getline(f, line)) {
    const std::vector<std::string> c = cells(line);
    if (c.size() < 11) continue;
    if (c[0] == "E4M3") {
      check_row<Fp8::kE4M3>(c);
      ++rows;
    } else if (c[0] == "E5M2") {
      check_row<Fp8::kE5M2>(c);
      EXPECT_EQ(c[10], "0x7C, 0xFC");
      EXPECT_EQ(fp8_to_float<Fp8::kE5M2>(0x7C), INFINITY);
      ++rows;
    }
  }
  EXPECT_EQ(rows, 2);
}

TEST(FormatDoc, StatedLimitsAndDefaultsMatchTheCode) {
  std::ifstream f(GIFT_FORMAT_MD);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  EXPECT_NE(doc.find("16 <= B <= 4096 (default 128"), std::string::npos);
  EXPECT_EQ(GIFT_BLOCK_MIN, 16);
  EXPECT_EQ(GIFT_BLOCK_MAX, 4096);
  EXPECT_EQ(GIFT_BLOCK_DEFAULT, 128);
  EXPECT_NE(doc.find("0xD2511F53 and 0xCD9E8D57"), std::string::npos);
  EXPECT_NE(doc.find("0x9E3779B9 and 0xBB67AE85"), std::string::npos);
  EXPECT_NE(doc.find("quiet NaN 0x7FC00000"), std::string::npos);
  EXPECT_EQ(bits_of(fp8_to_float<Fp8::kE4M3>(0x7F)), 0x7FC00000u);
  EXPECT_NE(doc.find("2^-127 is the fp32 subnormal 0x00400000"), std::string::npos);
  EXPECT_EQ(bits_of(e8m0_to_float(0)), 0x00400000u);
}

TEST(FormatDoc, FrameConstantsMatchTheCode) {
  std::ifstream f(GIFT_FORMAT_MD);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  namespace c = gift::container;
  // The magic as the preamble table spells it, byte by byte.
  const size_t at = doc.find("| 0 | 8 | magic | `");
  ASSERT_NE(at, std::string::npos);
  std::stringstream hex(doc.substr(at + 19, 23));
  for (int i = 0; i < 8; ++i) {
    int byte = -1;
    hex >> std::hex >> byte;
    EXPECT_EQ(byte, c::kMagic[i]) << "magic byte " << i;
  }
  EXPECT_NE(doc.find("| 8 | 2 | major | " + std::to_string(c::kMajor) + " |"), std::string::npos);
  EXPECT_NE(doc.find("| 10 | 2 | minor | " + std::to_string(c::kMinor) + " |"), std::string::npos);
  // The version this build writes has its change-log entry (3.4).
  EXPECT_NE(doc.find("- **" + std::to_string(c::kMajor) + "." + std::to_string(c::kMinor) + "** ("),
            std::string::npos);
  EXPECT_NE(doc.find("    | " + std::to_string(c::kPreambleBytes) + " bytes  |"),
            std::string::npos);
  EXPECT_NE(doc.find("`offset` is a multiple of " + std::to_string(c::kSectionAlign)),
            std::string::npos);
  EXPECT_NE(doc.find("at most " + std::to_string(c::kMaxZstdRatio) + " times stored_length"),
            std::string::npos);
  EXPECT_NE(doc.find("at most 64 MiB"), std::string::npos);
  EXPECT_EQ(c::kMaxHeaderBytes, uint64_t(64) << 20);
  EXPECT_NE(doc.find("nesting depth at most " + std::to_string(c::kMaxDepth)), std::string::npos);
  EXPECT_NE(doc.find("At most " + std::to_string(c::kMaxDims) + "."), std::string::npos);
  EXPECT_EQ(c::kMaxTables, 1u << 22);
  EXPECT_NE(doc.find("at most\n   2^22 tables"), std::string::npos);
}

}  // namespace
}  // namespace gift::num
