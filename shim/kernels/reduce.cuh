// Order-preserving, deterministic reductions and scans (operators need be associative, not
// commutative, and every fold has a fixed association). One source for both instantiations:
// run-time linked operators (reduce_jit.cu) and built-in sum / min / max (reduce_builtin.cu).
//
// Operators follow the pointer convention:
//   Map: map(const In* value, long long global_index, Acc* out)   (input -> accumulator)
//   Op:  op(const Acc* a, const Acc* b, Acc* out)                  (a before b)
// Accumulators travel as raw 4- or 8-byte words.
//
// A scan is reduce-then-scan at every level: pass 1 (Reduction with prefixes) folds each
// block's chunk and gives each block its exclusive prefix; pass 2 (Scan) scans each chunk
// seeded with it. Decoupled look-back would save one read, but the association of its
// prefixes depends on timing, which breaks bitwise determinism for floating point.
#pragma once

#include <cub/block/block_load.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/block/block_store.cuh>

#include "params.hpp"
#include "transform.cuh"  // Word<>, aligned16

namespace csj::kernels {

template <class Op, class Acc>
struct Combine {
  __device__ __forceinline__ Acc operator()(const Acc& a, const Acc& b) const {
    Acc out;
    Op()(&a, &b, &out);
    return out;
  }
};

// Order-preserving warp fold of the first `valid` lanes' values; the result is in lane 0.
template <class Op, class Acc>
__device__ __forceinline__ Acc warp_fold(Acc value, int valid) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const Acc other = __shfl_down_sync(0xffffffffu, value, offset);
    if ((lane & (2 * offset - 1)) == 0 && lane + offset < valid) value = Combine<Op, Acc>()(value, other);
  }
  return value;
}

template <class Map, class Op, int InSize, int AccSize>
struct Reduction {
  using In = typename Word<InSize>::type;
  using Acc = typename Word<AccSize>::type;
  static constexpr int kLaneItems = reduce_lane_items(InSize);
  static constexpr long long kWarpTile = 32LL * kLaneItems;

  struct TempStorage {
    Acc warp_values[kReduceWarps];
    int warp_valid[kReduceWarps];
    bool is_last;
  };

  // Fold of [begin, end) by one warp, in order; valid in lane 0 when the range is non-empty.
  __device__ __forceinline__ static Acc warp_range(const ReduceParams& p, long long begin, long long end) {
    const int lane = threadIdx.x & 31;
    const In* data = static_cast<const In*>(p.in);
    const bool aligned = aligned16(data + begin);
    Acc acc{};
    for (long long tile = begin; tile < end; tile += kWarpTile) {
      const long long base = tile + static_cast<long long>(lane) * kLaneItems;
      const long long remaining = end - base;
      const int count = remaining >= kLaneItems ? kLaneItems : (remaining > 0 ? static_cast<int>(remaining) : 0);
      In items[kLaneItems];
      if (count == kLaneItems && aligned) {
        const uint4* vectors = reinterpret_cast<const uint4*>(data + base);
#pragma unroll
        for (int v = 0; v < kLaneItems * InSize / 16; ++v) reinterpret_cast<uint4*>(items)[v] = vectors[v];
      } else {
#pragma unroll
        for (int i = 0; i < kLaneItems; ++i) {
          if (i < count) items[i] = data[base + i];
        }
      }
      Acc lane_acc{};
      if (count > 0) Map()(&items[0], p.index_base + base, &lane_acc);
#pragma unroll
      for (int i = 1; i < kLaneItems; ++i) {
        if (i < count) {
          Acc value;
          Map()(&items[i], p.index_base + base + i, &value);
          lane_acc = Combine<Op, Acc>()(lane_acc, value);
        }
      }
      const long long tile_remaining = end - tile;
      const int valid_lanes = tile_remaining >= kWarpTile
                                  ? 32
                                  : static_cast<int>((tile_remaining + kLaneItems - 1) / kLaneItems);
      const Acc tile_total = warp_fold<Op, Acc>(lane_acc, valid_lanes);
      acc = tile == begin ? tile_total : Combine<Op, Acc>()(acc, tile_total);
    }
    return acc;
  }

  __device__ static void run(const ReduceParams& p) {
    __shared__ TempStorage temp;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    const long long block_begin = static_cast<long long>(blockIdx.x) * p.chunk;
    const long long block_end = min(block_begin + p.chunk, p.n);
    // warp parts: multiples of one 16-byte vector per lane step keep vector loads aligned
    constexpr long long kAlign = 16 / InSize;
    long long part = (block_end - block_begin + kReduceWarps - 1) / kReduceWarps;
    part = (part + kAlign - 1) / kAlign * kAlign;
    const long long begin = min(block_begin + warp * part, block_end);
    const long long end = min(begin + part, block_end);
    const Acc warp_total = warp_range(p, begin, end);
    if (lane == 0) {
      temp.warp_values[warp] = warp_total;
      temp.warp_valid[warp] = end > begin;
    }
    __syncthreads();

    Acc* partials = static_cast<Acc*>(p.partials);
    if (threadIdx.x == 0) {
      Acc block_total = temp.warp_values[0];  // warp 0 always has elements
#pragma unroll
      for (int w = 1; w < kReduceWarps; ++w) {
        if (temp.warp_valid[w]) block_total = Combine<Op, Acc>()(block_total, temp.warp_values[w]);
      }
      partials[blockIdx.x] = block_total;
      __threadfence();
      temp.is_last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!temp.is_last) return;

    // The last block to finish folds every block's partial, in block order.
    __threadfence();
    const int blocks = gridDim.x;
    if (p.prefixes) {
      if (threadIdx.x == 0) {
        Acc* prefixes = static_cast<Acc*>(p.prefixes);
        Acc acc = __ldcg(partials);
        for (int b = 1; b < blocks; ++b) {
          prefixes[b] = acc;
          acc = Combine<Op, Acc>()(acc, __ldcg(partials + b));
        }
        *static_cast<Acc*>(p.result) = acc;
        *p.counter = 0;
      }
      return;
    }
    if (warp != 0) return;
    const int per_lane = (blocks + 31) / 32;
    const int first = lane * per_lane;
    const int last = min(first + per_lane, blocks);
    Acc acc{};
    for (int b = first; b < last; ++b) {
      const Acc value = __ldcg(partials + b);
      acc = b == first ? value : Combine<Op, Acc>()(acc, value);
    }
    const Acc total = warp_fold<Op, Acc>(acc, (blocks + per_lane - 1) / per_lane);
    if (lane == 0) {
      *static_cast<Acc*>(p.result) = total;
      *p.counter = 0;
    }
  }
};

template <class Op, int AccSize>
__device__ void fold(const FoldParams& p) {
  using Acc = typename Word<AccSize>::type;
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const Acc* values = static_cast<const Acc*>(p.values);
  Acc* prefixes = static_cast<Acc*>(p.prefixes);
  bool have = p.has_init != 0;
  Acc acc = *reinterpret_cast<const Acc*>(p.init);
  for (int k = 0; k < p.count; ++k) {
    if (prefixes) prefixes[k] = acc;
    acc = have ? Combine<Op, Acc>()(acc, values[k]) : values[k];
    have = true;
  }
  *static_cast<Acc*>(p.total) = acc;
}

// Hands the running prefix to each tile of a block and advances it by the tile's aggregate.
template <class Op, class Acc>
struct RunningPrefix {
  Acc running;
  __device__ __forceinline__ Acc operator()(Acc tile_aggregate) {
    const Acc prefix = running;
    running = Combine<Op, Acc>()(running, tile_aggregate);
    return prefix;
  }
};

template <class Map, class Op, int InSize, int AccSize>
struct Scan {
  using In = typename Word<InSize>::type;
  using Acc = typename Word<AccSize>::type;
  static constexpr int kItems = scan_items(AccSize);
  static constexpr long long kTile = scan_tile(AccSize);
  using Combiner = Combine<Op, Acc>;
  using Load = cub::BlockLoad<In, kScanBlock, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using Store = cub::BlockStore<Acc, kScanBlock, kItems, cub::BLOCK_STORE_WARP_TRANSPOSE>;
  using BlockScanT = cub::BlockScan<Acc, kScanBlock, cub::BLOCK_SCAN_WARP_SCANS>;

  union TempStorage {
    typename Load::TempStorage load;
    typename Store::TempStorage store;
    typename BlockScanT::TempStorage scan;
  };

  __device__ static void run(const ScanParams& p) {
    __shared__ TempStorage temp;
    const long long block_begin = static_cast<long long>(blockIdx.x) * p.chunk;
    const long long block_end = min(block_begin + p.chunk, p.n);
    // The block's seed: everything before its chunk, in a fixed association.
    bool have = p.has_seed != 0 || blockIdx.x > 0;
    RunningPrefix<Op, Acc> prefix{};
    if (blockIdx.x > 0) {
      const Acc before = static_cast<const Acc*>(p.prefixes)[blockIdx.x];
      prefix.running = p.has_seed ? Combiner()(*static_cast<const Acc*>(p.seed), before) : before;
    } else if (p.has_seed) {
      prefix.running = *static_cast<const Acc*>(p.seed);
    }
    for (long long base = block_begin; base < block_end; base += kTile) {
      const long long remaining = block_end - base;
      const bool full = remaining >= kTile;
      const int valid = full ? static_cast<int>(kTile) : static_cast<int>(remaining);
      const In* in = static_cast<const In*>(p.in) + base;
      In items[kItems];
      if (full) {
        Load(temp.load).Load(in, items);
      } else {
        Load(temp.load).Load(in, items, valid, in[0]);  // padding: a real element, never stored
      }
      __syncthreads();
      Acc values[kItems];
      const long long first_index = p.index_base + base + static_cast<long long>(threadIdx.x) * kItems;
#pragma unroll
      for (int i = 0; i < kItems; ++i) Map()(&items[i], first_index + i, &values[i]);
      BlockScanT scan(temp.scan);
      if (have) {
        if (p.exclusive) {
          scan.ExclusiveScan(values, values, Combiner(), prefix);
        } else {
          scan.InclusiveScan(values, values, Combiner(), prefix);
        }
      } else {  // the very first tile of an unseeded inclusive scan
        Acc aggregate;
        scan.InclusiveScan(values, values, Combiner(), aggregate);
        prefix.running = aggregate;
        have = true;
      }
      __syncthreads();
      Acc* out = static_cast<Acc*>(p.out) + base;
      if (full) {
        Store(temp.store).Store(out, values);
      } else {
        Store(temp.store).Store(out, values, valid);
      }
      __syncthreads();
    }
  }
};

}  // namespace csj::kernels
