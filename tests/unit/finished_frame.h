// Test helper: what a frame writer finishes, as bytes.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gift/gift.h"

// giftFrameWriterFinish's frame, copied out of the library's buffer; frees the writer.
inline std::vector<uint8_t> finished_frame(giftFrameWriter* w) {
  void* data = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(giftFrameWriterFinish(w, &data, &size), GIFT_OK) << giftGetLastErrorMessage();
  std::vector<uint8_t> out(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
  giftFree(data);
  giftFrameWriterFree(w);
  return out;
}
