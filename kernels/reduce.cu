// The compressed all-reduce's own kernels (kernels/reduce.h). Every value goes through the
// per-element functions the CPU plan uses (numerics/elementwise.h), and sums are formed in
// the CPU plan's order, so device and CPU ranks produce the same bits. Indices are 64-bit
// throughout: a shard or a bucket may exceed 2^31 elements.
#include <cuda_runtime.h>

#include <algorithm>

#include "common/error.h"
#include "kernels/cuda_check.h"
#include "kernels/reduce.h"
#include "numerics/elementwise.h"

namespace gift::kernels {
namespace {

using num::Fp8;
using transport::MessageHeader;

constexpr int kThreads = 256;
// Runs of 16 elements: 16 codes are one 16-byte load, and a run never straddles a scale
// block since blocks are powers of two of at least 16 elements.
constexpr int kRun = 16;

__device__ __forceinline__ uint64_t thread_index() {
  return uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t thread_stride() { return uint64_t(gridDim.x) * blockDim.x; }

__device__ __forceinline__ float scale_at(const uint8_t* scales, bool e8m0, uint64_t g) {
  return e8m0 ? num::e8m0_to_float(scales[g]) : reinterpret_cast<const float*>(scales)[g];
}

template <Fp8 K>
__global__ void __launch_bounds__(kThreads) sum_shard_kernel(SumShardArgs a) {
  const uint64_t runs = (a.count + kRun - 1) / kRun;
  const float world = float(a.world);
  for (uint64_t t = thread_index(); t < runs; t += thread_stride()) {
    const uint64_t e = t * kRun;
    const int n = int(a.count - e < kRun ? a.count - e : kRun);
    const uint64_t g = e / a.block;
    float sum[kRun];
    for (int r = 0; r < a.world; ++r) {
      const uint8_t* msg = a.in.msgs + uint64_t(r) * a.in.message_bytes;
      const float s = scale_at(msg + a.in.scales_at, a.e8m0, g);
      const uint8_t* p = msg + a.in.codes_at + e;
      uint8_t c[kRun];
      if (n == kRun && (reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
        const uint4 u = *reinterpret_cast<const uint4*>(p);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < kRun; ++k) c[k] = uint8_t(w[k / 4] >> (8 * (k % 4)));
      } else {
#pragma unroll
        for (int k = 0; k < kRun; ++k) c[k] = k < n ? p[k] : 0;
      }
      // Rank 0's value starts the sum (not 0 + value), as on the CPU: -0 stays -0.
#pragma unroll
      for (int k = 0; k < kRun; ++k) {
        const float v = num::decode_element<K>(c[k], s);
        sum[k] = r == 0 ? v : sum[k] + v;
      }
    }
    if (a.average) {
#pragma unroll
      for (int k = 0; k < kRun; ++k) sum[k] /= world;
      for (int k = 0; k < n; ++k) {
        if (transport::is_finite(sum[k])) continue;
        sum[k] = transport::average_dividing_first(a.world, [&](int r) {
          const uint8_t* msg = a.in.msgs + uint64_t(r) * a.in.message_bytes;
          return num::decode_element<K>(msg[a.in.codes_at + e + k],
                                        scale_at(msg + a.in.scales_at, a.e8m0, g));
        });
      }
    }
    float* out = a.sum + e;
    if (a.residual) {
      for (int k = 0; k < n; ++k) sum[k] += a.residual[e + k];
    }
    if (n == kRun && (reinterpret_cast<uintptr_t>(out) & 15u) == 0) {
#pragma unroll
      for (int k = 0; k < kRun; k += 4) {
        *reinterpret_cast<float4*>(out + k) =
            make_float4(sum[k], sum[k + 1], sum[k + 2], sum[k + 3]);
      }
    } else {
      for (int k = 0; k < n; ++k) out[k] = sum[k];
    }
  }
}

template <Fp8 K>
__global__ void __launch_bounds__(kThreads)
    encode_residual_kernel(const uint8_t* codes, const uint8_t* scales, bool e8m0, uint32_t block,
                           const float* values, float* residual, uint64_t count) {
  for (uint64_t i = thread_index(); i < count; i += thread_stride()) {
    residual[i] = values[i] - num::decode_element<K>(codes[i], scale_at(scales, e8m0, i / block));
  }
}

__global__ void __launch_bounds__(kThreads)
    to_fp32_kernel(const void* src, giftDType_t dtype, uint64_t count, const float* residual,
                   float* dst) {
  for (uint64_t i = thread_index(); i < count; i += thread_stride()) {
    float v;
    if (dtype == GIFT_DTYPE_F32) {
      v = static_cast<const float*>(src)[i];
    } else {
      const uint16_t h = static_cast<const uint16_t*>(src)[i];
      v = dtype == GIFT_DTYPE_BF16 ? num::bf16_to_float(h) : num::f16_to_float(h);
    }
    dst[i] = residual ? v + residual[i] : v;
  }
}

__global__ void __launch_bounds__(kThreads)
    from_fp32_kernel(const float* src, uint64_t count, giftDType_t dtype, uint16_t* dst) {
  for (uint64_t i = thread_index(); i < count; i += thread_stride()) {
    dst[i] = dtype == GIFT_DTYPE_BF16 ? num::bf16_from_float(src[i]) : num::f16_from_float(src[i]);
  }
}

__global__ void write_headers_kernel(uint8_t* msgs, uint64_t message_bytes, int n, MessageHeader h,
                                     int shard0, int shard_step, const uint64_t* shard_begin) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    MessageHeader m = h;
    const int shard = shard0 + i * shard_step;
    m.shard = uint32_t(shard);
    m.count = shard_begin[shard + 1] - shard_begin[shard];
    *reinterpret_cast<MessageHeader*>(msgs + uint64_t(i) * message_bytes) = m;
  }
}

__global__ void check_headers_kernel(const uint8_t* msgs, uint64_t message_bytes, int world,
                                     int rank, uint32_t step, uint64_t call,
                                     const uint64_t* shard_begin, MessageHeader mine,
                                     ReduceRecord* record) {
  for (int s = threadIdx.x; s < world; s += blockDim.x) {
    const MessageHeader& h =
        *reinterpret_cast<const MessageHeader*>(msgs + uint64_t(s) * message_bytes);
    const int shard = step == transport::kScatter ? rank : s;
    bool ok = h.magic == transport::kMessageMagic && h.step == step && h.sender == uint32_t(s) &&
              h.shard == uint32_t(shard) && h.call == call &&
              h.count == shard_begin[shard + 1] - shard_begin[shard];
    if (!ok) {
      if (atomicAdd(&record->bad_messages, 1ull) == 0) {
        record->bad_call = call;
        record->bad_step = step;
        record->bad_sender = uint32_t(s);
      }
      continue;
    }
    bool same = h.coords_hash == mine.coords_hash;
    for (int b = 0; b < 16; ++b) same = same && h.basis_id[b] == mine.basis_id[b];
    if (!same && atomicAdd(&record->bad_basis, 1ull) == 0) {
      record->bad_basis_call = call;
      record->bad_basis_step = step;
      record->bad_basis_sender = uint32_t(s);
      record->bad_basis_header = h;
    }
  }
}

__global__ void record_nonfinite_kernel(const giftEncodeStats* stats, int n, uint64_t call,
                                        uint32_t step, ReduceRecord* record) {
  unsigned long long total = 0;
  for (int i = 0; i < n; ++i) total += stats[i].nonfinite_count;
  if (total && atomicAdd(&record->nonfinite, total) == 0) {
    record->nonfinite_call = call;
    record->nonfinite_step = step;
  }
}

__global__ void mark_nonfinite_kernel(const giftEncodeStats* stats, int n, uint8_t* msgs,
                                      uint64_t message_bytes, const uint8_t* pieces, int world) {
  const bool inherited = pieces && transport::any_holds_nonfinite(pieces, message_bytes, world);
  for (int i = 0; i < n; ++i) {
    if (inherited || stats[i].nonfinite_count) {
      reinterpret_cast<MessageHeader*>(msgs + uint64_t(i) * message_bytes)->flags |=
          transport::kHoldsNonFinite;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    commit_if_finite_kernel(const uint8_t* msgs, uint64_t message_bytes, int world,
                            const ReduceRecord* record, const float* src, float* dst,
                            uint64_t count) {
  __shared__ bool commit;
  if (threadIdx.x == 0) {
    commit = !transport::any_holds_nonfinite(msgs, message_bytes, world) &&
             record->bad_messages == 0 && record->bad_basis == 0;
  }
  __syncthreads();
  if (!commit) return;
  for (uint64_t i = thread_index(); i < count; i += thread_stride()) dst[i] = src[i];
}

// Thread blocks for a grid-stride loop over `work` items: enough to fill the device, no
// more than there is work for.
giftResult_t blocks_for(uint64_t work, unsigned* out) {
  int device = 0, sms = 0;
  GIFT_CUDA_TRY(cudaGetDevice(&device));
  GIFT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const uint64_t resident = uint64_t(std::max(1, sms)) * (2048 / kThreads);
  *out = unsigned(std::max<uint64_t>(1, std::min(resident, (work + kThreads - 1) / kThreads)));
  return GIFT_OK;
}

}  // namespace

giftResult_t sum_shard(const SumShardArgs& a, cudaStream_t stream) {
  if (a.count == 0) return GIFT_OK;
  unsigned blocks = 0;
  if (const giftResult_t r = blocks_for((a.count + kRun - 1) / kRun, &blocks)) return r;
  if (a.kind == GIFT_FP8_E4M3) {
    sum_shard_kernel<Fp8::kE4M3><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    sum_shard_kernel<Fp8::kE5M2><<<blocks, kThreads, 0, stream>>>(a);
  }
  GIFT_CUDA_LAUNCHED(sum_shard_kernel);
  return GIFT_OK;
}

giftResult_t encode_residual(const uint8_t* codes, const void* scales, bool e8m0,
                             giftFp8Kind_t kind, uint32_t block, const float* values,
                             float* residual, uint64_t count, cudaStream_t stream) {
  if (count == 0) return GIFT_OK;
  unsigned blocks = 0;
  if (const giftResult_t r = blocks_for(count, &blocks)) return r;
  const uint8_t* s = static_cast<const uint8_t*>(scales);
  if (kind == GIFT_FP8_E4M3) {
    encode_residual_kernel<Fp8::kE4M3>
        <<<blocks, kThreads, 0, stream>>>(codes, s, e8m0, block, values, residual, count);
  } else {
    encode_residual_kernel<Fp8::kE5M2>
        <<<blocks, kThreads, 0, stream>>>(codes, s, e8m0, block, values, residual, count);
  }
  GIFT_CUDA_LAUNCHED(encode_residual_kernel);
  return GIFT_OK;
}

giftResult_t to_fp32(const void* src, giftDType_t dtype, uint64_t count, const float* residual,
                     float* dst, cudaStream_t stream) {
  if (count == 0) return GIFT_OK;
  if (dtype == GIFT_DTYPE_F32 && !residual) {
    GIFT_CUDA_TRY(
        cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    return GIFT_OK;
  }
  unsigned blocks = 0;
  if (const giftResult_t r = blocks_for(count, &blocks)) return r;
  to_fp32_kernel<<<blocks, kThreads, 0, stream>>>(src, dtype, count, residual, dst);
  GIFT_CUDA_LAUNCHED(to_fp32_kernel);
  return GIFT_OK;
}

giftResult_t from_fp32(const float* src, uint64_t count, giftDType_t dtype, void* dst,
                       cudaStream_t stream) {
  if (count == 0) return GIFT_OK;
  if (dtype == GIFT_DTYPE_F32) {
    GIFT_CUDA_TRY(
        cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    return GIFT_OK;
  }
  unsigned blocks = 0;
  if (const giftResult_t r = blocks_for(count, &blocks)) return r;
  from_fp32_kernel<<<blocks, kThreads, 0, stream>>>(src, count, dtype, static_cast<uint16_t*>(dst));
  GIFT_CUDA_LAUNCHED(from_fp32_kernel);
  return GIFT_OK;
}

giftResult_t write_headers(uint8_t* msgs, uint64_t message_bytes, int n, const MessageHeader& h,
                           int shard0, int shard_step, const uint64_t* shard_begin,
                           cudaStream_t stream) {
  write_headers_kernel<<<1, kThreads, 0, stream>>>(msgs, message_bytes, n, h, shard0, shard_step,
                                                   shard_begin);
  GIFT_CUDA_LAUNCHED(write_headers_kernel);
  return GIFT_OK;
}

giftResult_t check_headers(const uint8_t* msgs, uint64_t message_bytes, int world, int rank,
                           uint32_t step, uint64_t call, const uint64_t* shard_begin,
                           const MessageHeader& mine, ReduceRecord* record, cudaStream_t stream) {
  check_headers_kernel<<<1, kThreads, 0, stream>>>(msgs, message_bytes, world, rank, step, call,
                                                   shard_begin, mine, record);
  GIFT_CUDA_LAUNCHED(check_headers_kernel);
  return GIFT_OK;
}

giftResult_t record_nonfinite(const giftEncodeStats* stats, int n, uint64_t call, uint32_t step,
                              ReduceRecord* record, cudaStream_t stream) {
  record_nonfinite_kernel<<<1, 1, 0, stream>>>(stats, n, call, step, record);
  GIFT_CUDA_LAUNCHED(record_nonfinite_kernel);
  return GIFT_OK;
}

giftResult_t mark_nonfinite(const giftEncodeStats* stats, int n, uint8_t* msgs,
                            uint64_t message_bytes, const uint8_t* pieces, int world,
                            cudaStream_t stream) {
  mark_nonfinite_kernel<<<1, 1, 0, stream>>>(stats, n, msgs, message_bytes, pieces, world);
  GIFT_CUDA_LAUNCHED(mark_nonfinite_kernel);
  return GIFT_OK;
}

giftResult_t commit_if_finite(const uint8_t* msgs, uint64_t message_bytes, int world,
                              const ReduceRecord* record, const float* src, float* dst,
                              uint64_t count, cudaStream_t stream) {
  if (count == 0) return GIFT_OK;
  unsigned blocks = 0;
  if (const giftResult_t r = blocks_for(count, &blocks)) return r;
  commit_if_finite_kernel<<<blocks, kThreads, 0, stream>>>(msgs, message_bytes, world, record, src,
                                                           dst, count);
  GIFT_CUDA_LAUNCHED(commit_if_finite_kernel);
  return GIFT_OK;
}

}  // namespace gift::kernels
