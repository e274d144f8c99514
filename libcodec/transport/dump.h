// Dumps of all-reduce results as GIFT frames, for offline study with giftc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gift/gift_transport.h"

namespace gift::transport {

struct DumpSettings {
  uint32_t every = 0;  // 0: never
  std::string dir;
};

// The config's settings, or GIFT_DUMP_EVERY / GIFT_DUMP_DIR when the config leaves dumps off.
DumpSettings dump_settings(const giftAllReduceConfig& config);

// Whether the settings' folder can take dumps (nothing to check without dumps): plans check
// it when they are created, so that a wrong folder fails there rather than after a call.
giftResult_t check_dump_dir(const DumpSettings& s);

inline bool dump_due(const DumpSettings& s, uint64_t call) {
  return s.every > 0 && call % s.every == 0;
}

struct DumpTensor {
  const char* name;
  giftDType_t dtype;
  const std::vector<uint64_t>* shape;
  const void* data;
};

// Writes the tensors losslessly (as the all-reduce returned them) with the call's metadata
// to <dir>/allreduce-<bucket>-<call>.gift, <bucket> naming the bucket's tensor list.
giftResult_t write_dump(const DumpSettings& s, const giftAllReduceConfig& config, int world,
                        uint64_t call, const std::vector<DumpTensor>& tensors);

}  // namespace gift::transport
