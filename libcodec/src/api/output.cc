// The C API of outputs: giftOutput over OutputFile.
#include <new>

#include "api/handles.h"
#include "common/error.h"
#include "common/output_file.h"

using gift::fail;

extern "C" {

giftResult_t giftOutputOpenFile(const char* path, giftOutput** out) {
  gift::clear_error();
  if (!path || !out) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftOutputOpenFile: null pointer");
  *out = nullptr;
  giftOutput* o = new (std::nothrow) giftOutput;
  if (!o) return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory");
  if (const giftResult_t r = o->file.open(path)) {
    delete o;
    return r;
  }
  *out = o;
  return GIFT_OK;
}

giftResult_t giftOutputOpenFd(int fd, const char* name, giftOutput** out) {
  gift::clear_error();
  if (!out || fd < 0) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftOutputOpenFd: bad argument");
  *out = nullptr;
  giftOutput* o = new (std::nothrow) giftOutput;
  if (!o) return fail(GIFT_ERROR_OUT_OF_MEMORY, "out of memory");
  o->file.open_fd(fd, name ? name : "output");
  *out = o;
  return GIFT_OK;
}

giftResult_t giftOutputWrite(giftOutput* out, const void* data, uint64_t size) {
  gift::clear_error();
  if (!out || (size && !data)) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftOutputWrite: null");
  if (const giftResult_t r = out->file.check_not_streaming()) return r;
  return out->file.write(data, size);
}

giftResult_t giftOutputWriteBehind(giftOutput* out, const void* data, uint64_t size) {
  gift::clear_error();
  if (!out || (size && !data))
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftOutputWriteBehind: null");
  if (const giftResult_t r = out->file.check_not_streaming()) return r;
  return out->file.write_behind(data, size, nullptr);
}

giftResult_t giftOutputWait(giftOutput* out) {
  gift::clear_error();
  if (!out) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftOutputWait: null output");
  return out->file.flush();
}

giftResult_t giftOutputReserve(giftOutput* out, uint64_t total) {
  gift::clear_error();
  if (!out) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftOutputReserve: null output");
  if (const giftResult_t r = out->file.check_not_streaming()) return r;
  return out->file.reserve(total);
}

giftResult_t giftOutputSetSync(giftOutput* out, int sync) {
  gift::clear_error();
  if (!out) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftOutputSetSync: null output");
  out->file.set_sync(sync != 0);
  return GIFT_OK;
}

giftResult_t giftOutputSetReplace(giftOutput* out, int replace) {
  gift::clear_error();
  if (!out) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftOutputSetReplace: null output");
  out->file.set_replace(replace != 0);
  return GIFT_OK;
}

giftResult_t giftOutputSetMode(giftOutput* out, unsigned int mode) {
  gift::clear_error();
  if (!out) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftOutputSetMode: null output");
  if (mode > 0777) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftOutputSetMode: mode %o has bits past 0777", mode);
  }
  out->file.set_mode(mode);
  return GIFT_OK;
}

giftResult_t giftOutputCommit(giftOutput* out) {
  gift::clear_error();
  if (!out) return fail(GIFT_ERROR_INVALID_ARGUMENT, "giftOutputCommit: null output");
  return out->file.commit();
}

uint64_t giftOutputBytes(const giftOutput* out) { return out ? out->file.written() : 0; }

void giftOutputFree(giftOutput* out) { delete out; }

}  // extern "C"
