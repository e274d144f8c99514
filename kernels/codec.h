// The GPU codec behind gift_cuda.h. The C functions (api/device_codec.cc) check the
// arguments and call these, which trust them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gift/gift.h"

namespace gift::kernels {

// Usable CUDA devices; 0 without a device or a driver.
int device_count();

// Device memory encode needs as workspace (params validated).
uint64_t encode_workspace_bytes(const giftQuantParams& p, uint64_t rows, uint64_t cols);

// Enqueues the encode on `stream`. Assumes validated params and buffers (the CPU codec's
// checks), src and scales aligned to their element sizes and stats to 8 bytes; a non-null
// workspace of encode_workspace_bytes, 256-byte aligned; a null one is allocated on the
// stream and freed after use.
giftResult_t encode(const giftQuantParams& p, const void* src, giftDType_t src_dtype, uint64_t rows,
                    uint64_t cols, uint8_t* codes, void* scales, giftEncodeStats* stats,
                    void* workspace, cudaStream_t stream);

// Enqueues the decode on `stream`, under the same assumptions.
giftResult_t decode(const giftQuantParams& p, const uint8_t* codes, const void* scales,
                    uint64_t rows, uint64_t cols, void* dst, giftDType_t dst_dtype,
                    cudaStream_t stream);

}  // namespace gift::kernels
