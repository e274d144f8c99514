// Sized public structs (gift.h): the library reads and writes at most the `size` bytes the
// caller says its struct has, so a struct that grows keeps old callers working. The one
// place that checks a struct's header.
#pragma once

#include <cstddef>
#include <cstring>

#include "common/error.h"
#include "gift/gift.h"

namespace gift {

// The bytes of the header every sized struct starts with.
constexpr size_t kSizedHeader = sizeof(size_t) + 2 * sizeof(unsigned int);

template <class T>
giftResult_t check_sized(const T* s, const char* type) {
  if (!s) return fail(GIFT_ERROR_INVALID_ARGUMENT, "%s is NULL", type);
  if (s->magic != GIFT_STRUCT_MAGIC) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "%s was not initialized (its magic is wrong): start from its GIFT_..._INIT "
                "macro or its Init function",
                type);
  }
  if (s->size < kSizedHeader) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "%s has size %zu, less than its header of %zu bytes: start from its GIFT_..._INIT "
                "macro",
                type, s->size, kSizedHeader);
  }
  if (s->size > sizeof(T)) {
    return fail(GIFT_ERROR_INVALID_ARGUMENT,
                "%s has size %zu; this library knows sizes up to %zu (a newer gift.h?)", type,
                s->size, sizeof(T));
  }
  return GIFT_OK;
}

// *out = the caller's struct over `defaults`: fields past the caller's size keep theirs.
template <class T>
giftResult_t read_sized(const T* in, const T& defaults, T* out, const char* type) {
  if (const giftResult_t r = check_sized(in, type)) return r;
  *out = defaults;
  std::memcpy(static_cast<void*>(out), in, in->size);
  out->size = sizeof(T);
  return GIFT_OK;
}

// Writes `full` into the caller's struct, at most its size, keeping its header.
template <class T>
giftResult_t write_sized(const T& full, T* out, const char* type) {
  if (const giftResult_t r = check_sized(out, type)) return r;
  const size_t n = out->size;
  std::memcpy(reinterpret_cast<char*>(out) + kSizedHeader,
              reinterpret_cast<const char*>(&full) + kSizedHeader, n - kSizedHeader);
  return GIFT_OK;
}

}  // namespace gift
