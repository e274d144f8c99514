/* Preloaded into giftc by test_giftc.py: the file system then looks like one that cannot set
 * permission bits (vfat, some FUSE mounts), fchmod failing with EPERM. */
#include <errno.h>
#include <sys/stat.h>

int fchmod(int fd, mode_t mode) {
  (void)fd;
  (void)mode;
  errno = EPERM;
  return -1;
}
