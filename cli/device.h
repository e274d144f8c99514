// giftc's --device: where encode and decode run, the CPU or a CUDA device (gift_cuda.h, with
// the CPU's bytes).
#pragma once

#include <string>

#include "gift/gift.h"

namespace giftc {

enum class Device { kCpu, kCuda };

// "cpu" or "cuda". cuda is a usage error (exit 1) in a build without CUDA, and an I/O error
// (exit 3) when no CUDA device is usable.
Device parse_device(const std::string& s);

// Where the writer's encodes and the frame's decodes run.
void use_device(giftFrameWriter* w, Device d);
void use_device(giftFrame* f, Device d);

// One run of `giftc bench --device cuda`: seconds of a device-to-device copy of the input,
// of encoding it and of decoding it to fp32, each the best of several, on device buffers.
struct DeviceTimes {
  std::string device;
  double copy, encode, decode;
};
DeviceTimes time_on_device(const giftQuantParams& p, giftDType_t dtype, uint64_t rows,
                           uint64_t cols);

}  // namespace giftc
