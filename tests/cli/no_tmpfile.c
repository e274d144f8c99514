/* Preloaded into giftc by test_giftc.py: the file system then looks like one without
 * unnamed files (NFS, many FUSE file systems), open(..., O_TMPFILE) failing with EOPNOTSUPP,
 * so that outputs take their temporary-name path. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>

typedef int (*open_fn)(const char*, int, ...);

static int open_via(const char* symbol, const char* path, int flags, mode_t mode) {
  if ((flags & O_TMPFILE) == O_TMPFILE) {
    errno = EOPNOTSUPP;
    return -1;
  }
  const open_fn real = (open_fn)dlsym(RTLD_NEXT, symbol);
  return real(path, flags, mode);
}

#define MODE_ARG(flags, mode)                                  \
  mode_t mode = 0;                                             \
  if (((flags)&O_CREAT) || ((flags)&O_TMPFILE) == O_TMPFILE) { \
    va_list ap;                                                \
    va_start(ap, flags);                                       \
    mode = va_arg(ap, mode_t);                                 \
    va_end(ap);                                                \
  }

int open(const char* path, int flags, ...) {
  MODE_ARG(flags, mode)
  return open_via("open", path, flags, mode);
}

int open64(const char* path, int flags, ...) {
  MODE_ARG(flags, mode)
  return open_via("open64", path, flags, mode);
}
