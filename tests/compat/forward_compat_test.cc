// A frame of a newer minor version (written with a test-only schema, gift_v1_1_test.fbs,
// that appends fields to several tables) decodes with today's reader; a newer major does not.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "gift/gift.h"
#include "gift_v1_1_test_generated.h"
#include "unit/frame_edit.h"

namespace {

namespace fb11 = gift::fb_v1_1;

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

// Rewrites the header with the v1.1 schema, filling every field it adds.
std::vector<uint8_t> as_v1_1(const std::vector<uint8_t>& frame, uint16_t major, uint16_t minor) {
  return gift::testing::edit_frame<fb11::FrameT>(
      frame, [](const uint8_t* h, fb11::FrameT* o) { fb11::GetFrame(h)->UnPackTo(o); },
      [](const fb11::FrameT& o) {
        flatbuffers::FlatBufferBuilder b;
        b.ForceDefaults(true);
        b.Finish(fb11::Frame::Pack(b, &o), fb11::FrameIdentifier());
        return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
      },
      [](fb11::FrameT& f) {
        f.future_frame_step = 123456;
        f.future_frame_comment = "written by a newer writer";
        for (auto& t : f.tensors) {
          t->future_tensor_scale_bias = 0.25f;
          t->future_tensor_tags = {"a", "b", "c"};
          t->future_tensor_extra = std::make_unique<fb11::SectionT>(*t->codes);
          t->codes->future_section_flags = 7;
          t->codes->future_section_note = "note";
        }
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

TEST(ForwardCompat, Minor1FrameWithExtraFieldsDecodesToTheSameValues) {
  const std::vector<uint8_t> v10 = frame_v1_0();
  const std::vector<uint8_t> v11 = as_v1_1(v10, 1, 1);
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

TEST(ForwardCompat, OtherwiseValidMajor2FrameIsRefused) {
  const std::vector<uint8_t> v20 = as_v1_1(frame_v1_0(), 2, 0);
  giftFrame* f = nullptr;
  EXPECT_EQ(giftFrameOpen(v20.data(), v20.size(), &f), GIFT_ERROR_FRAME_VERSION);
  EXPECT_STREQ(giftGetLastErrorMessage(),
               "frame: unsupported GIFT format major version 2 (this build reads 1)");
  EXPECT_EQ(f, nullptr);
}

}  // namespace
