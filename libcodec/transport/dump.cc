#include "transport/dump.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "common/error.h"
#include "common/xxh3.h"

namespace gift::transport {

namespace {

using WriterPtr = std::unique_ptr<giftFrameWriter, decltype(&giftFrameWriterFree)>;

std::string config_text(const giftAllReduceConfig& c) {
  char buf[256];
  snprintf(buf, sizeof buf,
           "fp8=%s block=%" PRIu32 " scales=%s rounding=%s seed=%" PRIu64
           " op=%s error_feedback=%d integrity=%d",
           c.kind == GIFT_FP8_E4M3 ? "e4m3" : "e5m2", c.block,
           c.scale_dtype == GIFT_SCALE_DTYPE_F32 ? "f32" : "e8m0",
           c.rounding == GIFT_ROUND_NEAREST ? "nearest" : "stochastic", c.seed,
           c.op == GIFT_REDUCE_SUM ? "sum" : "avg", c.error_feedback, c.integrity);
  return buf;
}

}  // namespace

DumpSettings dump_settings(const giftAllReduceConfig& config) {
  DumpSettings s;
  s.every = config.dump_every;
  const char* dir = config.dump_path;
  if (s.every == 0) {
    const char* every = getenv("GIFT_DUMP_EVERY");
    s.every = every ? uint32_t(strtoul(every, nullptr, 10)) : 0;
    dir = getenv("GIFT_DUMP_DIR");
  }
  s.dir = dir && *dir ? dir : ".";
  return s;
}

giftResult_t check_dump_dir(const DumpSettings& s) {
  if (s.every == 0) return GIFT_OK;
  const char* dir = s.dir.c_str();
  const char* why = nullptr;
  struct stat st;
  if (stat(dir, &st) != 0) {
    why = strerror(errno);
  } else if (!S_ISDIR(st.st_mode)) {
    why = "not a folder";
  } else if (access(dir, W_OK | X_OK) != 0) {
    why = strerror(errno);
  }
  if (!why) return GIFT_OK;
  return fail(GIFT_ERROR_IO, "dumps every %" PRIu32 " calls into '%s': %s", s.every, dir, why);
}

giftResult_t check_dump_names(const DumpSettings& s, const BucketShape& bucket) {
  if (s.every == 0) return GIFT_OK;
  giftFrameWriter* raw = nullptr;
  if (const giftResult_t rc = giftFrameWriterCreate(&raw)) return rc;
  WriterPtr w(raw, giftFrameWriterFree);
  static const double kScalar = 0;  // the one element of a tensor of no dimensions
  for (size_t i = 0; i < bucket.dtypes.size(); ++i) {
    const std::vector<uint64_t> empty(bucket.shapes[i].size(), 0);
    if (giftFrameWriterAddTensor(w.get(), bucket.names[i].c_str(), empty.data(),
                                 uint32_t(empty.size()), bucket.dtypes[i], &kScalar, nullptr)) {
      const std::string why = giftGetLastErrorMessage();
      return fail(GIFT_ERROR_INVALID_ARGUMENT, "tensor %zu: dumps every %" PRIu32 " calls: %s", i,
                  s.every, why.c_str());
    }
  }
  return GIFT_OK;
}

giftResult_t write_dump(const DumpSettings& s, const giftAllReduceConfig& config, int world,
                        uint64_t call, const BucketShape& bucket, const void* const* data) {
  giftFrameWriter* raw = nullptr;
  giftResult_t rc = giftFrameWriterCreate(&raw);
  WriterPtr w(raw, giftFrameWriterFree);
  const std::string calls = std::to_string(call), worlds = std::to_string(world);
  const std::string conf = config_text(config);
  if (!rc) rc = giftFrameWriterAddMetadata(w.get(), "gift.allreduce.call", calls.c_str());
  if (!rc) rc = giftFrameWriterAddMetadata(w.get(), "gift.allreduce.world", worlds.c_str());
  if (!rc) rc = giftFrameWriterAddMetadata(w.get(), "gift.allreduce.config", conf.c_str());
  for (size_t i = 0; i < bucket.dtypes.size() && !rc; ++i) {
    rc = giftFrameWriterAddTensor(w.get(), bucket.names[i].c_str(), bucket.shapes[i].data(),
                                  uint32_t(bucket.shapes[i].size()), bucket.dtypes[i], data[i],
                                  nullptr);
  }
  const std::string key = bucket_key(bucket);
  char path[4096];
  snprintf(path, sizeof path, "%s/allreduce-%016" PRIx64 "-%06" PRIu64 ".gift", s.dir.c_str(),
           uint64_t(XXH3_64bits(key.data(), key.size())), call);
  if (!rc) rc = giftFrameWriterWriteFile(w.get(), path);
  if (rc == GIFT_OK || rc == GIFT_ERROR_IO) return rc;
  const std::string why = giftGetLastErrorMessage();
  return fail(GIFT_ERROR_IO, "%s: %s", path, why.c_str());
}

}  // namespace gift::transport
