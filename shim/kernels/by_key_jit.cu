// The by-key engine's JIT module (by_key_params.hpp says what each kernel does): built to
// LTO-IR, one module per key size (CSJ_KEY_SIZE: 4, 8) and value size (CSJ_VALUE_SIZE: 4 to
// 32), and linked at run time with the wrappers numba compiled:
//   int  csj_equal(const void* a, const void* b)           nonzero: the keys share a run
//   void csj_op(const void* a, const void* b, void* out)   the values' operator
// Keys and values move as opaque words of their sizes; tiles are read and written through
// CUB's warp-transposing block loads and stores, and folded with CUB's block scans, whose
// association is fixed for a block size.
#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/block/block_store.cuh>

#include "by_key_params.hpp"
#include "transform.cuh"

#if !defined(CSJ_KEY_SIZE) || !defined(CSJ_VALUE_SIZE)
#error "CSJ_KEY_SIZE and CSJ_VALUE_SIZE must be defined"
#endif

extern "C" __device__ int csj_equal(const void*, const void*);
extern "C" __device__ void csj_op(const void*, const void*, void*);

namespace {

using namespace csj::kernels;

using Key = Word<CSJ_KEY_SIZE>::type;
using Value = Word<CSJ_VALUE_SIZE>::type;
constexpr int kItems = by_key_items(CSJ_KEY_SIZE, CSJ_VALUE_SIZE);
constexpr int kTile = kByKeyBlock * kItems;
constexpr int kChunkScanBlock = by_key_scan_block(CSJ_VALUE_SIZE);

// One element, or the fold of a range: whether a run starts in it, the first key of its
// last run and the fold of that run's values. Invalid: the empty range (the identity).
struct Pair {
  int valid;
  int head;
  Key key;
  Value value;
};

__device__ __forceinline__ Pair empty_pair() {
  Pair pair;
  pair.valid = 0;
  pair.head = 0;
  return pair;
}

struct Segmented {
  __device__ __forceinline__ Pair operator()(const Pair& a, const Pair& b) const {
    if (!b.valid) return a;
    if (!a.valid || b.head) return b;
    Pair out;
    out.valid = 1;
    out.head = a.head;
    out.key = a.key;
    csj_op(&a.value, &b.value, &out.value);
    return out;
  }
};

// A Pair with its range's count of run ends: what the records hold.
struct Tally {
  long long tails;
  Pair pair;
};

struct Join {
  __device__ __forceinline__ Tally operator()(const Tally& a, const Tally& b) const {
    return {a.tails + b.tails, Segmented()(a.pair, b.pair)};
  }
};

__device__ __forceinline__ Tally read_record(const ByKeyRecord& record) {
  Tally tally;
  tally.tails = record.tails;
  tally.pair.valid = record.valid;
  tally.pair.head = record.head;
  memcpy(&tally.pair.key, &record.key, sizeof(Key));
  memcpy(&tally.pair.value, record.value, sizeof(Value));
  return tally;
}

__device__ __forceinline__ void write_record(ByKeyRecord& record, const Tally& tally) {
  record.tails = tally.tails;
  record.valid = tally.pair.valid;
  record.head = tally.pair.head;
  record.key = 0;
  memcpy(&record.key, &tally.pair.key, sizeof(Key));
  memcpy(record.value, &tally.pair.value, sizeof(Value));
}

struct Larger {
  __device__ __forceinline__ int operator()(int a, int b) const { return a > b ? a : b; }
};

__device__ __forceinline__ bool same_run(const Key& a, const Key& b) { return csj_equal(&a, &b) != 0; }

// Hands the running prefix to each tile of a chunk and advances it by the tile's fold.
struct RunningPrefix {
  Pair running;
  __device__ __forceinline__ Pair operator()(const Pair& tile) {
    const Pair prefix = running;
    running = Segmented()(running, tile);
    return prefix;
  }
};

struct Neighbours {
  Key first[kByKeyBlock];  // each thread's first and last key of the tile
  Key last[kByKeyBlock];
};

// heads[j], for the thread's items j = 0 .. kItems - 1 (blocked: thread t holds the tile's
// elements t * kItems ...) and the element after its last item (j = kItems): 1 where a run
// starts there. A shard's first element starts one unless the shard before ends with a key
// of its run; the position after a shard's last element starts one unless the shard after
// begins with one (so that heads[j + 1] says whether item j ends its run). 0 past the end.
__device__ __forceinline__ void run_heads(const ByKeyParams& p, const Key (&keys)[kItems], long long tile_start,
                                          Neighbours& neighbours, int (&heads)[kItems + 1]) {
  const int t = static_cast<int>(threadIdx.x);
  neighbours.first[t] = keys[0];
  neighbours.last[t] = keys[kItems - 1];
  __syncthreads();
  const Key* shard = static_cast<const Key*>(p.keys);
  const long long first = tile_start + static_cast<long long>(t) * kItems;  // the shard index of item 0
#pragma unroll
  for (int j = 0; j <= kItems; ++j) {
    const long long at = first + j;
    int head = 0;
    if (at < p.n) {
      Key key;
      if (j < kItems) {
        key = keys[j];
      } else {
        key = t + 1 < kByKeyBlock ? neighbours.first[t + 1] : shard[at];
      }
      if (j > 0) {
        head = !same_run(keys[j - 1], key);
      } else if (at == 0) {
        head = p.prev_key == nullptr || !same_run(*static_cast<const Key*>(p.prev_key), key);
      } else {
        const Key before = t > 0 ? neighbours.last[t - 1] : shard[at - 1];
        head = !same_run(before, key);
      }
    } else if (at == p.n && j > 0) {
      head = p.next_key == nullptr || !same_run(keys[j - 1], *static_cast<const Key*>(p.next_key));
    }
    heads[j] = head;
  }
}

// Element j's pair; in the exclusive scan a run's head holds op(init, value), so every run
// of the scan starts from init.
__device__ __forceinline__ Pair element_pair(const ByKeyParams& p, int head, const Key& key, const Value& value) {
  Pair pair;
  pair.valid = 1;
  pair.head = head;
  pair.key = key;
  if (p.mode == kByKeyExclusive && head) {
    csj_op(reinterpret_cast<const Value*>(p.init), &value, &pair.value);
  } else {
    pair.value = value;
  }
  return pair;
}

using LoadKeys = cub::BlockLoad<Key, kByKeyBlock, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
using LoadValues = cub::BlockLoad<Value, kByKeyBlock, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
using StoreValues = cub::BlockStore<Value, kByKeyBlock, kItems, cub::BLOCK_STORE_WARP_TRANSPOSE>;
using ScanPairs = cub::BlockScan<Pair, kByKeyBlock>;
using ScanInts = cub::BlockScan<int, kByKeyBlock>;
using ReduceInts = cub::BlockReduce<int, kByKeyBlock>;

__device__ __forceinline__ void load_keys(const ByKeyParams& p, typename LoadKeys::TempStorage& storage,
                                          long long tile_start, int valid, Key (&keys)[kItems]) {
  const Key* in = static_cast<const Key*>(p.keys) + tile_start;
  if (valid == kTile) {
    LoadKeys(storage).Load(in, keys);
  } else {
    LoadKeys(storage).Load(in, keys, valid);
  }
}

}  // namespace

// Each chunk's record. Only the values of each tile's last run are read: the run heads say
// where it starts, and the pairs before it would be reset by its head.
extern "C" __global__ void __launch_bounds__(kByKeyBlock)
    csj_by_key_reduce(const __grid_constant__ ByKeyParams p) {
  __shared__ union {
    typename LoadKeys::TempStorage load;
    typename ScanPairs::TempStorage scan;
    typename ReduceInts::TempStorage reduce;
  } temp;
  __shared__ Neighbours neighbours;
  __shared__ int last_head;
  const int t = static_cast<int>(threadIdx.x);
  const long long chunk_start = static_cast<long long>(blockIdx.x) * kTile * kByKeyChunkTiles;
  const Value* values = static_cast<const Value*>(p.values);
  Tally chunk = {0, empty_pair()};  // thread 0's copy is the chunk's
  for (int tile = 0; tile < kByKeyChunkTiles; ++tile) {
    const long long tile_start = chunk_start + static_cast<long long>(tile) * kTile;
    if (tile_start >= p.n) break;
    const int valid = static_cast<int>(min(p.n - tile_start, static_cast<long long>(kTile)));
    Key keys[kItems];
    load_keys(p, temp.load, tile_start, valid, keys);
    int heads[kItems + 1];
    run_heads(p, keys, tile_start, neighbours, heads);
    int latest = -1, tails = 0;
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (t * kItems + j < valid) {
        if (heads[j]) latest = t * kItems + j;
        tails += heads[j + 1];
      }
    }
    __syncthreads();  // the key load's storage is free
    latest = ReduceInts(temp.reduce).Reduce(latest, Larger());
    __syncthreads();
    tails = ReduceInts(temp.reduce).Sum(tails);
    if (t == 0) last_head = latest;
    __syncthreads();
    const int from = last_head < 0 ? 0 : last_head;
    Pair folded = empty_pair();
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int local = t * kItems + j;
      if (local < valid && local >= from) {
        folded = Segmented()(folded, element_pair(p, heads[j], keys[j], values[tile_start + local]));
      }
    }
    Pair tile_fold;
    ScanPairs(temp.scan).InclusiveScan(folded, folded, Segmented(), tile_fold);
    __syncthreads();
    if (t == 0) chunk = Join()(chunk, Tally{tails, tile_fold});
  }
  if (t == 0) write_record(p.chunks[blockIdx.x], chunk);
}

// One block: the chunks' records replaced by their exclusive prefix (each thread folds a run
// of consecutive chunks, the runs are scanned across the block), and the shard's total.
extern "C" __global__ void __launch_bounds__(kChunkScanBlock)
    csj_by_key_chunks(const __grid_constant__ ByKeyParams p) {
  using Scan = cub::BlockScan<Tally, kChunkScanBlock>;
  __shared__ typename Scan::TempStorage temp;
  const long long count = p.num_chunks;
  const long long per = (count + kChunkScanBlock - 1) / kChunkScanBlock;
  const long long first = min(static_cast<long long>(threadIdx.x) * per, count);
  const long long last = min(first + per, count);
  const Tally none = {0, empty_pair()};
  Tally run = none;
  for (long long c = first; c < last; ++c) run = Join()(run, read_record(p.chunks[c]));
  Tally acc;
  Scan(temp).ExclusiveScan(run, acc, none, Join());
  for (long long c = first; c < last; ++c) {
    const Tally here = read_record(p.chunks[c]);
    write_record(p.chunks[c], acc);
    acc = Join()(acc, here);
  }
  if (threadIdx.x == kChunkScanBlock - 1) write_record(*p.total, acc);
}

// One thread: the fold of the earlier shards' totals, in place order.
extern "C" __global__ void csj_by_key_carry(const __grid_constant__ ByKeyParams p) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  Tally acc = {0, empty_pair()};
  for (int k = 0; k < p.count; ++k) acc = Join()(acc, read_record(p.sources[k]));
  write_record(*p.carry, acc);
}

// Each chunk again, from its prefix (the carry into the shard, then the chunks before).
extern "C" __global__ void __launch_bounds__(kByKeyBlock)
    csj_by_key_sweep(const __grid_constant__ ByKeyParams p) {
  __shared__ union {
    typename LoadKeys::TempStorage load_keys;
    typename LoadValues::TempStorage load_values;
    typename StoreValues::TempStorage store;
    typename ScanPairs::TempStorage scan;
    typename ScanInts::TempStorage scan_ints;
  } temp;
  __shared__ Neighbours neighbours;
  __shared__ Pair start;
  const int t = static_cast<int>(threadIdx.x);
  const ByKeyRecord& record = p.chunks[blockIdx.x];
  if (t == 0) {
    const Pair carry = p.carry != nullptr ? read_record(*p.carry).pair : empty_pair();
    start = Segmented()(carry, read_record(record).pair);
  }
  long long out_base = record.tails;  // run ends before the chunk, in this shard
  __syncthreads();
  RunningPrefix prefix{start};
  const long long chunk_start = static_cast<long long>(blockIdx.x) * kTile * kByKeyChunkTiles;
  for (int tile = 0; tile < kByKeyChunkTiles; ++tile) {
    const long long tile_start = chunk_start + static_cast<long long>(tile) * kTile;
    if (tile_start >= p.n) break;
    const int valid = static_cast<int>(min(p.n - tile_start, static_cast<long long>(kTile)));
    Key keys[kItems];
    load_keys(p, temp.load_keys, tile_start, valid, keys);
    int heads[kItems + 1];
    run_heads(p, keys, tile_start, neighbours, heads);  // syncs: the key load's storage is free
    Value values[kItems];
    const Value* in = static_cast<const Value*>(p.values) + tile_start;
    if (valid == kTile) {
      LoadValues(temp.load_values).Load(in, values);
    } else {
      LoadValues(temp.load_values).Load(in, values, valid);
    }
    Pair pairs[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      pairs[j] = t * kItems + j < valid ? element_pair(p, heads[j], keys[j], values[j]) : empty_pair();
    }
    __syncthreads();
    if (p.mode == kByKeyExclusive) {
      ScanPairs(temp.scan).ExclusiveScan(pairs, pairs, Segmented(), prefix);
    } else {
      ScanPairs(temp.scan).InclusiveScan(pairs, pairs, Segmented(), prefix);
    }
    __syncthreads();
    if (p.mode == kByKeyReduce) {
      int ends = 0;
#pragma unroll
      for (int j = 0; j < kItems; ++j) ends += t * kItems + j < valid ? heads[j + 1] : 0;
      int rank, tile_ends;
      ScanInts(temp.scan_ints).ExclusiveSum(ends, rank, tile_ends);
      Key* out_keys = static_cast<Key*>(p.out_keys);
      Value* out_values = static_cast<Value*>(p.out_values);
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        if (t * kItems + j < valid && heads[j + 1]) {
          out_keys[out_base + rank] = pairs[j].key;
          out_values[out_base + rank] = pairs[j].value;
          ++rank;
        }
      }
      out_base += tile_ends;
    } else {
      const Value init = *reinterpret_cast<const Value*>(p.init);
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        values[j] = p.mode == kByKeyExclusive && heads[j] ? init : pairs[j].value;
      }
      Value* out = static_cast<Value*>(p.out_values) + tile_start;
      if (valid == kTile) {
        StoreValues(temp.store).Store(out, values);
      } else {
        StoreValues(temp.store).Store(out, values, valid);
      }
    }
    __syncthreads();
  }
}
