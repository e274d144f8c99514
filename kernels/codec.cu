// GPU encode and decode (kernels/codec.h, behind gift_cuda.h): the CPU path's bytes on the
// GPU. Scale groups come from numerics/groups.h and every scale, code and value from
// numerics/elementwise.h, the functions the CPU encoder calls, so the same input gives the
// same bytes.
//
// Block scales, the hot path, take one fused pass: the threads of a group (a power of two,
// at most a warp) each load 16 elements at a time with 16-byte loads, agree on the group's
// amax with warp shuffles, write the scale and convert from registers, storing 16 codes
// with one 16-byte store; decode takes each lane's 16 elements in chunks of 4 (BlockLanes). The
// other layouts (tensor, row, tile) can have groups far larger than a thread block, so they take
// two passes over "items" (a group's rectangle cut into pieces of at most kItemElems): a census
// that folds each item's amax into its group with an atomic maximum on the bit pattern
// (non-negative floats order like their bits), then the conversion.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "kernels/codec.h"
#include "kernels/cuda_check.h"
#include "numerics/elementwise.h"
#include "numerics/groups.h"
#include "numerics/shapes.h"

namespace gift::kernels {
namespace {

using num::Fp8;

constexpr int kThreads = 256;
constexpr uint32_t kItemCols = 4096;   // widest item of the two-pass layouts
constexpr uint32_t kItemElems = 8192;  // largest item

// What an encode saw, accumulated on the device; the head of the workspace.
struct Census {
  unsigned long long nonfinite;
  unsigned long long first_nonfinite;  // ULLONG_MAX when there is none
  unsigned int amax_bits;              // the tensor's finite amax
};
// The per-group amax words of the two-pass layouts follow at this offset.
constexpr uint64_t kCensusBytes = 256;
static_assert(sizeof(Census) <= kCensusBytes, "census fits its slot");

template <giftDType_t DT>
using DTypeTag = std::integral_constant<giftDType_t, DT>;
template <Fp8 K>
using KindTag = std::integral_constant<Fp8, K>;

// Calls f(DTypeTag, KindTag) with the compile-time forms of a run-time dtype and kind.
template <typename F>
giftResult_t dispatch(giftDType_t dt, giftFp8Kind_t kind, F&& f) {
  auto with_kind = [&](auto d) {
    return kind == GIFT_FP8_E4M3 ? f(d, KindTag<Fp8::kE4M3>{}) : f(d, KindTag<Fp8::kE5M2>{});
  };
  switch (dt) {
    case GIFT_DTYPE_BF16:
      return with_kind(DTypeTag<GIFT_DTYPE_BF16>{});
    case GIFT_DTYPE_F16:
      return with_kind(DTypeTag<GIFT_DTYPE_F16>{});
    default:
      return with_kind(DTypeTag<GIFT_DTYPE_F32>{});
  }
}

template <giftDType_t DT>
constexpr int kSize = int(dtype_size(DT));

__device__ __forceinline__ uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

template <int N>
__device__ __forceinline__ bool aligned(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & (N - 1)) == 0;
}

template <giftDType_t DT>
__device__ __forceinline__ float widen(uint16_t h) {
  return DT == GIFT_DTYPE_BF16 ? num::bf16_to_float(h) : num::f16_to_float(h);
}

template <giftDType_t DT>
__device__ __forceinline__ float load_one(const void* src, uint64_t i) {
  if constexpr (DT == GIFT_DTYPE_F32) {
    return static_cast<const float*>(src)[i];
  } else {
    return widen<DT>(static_cast<const uint16_t*>(src)[i]);
  }
}

// Elements [e, e + n) of src (n <= 16) into v, zeros after them; 16-byte loads when the
// run is whole and aligned.
template <giftDType_t DT>
__device__ __forceinline__ void load16(const void* src, uint64_t e, int n, float (&v)[16]) {
  const char* p = static_cast<const char*>(src) + e * kSize<DT>;
  if (n == 16 && aligned<16>(p)) {
    if constexpr (DT == GIFT_DTYPE_F32) {
      const float4* q = reinterpret_cast<const float4*>(p);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 f = q[k];
        v[4 * k] = f.x;
        v[4 * k + 1] = f.y;
        v[4 * k + 2] = f.z;
        v[4 * k + 3] = f.w;
      }
    } else {
      const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const uint4 u = q[k];
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          v[8 * k + 2 * j] = widen<DT>(uint16_t(w[j]));
          v[8 * k + 2 * j + 1] = widen<DT>(uint16_t(w[j] >> 16));
        }
      }
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < 16; ++k) v[k] = k < n ? load_one<DT>(src, e + k) : 0.0f;
}

__device__ __forceinline__ void store16(uint8_t* codes, uint64_t e, int n, const uint8_t (&c)[16]) {
  uint8_t* p = codes + e;
  if (n == 16 && aligned<16>(p)) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = uint32_t(c[4 * j]) | uint32_t(c[4 * j + 1]) << 8 | uint32_t(c[4 * j + 2]) << 16 |
             uint32_t(c[4 * j + 3]) << 24;
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
  for (int k = 0; k < n; ++k) p[k] = c[k];
}

// Codes [e, e + n) into c (n <= 4).
__device__ __forceinline__ void load_codes4(const uint8_t* codes, uint64_t e, int n, uint8_t* c) {
  const uint8_t* p = codes + e;
  if (n == 4 && aligned<4>(p)) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
#pragma unroll
    for (int k = 0; k < 4; ++k) c[k] = uint8_t(w >> (8 * k));
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) c[k] = k < n ? p[k] : 0;
}

// Values [e, e + n) of dst in its dtype (n <= 4).
template <giftDType_t DT>
__device__ __forceinline__ void store_values4(void* dst, uint64_t e, int n, const float* v) {
  char* p = static_cast<char*>(dst) + e * kSize<DT>;
  if constexpr (DT == GIFT_DTYPE_F32) {
    if (n == 4 && aligned<16>(p)) {
      *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
      return;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k < n) reinterpret_cast<float*>(p)[k] = v[k];
    }
  } else {
    uint16_t h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      h[k] = DT == GIFT_DTYPE_BF16 ? num::bf16_from_float(v[k]) : num::f16_from_float(v[k]);
    }
    if (n == 4 && aligned<8>(p)) {
      *reinterpret_cast<uint2*>(p) =
          make_uint2(uint32_t(h[0]) | uint32_t(h[1]) << 16, uint32_t(h[2]) | uint32_t(h[3]) << 16);
      return;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k < n) reinterpret_cast<uint16_t*>(p)[k] = h[k];
    }
  }
}

// What one thread saw of the input, folded into the census once per thread block.
struct ThreadCensus {
  unsigned int amax_bits = 0;
  unsigned long long nonfinite = 0, first = ULLONG_MAX;

  // Folds |v| into a group's amax (returned) or counts it as non-finite at `index`.
  __device__ __forceinline__ unsigned int see(float v, uint64_t index, unsigned int group_amax) {
    const unsigned int b = num::bits_of(v) & 0x7FFFFFFFu;
    if (b < 0x7F800000u) return max(group_amax, b);
    ++nonfinite;
    first = min(first, static_cast<unsigned long long>(index));
    return group_amax;
  }

  // Every thread of the block calls this once, at its end.
  __device__ void fold_into(Census* census) {
    __shared__ unsigned int s_amax;
    __shared__ unsigned long long s_nonfinite, s_first;
    if (threadIdx.x == 0) {
      s_amax = 0;
      s_nonfinite = 0;
      s_first = ULLONG_MAX;
    }
    __syncthreads();
    for (int off = 16; off; off >>= 1) {
      amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, off));
      nonfinite += __shfl_xor_sync(0xFFFFFFFFu, nonfinite, off);
      first = min(first, __shfl_xor_sync(0xFFFFFFFFu, first, off));
    }
    if ((threadIdx.x & 31) == 0) {
      atomicMax(&s_amax, amax_bits);
      if (nonfinite) {
        atomicAdd(&s_nonfinite, nonfinite);
        atomicMin(&s_first, first);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      atomicMax(&census->amax_bits, s_amax);
      if (s_nonfinite) {
        atomicAdd(&census->nonfinite, s_nonfinite);
        atomicMin(&census->first_nonfinite, s_first);
      }
    }
  }
};

struct EncodeArgs {
  const void* src;
  uint64_t rows, cols;
  uint8_t* codes;
  void* scales;
  bool e8m0, keep_nonfinite, stochastic;
  uint64_t seed;
  uint32_t tensor_index;
  Census* census;
  unsigned int* group_amax;  // two-pass layouts
};

__device__ __forceinline__ void store_scale(void* scales, bool e8m0, uint64_t g,
                                            const num::GroupScale& gs) {
  if (e8m0) {
    static_cast<uint8_t*>(scales)[g] = static_cast<uint8_t>(gs.stored);
  } else {
    static_cast<uint32_t*>(scales)[g] = gs.stored;
  }
}

// The threads of one block group: `tpg` lanes of a warp (a power of two), each taking runs
// of 16 elements, interleaved so that a group's lanes read consecutive bytes.
struct BlockLanes {
  uint32_t block, tpg, steps;  // steps = runs per lane
  uint64_t groups_per_row, groups;

  __device__ uint32_t sub() const { return threadIdx.x & (tpg - 1); }
  __device__ unsigned mask() const {
    return tpg == 32 ? 0xFFFFFFFFu : ((1u << tpg) - 1u) << ((threadIdx.x & 31) & ~(tpg - 1));
  }
  __device__ uint64_t first_group() const {
    return (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / tpg;
  }
  __device__ uint64_t stride() const { return uint64_t(gridDim.x) * blockDim.x / tpg; }
  // Offset in the group of this lane's run m: 16 consecutive elements (encode).
  __device__ uint32_t run(uint32_t m) const { return (m * tpg + sub()) * 16; }
  // Offset in the group of chunk q of this lane's run m in decode, which takes its 16
  // elements as 4 chunks of 4 interleaved with the other lanes' (offsets grow with m, then
  // q), so that each store of a warp is contiguous: 0.42 -> 0.70 of a device copy's
  // bandwidth for fp32 on an H200, where encode loses with it (0.62 -> 0.44).
  __device__ uint32_t chunk(uint32_t m, int q) const {
    return (m * tpg * 4 + uint32_t(q) * tpg + sub()) * 4;
  }
};

// Elements of a chunk at offset k0 of a group of len elements.
__device__ __forceinline__ int chunk_count(uint32_t k0, uint64_t len) {
  return k0 < len ? int(min64(4, len - k0)) : 0;
}

// SR: stochastic rounding, a template parameter so that round-to-nearest kernels do not
// hold the generator's registers (64 against 90: twice the resident threads).
template <giftDType_t DT, Fp8 K, bool SR>
__global__ void __launch_bounds__(kThreads) encode_blocks_kernel(EncodeArgs a, BlockLanes l) {
  ThreadCensus tc;
  num::Rounding rounding(SR, a.seed, a.tensor_index);  // a lane's runs are 16 consecutive
  for (uint64_t g = l.first_group(); g < l.groups; g += l.stride()) {
    const uint64_t row = g / l.groups_per_row, c0 = (g % l.groups_per_row) * l.block;
    const uint64_t len = min64(l.block, a.cols - c0), start = row * a.cols + c0;
    float v[16];
    unsigned int amax = 0;
    for (uint32_t m = 0; m < l.steps; ++m) {
      const uint32_t k0 = l.run(m);
      const int n = k0 < len ? int(min64(16, len - k0)) : 0;
      load16<DT>(a.src, start + k0, n, v);
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        if (k < n) amax = tc.see(v[k], start + k0 + k, amax);
      }
    }
    for (uint32_t off = l.tpg / 2; off; off >>= 1) {
      amax = max(amax, __shfl_xor_sync(l.mask(), amax, int(off), int(l.tpg)));
    }
    tc.amax_bits = max(tc.amax_bits, amax);
    const num::GroupScale gs = num::group_scale(num::float_of(amax), K, a.e8m0);
    if (l.sub() == 0) store_scale(a.scales, a.e8m0, g, gs);
    for (uint32_t m = 0; m < l.steps; ++m) {
      const uint32_t k0 = l.run(m);
      const int n = k0 < len ? int(min64(16, len - k0)) : 0;
      if (n == 0) break;
      if (l.steps > 1) load16<DT>(a.src, start + k0, n, v);  // one run: still in registers
      uint8_t c[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        c[k] = num::encode_element<K>(v[k], gs, a.keep_nonfinite, rounding, start + k0 + k);
      }
      store16(a.codes, start + k0, n, c);
    }
  }
  tc.fold_into(a.census);
}

template <giftDType_t DT, Fp8 K>
__global__ void __launch_bounds__(kThreads)
    decode_blocks_kernel(const uint8_t* codes, const void* scales, bool e8m0, uint64_t cols,
                         void* dst, BlockLanes l) {
  for (uint64_t g = l.first_group(); g < l.groups; g += l.stride()) {
    const uint64_t row = g / l.groups_per_row, c0 = (g % l.groups_per_row) * l.block;
    const uint64_t len = min64(l.block, cols - c0), start = row * cols + c0;
    const float s = num::stored_scale(scales, e8m0, g);
    for (uint32_t m = 0; m < l.steps; ++m) {
      if (l.chunk(m, 0) >= len) break;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t k0 = l.chunk(m, q);
        const int n = chunk_count(k0, len);
        uint8_t c[4];
        load_codes4(codes, start + k0, n, c);
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = num::decode_element<K>(c[k], s);
        store_values4<DT>(dst, start + k0, n, v);
      }
    }
  }
}

// ---- Two-pass layouts: items ---------------------------------------------------------------

// A group's rectangle cut into items of at most kItemCols columns and kItemElems elements.
struct Items {
  GroupGrid grid;
  uint32_t item_rows, item_cols;  // nominal size of an item
  uint64_t per_group_rows, per_group_cols;

  __device__ uint64_t count() const { return grid.count() * per_group_rows * per_group_cols; }
  // Rectangle of item i and its group.
  __device__ Rect rect(uint64_t i, uint64_t* g) const {
    const uint64_t per_group = per_group_rows * per_group_cols;
    *g = i / per_group;
    const uint64_t q = i % per_group;
    const Rect gr = grid.rect(*g);
    const uint64_t r0 = min64(gr.r1, gr.r0 + (q / per_group_cols) * item_rows);
    const uint64_t c0 = min64(gr.c1, gr.c0 + (q % per_group_cols) * item_cols);
    return {r0, min64(gr.r1, r0 + item_rows), c0, min64(gr.c1, c0 + item_cols)};
  }
};

// Items are cut from the part of a group that lies in the tensor: a tile larger than the
// tensor would otherwise make (almost all empty) items without bound.
Items make_items(const GroupGrid& grid) {
  const uint64_t h = std::max<uint64_t>(1, std::min(grid.height, grid.rows));
  const uint64_t w = std::max<uint64_t>(1, std::min(grid.width, grid.cols));
  Items it{grid, 1, 1, 1, 1};
  it.item_cols = uint32_t(std::min<uint64_t>(w, kItemCols));
  it.item_rows = uint32_t(std::max<uint64_t>(1, std::min<uint64_t>(h, kItemElems / it.item_cols)));
  it.per_group_rows = ceil_div(h, it.item_rows);
  it.per_group_cols = ceil_div(w, it.item_cols);
  return it;
}

// Calls f(flat index) for every element of r, spread over the block's threads (a row of
// the item at most kItemCols wide, so the 32-bit division is exact).
template <typename F>
__device__ __forceinline__ void for_each_in(const Rect& r, uint64_t cols, F&& f) {
  const uint32_t w = uint32_t(r.c1 - r.c0), n = uint32_t(r.count());
  for (uint32_t k = threadIdx.x; k < n; k += blockDim.x) {
    f((r.r0 + k / w) * cols + r.c0 + k % w);
  }
}

template <giftDType_t DT>
__global__ void __launch_bounds__(kThreads) census_items_kernel(EncodeArgs a, Items it) {
  __shared__ unsigned int s_group_amax;
  ThreadCensus tc;
  for (uint64_t i = blockIdx.x; i < it.count(); i += gridDim.x) {
    uint64_t g = 0;
    const Rect r = it.rect(i, &g);
    unsigned int amax = 0;
    for_each_in(r, a.cols, [&](uint64_t e) { amax = tc.see(load_one<DT>(a.src, e), e, amax); });
    if (threadIdx.x == 0) s_group_amax = 0;
    __syncthreads();
    atomicMax(&s_group_amax, amax);
    __syncthreads();
    if (threadIdx.x == 0) {
      atomicMax(&a.group_amax[g], s_group_amax);
      tc.amax_bits = max(tc.amax_bits, s_group_amax);
    }
    __syncthreads();  // s_group_amax is reset for the next item only after thread 0 read it
  }
  tc.fold_into(a.census);
}

template <giftDType_t DT, Fp8 K>
__global__ void __launch_bounds__(kThreads) convert_items_kernel(EncodeArgs a, Items it) {
  num::Rounding rounding(a.stochastic, a.seed, a.tensor_index);
  for (uint64_t i = blockIdx.x; i < it.count(); i += gridDim.x) {
    uint64_t g = 0;
    const Rect r = it.rect(i, &g);
    const num::GroupScale gs = num::group_scale(num::float_of(a.group_amax[g]), K, a.e8m0);
    const Rect gr = it.grid.rect(g);
    if (threadIdx.x == 0 && r.r0 == gr.r0 && r.c0 == gr.c0) store_scale(a.scales, a.e8m0, g, gs);
    for_each_in(r, a.cols, [&](uint64_t e) {
      a.codes[e] =
          num::encode_element<K>(load_one<DT>(a.src, e), gs, a.keep_nonfinite, rounding, e);
    });
  }
}

template <giftDType_t DT, Fp8 K>
__global__ void __launch_bounds__(kThreads)
    decode_items_kernel(const uint8_t* codes, const void* scales, bool e8m0, void* dst, Items it) {
  for (uint64_t i = blockIdx.x; i < it.count(); i += gridDim.x) {
    uint64_t g = 0;
    const Rect r = it.rect(i, &g);
    const float s = num::stored_scale(scales, e8m0, g);
    for_each_in(r, it.grid.cols, [&](uint64_t e) {
      const float v = num::decode_element<K>(codes[e], s);
      if constexpr (DT == GIFT_DTYPE_F32) {
        static_cast<float*>(dst)[e] = v;
      } else {
        static_cast<uint16_t*>(dst)[e] =
            DT == GIFT_DTYPE_BF16 ? num::bf16_from_float(v) : num::f16_from_float(v);
      }
    });
  }
}

__global__ void write_stats_kernel(const Census* census, giftEncodeStats* stats) {
  stats->amax = num::float_of(census->amax_bits);
  stats->nonfinite_count = census->nonfinite;
  stats->first_nonfinite = census->first_nonfinite;
}

// ---- Launch ---------------------------------------------------------------------------------

// Thread blocks for a grid-stride kernel: as many as stay resident on the device at once,
// and no more than there is work for.
template <typename Kernel>
giftResult_t grid_size(Kernel kernel, uint64_t work_blocks, unsigned* out) {
  int device = 0, sms = 0, per_sm = 0;
  GIFT_CUDA_TRY(cudaGetDevice(&device));
  GIFT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  GIFT_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  const uint64_t resident = uint64_t(std::max(1, sms)) * uint64_t(std::max(1, per_sm));
  *out = unsigned(std::max<uint64_t>(1, std::min(resident, work_blocks)));
  return GIFT_OK;
}

BlockLanes block_lanes(const giftQuantParams& p, const GroupGrid& grid) {
  BlockLanes l;
  l.block = p.block;
  l.tpg = std::min<uint32_t>(32, p.block / 16);
  l.steps = p.block / 16 / l.tpg;
  l.groups_per_row = grid.grid_cols;
  l.groups = grid.count();
  return l;
}

uint64_t workspace_bytes(const giftQuantParams& p, const GroupGrid& grid) {
  return kCensusBytes + (p.layout == GIFT_SCALE_BLOCK ? 0 : 4 * grid.count());
}

giftResult_t launch_encode(const giftQuantParams& p, const GroupGrid& grid, EncodeArgs a,
                           giftDType_t dtype, cudaStream_t stream) {
  return dispatch(dtype, p.kind, [&](auto dt, auto kind) -> giftResult_t {
    constexpr giftDType_t DT = decltype(dt)::value;
    constexpr Fp8 K = decltype(kind)::value;
    unsigned blocks = 0;
    if (p.layout == GIFT_SCALE_BLOCK) {
      const BlockLanes l = block_lanes(p, grid);
      const auto kernel =
          a.stochastic ? encode_blocks_kernel<DT, K, true> : encode_blocks_kernel<DT, K, false>;
      if (const giftResult_t r = grid_size(kernel, ceil_div(l.groups * l.tpg, kThreads), &blocks))
        return r;
      kernel<<<blocks, kThreads, 0, stream>>>(a, l);
      GIFT_CUDA_LAUNCHED(encode_blocks_kernel);
      return GIFT_OK;
    }
    const Items it = make_items(grid);
    const uint64_t items = grid.count() * it.per_group_rows * it.per_group_cols;
    if (const giftResult_t r = grid_size(census_items_kernel<DT>, items, &blocks)) return r;
    census_items_kernel<DT><<<blocks, kThreads, 0, stream>>>(a, it);
    GIFT_CUDA_LAUNCHED(census_items_kernel);
    if (const giftResult_t r = grid_size(convert_items_kernel<DT, K>, items, &blocks)) return r;
    convert_items_kernel<DT, K><<<blocks, kThreads, 0, stream>>>(a, it);
    GIFT_CUDA_LAUNCHED(convert_items_kernel);
    return GIFT_OK;
  });
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // a missing driver is not an error to keep
    return 0;
  }
  return n;
}

uint64_t encode_workspace_bytes(const giftQuantParams& p, uint64_t rows, uint64_t cols) {
  return workspace_bytes(p, group_grid(p, rows, cols));
}

giftResult_t encode(const giftQuantParams& p, const void* src, giftDType_t src_dtype, uint64_t rows,
                    uint64_t cols, uint8_t* codes, void* scales, giftEncodeStats* stats,
                    void* workspace, cudaStream_t stream) {
  const GroupGrid grid = group_grid(p, rows, cols);
  const uint64_t need = workspace_bytes(p, grid);
  void* ws = workspace;
  if (!ws) GIFT_CUDA_TRY(cudaMallocAsync(&ws, need, stream));
  auto* census = static_cast<Census*>(ws);
  giftResult_t result = [&]() -> giftResult_t {
    GIFT_CUDA_TRY(cudaMemsetAsync(ws, 0, need, stream));
    GIFT_CUDA_TRY(
        cudaMemsetAsync(&census->first_nonfinite, 0xFF, sizeof(unsigned long long), stream));
    if (rows > 0 && cols > 0) {
      EncodeArgs a{src,
                   rows,
                   cols,
                   codes,
                   scales,
                   p.scale_dtype == GIFT_SCALE_DTYPE_E8M0,
                   p.nonfinite == GIFT_NONFINITE_KEEP,
                   p.rounding == GIFT_ROUND_STOCHASTIC,
                   p.seed,
                   p.tensor_index,
                   census,
                   reinterpret_cast<unsigned int*>(static_cast<char*>(ws) + kCensusBytes)};
      if (const giftResult_t r = launch_encode(p, grid, a, src_dtype, stream)) return r;
    } else if (grid.count()) {
      // An empty tensor's groups (tensor and row layouts have some) all have amax 0, whose
      // scale is stored as zero bytes in both scale types (FORMAT.md 1.7, 1.8).
      GIFT_CUDA_TRY(cudaMemsetAsync(scales, 0, grid.count() * scale_size(p.scale_dtype), stream));
    }
    if (stats) {
      write_stats_kernel<<<1, 1, 0, stream>>>(census, stats);
      GIFT_CUDA_LAUNCHED(write_stats_kernel);
    }
    return GIFT_OK;
  }();
  if (!workspace) {
    const cudaError_t e = cudaFreeAsync(ws, stream);
    if (result == GIFT_OK && e != cudaSuccess) result = cuda_failed(e, "cudaFreeAsync(workspace)");
  }
  return result;
}

giftResult_t decode(const giftQuantParams& p, const uint8_t* codes, const void* scales,
                    uint64_t rows, uint64_t cols, void* dst, giftDType_t dst_dtype,
                    cudaStream_t stream) {
  if (rows * cols == 0) return GIFT_OK;
  const GroupGrid grid = group_grid(p, rows, cols);
  const bool e8m0 = p.scale_dtype == GIFT_SCALE_DTYPE_E8M0;
  return dispatch(dst_dtype, p.kind, [&](auto dt, auto kind) -> giftResult_t {
    constexpr giftDType_t DT = decltype(dt)::value;
    constexpr Fp8 K = decltype(kind)::value;
    unsigned blocks = 0;
    if (p.layout == GIFT_SCALE_BLOCK) {
      const BlockLanes l = block_lanes(p, grid);
      if (const giftResult_t r =
              grid_size(decode_blocks_kernel<DT, K>, ceil_div(l.groups * l.tpg, kThreads), &blocks))
        return r;
      decode_blocks_kernel<DT, K>
          <<<blocks, kThreads, 0, stream>>>(codes, scales, e8m0, cols, dst, l);
      GIFT_CUDA_LAUNCHED(decode_blocks_kernel);
      return GIFT_OK;
    }
    const Items it = make_items(grid);
    const uint64_t items = grid.count() * it.per_group_rows * it.per_group_cols;
    if (const giftResult_t r = grid_size(decode_items_kernel<DT, K>, items, &blocks)) return r;
    decode_items_kernel<DT, K><<<blocks, kThreads, 0, stream>>>(codes, scales, e8m0, dst, it);
    GIFT_CUDA_LAUNCHED(decode_items_kernel);
    return GIFT_OK;
  });
}

}  // namespace gift::kernels
