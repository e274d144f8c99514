// Dumps of all-reduce results as GIFT frames, for offline study with giftc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gift/gift_transport.h"
#include "transport/config.h"

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

// Whether a dump can hold the bucket's tensors (the frame writer's rules on names and
// dimensions: distinct, non-empty UTF-8 names, ...), tried on empty tensors of the same names
// and ranks (nothing to check without dumps): rank 0's plan fails its creation with
// GIFT_ERROR_INVALID_ARGUMENT instead of every dump failing.
giftResult_t check_dump_names(const DumpSettings& s, const BucketShape& bucket);

inline bool dump_due(const DumpSettings& s, uint64_t call) {
  return s.every > 0 && call % s.every == 0;
}

// Writes the bucket's tensors (data[i]: tensor i) losslessly, as the all-reduce returned them,
// with the call's metadata to <dir>/allreduce-<bucket>-<call>.gift, <bucket> a hash of the
// bucket's key (bucket_key: names, dtypes and shapes), so that a run's buckets dump to distinct
// files. A failure is GIFT_ERROR_IO, with the writer's reason.
giftResult_t write_dump(const DumpSettings& s, const giftAllReduceConfig& config, int world,
                        uint64_t call, const BucketShape& bucket, const void* const* data);

}  // namespace gift::transport
