// Test helper: rewrites a frame's header through the FlatBuffers object API and reassembles
// a frame around it (new preamble and checksum, the data area moved as a block), so tests can
// produce frames that are valid except for one chosen field.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "container/layout.h"
#include "container/sections.h"

namespace gift::testing {

// Unpacks with `Root::UnPack`, lets `edit` change the object, repacks. FrameT is the object
// type of whichever schema (today's or a test-only extended one) the caller compiled.
template <typename FrameT, typename Unpack, typename Pack, typename Edit>
std::vector<uint8_t> edit_frame(const std::vector<uint8_t>& frame, Unpack unpack, Pack pack,
                                Edit edit, uint16_t major = 1, uint16_t minor = 0) {
  using namespace gift::container;
  const Preamble pre = read_preamble(frame.data());
  const uint64_t old_start = align_up(kPreambleBytes + pre.header_length);
  FrameT obj;
  unpack(frame.data() + kPreambleBytes, &obj);
  // Section offsets move with the data area; measure the new header first.
  auto build = [&](int64_t shift, std::vector<uint8_t>* header) {
    FrameT copy = obj;
    for (auto& t : copy.tensors) {
      if (t->codes) t->codes->offset += uint64_t(shift);
      if (t->scales) t->scales->offset += uint64_t(shift);
    }
    edit(copy);
    *header = pack(copy);
  };
  std::vector<uint8_t> header;
  build(0, &header);
  const int64_t shift = int64_t(align_up(kPreambleBytes + header.size())) - int64_t(old_start);
  build(shift, &header);
  const uint64_t new_start = align_up(kPreambleBytes + header.size());
  std::vector<uint8_t> out(new_start + (frame.size() - std::min<uint64_t>(old_start, frame.size())),
                           0);
  Preamble p;
  p.major = major;
  p.minor = minor;
  p.header_length = uint32_t(header.size());
  p.header_checksum = checksum64(header.data(), header.size());
  p.frame_length = out.size();
  write_preamble(p, out.data());
  std::memcpy(out.data() + kPreambleBytes, header.data(), header.size());
  if (frame.size() > old_start) {
    std::memcpy(out.data() + new_start, frame.data() + old_start, frame.size() - old_start);
  }
  return out;
}

}  // namespace gift::testing
