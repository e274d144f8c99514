// giftc's tensor-file readers (.npy, safetensors) on hand-built byte images (independent of
// NumPy and the safetensors package), hostile ones included.
#include "io/npy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "failure.h"
#include "gift/gift.h"
#include "io/tensor_file.h"

namespace {

std::vector<uint8_t> npy(int major, const std::string& dict, const std::vector<uint8_t>& data) {
  std::string header = dict;
  const size_t pre = major == 1 ? 10 : 12;
  while ((pre + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', uint8_t(major), 0};
  const uint32_t len = uint32_t(header.size());
  out.push_back(uint8_t(len));
  out.push_back(uint8_t(len >> 8));
  if (major != 1) {
    out.push_back(uint8_t(len >> 16));
    out.push_back(uint8_t(len >> 24));
  }
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> floats(std::initializer_list<float> v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.begin(), b.size());
  return b;
}

struct Outcome {
  int code;  // giftc's exit code: kOk, or the Failure's
  std::string message;
};

template <typename F>
Outcome outcome(F&& f) {
  try {
    f();
  } catch (const giftc::Failure& e) {
    return {e.code, e.what()};
  }
  return {giftc::kOk, ""};
}

Outcome parse(const std::vector<uint8_t>& bytes, gift::io::NpyArray* a, size_t size = SIZE_MAX) {
  return outcome(
      [&] { gift::io::parse_npy(bytes.data(), std::min(size, bytes.size()), "t.npy", a); });
}

TEST(Npy, ReadsEveryVersionAndShape) {
  for (int major : {1, 2, 3}) {
    gift::io::NpyArray a;
    ASSERT_EQ(parse(npy(major, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                        floats({1, 2, 3, 4, 5, 6})),
                    &a)
                  .code,
              giftc::kOk);
    EXPECT_EQ(a.shape, (std::vector<uint64_t>{2, 3}));
    EXPECT_EQ(a.dtype, GIFT_DTYPE_F32);
    float v[6];
    std::memcpy(v, a.data.data(), 24);
    EXPECT_EQ(v[5], 6.0f);
  }
  gift::io::NpyArray a;
  ASSERT_EQ(
      parse(npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", floats({7})), &a)
          .code,
      giftc::kOk);
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(a.count(), 1u);
  ASSERT_EQ(parse(npy(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }",
                      {0, 60, 0, 0, 0, 188}),
                  &a)
                .code,
            giftc::kOk);
  EXPECT_EQ(a.dtype, GIFT_DTYPE_F16);
  EXPECT_EQ(a.shape, (std::vector<uint64_t>{3}));
  ASSERT_EQ(
      parse(npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }", {}), &a).code,
      giftc::kOk);
  EXPECT_EQ(a.count(), 0u);
  // Keys in any order, no comma after the last (as other writers than NumPy's give them),
  // and no elements however large the other dimensions.
  ASSERT_EQ(parse(npy(1, "{'shape':(2,3),'fortran_order':False,'descr':'<f2'}",
                      {0, 60, 0, 0, 0, 188, 0, 60, 0, 0, 0, 188}),
                  &a)
                .code,
            giftc::kOk);
  EXPECT_EQ(a.shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(a.dtype, GIFT_DTYPE_F16);
  ASSERT_EQ(parse(npy(1,
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, "
                      "4294967296, 0), }",
                      {}),
                  &a)
                .code,
            giftc::kOk);
  EXPECT_EQ(a.count(), 0u);
}

TEST(Npy, RejectsBadInputWithAPreciseMessage) {
  gift::io::NpyArray a;
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  struct Case {
    std::vector<uint8_t> bytes;
    const char* message;
  };
  std::vector<uint8_t> truncated = npy(1, ok, floats({1, 2}));
  truncated.pop_back();
  std::vector<uint8_t> long_header = npy(2, ok, floats({1, 2}));
  long_header[10] = 0x10;  // header length 1 MiB + ...
  const std::vector<Case> cases = {
      {{'x', 'y'}, "t.npy: not a supported .npy file: no .npy magic"},
      {npy(4, ok, floats({1, 2})), "t.npy: unsupported .npy format version 4.0"},
      {npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", floats({1, 2, 3, 4})),
       "t.npy: unsupported .npy dtype '<f8' (supported: '<f4' float32, '<f2' float16)"},
      {npy(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", floats({1, 2})),
       "t.npy: unsupported .npy dtype '>f4' (supported: '<f4' float32, '<f2' float16)"},
      {npy(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", floats({1, 2})),
       "t.npy: Fortran-ordered arrays are not supported"},
      {truncated,
       "t.npy: .npy data is 7 bytes, the header's shape needs 8 (truncated or trailing data)"},
      {npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", {}),
       "t.npy: not a supported .npy file: element count overflows 64 bits"},
      {npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2147483648, 4294967296), }", {}),
       "t.npy: not a supported .npy file: byte count overflows 64 bits"},
      {npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }",
           {}),
       "t.npy: not a supported .npy file: dimension overflows 64 bits"},
      {npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1), }", {}),
       "t.npy: not a supported .npy file: negative dimension in 'shape'"},
      {npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", {}),
       "t.npy: not a supported .npy file: non-integer dimension in 'shape'"},
      // Python reads (2) as the number 2, which numpy refuses as a shape; (2,) and (2, 1)
      // are tuples.
      {npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", floats({1, 2})),
       "t.npy: not a supported .npy file: 'shape' is a number in parentheses, not a tuple "
       "(one dimension is (N,))"},
      // Python reads a key given twice as its last value ('<f2' here), a search its first.
      {npy(1, "{'descr': '<f4', 'descr': '<f2', 'fortran_order': False, 'shape': (2,), }",
           floats({1, 2})),
       "t.npy: not a supported .npy file: 'descr' given twice"},
      {npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), ", floats({1, 2})),
       "t.npy: not a supported .npy file: header dict not closed with '}'"},
      {npy(1, "{'descr': '<f4', fortran_order: False, 'shape': (2,), }", floats({1, 2})),
       "t.npy: not a supported .npy file: unreadable key in the header"},
      {npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,) 'x': 1}", floats({1, 2})),
       "t.npy: not a supported .npy file: header dict not closed with '}'"},
      {npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", floats({1, 2})),
       "t.npy: not a supported .npy file: unexpected key 'x'"},
      {npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } #", floats({1, 2})),
       "t.npy: not a supported .npy file: bytes after the header dict"},
      {npy(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", floats({1, 2})),
       "t.npy: not a supported .npy file: 'fortran_order' is not a bool"},
      {npy(1, "{'descr': '<f4', 'shape': (2,), }", floats({1, 2})),
       "t.npy: not a supported .npy file: header has no 'fortran_order'"},
      {npy(1, "{'fortran_order': False, 'shape': (2,), }", floats({1, 2})),
       "t.npy: not a supported .npy file: header has no 'descr'"},
      {long_header, "t.npy: not a supported .npy file: header longer than 64 KiB"},
  };
  for (const Case& c : cases) {
    const Outcome o = parse(c.bytes, &a);
    EXPECT_EQ(o.code, giftc::kBadInput) << c.message;
    EXPECT_EQ(o.message, c.message);
  }
  // Every truncation of a valid file is rejected, never read past its end.
  const std::vector<uint8_t> good = npy(1, ok, floats({1, 2}));
  for (size_t len = 0; len < good.size(); ++len) {
    EXPECT_EQ(parse(good, &a, len).code, giftc::kBadInput) << len;
  }
}

TEST(Npy, MissingFileIsAnIoError) {
  gift::io::NpyArray a;
  const Outcome o = outcome([&] { gift::io::read_npy("/nonexistent/x.npy", &a); });
  EXPECT_EQ(o.code, giftc::kIoError);
  EXPECT_EQ(o.message, "/nonexistent/x.npy: cannot open: No such file or directory");
}

// Tensors at an odd address of their file are copied aside to an aligned one; an empty one
// too, to an address that is not null (the fuzzer's npy-empty-f32-at-odd-offset: the copy of
// no bytes went to a null pointer, which memcpy may not take).
TEST(Npy, TensorsAtOddAddressesAreAligned) {
  for (const auto& [shape, data] :
       {std::pair<std::string, std::vector<uint8_t>>{"(0, 3)", {}}, {"(2,)", floats({1, 2})}}) {
    const std::vector<uint8_t> file =
        npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }", data);
    std::vector<uint8_t> shifted(file.size() + 1);  // the file at an odd address
    std::memcpy(shifted.data() + 1, file.data(), file.size());
    gift::io::TensorFile f;
    ASSERT_EQ(outcome([&] {
                gift::io::parse_tensor_file(gift::io::FileKind::kNpy, shifted.data() + 1,
                                            file.size(), "t.npy", "t", &f);
              }).code,
              giftc::kOk)
        << shape;
    ASSERT_EQ(f.tensors.size(), 1u);
    const gift::io::TensorRef& t = f.tensors[0];
    EXPECT_NE(t.data(), nullptr) << shape;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 4, 0u) << shape;
    ASSERT_EQ(t.bytes, data.size());
    if (!data.empty()) {
      EXPECT_EQ(std::memcmp(t.data(), data.data(), data.size()), 0) << shape;
    }
  }
}

// A safetensors file of header h and no data, parsed.
Outcome parse_header(const std::string& h) {
  std::vector<uint8_t> b(8);
  for (size_t i = 0; i < 8; ++i) b[i] = uint8_t(uint64_t(h.size()) >> (8 * i));
  b.insert(b.end(), h.begin(), h.end());
  gift::io::TensorFile f;
  return outcome([&] {
    gift::io::parse_tensor_file(gift::io::FileKind::kSafetensors, b.data(), b.size(),
                                "t.safetensors", "t", &f);
  });
}

// A header that does not parse says why: not UTF-8 (a name in another encoding), or not JSON,
// and where.
TEST(Safetensors, HeaderThatDoesNotParseSaysWhyAndWhere) {
  EXPECT_EQ(parse_header("{\"a\xff\": {}}").message,
            "t.safetensors: safetensors header is not UTF-8 (at byte 4 of the header)");
  EXPECT_EQ(parse_header("{\"a\": [}").message,
            "t.safetensors: safetensors header is not valid JSON (at byte 8 of the header)");
  EXPECT_EQ(parse_header("[1, 2]").message,
            "t.safetensors: safetensors header is not a JSON object");
  // Not a parse error but nlohmann's out_of_range, which the fuzzer found uncaught.
  EXPECT_EQ(parse_header("{\"s\": 1e999}").message,
            "t.safetensors: safetensors header is not valid JSON (a number out of range)");
}

// A header whose JSON nests deeper than any real one (three levels) is refused: printing such a
// value into a message recursed once per level and overflowed the stack.
TEST(Safetensors, DeeplyNestedHeaderIsRefused) {
  auto parse_with_dtype_depth = [](size_t depth) {
    return parse_header(R"({"a":{"dtype":)" + std::string(depth, '[') + std::string(depth, ']') +
                        R"(,"shape":[],"data_offsets":[0,0]}})");
  };
  const Outcome deep = parse_with_dtype_depth(100000);
  EXPECT_EQ(deep.code, giftc::kBadInput);
  EXPECT_EQ(deep.message, "t.safetensors: safetensors header nests JSON deeper than 64 levels");
  const Outcome shallow = parse_with_dtype_depth(3);
  EXPECT_EQ(shallow.code, giftc::kBadInput);
  EXPECT_EQ(shallow.message,
            "t.safetensors: tensor 'a': unsupported dtype [[[]]] (supported: F32, BF16, F16)");
}

}  // namespace
