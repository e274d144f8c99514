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

// Names the bucket by its tensor names, so buckets of one run dump to distinct files.
uint64_t bucket_id(const std::vector<DumpTensor>& tensors) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const DumpTensor& t : tensors) XXH3_64bits_update(st, t.name, strlen(t.name) + 1);
  const uint64_t id = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return id;
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

giftResult_t write_dump(const DumpSettings& s, const giftAllReduceConfig& config, int world,
                        uint64_t call, const std::vector<DumpTensor>& tensors) {
  giftFrameWriter* raw = nullptr;
  if (const giftResult_t rc = giftFrameWriterCreate(&raw)) return rc;
  WriterPtr w(raw, giftFrameWriterFree);
  const std::string calls = std::to_string(call), worlds = std::to_string(world);
  const std::string conf = config_text(config);
  if (giftResult_t rc = giftFrameWriterAddMetadata(w.get(), "gift.allreduce.call", calls.c_str());
      rc || (rc = giftFrameWriterAddMetadata(w.get(), "gift.allreduce.world", worlds.c_str())) ||
      (rc = giftFrameWriterAddMetadata(w.get(), "gift.allreduce.config", conf.c_str()))) {
    return rc;
  }
  for (const DumpTensor& t : tensors) {
    if (const giftResult_t rc =
            giftFrameWriterAddTensor(w.get(), t.name, t.shape->data(), uint32_t(t.shape->size()),
                                     t.dtype, t.data, nullptr)) {
      return rc;
    }
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/allreduce-%016" PRIx64 "-%06" PRIu64 ".gift", s.dir.c_str(),
           bucket_id(tensors), call);
  return giftFrameWriterWriteFile(w.get(), path);
}

}  // namespace gift::transport
