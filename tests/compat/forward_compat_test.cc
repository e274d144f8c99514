// Frames of newer versions, written with test-only schemas, against today's reader
// (FORMAT.md 3.1): a newer minor's informative fields are ignored and every tensor decodes
// to the same values; what would change decoding is refused, never ignored.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "gift/gift.h"
#include "gift_v1_1_test_generated.h"
#include "gift_v2_0_test_generated.h"
#include "unit/frame_edit.h"

namespace {

namespace fb11 = gift::fb_v1_1;
namespace fb20 = gift::fb_v2_0;

std::vector<uint8_t> frame_v1_0() {
  giftFrameWriter* w = nullptr;
  giftFrameWriterCreate(&w);
  std::vector<float> a(3 * 500), b(20);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i % 97) - 48) * 0.013f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(i) * 0.5f;
  const uint64_t sa[] = {3, 500}, sb[] = {20};
  giftQuantParams p;
  giftQuantParamsInit(&p);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "w", sa, 2, GIFT_DTYPE_F32, a.data(), &p), GIFT_OK);
  EXPECT_EQ(giftFrameWriterAddTensor(w, "b", sb, 1, GIFT_DTYPE_F32, b.data(), nullptr), GIFT_OK);
  void* data;
  uint64_t size;
  EXPECT_EQ(giftFrameWriterFinish(w, &data, &size), GIFT_OK);
  std::vector<uint8_t> out(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  giftFree(data);
  giftFrameWriterFree(w);
  return out;
}

// Rewrites the header with a test-only schema (FrameT is its object type), filling every
// informative field that schema adds, then `edit`.
template <typename FrameT, typename Edit>
std::vector<uint8_t> rewrite(const std::vector<uint8_t>& frame, uint16_t major, uint16_t minor,
                             Edit edit) {
  using Root = typename FrameT::TableType;
  return gift::testing::edit_frame<FrameT>(
      frame, [](const uint8_t* h, FrameT* o) { flatbuffers::GetRoot<Root>(h)->UnPackTo(o); },
      [](const FrameT& o) {
        flatbuffers::FlatBufferBuilder b;
        b.ForceDefaults(true);
        b.Finish(Root::Pack(b, &o), fb11::FrameIdentifier());
        return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
      },
      [&](FrameT& f) {
        f.future_frame_step = 123456;
        f.future_frame_comment = "written by a newer writer";
        for (auto& t : f.tensors) {
          t->future_tensor_tags = {"a", "b", "c"};
          using SectionT = std::decay_t<decltype(*t->codes)>;
          t->future_tensor_extra = std::make_unique<SectionT>(*t->codes);
          t->codes->future_section_flags = 7;
          t->codes->future_section_note = "note";
        }
        edit(f);
      },
      major, minor);
}

std::vector<std::vector<float>> decode_all(const std::vector<uint8_t>& frame) {
  giftFrame* f = nullptr;
  EXPECT_EQ(giftFrameOpen(frame.data(), frame.size(), &f), GIFT_OK) << giftGetLastErrorMessage();
  std::vector<std::vector<float>> out;
  if (!f) return out;
  for (uint64_t i = 0; i < giftFrameTensorCount(f); ++i) {
    giftTensorInfo info = GIFT_TENSOR_INFO_INIT;
    giftFrameTensorInfo(f, i, &info);
    std::vector<float> v(info.elements);
    EXPECT_EQ(giftFrameDecodeTensor(f, i, v.data(), v.size() * 4, GIFT_DTYPE_F32), GIFT_OK)
        << giftGetLastErrorMessage();
    out.push_back(v);
  }
  EXPECT_EQ(giftFrameVerify(f), GIFT_OK);
  giftFrameClose(f);
  return out;
}

TEST(ForwardCompat, Minor1FrameWithInformativeFieldsDecodesToTheSameValues) {
  const std::vector<uint8_t> v10 = frame_v1_0();
  const std::vector<uint8_t> v11 = rewrite<fb11::FrameT>(v10, 1, 1, [](fb11::FrameT&) {});
  // The rewritten header really carries the new fields.
  const auto* h = fb11::GetFrame(v11.data() + 32);
  ASSERT_EQ(h->future_frame_step(), 123456u);
  ASSERT_EQ(h->tensors()->Get(0)->future_tensor_tags()->size(), 3u);
  ASSERT_GT(v11.size(), v10.size());
  const auto want = decode_all(v10);
  const auto got = decode_all(v11);
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), want[i].size() * 4)) << i;
  }
}

// A minor version may change decoding only through a new enum value, which 1.x readers check
// and refuse (FORMAT.md 3.1), so the offset below cannot be silently dropped.
TEST(ForwardCompat, Minor1DecodeChangingEnumValueIsRefused) {
  const std::vector<uint8_t> v11 = rewrite<fb11::FrameT>(frame_v1_0(), 1, 1, [](fb11::FrameT& f) {
    f.tensors[0]->encoding = fb11::Encoding::Fp8Offset;
    f.tensors[0]->future_tensor_offset = 0.25f;
  });
  giftFrame* f = nullptr;
  EXPECT_EQ(giftFrameOpen(v11.data(), v11.size(), &f), GIFT_ERROR_FIELD_INVALID);
  EXPECT_STREQ(giftGetLastErrorMessage(),
               "frame: tensor 'w': unknown dtype, encoding or coordinates");
  EXPECT_EQ(f, nullptr);
}

// A field that changes how tensors decode comes with a new major version, which 1.x readers
// refuse before they read the header.
TEST(ForwardCompat, Major2FrameWithADecodeChangingFieldIsRefused) {
  const std::vector<uint8_t> v20 = rewrite<fb20::FrameT>(frame_v1_0(), 2, 0, [](fb20::FrameT& f) {
    for (auto& t : f.tensors) t->scale_bias = 0.5f;
  });
  ASSERT_EQ(fb20::GetFrame(v20.data() + 32)->tensors()->Get(0)->scale_bias(), 0.5f);
  giftFrame* f = nullptr;
  EXPECT_EQ(giftFrameOpen(v20.data(), v20.size(), &f), GIFT_ERROR_FRAME_VERSION);
  EXPECT_STREQ(giftGetLastErrorMessage(),
               "frame: unsupported GIFT format major version 2 (this build reads 1)");
  EXPECT_EQ(f, nullptr);
}

}  // namespace
