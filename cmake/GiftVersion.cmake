# The library's version (libgift's SONAME follows its major) and the GIFT format version
# that its writer stamps into frames (format/FORMAT.md 3.1). Each is set here only: the build
# includes this file, and libcodec generates gift/gift_version.h from it for the code.
set(GIFT_VERSION 0.1.0)
set(GIFT_FORMAT_VERSION 1.0)
