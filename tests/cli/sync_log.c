/* Preloaded into giftc by test_giftc.py: each fsync, fdatasync or sync_file_range call
 * appends a line naming it and the file's size (or "folder") to $GIFT_SYNC_LOG, then runs
 * the real call, so a test sees whether giftc made its outputs durable, and when. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void note(const char* call, int fd) {
  const char* log = getenv("GIFT_SYNC_LOG");
  if (!log) return;
  struct stat st;
  char line[96];
  const int got = fstat(fd, &st) == 0;
  const int n = got && S_ISDIR(st.st_mode) ? snprintf(line, sizeof line, "%s folder\n", call)
                                           : snprintf(line, sizeof line, "%s %lld\n", call,
                                                      got ? (long long)st.st_size : -1);
  const int out = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (out < 0) return;
  if (write(out, line, (size_t)n) != n) abort(); /* a test must not read a partial log */
  close(out);
}

int fsync(int fd) {
  note("fsync", fd);
  return ((int (*)(int))dlsym(RTLD_NEXT, "fsync"))(fd);
}

int fdatasync(int fd) {
  note("fdatasync", fd);
  return ((int (*)(int))dlsym(RTLD_NEXT, "fdatasync"))(fd);
}

int sync_file_range(int fd, off_t offset, off_t nbytes, unsigned int flags) {
  note("sync_file_range", fd);
  return ((int (*)(int, off_t, off_t, unsigned int))dlsym(RTLD_NEXT, "sync_file_range"))(
      fd, offset, nbytes, flags);
}
