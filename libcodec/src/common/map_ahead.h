// Mapping the pages of memory the CPU is about to read, in one system call.
#pragma once

#include <cstdint>

namespace gift {

// Maps the pages of [p, p + bytes) before they are read. In a memory-mapped file (giftc's
// inputs, a frame opened by giftFrameOpenFile) each fault maps only 64 KiB (the kernel's
// fault-around), and one call maps them all: giftc encode of a 512 MiB dump, one thread,
// took 3 to 4% less time with each band mapped ahead. In memory already mapped, or before
// Linux 5.14, it changes nothing. Errors are ignored: a page left unmapped faults on its read
// as before, which reports any I/O error as a read always has. Callers map at most
// kMapAheadBytes at a time, so that a file larger than memory is not read twice.
void map_ahead(const void* p, uint64_t bytes);
constexpr uint64_t kMapAheadBytes = uint64_t(4) << 20;

}  // namespace gift
