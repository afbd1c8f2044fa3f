// Order-preserving reductions and scans (operators need be associative, not commutative).
// One source for both instantiations: run-time linked operators (reduce_jit.cu) and the
// built-in sum / min / max (reduce_builtin.cu).
//
// Operators follow the pointer convention:
//   Map: map(const In* value, long long global_index, Acc* out)   (input -> accumulator)
//   Op:  op(const Acc* a, const Acc* b, Acc* out)                  (a before b)
// Accumulators travel as raw 4- or 8-byte words, so CUB's single-word tile state applies.
#pragma once

#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/block/block_store.cuh>
#include <cub/agent/single_pass_scan_operators.cuh>

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

template <class Map, class Op, int InSize, int AccSize>
struct Reduction {
  using In = typename Word<InSize>::type;
  using Acc = typename Word<AccSize>::type;
  static constexpr int kItems = reduce_items(InSize);
  static constexpr long long kTile = static_cast<long long>(kReduceBlock) * kItems;
  using BlockReduceT = cub::BlockReduce<Acc, kReduceBlock>;

  struct TempStorage {
    typename BlockReduceT::TempStorage reduce;
    bool is_last;
  };

  __device__ __forceinline__ static Acc map(const In& value, long long index) {
    Acc out;
    Map()(&value, index, &out);
    return out;
  }

  // This thread's items of one tile, folded in order; returns how many it had.
  __device__ __forceinline__ static int thread_fold(const ReduceParams& p, long long base,
                                                    bool aligned, Acc& acc) {
    const In* data = static_cast<const In*>(p.in) + base;
    const long long remaining = p.n - base;
    const int count = remaining >= kItems ? kItems : (remaining > 0 ? static_cast<int>(remaining) : 0);
    In items[kItems];
    if (count == kItems && aligned) {
      const uint4* vectors = reinterpret_cast<const uint4*>(data);
#pragma unroll
      for (int v = 0; v < kReduceVectors; ++v) reinterpret_cast<uint4*>(items)[v] = vectors[v];
    } else {
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (i < count) items[i] = data[i];
      }
    }
    if (count > 0) acc = map(items[0], p.index_base + base);
#pragma unroll
    for (int i = 1; i < kItems; ++i) {
      if (i < count) acc = Combine<Op, Acc>()(acc, map(items[i], p.index_base + base + i));
    }
    return count;
  }

  __device__ static void run(const ReduceParams& p) {
    __shared__ TempStorage temp;
    const long long num_tiles = (p.n + kTile - 1) / kTile;
    const long long first = static_cast<long long>(blockIdx.x) * p.tiles_per_block;
    const long long last = min(first + p.tiles_per_block, num_tiles);
    const bool aligned = aligned16(p.in);
    Acc block_acc{};
    for (long long tile = first; tile < last; ++tile) {
      Acc thread_acc{};
      thread_fold(p, tile * kTile + static_cast<long long>(threadIdx.x) * kItems, aligned, thread_acc);
      const long long tile_remaining = p.n - tile * kTile;
      const int valid_threads = tile_remaining >= kTile
                                    ? kReduceBlock
                                    : static_cast<int>((tile_remaining + kItems - 1) / kItems);
      Acc tile_total = BlockReduceT(temp.reduce).Reduce(thread_acc, Combine<Op, Acc>(), valid_threads);
      __syncthreads();  // temp.reduce is reused by the next tile
      if (threadIdx.x == 0) block_acc = tile == first ? tile_total : Combine<Op, Acc>()(block_acc, tile_total);
    }

    // The last block to finish folds every block's partial, in block order.
    Acc* partials = static_cast<Acc*>(p.partials);
    if (threadIdx.x == 0) {
      partials[blockIdx.x] = block_acc;
      __threadfence();
      temp.is_last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!temp.is_last) return;
    __threadfence();
    const int blocks = gridDim.x;
    const int per_thread = (blocks + kReduceBlock - 1) / kReduceBlock;
    const int begin = threadIdx.x * per_thread;
    const int end = min(begin + per_thread, blocks);
    Acc thread_acc{};
    for (int k = begin; k < end; ++k) {
      const Acc value = __ldcg(partials + k);
      thread_acc = k == begin ? value : Combine<Op, Acc>()(thread_acc, value);
    }
    const int valid_threads = (blocks + per_thread - 1) / per_thread;
    Acc total = BlockReduceT(temp.reduce).Reduce(thread_acc, Combine<Op, Acc>(), valid_threads);
    if (threadIdx.x == 0) {
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

template <int AccSize>
__device__ void scan_init(const ScanInitParams& p) {
  using Acc = typename Word<AccSize>::type;
  cub::ScanTileState<Acc> state;
  state.Init(p.num_tiles, p.tile_state, 0);
  state.InitializeStatus(p.num_tiles);
}

// Hands a fixed seed to tile 0 and publishes seed op aggregate as its inclusive value.
template <class Op, class Acc, class TileState>
struct SeedCallback {
  Acc seed;
  TileState& state;
  __device__ __forceinline__ Acc operator()(Acc block_aggregate) {
    if (threadIdx.x == 0) state.SetInclusive(0, Combine<Op, Acc>()(seed, block_aggregate));
    return seed;
  }
};

template <class Map, class Op, int InSize, int AccSize>
struct Scan {
  using In = typename Word<InSize>::type;
  using Acc = typename Word<AccSize>::type;
  static constexpr int kItems = scan_items(AccSize);
  static constexpr long long kTile = static_cast<long long>(kScanBlock) * kItems;
  using TileState = cub::ScanTileState<Acc>;
  using Combiner = Combine<Op, Acc>;
  using Prefix = cub::TilePrefixCallbackOp<Acc, Combiner, TileState>;
  using Load = cub::BlockLoad<In, kScanBlock, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using Store = cub::BlockStore<Acc, kScanBlock, kItems, cub::BLOCK_STORE_WARP_TRANSPOSE>;
  using BlockScanT = cub::BlockScan<Acc, kScanBlock, cub::BLOCK_SCAN_WARP_SCANS>;

  union TempStorage {
    typename Load::TempStorage load;
    typename Store::TempStorage store;
    struct {
      typename BlockScanT::TempStorage scan;
      typename Prefix::TempStorage prefix;
    } scan;
  };

  __device__ static void run(const ScanParams& p) {
    __shared__ TempStorage temp;
    TileState state;
    state.Init(0, p.tile_state, 0);
    const int tile = blockIdx.x;
    const long long base = tile * kTile;
    const long long remaining = p.n - base;
    const bool full = remaining >= kTile;
    const int valid = full ? static_cast<int>(kTile) : static_cast<int>(remaining);

    In items[kItems];
    const In* in = static_cast<const In*>(p.in) + base;
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

    BlockScanT scan(temp.scan.scan);
    if (tile == 0) {
      if (p.has_seed) {
        SeedCallback<Op, Acc, TileState> seed{*static_cast<const Acc*>(p.seed), state};
        if (p.exclusive) {
          scan.ExclusiveScan(values, values, Combiner(), seed);
        } else {
          scan.InclusiveScan(values, values, Combiner(), seed);
        }
      } else {  // inclusive only: an exclusive scan always has a seed
        Acc aggregate;
        scan.InclusiveScan(values, values, Combiner(), aggregate);
        if (threadIdx.x == 0) state.SetInclusive(0, aggregate);
      }
    } else {
      Prefix prefix(state, temp.scan.prefix, Combiner(), tile);
      if (p.exclusive) {
        scan.ExclusiveScan(values, values, Combiner(), prefix);
      } else {
        scan.InclusiveScan(values, values, Combiner(), prefix);
      }
    }
    __syncthreads();
    Acc* out = static_cast<Acc*>(p.out) + base;
    if (full) {
      Store(temp.store).Store(out, values);
    } else {
      Store(temp.store).Store(out, values, valid);
    }
  }
};

}  // namespace csj::kernels
