// Test helper over frame_edit.h for frames of today's schema: the frame with its header
// re-packed after `edit`, everything else kept valid.
#pragma once

#include <cstdint>
#include <vector>

#include "gift_generated.h"
#include "unit/frame_edit.h"

namespace gift::testing {

template <typename Edit>
std::vector<uint8_t> edited(const std::vector<uint8_t>& frame, Edit edit) {
  return edit_frame<fb::FrameT>(
      frame, [](const uint8_t* h, fb::FrameT* o) { fb::GetFrame(h)->UnPackTo(o); },
      [](const fb::FrameT& o) {
        flatbuffers::FlatBufferBuilder b;
        b.ForceDefaults(true);
        b.Finish(fb::Frame::Pack(b, &o), fb::FrameIdentifier());
        return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
      },
      edit);
}

}  // namespace gift::testing
