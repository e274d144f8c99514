#include "numerics/codec.h"

#include <omp.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <vector>

#include "common/ctx.h"
#include "common/error.h"
#include "numerics/elementwise.h"
#include "numerics/fp_env.h"
#include "numerics/groups.h"
#include "numerics/shapes.h"
#include "numerics/simd.h"

namespace gift {
namespace {

using num::Fp8;

// A group of at least this many elements, when there are too few groups to keep every
// thread busy (tensor and row layouts), is split into chunks across threads.
constexpr uint64_t kSplitGroupElems = uint64_t(1) << 18;
constexpr uint64_t kChunkElems = uint64_t(1) << 16;

// Decoded outputs from this size on are written with non-temporal stores (simd::dequantize,
// simd::BlockRun::stream): beyond any core's share of the caches, where a cached store would
// only evict other data and read each line from memory before writing it. Smaller ones
// (giftc decode's bands, 8 MiB at most, most transport shards), which their reader is more
// likely to find in cache, stay cached.
constexpr uint64_t kStreamBytes = uint64_t(32) << 20;

// task(t, thread) for t in [0, tasks), in a static schedule on a team of team_size(threads,
// tasks), `thread` the running thread's place in the team (below `threads`: what per-thread
// state is indexed by), then end_team() on each of the team's threads. A team of one runs them
// here, outside OpenMP: libgomp's region of one thread (its `if` clause as well) still
// allocates a team and ends at a barrier that calls futex(2), and giftc's bands take the
// encoder and decoder once per piece of 64K elements (giftc encode --threads 1 of a 512 MiB
// bf16 dump: 4,694 futex calls, 616 this way). Here omp_get_thread_num() would be the
// caller's place in a region of its own (the transport encodes inside one), hence `thread`.
template <typename Task, typename End = void (*)()>
void for_each_task(
    int threads, int64_t tasks, Task&& task, End&& end_team = [] {}) {
  const int team = team_size(threads, tasks);
  if (team == 1) {
    for (int64_t t = 0; t < tasks; ++t) task(t, size_t(0));
    end_team();
    return;
  }
#pragma omp parallel num_threads(team)
  {
    const size_t thread = static_cast<size_t>(omp_get_thread_num());
#pragma omp for schedule(static) nowait
    for (int64_t t = 0; t < tasks; ++t) task(t, thread);
    end_team();
  }
}

const uint8_t* at(const void* base, giftDType_t dtype, uint64_t index) {
  return static_cast<const uint8_t*>(base) + index * dtype_size(dtype);
}

float load_as_float(const void* src, giftDType_t dtype, uint64_t i) {
  switch (dtype) {
    case GIFT_DTYPE_BF16:
      return num::bf16_to_float(static_cast<const uint16_t*>(src)[i]);
    case GIFT_DTYPE_F16:
      return num::f16_to_float(static_cast<const uint16_t*>(src)[i]);
    default:
      return static_cast<const float*>(src)[i];
  }
}

bool is_finite_bits(uint32_t abs_bits) { return abs_bits < 0x7F800000u; }

using num::GroupScale;

// The scale rule of FORMAT.md: stores the scale at index g and returns how to apply it.
GroupScale make_scale(const giftQuantParams& p, float amax, void* scales, uint64_t g) {
  const GroupScale gs =
      num::group_scale(amax, static_cast<Fp8>(p.kind), p.scale_dtype == GIFT_SCALE_DTYPE_E8M0);
  if (p.scale_dtype == GIFT_SCALE_DTYPE_E8M0) {
    static_cast<uint8_t*>(scales)[g] = static_cast<uint8_t>(gs.stored);
  } else {
    static_cast<uint32_t*>(scales)[g] = gs.stored;
  }
  return gs;
}

// Per-element path: stochastic rounding and spans holding NaN/Inf.
// Element i of the span is element origin.first_element + i of the tensor.
template <Fp8 K>
void convert_span_scalar(const giftQuantParams& p, const void* src, giftDType_t dtype,
                         uint64_t begin, uint64_t n, const GroupScale& gs, const BandOrigin& origin,
                         uint8_t* codes) {
  num::Rounding rounding(p.rounding == GIFT_ROUND_STOCHASTIC, p.seed, p.tensor_index);
  const bool keep = p.nonfinite == GIFT_NONFINITE_KEEP;
  for (uint64_t i = begin; i < begin + n; ++i) {
    codes[i] = num::encode_element<K>(load_as_float(src, dtype, i), gs, keep, rounding,
                                      origin.first_element + i);
  }
}

void convert_span(const giftQuantParams& p, const void* src, giftDType_t dtype, uint64_t begin,
                  uint64_t n, const GroupScale& gs, bool has_nonfinite, const BandOrigin& origin,
                  uint8_t* codes) {
  if (!has_nonfinite && gs.zero) {  // all-zero groups are common (unused embedding rows)
    if (n) std::memset(codes + begin, 0, n);
  } else if (p.rounding == GIFT_ROUND_NEAREST && !has_nonfinite) {
    // Finite values over a nonzero scale made from an amax at least theirs: below 1.5 times
    // the FP8 maximum in magnitude (the scale rounded down by at most half a subnormal step),
    // in the bounded conversion's domain, as in the block encoder.
    simd::quantize_rn_bounded(at(src, dtype, begin), dtype, n, gs.factor, gs.divide, p.kind,
                              codes + begin);
  } else if (p.kind == GIFT_FP8_E4M3) {
    convert_span_scalar<Fp8::kE4M3>(p, src, dtype, begin, n, gs, origin, codes);
  } else {
    convert_span_scalar<Fp8::kE5M2>(p, src, dtype, begin, n, gs, origin, codes);
  }
}

// What one pass over values saw.
struct Census {
  float finite_amax = 0.0f;
  uint64_t nonfinite = 0;
  uint64_t first_nonfinite = UINT64_MAX;

  void merge(const Census& o) {
    finite_amax = std::max(finite_amax, o.finite_amax);
    nonfinite += o.nonfinite;
    first_nonfinite = std::min(first_nonfinite, o.first_nonfinite);
  }
};

Census census_span(const void* src, giftDType_t dtype, uint64_t begin, uint64_t n) {
  Census c;
  const uint32_t bits = simd::abs_max_bits(at(src, dtype, begin), dtype, n);
  if (is_finite_bits(bits)) {
    c.finite_amax = num::float_of(bits);
    return c;
  }
  for (uint64_t i = begin; i < begin + n; ++i) {  // rare: only spans holding NaN/Inf
    const uint32_t b = num::bits_of(load_as_float(src, dtype, i)) & 0x7FFFFFFFu;
    if (is_finite_bits(b)) {
      c.finite_amax = std::max(c.finite_amax, num::float_of(b));
    } else {
      c.first_nonfinite = std::min(c.first_nonfinite, i);
      ++c.nonfinite;
    }
  }
  return c;
}

template <typename F>
void for_each_row_span(const GroupGrid& grid, const Rect& r, F&& f) {
  if (r.c0 == 0 && r.c1 == grid.cols) {  // whole rows: one contiguous span
    f(r.r0 * grid.cols, r.count());
    return;
  }
  for (uint64_t row = r.r0; row < r.r1; ++row) f(row * grid.cols + r.c0, r.c1 - r.c0);
}

// The amax group g's scale comes from: its own, or over the whole group where it reaches
// past the rows given (BandOrigin).
float scale_amax(const Census& c, const BandOrigin& origin, uint64_t g) {
  return origin.group_amax ? origin.group_amax[g] : c.finite_amax;
}

// One group entirely on the calling thread.
Census encode_group(const giftQuantParams& p, const GroupGrid& grid, uint64_t g, const void* src,
                    giftDType_t dtype, uint8_t* codes, void* scales, const BandOrigin& origin) {
  const Rect r = grid.rect(g);
  Census census;
  for_each_row_span(grid, r,
                    [&](uint64_t b, uint64_t n) { census.merge(census_span(src, dtype, b, n)); });
  const GroupScale gs = make_scale(p, scale_amax(census, origin, g), scales, g);
  for_each_row_span(grid, r, [&](uint64_t b, uint64_t n) {
    convert_span(p, src, dtype, b, n, gs, census.nonfinite > 0, origin, codes);
  });
  return census;
}

// Splits [begin, begin + n) into chunks spread over threads: f(first, count, thread), thread
// as for_each_task gives it.
template <typename F>
void parallel_chunks(uint64_t begin, uint64_t n, int threads, F&& f) {
  const int64_t chunks = static_cast<int64_t>(ceil_div(n, kChunkElems));
  for_each_task(threads, chunks, [&](int64_t c, size_t thread) {
    const num::FpEnvGuard fp_env;
    const uint64_t b = begin + uint64_t(c) * kChunkElems;
    f(b, std::min(kChunkElems, begin + n - b), thread);
  });
}

// One large contiguous group (whole rows) split across threads: a parallel census, then
// a parallel conversion with the common scale.
Census encode_group_split(const giftQuantParams& p, const GroupGrid& grid, uint64_t g,
                          const void* src, giftDType_t dtype, uint8_t* codes, void* scales,
                          int threads, const BandOrigin& origin) {
  const Rect r = grid.rect(g);
  std::vector<Census> parts(static_cast<size_t>(threads));
  parallel_chunks(r.r0 * grid.cols, r.count(), threads, [&](uint64_t b, uint64_t n, size_t thread) {
    parts[thread].merge(census_span(src, dtype, b, n));
  });
  Census census;
  for (const Census& c : parts) census.merge(c);
  const GroupScale gs = make_scale(p, scale_amax(census, origin, g), scales, g);
  parallel_chunks(r.r0 * grid.cols, r.count(), threads, [&](uint64_t b, uint64_t n, size_t) {
    convert_span(p, src, dtype, b, n, gs, census.nonfinite > 0, origin, codes);
  });
  return census;
}

// Block layout: the groups of all rows, in order, cut into tasks of about kChunkElems
// elements; each task is walked as runs of whole blocks within one row (f(first group, first
// element, elements, thread), thread as for_each_task gives it), then end_task runs on the
// task's thread. Where every row is whole blocks, the blocks of consecutive rows follow
// one another in memory as their scales do, and a task is one run: the encoder reads a run
// of 64 blocks or more faster (simd.cc, kReadStreams, as parts then; rows of 4096 fp32 from
// memory, one thread: 35 to 40% faster than run by run), and a run read in order fetches
// across its rows.
template <typename F, typename G = void (*)()>
void for_each_block_run(
    const giftQuantParams& p, const GroupGrid& grid, int threads, F&& f, G&& end_task = [] {}) {
  const uint64_t nb = grid.grid_cols, groups = grid.count();
  const uint64_t per_task = std::max<uint64_t>(1, kChunkElems / p.block);
  const int64_t tasks = static_cast<int64_t>(ceil_div(groups, per_task));
  for_each_task(threads, tasks, [&](int64_t t, size_t thread) {
    const num::FpEnvGuard fp_env;
    uint64_t g = uint64_t(t) * per_task;
    const uint64_t end = std::min(groups, g + per_task);
    if (grid.cols % p.block == 0) {
      f(g, g * p.block, (end - g) * p.block, thread);
      g = end;
    }
    while (g < end) {
      const uint64_t row = g / nb, first = g % nb, last = std::min(nb, first + (end - g));
      const uint64_t c0 = first * p.block, c1 = std::min(grid.cols, last * p.block);
      f(g, row * grid.cols + c0, c1 - c0, thread);
      g += last - first;
    }
    end_task();
  });
}

simd::BlockRun block_run(const giftQuantParams& p, const void* src, giftDType_t dtype,
                         uint64_t first_group, uint64_t first_elem, uint64_t n, uint8_t* codes,
                         void* scales, bool stream) {
  return {src ? at(src, dtype, first_elem) : nullptr,
          dtype,
          n,
          p.block,
          p.kind,
          p.scale_dtype,
          codes + first_elem,
          static_cast<uint8_t*>(scales) + first_group * scale_size(p.scale_dtype),
          stream};
}

// Round to nearest in blocks, the hot path: whole runs in vector code. A run that meets
// NaN/Inf is redone group by group on the general path.
Census encode_blocks(const giftQuantParams& p, const GroupGrid& grid, const void* src,
                     giftDType_t dtype, uint8_t* codes, void* scales, int threads,
                     const BandOrigin& origin) {
  std::vector<Census> parts(static_cast<size_t>(threads));
  for_each_block_run(p, grid, threads, [&](uint64_t g, uint64_t e, uint64_t n, size_t thread) {
    Census& acc = parts[thread];
    // Codes stay cached at any size: streaming them gained about 7% (256 MiB, one thread) at
    // sizes that giftc's pieces and transport shards never reach, and evicts what is sent next.
    simd::BlockRun run = block_run(p, src, dtype, g, e, n, codes, scales, false);
    run.readable_after = (grid.rows * grid.cols - e - n) * dtype_size(dtype);
    if (origin.census && e % simd::kCensusChunk == 0) {
      run.census = origin.census + e / simd::kCensusChunk;
      run.census_done = origin.census_done + e / simd::kCensusChunk;
    }
    const uint32_t bits = simd::encode_blocks_rn(run);
    if (is_finite_bits(bits)) {
      acc.finite_amax = std::max(acc.finite_amax, num::float_of(bits));
      return;
    }
    for (uint64_t k = 0; k < ceil_div(n, p.block); ++k) {
      acc.merge(encode_group(p, grid, g + k, src, dtype, codes, scales, BandOrigin{}));
    }
  });
  Census census;
  for (const Census& c : parts) census.merge(c);
  return census;
}

// Tile layout: row by row, a row being a run of blocks of tile_cols whose scales are its row of
// tiles', in the block decoder (rows cut into pieces of about kChunkElems for the threads).
// Tile by tile, each tile's row of tile_cols elements was a call of its own: tiles of 32 x 32
// decoded at 0.07 of memcpy (giftc bench --threads 1, Xeon), where blocks of 32 reach 0.7.
void decode_tile_rows(const giftQuantParams& p, const GroupGrid& grid, const uint8_t* codes,
                      const void* scales, uint8_t* out, giftDType_t dst_dtype, int threads,
                      bool stream) {
  giftQuantParams rows_of_blocks = p;
  rows_of_blocks.block = p.tile_cols;
  const uint64_t piece = std::max<uint64_t>(1, kChunkElems / p.tile_cols) * p.tile_cols;
  const uint64_t pieces_per_row = std::max<uint64_t>(1, ceil_div(grid.cols, piece));
  const int64_t tasks = static_cast<int64_t>(grid.rows * pieces_per_row);
  const size_t width = dtype_size(dst_dtype);
  for_each_task(
      threads, tasks,
      [&](int64_t t, size_t) {
        const num::FpEnvGuard fp_env;
        const uint64_t r = uint64_t(t) / pieces_per_row, c0 = uint64_t(t) % pieces_per_row * piece;
        const uint64_t n = std::min(piece, grid.cols - c0), e = r * grid.cols + c0;
        const uint64_t g = r / grid.height * grid.grid_cols + c0 / grid.width;
        simd::decode_blocks(
            block_run(rows_of_blocks, nullptr, dst_dtype, g, e, n, const_cast<uint8_t*>(codes),
                      const_cast<void*>(scales), stream),
            out + e * width, dst_dtype);
      },
      [&] {
        if (stream) simd::stream_fence();  // each thread, before the region's closing barrier
      });
}

// Tile layout, round to nearest: a row of tiles in pieces of about kChunkElems (one tile at
// least), each piece's rows read in order, each row in one call for its tiles' amax, then
// (from the cores' caches, for tiles up to kChunkElems) one for their codes. Tile by tile, two
// calls for each row of each tile took 2.8 times as long as the block encoder (tiles of 1 x 128
// against blocks of 128, giftc bench --threads 1). A piece holding NaN or Inf is taken tile by
// tile, as other layouts are.
Census encode_tile_rows(const giftQuantParams& p, const GroupGrid& grid, const void* src,
                        giftDType_t dtype, uint8_t* codes, void* scales, int threads,
                        const BandOrigin& origin) {
  const uint64_t tiles_per_piece = std::max<uint64_t>(1, kChunkElems / (grid.height * grid.width));
  const uint64_t pieces_per_row = ceil_div(grid.grid_cols, tiles_per_piece);
  const int64_t tasks = static_cast<int64_t>(grid.grid_rows * pieces_per_row);
  const uint32_t width = static_cast<uint32_t>(grid.width);
  std::vector<Census> parts(static_cast<size_t>(threads));
  // Each thread's piece's tiles' amax bits and factors, reused piece by piece.
  std::vector<std::vector<uint32_t>> bits_of(static_cast<size_t>(threads));
  std::vector<std::vector<float>> factor_of(static_cast<size_t>(threads));
  for_each_task(threads, tasks, [&](int64_t t, size_t thread) {
    const num::FpEnvGuard fp_env;
    Census& acc = parts[thread];
    std::vector<uint32_t>& bits = bits_of[thread];
    std::vector<float>& factor = factor_of[thread];
    const uint64_t first = uint64_t(t) % pieces_per_row * tiles_per_piece;
    const uint64_t g0 = uint64_t(t) / pieces_per_row * grid.grid_cols + first;
    const uint64_t count = std::min(tiles_per_piece, grid.grid_cols - first);
    const Rect top = grid.rect(g0);
    const uint64_t n = grid.rect(g0 + count - 1).c1 - top.c0;  // the piece's columns
    bits.assign(count, 0);
    for (uint64_t row = top.r0; row < top.r1; ++row)
      simd::blocks_abs_max_bits(at(src, dtype, row * grid.cols + top.c0), dtype, n, width,
                                bits.data());
    if (!std::all_of(bits.begin(), bits.end(), is_finite_bits)) {
      for (uint64_t k = 0; k < count; ++k)
        acc.merge(encode_group(p, grid, g0 + k, src, dtype, codes, scales, origin));
      return;
    }
    factor.resize(count);
    bool divide = false;
    for (uint64_t k = 0; k < count; ++k) {
      Census tile;
      tile.finite_amax = num::float_of(bits[k]);
      const GroupScale gs = make_scale(p, scale_amax(tile, origin, g0 + k), scales, g0 + k);
      // Finite values over it are bounded, as in convert_span.
      factor[k] = gs.zero ? 0.0f : gs.factor;
      divide = gs.divide;
      acc.merge(tile);
    }
    for (uint64_t row = top.r0; row < top.r1; ++row) {
      const uint64_t b = row * grid.cols + top.c0;
      simd::quantize_blocks_rn_bounded(at(src, dtype, b), dtype, n, width, factor.data(), divide,
                                       p.kind, codes + b);
    }
  });
  Census census;
  for (const Census& c : parts) census.merge(c);
  return census;
}

bool split_groups(const GroupGrid& grid, int threads) {
  return grid.width >= grid.cols && grid.count() < uint64_t(threads) * 4 &&
         grid.height * grid.cols >= kSplitGroupElems;
}

}  // namespace

giftResult_t encode_tensor(const giftCtx* ctx, const giftQuantParams& p, const void* src,
                           giftDType_t src_dtype, uint64_t rows, uint64_t cols, uint8_t* codes,
                           void* scales, giftEncodeStats* stats, const BandOrigin& origin) {
  const num::FpEnvGuard fp_env;  // the calling thread's serial parts (scales of split groups)
  const GroupGrid grid = group_grid(p, rows, cols);
  const int threads = thread_count(ctx);
  const int64_t groups = static_cast<int64_t>(grid.count());
  Census total;
  if (p.layout == GIFT_SCALE_BLOCK && p.rounding == GIFT_ROUND_NEAREST) {
    total = encode_blocks(p, grid, src, src_dtype, codes, scales, threads, origin);
  } else if (split_groups(grid, threads)) {  // tiles as wide as the tensor too: too few for threads
    for (int64_t g = 0; g < groups; ++g) {
      total.merge(
          encode_group_split(p, grid, uint64_t(g), src, src_dtype, codes, scales, threads, origin));
    }
  } else if (p.layout == GIFT_SCALE_TILE && p.rounding == GIFT_ROUND_NEAREST) {
    total = encode_tile_rows(p, grid, src, src_dtype, codes, scales, threads, origin);
  } else {
    std::vector<Census> parts(static_cast<size_t>(threads));
    for_each_task(threads, groups, [&](int64_t g, size_t thread) {
      const num::FpEnvGuard fp_env;
      parts[thread].merge(
          encode_group(p, grid, uint64_t(g), src, src_dtype, codes, scales, origin));
    });
    for (const Census& c : parts) total.merge(c);
  }

  if (stats) {
    stats->amax = total.finite_amax;
    stats->nonfinite_count = total.nonfinite;
    stats->first_nonfinite = total.first_nonfinite;
  }
  const giftEncodeStats seen{total.finite_amax, total.nonfinite, total.first_nonfinite};
  return nonfinite_result(p, seen, cols);
}

void group_amax(const giftCtx* ctx, const giftQuantParams& p, const void* src,
                giftDType_t src_dtype, uint64_t rows, uint64_t cols, float* amax) {
  const GroupGrid grid = group_grid(p, rows, cols);
  const int64_t groups = static_cast<int64_t>(grid.count());
  for_each_task(thread_count(ctx), groups, [&](int64_t g, size_t) {
    Census census;
    for_each_row_span(grid, grid.rect(uint64_t(g)), [&](uint64_t b, uint64_t n) {
      census.merge(census_span(src, src_dtype, b, n));
    });
    amax[g] = census.finite_amax;
  });
}

giftResult_t nonfinite_result(const giftQuantParams& p, const giftEncodeStats& s, uint64_t cols) {
  if (s.nonfinite_count == 0 || p.nonfinite != GIFT_NONFINITE_ERROR) return GIFT_OK;
  return nonfinite_error(s, cols);
}

giftResult_t nonfinite_error(const giftEncodeStats& s, uint64_t cols) {
  const uint64_t i = s.first_nonfinite;
  return fail(GIFT_ERROR_NONFINITE_INPUT,
              "%" PRIu64 " non-finite value%s in the input, the first at index %" PRIu64
              " (row %" PRIu64 ", column %" PRIu64 ")",
              s.nonfinite_count, s.nonfinite_count == 1 ? "" : "s", i, cols ? i / cols : 0,
              cols ? i % cols : 0);
}

void decode_tensor(const giftCtx* ctx, const giftQuantParams& p, const uint8_t* codes,
                   const void* scales, uint64_t rows, uint64_t cols, void* dst,
                   giftDType_t dst_dtype) {
  const num::FpEnvGuard fp_env;
  const GroupGrid grid = group_grid(p, rows, cols);
  const int threads = thread_count(ctx);
  const int64_t groups = static_cast<int64_t>(grid.count());
  uint8_t* out = static_cast<uint8_t*>(dst);
  const size_t width = dtype_size(dst_dtype);
  // Streamed where every row, and every block or tile row, starts 16-byte aligned, as the
  // streamed stores need; a span's last elements short of a whole vector are stored plainly,
  // into a line whose rest may be streamed (correct, only slower).
  const uint64_t span = p.layout == GIFT_SCALE_BLOCK  ? p.block
                        : p.layout == GIFT_SCALE_TILE ? p.tile_cols
                                                      : cols;
  const bool stream =
      rows * cols * width >= kStreamBytes && cols * width % 16 == 0 && span * width % 16 == 0;
  const auto fence = [&] {
    if (stream) simd::stream_fence();
  };
  if (p.layout == GIFT_SCALE_BLOCK) {
    for_each_block_run(
        p, grid, threads,
        [&](uint64_t g, uint64_t e, uint64_t n, size_t) {
          simd::decode_blocks(block_run(p, nullptr, dst_dtype, g, e, n, const_cast<uint8_t*>(codes),
                                        const_cast<void*>(scales), stream),
                              out + e * width, dst_dtype);
        },
        fence);
    return;
  }
  if (p.layout == GIFT_SCALE_TILE) {
    decode_tile_rows(p, grid, codes, scales, out, dst_dtype, threads, stream);
    return;
  }
  auto scale_of = [&](uint64_t g) {
    return num::stored_scale(scales, p.scale_dtype == GIFT_SCALE_DTYPE_E8M0, g);
  };
  auto decode_span = [&](uint64_t b, uint64_t n, float s) {
    simd::dequantize(codes + b, n, s, p.kind, out + b * width, dst_dtype, stream);
  };
  if (split_groups(grid, threads)) {
    for (int64_t g = 0; g < groups; ++g) {
      const Rect r = grid.rect(uint64_t(g));
      const float s = scale_of(uint64_t(g));
      parallel_chunks(r.r0 * cols, r.count(), threads, [&](uint64_t b, uint64_t n, size_t) {
        decode_span(b, n, s);
        fence();
      });
    }
    return;
  }
  for_each_task(
      threads, groups,
      [&](int64_t g, size_t) {
        const num::FpEnvGuard fp_env;
        const float s = scale_of(uint64_t(g));
        for_each_row_span(grid, grid.rect(uint64_t(g)),
                          [&](uint64_t b, uint64_t n) { decode_span(b, n, s); });
      },
      fence);  // each thread, before the region's closing barrier
}

}  // namespace gift
