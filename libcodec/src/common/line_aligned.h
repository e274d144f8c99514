// std::vector storage aligned to a cache line, for buffers written through non-temporal
// stores: glibc's large allocations start 16 bytes into a page, which splits every
// vector-wide streamed store into 16-byte pieces (simd.cc, StreamAligned16).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace gift {

template <typename T>
struct LineAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};

  LineAligned() = default;
  template <typename U>
  LineAligned(const LineAligned<U>&) noexcept {}  // NOLINT: allocators convert implicitly

  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlign); }

  template <typename U>
  bool operator==(const LineAligned<U>&) const noexcept {
    return true;
  }
  template <typename U>
  bool operator!=(const LineAligned<U>&) const noexcept {
    return false;
  }
};

template <typename T>
using LineAlignedVector = std::vector<T, LineAligned<T>>;

}  // namespace gift
