// The by-key engine's JIT modules (by_key_params.hpp says what each kernel does), and the
// run heads as a selection (unique_by_key; select_params.hpp, bodies in select.cuh): built to
// LTO-IR, one module per key size (CSJ_KEY_SIZE: 4, 8), value size (CSJ_VALUE_SIZE: 4 to 32)
// and call, and linked at run time with the wrappers numba compiled. A module holds only the
// kernels of one call, as nvJitLink compiles every kernel of a module for each new operator:
// CSJ_BY_KEY_INCLUSIVE, _EXCLUSIVE (the scans by key) and _REDUCE (reduce_by_key) each take
// the two passes' first kernels and their mode's sweep, single pass and fix-up (reduce_by_key
// also its gather); CSJ_BY_KEY_HEADS the run heads' selection alone. The wrappers:
//   int  csj_equal(const void* a, const void* b)           nonzero: the keys share a run
//   void csj_op(const void* a, const void* b, void* out)   the values' operator
// Keys and values move as opaque words of their sizes; tiles are read and written through
// CUB's warp-transposing block loads and stores, and folded with CUB's block reductions and
// scans, whose association is fixed for a block size.
//
// reduce_by_key's single pass is persistent: the blocks resident at once loop over the
// shard's tiles, each warp copying its next tile in with cp.async while it works on the current
// one (one_pass_persistent). On one H100, builds alternated in one call, 2^28 int32 keys in
// runs of 64: 1889-1902 GB/s against 1776-1795 with a block for each group of tiles.
#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/block/block_store.cuh>

#include "async_copy.cuh"
#include "by_key_params.hpp"
#include "select.cuh"
#include "transform.cuh"

#if !defined(CSJ_KEY_SIZE) || !defined(CSJ_VALUE_SIZE)
#error "CSJ_KEY_SIZE and CSJ_VALUE_SIZE must be defined"
#endif
#if defined(CSJ_BY_KEY_INCLUSIVE) + defined(CSJ_BY_KEY_EXCLUSIVE) + defined(CSJ_BY_KEY_REDUCE) + \
        defined(CSJ_BY_KEY_HEADS) != 1
#error "one of CSJ_BY_KEY_INCLUSIVE, CSJ_BY_KEY_EXCLUSIVE, CSJ_BY_KEY_REDUCE and CSJ_BY_KEY_HEADS must be defined"
#endif

extern "C" __device__ int csj_equal(const void*, const void*);
extern "C" __device__ void csj_op(const void*, const void*, void*);

namespace {

using namespace csj::kernels;

using Key = Word<CSJ_KEY_SIZE>::type;
using Value = Word<CSJ_VALUE_SIZE>::type;
constexpr int kItems = by_key_items(CSJ_KEY_SIZE, CSJ_VALUE_SIZE);
constexpr int kTile = kByKeyBlock * kItems;
constexpr int kSweepBlocks = by_key_sweep_blocks(CSJ_KEY_SIZE, CSJ_VALUE_SIZE);
constexpr int kLaneItems = by_key_lane_items(CSJ_KEY_SIZE, CSJ_VALUE_SIZE);  // the single pass's
constexpr int kPassTile = 32 * kLaneItems;
constexpr int kPassBlocks = 4;

// One element, or the fold of a range: whether it holds an element (kValid: else it is the
// empty range, the identity) and whether a run starts in it (kHead), the fold of its last
// run's values and, where a result needs it (the records, reduce_by_key's sweep), the first
// key of that run. The scans' sweeps carry no key.
constexpr int kValid = 1;
constexpr int kHead = 2;

template <bool kWithKey>
struct PairOf {
  static constexpr bool kKeyed = kWithKey;
  int flags;
  Key key;
  Value value;
};
template <>
struct PairOf<false> {
  static constexpr bool kKeyed = false;
  int flags;
  Value value;
};
using Pair = PairOf<true>;

template <class P>
__device__ __forceinline__ P empty_pair() {
  P pair;
  pair.flags = 0;
  return pair;
}

struct Segmented {
  template <class P>
  __device__ __forceinline__ P operator()(const P& a, const P& b) const {
    if (!(b.flags & kValid)) return a;
    if (!(a.flags & kValid) || (b.flags & kHead)) return b;
    P out = a;  // a's head and key
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
  tally.pair.flags = (record.valid ? kValid : 0) | (record.head ? kHead : 0);
  memcpy(&tally.pair.key, &record.key, sizeof(Key));
  memcpy(&tally.pair.value, record.value, sizeof(Value));
  return tally;
}

__device__ __forceinline__ void write_record(ByKeyRecord& record, const Tally& tally) {
  record.tails = tally.tails;
  record.valid = (tally.pair.flags & kValid) ? 1 : 0;
  record.head = (tally.pair.flags & kHead) ? 1 : 0;
  record.key = 0;
  memcpy(&record.key, &tally.pair.key, sizeof(Key));
  memcpy(record.value, &tally.pair.value, sizeof(Value));
}

template <class P>
__device__ __forceinline__ P without_key(const Pair& pair) {
  if constexpr (P::kKeyed) {
    return pair;
  } else {
    P out;
    out.flags = pair.flags;
    out.value = pair.value;
    return out;
  }
}

// The latest run head of a tile and its count of run ends, reduced together.
struct HeadsAndTails {
  int latest;
  int tails;
};
struct LatestAndSum {
  __device__ __forceinline__ HeadsAndTails operator()(const HeadsAndTails& a, const HeadsAndTails& b) const {
    return {a.latest > b.latest ? a.latest : b.latest, a.tails + b.tails};
  }
};

__device__ __forceinline__ bool same_run(const Key& a, const Key& b) { return csj_equal(&a, &b) != 0; }

// Hands the running prefix to each tile of a chunk and advances it by the tile's fold.
template <class P>
struct RunningPrefix {
  P running;
  __device__ __forceinline__ P operator()(const P& tile) {
    const P prefix = running;
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
template <class P>
__device__ __forceinline__ P element_pair(const ByKeyParams& p, bool exclusive, int head, const Key& key,
                                          const Value& value) {
  P pair;
  pair.flags = kValid | (head ? kHead : 0);
  if constexpr (P::kKeyed) pair.key = key;
  if (exclusive && head) {
    csj_op(reinterpret_cast<const Value*>(p.init), &value, &pair.value);
  } else {
    pair.value = value;
  }
  return pair;
}

using LoadKeys = cub::BlockLoad<Key, kByKeyBlock, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
using LoadValues = cub::BlockLoad<Value, kByKeyBlock, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
using StoreValues = cub::BlockStore<Value, kByKeyBlock, kItems, cub::BLOCK_STORE_WARP_TRANSPOSE>;
using ReducePairs = cub::BlockReduce<Pair, kByKeyBlock>;
using ReduceHeads = cub::BlockReduce<HeadsAndTails, kByKeyBlock>;
using ScanInts = cub::BlockScan<int, kByKeyBlock>;

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
#if !defined(CSJ_BY_KEY_HEADS)
extern "C" __global__ void __launch_bounds__(kByKeyBlock)
    csj_by_key_reduce(const __grid_constant__ ByKeyParams p) {
  __shared__ union {
    typename LoadKeys::TempStorage load;
    typename ReducePairs::TempStorage pairs;
    typename ReduceHeads::TempStorage heads;
  } temp;
  __shared__ Neighbours neighbours;
  __shared__ int last_head;
  const int t = static_cast<int>(threadIdx.x);
  const long long chunk_start = static_cast<long long>(blockIdx.x) * kTile * p.chunk_tiles;
  const Value* values = static_cast<const Value*>(p.values);
  Tally chunk = {0, empty_pair<Pair>()};  // thread 0's copy is the chunk's
  for (int tile = 0; tile < p.chunk_tiles; ++tile) {
    const long long tile_start = chunk_start + static_cast<long long>(tile) * kTile;
    if (tile_start >= p.n) break;
    const int valid = static_cast<int>(min(p.n - tile_start, static_cast<long long>(kTile)));
    Key keys[kItems];
    load_keys(p, temp.load, tile_start, valid, keys);
    int heads[kItems + 1];
    run_heads(p, keys, tile_start, neighbours, heads);
    HeadsAndTails mine = {-1, 0};
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      if (t * kItems + j < valid) {
        if (heads[j]) mine.latest = t * kItems + j;
        mine.tails += heads[j + 1];
      }
    }
    __syncthreads();  // the key load's storage is free
    const HeadsAndTails block = ReduceHeads(temp.heads).Reduce(mine, LatestAndSum());
    if (t == 0) last_head = block.latest;
    __syncthreads();
    const int from = last_head < 0 ? 0 : last_head;
    Pair folded = empty_pair<Pair>();
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int local = t * kItems + j;
      if (local < valid && local >= from) {
        folded = Segmented()(folded, element_pair<Pair>(p, p.mode == kByKeyExclusive, heads[j], keys[j],
                                                        values[tile_start + local]));
      }
    }
    const Pair tile_fold = ReducePairs(temp.pairs).Reduce(folded, Segmented());
    __syncthreads();
    if (t == 0) chunk = Join()(chunk, Tally{block.tails, tile_fold});
  }
  if (t == 0) write_record(p.chunks[blockIdx.x], chunk);
}
#endif

// Replaces `count` records by their exclusive prefix (each thread of the block folds `per`
// consecutive ones, the runs are scanned across the block in thread order) and returns the
// fold of all of them (valid in every thread).
template <int kThreads, class Storage>
__device__ __forceinline__ Tally scan_records(Storage& storage, ByKeyRecord* records, long long count,
                                              long long per) {
  const long long first = min(static_cast<long long>(threadIdx.x) * per, count);
  const long long last = min(first + per, count);
  const Tally none = {0, empty_pair<Pair>()};
  Tally run = none;
  for (long long c = first; c < last; ++c) run = Join()(run, read_record(records[c]));
  Tally acc, all;
  cub::BlockScan<Tally, kThreads>(storage).ExclusiveScan(run, acc, none, Join(), all);
  for (long long c = first; c < last; ++c) {
    const Tally here = read_record(records[c]);
    write_record(records[c], acc);
    acc = Join()(acc, here);
  }
  return all;
}

// One block a group of kByKeyGroup chunks: their records replaced by their exclusive prefix
// within the group, and the group's fold.
#if !defined(CSJ_BY_KEY_HEADS)
extern "C" __global__ void __launch_bounds__(kByKeyGroupThreads)
    csj_by_key_chunks(const __grid_constant__ ByKeyParams p) {
  __shared__ typename cub::BlockScan<Tally, kByKeyGroupThreads>::TempStorage temp;
  const long long first = static_cast<long long>(blockIdx.x) * kByKeyGroup;
  const Tally group = scan_records<kByKeyGroupThreads>(temp, p.chunks + first, min(kByKeyGroup, p.num_chunks - first),
                                                        kByKeyGroupRun);
  if (threadIdx.x == 0) write_record(p.groups[blockIdx.x], group);
}
#endif

// One block: the groups' folds replaced by their exclusive prefix, and the shard's total.
#if !defined(CSJ_BY_KEY_HEADS)
extern "C" __global__ void __launch_bounds__(kByKeyGroupThreads)
    csj_by_key_groups(const __grid_constant__ ByKeyParams p) {
  __shared__ typename cub::BlockScan<Tally, kByKeyGroupThreads>::TempStorage temp;
  const long long per = (p.num_groups + kByKeyGroupThreads - 1) / kByKeyGroupThreads;
  const Tally total = scan_records<kByKeyGroupThreads>(temp, p.groups, p.num_groups, per);
  if (threadIdx.x == 0) write_record(*p.total, total);
}
#endif

// One thread: the fold of the earlier shards' totals, in place order.
#if !defined(CSJ_BY_KEY_HEADS)
extern "C" __global__ void csj_by_key_carry(const __grid_constant__ ByKeyParams p) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  Tally acc = {0, empty_pair<Pair>()};
  for (int k = 0; k < p.count; ++k) acc = Join()(acc, read_record(p.sources[k]));
  write_record(*p.carry, acc);
}
#endif

// Each chunk again, from its prefix (the carry into the shard, then the chunks before). One
// kernel per mode, so that each holds only what it needs: the scans carry no keys.
template <int kMode>
__device__ __forceinline__ void sweep(const ByKeyParams& p) {
  constexpr bool kReduce = kMode == kByKeyReduce;
  constexpr bool kExclusive = kMode == kByKeyExclusive;
  using P = PairOf<kReduce>;
  using ScanPairs = cub::BlockScan<P, kByKeyBlock>;
  __shared__ union {
    typename LoadKeys::TempStorage load_keys;
    typename LoadValues::TempStorage load_values;
    typename StoreValues::TempStorage store;
    typename ScanPairs::TempStorage scan;
    typename ScanInts::TempStorage scan_ints;
  } temp;
  __shared__ Neighbours neighbours;
  __shared__ P start;
  const int t = static_cast<int>(threadIdx.x);
  const ByKeyRecord& record = p.chunks[blockIdx.x];
  const ByKeyRecord& group = p.groups[blockIdx.x / kByKeyGroup];
  if (t == 0) {
    const Pair carry = p.carry != nullptr ? read_record(*p.carry).pair : empty_pair<Pair>();
    start = without_key<P>(Segmented()(carry, Segmented()(read_record(group).pair, read_record(record).pair)));
  }
  long long out_base = group.tails + record.tails;  // run ends before the chunk, in this shard
  __syncthreads();
  RunningPrefix<P> prefix{start};
  const long long chunk_start = static_cast<long long>(blockIdx.x) * kTile * p.chunk_tiles;
  for (int tile = 0; tile < p.chunk_tiles; ++tile) {
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
    P pairs[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      pairs[j] = t * kItems + j < valid ? element_pair<P>(p, kExclusive, heads[j], keys[j], values[j])
                                        : empty_pair<P>();
    }
    __syncthreads();
    if constexpr (kExclusive) {
      ScanPairs(temp.scan).ExclusiveScan(pairs, pairs, Segmented(), prefix);
    } else {
      ScanPairs(temp.scan).InclusiveScan(pairs, pairs, Segmented(), prefix);
    }
    __syncthreads();
    if constexpr (kReduce) {
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
      if constexpr (kExclusive) {
        const Value init = *reinterpret_cast<const Value*>(p.init);
#pragma unroll
        for (int j = 0; j < kItems; ++j) values[j] = heads[j] ? init : pairs[j].value;
      } else {
#pragma unroll
        for (int j = 0; j < kItems; ++j) values[j] = pairs[j].value;
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

#if defined(CSJ_BY_KEY_INCLUSIVE)
extern "C" __global__ void __launch_bounds__(kByKeyBlock, kSweepBlocks)
    csj_by_key_sweep_inclusive(const __grid_constant__ ByKeyParams p) {
  sweep<kByKeyInclusive>(p);
}
#endif

#if defined(CSJ_BY_KEY_EXCLUSIVE)
extern "C" __global__ void __launch_bounds__(kByKeyBlock, kSweepBlocks)
    csj_by_key_sweep_exclusive(const __grid_constant__ ByKeyParams p) {
  sweep<kByKeyExclusive>(p);
}
#endif

#if defined(CSJ_BY_KEY_REDUCE)
extern "C" __global__ void __launch_bounds__(kByKeyBlock, kSweepBlocks)
    csj_by_key_sweep_reduce(const __grid_constant__ ByKeyParams p) {
  sweep<kByKeyReduce>(p);
}
#endif

// ---- the single pass ----------------------------------------------------------------------
// One kernel per mode reads each tile once: tiles are taken in order from a counter (so every
// predecessor of a running tile has started and will publish: no deadlock), folded and
// scanned locally, and joined to what came before them by a decoupled look-back whose fold
// is fixed: left folds in two levels, within groups of 32 tiles and over the groups (LookBack
// says how). A tile publishes its own fold (the aggregate) at once, then its fold from its
// group's first tile (its local inclusive fold); a tile's local fold is found from the
// nearest earlier local one in its group, j, folded left with the aggregates of j + 1 ..
// t - 1, which is agg(f) . ... . agg(t) associated from the left whichever j a tile happened
// to find; the groups' prefixes likewise. So the results are the same bits run after run
// (CUB's look-back combines a window of aggregates as a tree whose shape depends on timing).
// Under the segmented combine a run head resets the fold, so a head tile publishes its
// aggregate as its local fold at once, a group whose local fold holds a head is its own
// prefix, and the look-backs after them stop there.
// reduce_by_key writes each tile's outputs from the tile's first element's position (scratch
// at the shard's size) and its count of run ends; the counts' exclusive prefix, taken after the
// pass, places them (csj_by_key_one_pass_gather). Looked back with the pairs, the counts would
// keep a head tile from publishing its inclusive record before its predecessors had theirs
// (5x slower on an H200); looked back apart, at a warp's tiles the frontier of inclusive counts
// fell further behind than a window of 32 tiles reaches (1.7-1.8 ms against the scans' 1.25 for
// 2^28 int32 keys).

namespace {

// The last tile's inclusive pair as the shard's total (ByKeyRecord: the scans' pairs have no
// key; the single pass counts a shard's run ends apart, so the record's count stays 0).
template <class P>
__device__ __forceinline__ Tally as_tally(const P& pair) {
  Tally tally = {0, empty_pair<Pair>()};
  tally.pair.flags = pair.flags;
  if constexpr (P::kKeyed) {
    tally.pair.key = pair.key;
  } else {
    memset(&tally.pair.key, 0, sizeof(Key));
  }
  tally.pair.value = pair.value;
  return tally;
}

// Records move as words through L2 (st.cg / ld.cg): another block wrote them, and a line a
// block read before its neighbour's record was there must not be served from L1.
template <class R>
struct RecordWords {
  using Word = std::conditional_t<alignof(R) >= 8, unsigned long long, unsigned int>;
  static_assert(sizeof(R) % sizeof(Word) == 0 && alignof(R) >= 4, "tile records are whole words");
  static_assert(sizeof(R) <= kByKeyTileRecord, "a tile record fits the host's allocation");
  static constexpr int kWords = sizeof(R) / sizeof(Word);
  static __device__ __forceinline__ void store(R* slot, const R& record) {
    Word words[kWords];
    memcpy(words, &record, sizeof(R));
    auto* out = reinterpret_cast<Word*>(slot);
#pragma unroll
    for (int w = 0; w < kWords; ++w) __stcg(out + w, words[w]);
  }
  static __device__ __forceinline__ R load(const R* slot) {
    Word words[kWords];
    const auto* in = reinterpret_cast<const Word*>(slot);
#pragma unroll
    for (int w = 0; w < kWords; ++w) words[w] = __ldcg(in + w);
    R record;
    memcpy(&record, words, sizeof(R));
    return record;
  }
};

// A tile record of at most 16 bytes travels with its state in one 16-byte word (the state in
// the flags' upper bits): stored and loaded whole, as CUB's tile states of 8-byte values are,
// so a reader that sees the state has the record, with no fence on either side, and one trip
// to L2 brings a window's states and records together. The host zeroes the words (state
// none) before the pass. Wider records take RecordWords under tile_flags.
constexpr int kStateShift = 2;  // flags: kValid, kHead below
template <class P>
struct PackedSlots {
  static constexpr bool kFits = sizeof(P) <= 16;
  static_assert(offsetof(P, flags) == 0, "the flags lead a record");
  static __device__ __forceinline__ uint4* aggregates(const ByKeyParams& p) { return static_cast<uint4*>(p.tile_records); }
  static __device__ __forceinline__ uint4* inclusives(const ByKeyParams& p) {
    return static_cast<uint4*>(p.tile_records) + p.num_tiles;
  }
  static __device__ __forceinline__ void store(uint4* slot, const P& record, int state) {
    P tagged = record;
    tagged.flags = (record.flags & (kValid | kHead)) | (state << kStateShift);
    uint4 word = make_uint4(0, 0, 0, 0);
    memcpy(&word, &tagged, sizeof(P));
    asm volatile("st.relaxed.gpu.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(slot), "r"(word.x), "r"(word.y),
                 "r"(word.z), "r"(word.w)
                 : "memory");
  }
  static __device__ __forceinline__ uint4 load(const uint4* slot) {
    uint4 word;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(word.x), "=r"(word.y), "=r"(word.z), "=r"(word.w)
                 : "l"(slot)
                 : "memory");
    return word;
  }
  static __device__ __forceinline__ int state(const uint4& word) { return static_cast<int>(word.x) >> kStateShift; }
  static __device__ __forceinline__ P record(const uint4& word) {
    P record;
    memcpy(&record, &word, sizeof(P));
    record.flags &= kValid | kHead;
    return record;
  }
};

// The look-back joins tiles in two levels, each a strict left fold (the association that keeps
// the bits fixed whichever record a look-back stops at). Tiles form groups of
// kByKeyLookBackGroup consecutive tiles: a tile's local fold is agg(f) . agg(f + 1) . ... .
// agg(t) from its group's first tile f, and a group's prefix is the left fold of the groups'
// local folds (each group's last tile's) from the shard's first group. A tile's exclusive pair
// is the prefix of the groups before its own joined with the local fold of its group's tiles
// before it, its inclusive pair the same with its own. A strict left fold over all the tiles
// is one chain whose front moves by one look-back's hop at a time: where no tile holds a head
// (one run over 2^28 int32 keys) the scan by key took 49 ms and reduce_by_key 47-50 on an
// H100, against 1.3 and 1.0 ms in runs of 64; in two levels, 2.7-2.8 and 5.6-7.1 ms (on an
// H200 2.66 and 6.52 against 48.8 and 49.2 in one call).
// Each tile has two record slots: its aggregate (kByKeyTileAggregate) and its local fold
// (kByKeyTileInclusive); a group's last tile, whose aggregate no tile reads, puts its group's
// prefix in its aggregate slot instead (kByKeyTileGroup).
constexpr long long kGroupTiles = kByKeyLookBackGroup;

__device__ __forceinline__ long long group_end(long long group) { return group * kGroupTiles + kGroupTiles - 1; }

// Whether tiles 0 .. `tile` hold a run head (the fix-ups' stop), after the pass, in either
// layout: the tile's local fold has one, or the prefix of the groups before its own.
template <class P>
__device__ __forceinline__ bool head_through(const ByKeyParams& p, long long tile) {
  const long long group = tile / kGroupTiles;
  if constexpr (PackedSlots<P>::kFits) {
    using Slots = PackedSlots<P>;
    if (Slots::record(Slots::load(Slots::inclusives(p) + tile)).flags & kHead) return true;
    return group > 0 && (Slots::record(Slots::load(Slots::aggregates(p) + group_end(group - 1))).flags & kHead);
  } else {
    const P* records = static_cast<const P*>(p.tile_records);
    if (records[p.num_tiles + tile].flags & kHead) return true;
    return group > 0 && (records[group_end(group - 1)].flags & kHead);
  }
}

// The single pass's look-back (called by the tile's warp with the tile's fold): publishes the
// tile's records, looks back and returns the exclusive pair (lane 0's). Within the group it
// reads at most one window (the 31 tiles before); across groups, 32 groups a window. kHelp: a
// look-back that folds groups (32 at a time, those further back than 32 staged from L2)
// publishes the prefix up to each window's last group as that group's prefix (helping; the
// same bits that group's own last tile publishes), so the look-backs after it stop short. A
// shard's last tile, which no tile of the shard waits on, waits instead for the group before
// it to have its prefix (and keeps its registers).
template <bool kReduce, bool kHelp = true>
struct LookBack {
  using P = PairOf<kReduce>;
  const ByKeyParams& p;
  long long tile;
  P* stage;                               // 64 records in shared memory
  P* found;                               // 3 records in shared memory: the nearest known one,
                                          // the tile's local fold, the local fold before it

  __device__ __forceinline__ P* aggregates() const { return static_cast<P*>(p.tile_records); }
  __device__ __forceinline__ P* inclusives() const { return static_cast<P*>(p.tile_records) + p.num_tiles; }

  // Publishes `record` in tile `at`'s inclusive slot (kByKeyTileInclusive: its local fold) or
  // its aggregate slot (kByKeyTileAggregate: its fold; kByKeyTileGroup: its group's prefix), in
  // the layout its size takes: packed with the state, or the record, a fence, then its flag
  // (a tile's flag only rises: none, aggregate, inclusive, group).
  __device__ __forceinline__ void publish(long long at, const P& record, int state) const {
    const bool inclusive = state == kByKeyTileInclusive;
    if constexpr (PackedSlots<P>::kFits) {
      using Slots = PackedSlots<P>;
      Slots::store((inclusive ? Slots::inclusives(p) : Slots::aggregates(p)) + at, record, state);
    } else {
      RecordWords<P>::store((inclusive ? inclusives() : aggregates()) + at, record);
      __threadfence();  // the record before the flag that says it is there
      atomicExch(p.tile_flags + at, state);
    }
  }

  __device__ __forceinline__ P operator()(const P& tile_fold) {
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int place = static_cast<int>(tile % kGroupTiles);  // in its group
    // A tile with a head, or a group's first, has its local fold already.
    const bool complete = place == 0 || (tile_fold.flags & kHead);
    if (lane == 0) {
      if (complete) {
        publish(tile, tile_fold, kByKeyTileInclusive);
      } else if (place != kGroupTiles - 1) {  // no tile reads a group's last aggregate
        publish(tile, tile_fold, kByKeyTileAggregate);
      }
    }
    // Lane 0 keeps the pairs in shared memory, out of the registers the tile's items hold:
    // found[1] the tile's fold, then its local fold; found[2] the local fold of the group's
    // tiles before it.
    if (lane == 0) found[1] = tile_fold;
    if (place > 0) {
      if constexpr (PackedSlots<P>::kFits) {
        local_packed(lane, place);
      } else {
        local_flagged(lane, place);
      }
    } else if (lane == 0) {
      found[2] = empty_pair<P>();
    }
    if (lane == 0 && !complete) {
      const P local = Segmented()(found[2], found[1]);
      publish(tile, local, kByKeyTileInclusive);
      found[1] = local;
    }
    __syncwarp();
    // The groups before this one count unless a head in the group's tiles before it resets the fold.
    const bool reset = found[2].flags & kHead;
    const int group = static_cast<int>(tile / kGroupTiles);  // (2^31 groups: 2^42 elements at least)
    P prefix = empty_pair<P>();  // lane 0: the prefix of the groups before this one
    if (group > 0 && !reset) {
      if constexpr (PackedSlots<P>::kFits) {
        prefix = group_packed(lane, group);
      } else {
        prefix = group_flagged(lane, group);
      }
    }
    if (lane == 0) {
      const bool group_last = place == kGroupTiles - 1;
      const bool shard_last = tile == p.num_tiles - 1;
      if (group_last || shard_last) {
        const P inclusive = Segmented()(prefix, found[1]);
        if (group_last) publish(tile, inclusive, kByKeyTileGroup);
        // the shard's total, which the carries of the shards after it fold (its run ends are
        // counted apart: the tiles' counts, scanned after the pass)
        if (shard_last && p.total != nullptr) write_record(*p.total, as_tally(inclusive));
      }
    }
    __syncwarp();
    const P exclusive = Segmented()(prefix, found[2]);
    return exclusive;  // lane 0's is the one the scan uses
  }

  // The local fold of the group's tiles before this one (lane 0's), over packed words: lane l
  // reads tile - 1 - l's inclusive and aggregate words at once, until the tiles up to the
  // nearest one with its local fold are there (a tile seen once stays seen); the aggregates
  // after it are staged and folded by lane 0.
  __device__ __forceinline__ void local_packed(int lane, int place) const {
    using Slots = PackedSlots<P>;
    const int at = place - 1 - lane;  // within the group
    bool inclusive = at < 0;  // before the group: the empty fold (lane 31 at least)
    bool published = at < 0;
    uint4 inclusive_word = make_uint4(0, 0, 0, 0);
    uint4 aggregate_word = make_uint4(0, 0, 0, 0);
    for (;;) {
      if (!published) {
        inclusive_word = Slots::load(Slots::inclusives(p) + (tile - 1 - lane));
        aggregate_word = Slots::load(Slots::aggregates(p) + (tile - 1 - lane));
        inclusive = Slots::state(inclusive_word) == kByKeyTileInclusive;
        published = inclusive || Slots::state(aggregate_word) == kByKeyTileAggregate;
      }
      const unsigned inclusives = __ballot_sync(0xffffffffu, inclusive);
      const unsigned needed = ((inclusives & (0u - inclusives)) << 1) - 1u;
      if ((__ballot_sync(0xffffffffu, published) & needed) == needed) break;
    }
    stage[lane] = Slots::record(aggregate_word);
    const int from = __ffs(__ballot_sync(0xffffffffu, inclusive)) - 1;
    if (lane == from && at >= 0) *found = Slots::record(inclusive_word);
    __syncwarp();
    if (lane == 0) {
      P within = empty_pair<P>();
      if (from < place) within = *found;
      for (int back = from - 1; back >= 0; --back) within = Segmented()(within, stage[back]);
      found[2] = within;
    }
    __syncwarp();
  }

  // The same for wider records, by their flags: every tile of the window in the group waited
  // for, then the records after the nearest one with its local fold.
  __device__ __forceinline__ void local_flagged(int lane, int place) const {
    const long long at = tile - 1 - lane;
    int state = kByKeyTileInclusive;  // before the group: the empty fold
    if (lane < place) {
      const volatile int* flag = p.tile_flags + at;
      do {
        state = *flag;
      } while (state == kByKeyTileNone);
    }
    const int from = __ffs(__ballot_sync(0xffffffffu, state == kByKeyTileInclusive)) - 1;
    __syncwarp();
    __threadfence();  // the flags every lane saw before the records any lane reads
    if (lane < from) stage[lane] = RecordWords<P>::load(aggregates() + at);
    __syncwarp();
    if (lane == 0) {
      P within = empty_pair<P>();
      if (from < place) within = RecordWords<P>::load(inclusives() + tile - 1 - from);
      for (int back = from - 1; back >= 0; --back) within = Segmented()(within, stage[back]);
      found[2] = within;
    }
    __syncwarp();
  }

  // The prefix of the groups before `group` (lane 0's), over packed words: the nearest group
  // whose prefix is known (published, or its local fold holding a head, which resets it),
  // folded left with the local folds of the groups after it, 32 groups a window.
  __device__ __forceinline__ P group_packed(int lane, int group) const {
    using Slots = PackedSlots<P>;
    if constexpr (!kHelp) {  // a shard's last tile: lane 0 waits for the group before to know its prefix
      P prefix = empty_pair<P>();
      if (lane == 0) {
        for (;;) {
          const uint4 prefix_word = Slots::load(Slots::aggregates(p) + group_end(group - 1));
          if (Slots::state(prefix_word) == kByKeyTileGroup) {
            prefix = Slots::record(prefix_word);
            break;
          }
          const uint4 fold_word = Slots::load(Slots::inclusives(p) + group_end(group - 1));
          if (Slots::state(fold_word) == kByKeyTileInclusive && (Slots::record(fold_word).flags & kHead)) {
            prefix = Slots::record(fold_word);
            break;
          }
        }
      }
      return prefix;
    }
    int nearest = -1;  // -1: the shard's start, the empty prefix
    for (int top = group - 1; top >= 0; top -= 32) {
      const int k = top - lane;
      bool known = k < 0;
      bool published = k < 0;
      uint4 word = make_uint4(0, 0, 0, 0);  // the group's prefix where known by it, else its local fold
      // Only the groups up to the nearest known one are waited for.
      for (;;) {
        if (!published) {
          const uint4 prefix_word = Slots::load(Slots::aggregates(p) + group_end(k));
          const uint4 fold_word = Slots::load(Slots::inclusives(p) + group_end(k));
          const bool prefixed = Slots::state(prefix_word) == kByKeyTileGroup;
          const bool folded = Slots::state(fold_word) == kByKeyTileInclusive;
          known = prefixed || (folded && (Slots::record(fold_word).flags & kHead));
          published = prefixed || folded;
          word = prefixed ? prefix_word : fold_word;
        }
        const unsigned knowns = __ballot_sync(0xffffffffu, known);
        const unsigned needed = knowns ? ((knowns & (0u - knowns)) << 1) - 1u : 0xffffffffu;
        if ((__ballot_sync(0xffffffffu, published) & needed) == needed) break;
      }
      if (top == group - 1) stage[lane] = Slots::record(word);  // lane l: group - 1 - l (its fold where not known)
      const unsigned done = __ballot_sync(0xffffffffu, known);
      if (done) {
        const int from = __ffs(done) - 1;
        nearest = top - from;
        if (lane == from && k >= 0) *found = Slots::record(word);
        break;
      }
    }
    __syncwarp();
    P prefix = empty_pair<P>();
    if (lane == 0 && nearest >= 0) prefix = *found;
    // The fold from there, 32 groups at a time: a window within the 32 groups before folds the
    // staged folds; one further back is staged first (one trip to L2, each lane one group).
    // The prefix up to each window's last group is published as that group's (helping: the
    // group before this one's too, so that its other tiles and the groups after find it).
    for (int low = nearest + 1; low < group; low += 32) {
      const int count = static_cast<int>(min(group - low, 32));
      const bool far = low + 32 < group;
      if (far) {
        if (lane < count) stage[32 + lane] = Slots::record(Slots::load(Slots::inclusives(p) + group_end(low + lane)));
        __syncwarp();
      }
      if (lane == 0) {
        for (int l = 0; l < count; ++l) prefix = Segmented()(prefix, far ? stage[32 + l] : stage[group - 1 - low - l]);
        publish(group_end(low + count - 1), prefix, kByKeyTileGroup);
      }
      __syncwarp();
    }
    return prefix;
  }

  // The same for wider records, by their flags: every group of a window waited for until its
  // local fold is there, then the records.
  __device__ __forceinline__ P group_flagged(int lane, int group) const {
    int nearest = -1;
    bool prefixed = false;  // the nearest group's prefix is published (else its fold has a head)
    for (int top = group - 1; top >= 0; top -= 32) {
      const int k = top - lane;
      int state = kByKeyTileGroup;  // before the shard: the empty prefix
      bool known = true;
      if (k >= 0) {
        const volatile int* flag = p.tile_flags + group_end(k);
        do {
          state = *flag;
        } while (state < kByKeyTileInclusive);
        __threadfence();  // the flag before the record it announces
        known = state == kByKeyTileGroup || (__ldcg(&inclusives()[group_end(k)].flags) & kHead);
      }
      const unsigned done = __ballot_sync(0xffffffffu, known);
      if (done) {
        const int from = __ffs(done) - 1;
        nearest = top - from;
        prefixed = __shfl_sync(0xffffffffu, state == kByKeyTileGroup, from);
        break;
      }
    }
    // the flags every lane saw before the records any lane reads (a vote orders no memory)
    __syncwarp();
    __threadfence();
    P prefix = empty_pair<P>();
    if (lane == 0 && nearest >= 0) {
      prefix = RecordWords<P>::load((prefixed ? aggregates() : inclusives()) + group_end(nearest));
    }
    for (int low = nearest + 1; low < group; low += 32) {
      if (low + lane < group) stage[lane] = RecordWords<P>::load(inclusives() + group_end(low + lane));
      __syncwarp();
      if (lane == 0) {
        const int count = static_cast<int>(min(group - low, 32));
        for (int l = 0; l < count; ++l) prefix = Segmented()(prefix, stage[l]);
        if (kHelp) publish(group_end(low + count - 1), prefix, kByKeyTileGroup);  // helping
      }
      __syncwarp();
    }
    return prefix;
  }
};

// Moves a value between the lanes of a warp, a 4-byte word at a time (pairs, keys of either
// size, records of any).
template <class T, class Move>
__device__ __forceinline__ T move_words(const T& value, Move move) {
  static_assert(sizeof(T) % 4 == 0, "lanes exchange whole words");
  unsigned words[sizeof(T) / 4];
  memcpy(words, &value, sizeof(T));
#pragma unroll
  for (int w = 0; w < int(sizeof(T) / 4); ++w) words[w] = move(words[w]);
  T out;
  memcpy(&out, words, sizeof(T));
  return out;
}
template <class T>
__device__ __forceinline__ T from_lane_before(const T& value, int delta) {
  return move_words(value, [delta](unsigned w) { return __shfl_up_sync(0xffffffffu, w, delta); });
}
template <class T>
__device__ __forceinline__ T from_lane(const T& value, int lane) {
  return move_words(value, [lane](unsigned w) { return __shfl_sync(0xffffffffu, w, lane); });
}

// A warp's tile of one array in shared memory, one element of padding every 32 so that
// neither the striped nor the blocked accesses of 4-byte elements meet in a bank.
template <class T>
struct WarpTile {
  T items[kPassTile + kPassTile / 32];
  static __device__ __forceinline__ int slot(int i) { return i + i / 32; }
  // element lane + 32 k from striped[k]; a __syncwarp() before the blocked reads
  __device__ __forceinline__ void put_striped(int lane, const T (&striped)[kLaneItems]) {
#pragma unroll
    for (int k = 0; k < kLaneItems; ++k) items[slot(lane + 32 * k)] = striped[k];
  }
  __device__ __forceinline__ T& blocked(int lane, int j) { return items[slot(lane * kLaneItems + j)]; }
  __device__ __forceinline__ void get_striped(int lane, T (&striped)[kLaneItems]) const {
#pragma unroll
    for (int k = 0; k < kLaneItems; ++k) striped[k] = items[slot(lane + 32 * k)];
  }
  // Whether a lane's share of a tile is whole 16-byte vectors of whole elements: elements of
  // 4, 8 or 16 bytes (not 12, 24 or 32), and a lane's share a multiple of 16 bytes (not
  // the 2 keys a lane holds beside 32-byte values).
  static constexpr bool kVectors = 16 % sizeof(T) == 0 && (kLaneItems * sizeof(T)) % 16 == 0;
  // The tile's elements from `in` (16-byte aligned) in 16-byte vectors, lane l loading
  // vectors l, l + 32, ... (each a warp's coalesced 512 bytes), all of them before the first
  // is placed: a quarter of the loads of 4-byte elements a lane issues one by one.
  __device__ __forceinline__ void load_vectors(int lane, const T* in) {
    static_assert(kVectors, "a lane's share is whole vectors");
    constexpr int kPer = 16 / static_cast<int>(sizeof(T));  // elements a vector
    constexpr int kCount = kLaneItems / kPer;              // vectors a lane
    const uint4* vectors = reinterpret_cast<const uint4*>(in);
    uint4 words[kCount];
#pragma unroll
    for (int v = 0; v < kCount; ++v) words[v] = vectors[lane + 32 * v];
#pragma unroll
    for (int v = 0; v < kCount; ++v) {
      T elements[kPer];
      memcpy(elements, &words[v], 16);
#pragma unroll
      for (int c = 0; c < kPer; ++c) items[slot(kPer * (lane + 32 * v) + c)] = elements[c];
    }
  }
};

// The warps' tiles of keys and values, the look-back's staging, and the block's first tile:
// the single pass's shared memory (one per kernel, whichever tile body a warp runs).
template <class P>
struct PassShared {
  alignas(16) WarpTile<Key> keys[kByKeyPassWarps];  // 16-byte copies land in them (SwizzledTile)
  alignas(16) WarpTile<Value> values[kByKeyPassWarps];
  P stage[kByKeyPassWarps][64];  // the look-back's: the window nearest the tile, one further back
  P found[kByKeyPassWarps][3];
  long long first_tile;
  Key edges[kByKeyPassWarps][2];  // a prefetched tile's key before it (where there is one) and after it
  long long claims[2];            // the persistent pass's groups (first tiles), claimed a turn ahead
  unsigned char turns[kByKeyBlock];  // each thread's turn (claims' slot of the next group), kept out of registers
};

// The persistent reduce_by_key pass's prefetch (one_pass_persistent): a warp's next tile is
// copied global -> shared with cp.async (async_copy.cuh: LDGSTS, through L2 only: .cg) while
// the warp works on its current tile, so that a tile's HBM latency is hidden behind the
// previous tile's fold, scan, look-back and writes; the copies hold no registers while in flight.

// A warp's tile of 16-byte-vector elements (WarpTile<T>::kVectors) laid out in its WarpTile's
// storage as 16-byte chunks, chunk q at q ^ ((q >> 3) & 3): unpadded, so that whole chunks can
// be copied in, and swizzled so that a lane's blocked chunks (lane l: chunks C l .. C l + C - 1,
// C = 1, 2 or 4), read 16 bytes at a time, fall in 8 distinct 16-byte bank groups for each
// 8 lanes (one wavefront of 128-bit accesses): conflict-free, as the striped copies are. A
// lane's striped chunks q + 32 v land 32 v chunks apart (the swizzle takes bits 3-4 of q,
// the lane's), so its copies take one address and immediate offsets.
template <class T>
struct SwizzledTile {
  static_assert(WarpTile<T>::kVectors, "a lane's share is whole 16-byte chunks");
  static_assert(sizeof(WarpTile<T>) % 16 == 0, "the warps' tiles stay 16-byte aligned");
  static constexpr int kLaneChunks = kLaneItems * static_cast<int>(sizeof(T)) / 16;
  static __device__ __forceinline__ int place(int q) { return q ^ ((q >> 3) & 3); }
  // vectors: `in` is 16-byte aligned (else 4-byte words are copied, to the same places)
  static __device__ __forceinline__ void prefetch(WarpTile<T>& tile, int lane, const T* in, bool vectors) {
    // striped: chunk lane + 32 v, each 32 lanes' copies a coalesced 512 bytes, to place(lane) + 32 v
    char* to = reinterpret_cast<char*>(tile.items) + 16 * place(lane);
    const char* from = reinterpret_cast<const char*>(in) + 16 * lane;
    if (vectors) {
      copies_async<16, 0, kLaneChunks, 512>(to, from);
    } else {  // the same chunks a word at a time (through L1: .ca, the 4 words of a chunk share its sector)
      copies_async<4, 0, kLaneChunks, 512>(to, from);
      copies_async<4, 4, kLaneChunks, 512>(to, from);
      copies_async<4, 8, kLaneChunks, 512>(to, from);
      copies_async<4, 12, kLaneChunks, 512>(to, from);
    }
  }
  static __device__ __forceinline__ void blocked(const WarpTile<T>& tile, int lane, T (&out)[kLaneItems]) {
    const uint4* chunks = reinterpret_cast<const uint4*>(tile.items);
    uint4 words[kLaneChunks];
#pragma unroll
    for (int c = 0; c < kLaneChunks; ++c) words[c] = chunks[place(kLaneChunks * lane + c)];
    static_assert(sizeof(words) == sizeof(out), "a lane's chunks are its items");
    memcpy(out, words, sizeof(out));
  }
};

// A run of the lane's items folded from left to right with their heads known: a head starts
// the fold again (its pair: element_pair's), any other item is folded into it. The same
// association as Segmented's left fold of the items' pairs; for the items after the first
// of a fold that already holds an element, whose pairs are all valid (full tiles).
template <bool kExclusive, class P>
__device__ __forceinline__ void fold_item(const ByKeyParams& p, P& fold, bool head, const Key& key,
                                          const Value& value) {
  if (head) {
    fold = element_pair<P>(p, kExclusive, 1, key, value);
  } else {
    Value next;
    csj_op(&fold.value, &value, &next);
    fold.value = next;
  }
}

// The lane's run heads, from its keys (blocked: items first ..., lane l's elements l * kLaneItems
// ... of the tile) and the keys either side of the tile (lane 0's before_tile: the key before
// the tile where there is one; lane 31's after_tile: the key after it where it is in the
// shard): bit j (j = 0 .. kLaneItems - 1) where a run starts at item j; bit kLaneItems where
// one starts after the lane's last item, so that bit j + 1 says whether item j ends its run
// (the shard's rules as run_heads'). kFull: every item and the element after the tile are in
// the shard.
template <bool kFull>
__device__ __forceinline__ unsigned lane_heads(const ByKeyParams& p, const Key (&keys)[kLaneItems], long long first,
                                               int lane, const Key& before_tile, const Key& after_tile) {
  constexpr int kI = kLaneItems;
  const auto in_shard = [&](long long at) { return kFull || at < p.n; };
  const Key lane_before = from_lane_before(keys[kI - 1], 1);
  unsigned heads = 0;
#pragma unroll
  for (int j = 0; j < kI; ++j) {
    const long long at = first + j;
    if (in_shard(at)) {
      bool head;
      if (j > 0) {
        head = !same_run(keys[j - 1], keys[j]);
      } else if (at == 0) {
        head = p.prev_key == nullptr || !same_run(*static_cast<const Key*>(p.prev_key), keys[0]);
      } else {
        head = !same_run(lane == 0 ? before_tile : lane_before, keys[0]);
      }
      heads |= static_cast<unsigned>(head) << j;
    } else if (at == p.n && j > 0) {
      heads |= static_cast<unsigned>(p.next_key == nullptr ||
                                     !same_run(keys[j - 1], *static_cast<const Key*>(p.next_key)))
               << j;
    }
  }
  const unsigned next_lane_head = __shfl_down_sync(0xffffffffu, heads, 1) & 1u;
  const long long after = first + kI;
  if (in_shard(after)) {
    heads |= (lane < 31 ? next_lane_head : static_cast<unsigned>(!same_run(keys[kI - 1], after_tile))) << kI;
  } else if (after == p.n) {
    heads |= static_cast<unsigned>(p.next_key == nullptr || !same_run(keys[kI - 1], *static_cast<const Key*>(p.next_key)))
             << kI;
  }
  return heads;
}

// Whether the shard's keys and values both start 16-byte aligned (so do their tiles): then
// whole tiles move as 16-byte vectors; a shard off that alignment moves element by element.
__device__ __forceinline__ bool vectors_aligned(const ByKeyParams& p) {
  return ((reinterpret_cast<std::uintptr_t>(p.keys) | reinterpret_cast<std::uintptr_t>(p.values)) & 15) == 0;
}

// A tile's `valid` keys and values into the warp's shared-memory tiles, striped: 16-byte
// vectors where the tile is full and both arrays are 16-byte aligned, else element by element
// (bounded by `valid` in a shard's last tile). A __syncwarp() before the blocked reads.
template <bool kFull>
__device__ __forceinline__ void load_tile(const ByKeyParams& p, WarpTile<Key>& key_tile, WarpTile<Value>& value_tile,
                                          long long tile_start, int valid, int lane) {
  const Key* keys_in = static_cast<const Key*>(p.keys) + tile_start;
  const Value* values_in = static_cast<const Value*>(p.values) + tile_start;
  if constexpr (kFull && WarpTile<Key>::kVectors && WarpTile<Value>::kVectors) {
    if (vectors_aligned(p)) {
      key_tile.load_vectors(lane, keys_in);
      value_tile.load_vectors(lane, values_in);
      return;
    }
  }
  Key keys[kLaneItems];
  Value values[kLaneItems];
  if (valid == kPassTile) {
    cub::LoadDirectStriped<32>(lane, keys_in, keys);
    cub::LoadDirectStriped<32>(lane, values_in, values);
  } else {
    cub::LoadDirectStriped<32>(lane, keys_in, keys, valid);
    cub::LoadDirectStriped<32>(lane, values_in, values, valid);
  }
  key_tile.put_striped(lane, keys);
  value_tile.put_striped(lane, values);
}

// What comes before a lane's fold: the lanes' inclusive folds scanned across the warp by
// shuffles (a fixed tree) give what the tile holds before the lane (`lane`, empty for lane 0),
// and the look-back, given the tile's fold, what the tiles before it hold (`tile`, lane 0's
// broadcast). Both bodies of the single pass join their tile to what came before this way.
template <class P>
struct Prefixes {
  P lane;
  P tile;
};
template <bool kReduce, bool kHelp>
__device__ __forceinline__ Prefixes<PairOf<kReduce>> warp_prefixes(const ByKeyParams& p,
                                                                  PassShared<PairOf<kReduce>>& shared,
                                                                  long long tile, int warp, int lane,
                                                                  const PairOf<kReduce>& lane_fold) {
  using P = PairOf<kReduce>;
  P inclusive = lane_fold;
#pragma unroll
  for (int delta = 1; delta < 32; delta *= 2) {
    const P earlier = from_lane_before(inclusive, delta);
    if (lane >= delta) inclusive = Segmented()(earlier, inclusive);
  }
  P lane_prefix = from_lane_before(inclusive, 1);
  if (lane == 0) lane_prefix = empty_pair<P>();
  const P tile_fold = from_lane(inclusive, 31);
  LookBack<kReduce, kHelp> look_back{p, tile, shared.stage[warp], shared.found[warp]};
  return {lane_prefix, from_lane(look_back(tile_fold), 0)};
}

// reduce_by_key's outputs in a tile: the run ends of the lanes before this one (the place of
// the lane's first output, returned), given the lane's own count; lane 31 stores the tile's
// count (tile_ends), which the scan after the pass turns into the tile's place.
__device__ __forceinline__ int outputs_before(const ByKeyParams& p, long long tile, int lane, int ends) {
  int sum = ends;
#pragma unroll
  for (int delta = 1; delta < 32; delta *= 2) {
    const int earlier = __shfl_up_sync(0xffffffffu, sum, delta);
    if (lane >= delta) sum += earlier;
  }
  if (lane == 31) p.tile_ends[tile] = sum;
  return sum - ends;
}

// The single pass over one warp's tile: a coalesced striped load of its keys and values into
// the warp's shared memory, where lane l reads the elements l * kLaneItems ... (blocked); each
// lane folds its pairs and the warp scans the lanes' folds by shuffles in a fixed tree; the
// tile's fold goes to the look-back, whose exclusive fold each lane then folds its own elements
// from, left to right, reading them from shared memory again (so that nothing but the lane's
// heads and folds stays in registers across the look-back). No block barrier after the tile
// is taken: each warp runs on its own. Every association (lane, warp tree, tiles from the
// left) is fixed for a shard size. kFull: a tile with every element in the shard and one
// more after it (all but a shard's last tile), whose body has no bound checks (fewer than
// half the instructions a lane issues otherwise); the last tile takes the checked body.
// reduce_by_key's full tiles take one_pass_reduce_full_tile instead, which folds once.
template <int kMode, bool kFull>
__device__ __forceinline__ void one_pass_tile(const ByKeyParams& p, PassShared<PairOf<kMode == kByKeyReduce>>& shared,
                                              long long tile, int warp, int lane) {
  constexpr bool kReduce = kMode == kByKeyReduce;
  constexpr bool kExclusive = kMode == kByKeyExclusive;
  static_assert(!(kReduce && kFull), "reduce_by_key's full tiles take one_pass_reduce_full_tile");
  constexpr int kI = kLaneItems;
  using P = PairOf<kReduce>;
  const long long tile_start = tile * kPassTile;
  const int valid = kFull ? kPassTile : static_cast<int>(min(p.n - tile_start, static_cast<long long>(kPassTile)));
  const auto in_shard = [&](long long at) { return kFull || at < p.n; };
  const Key* shard_keys = static_cast<const Key*>(p.keys);
  WarpTile<Key>& key_tile = shared.keys[warp];
  WarpTile<Value>& value_tile = shared.values[warp];
  load_tile<kFull>(p, key_tile, value_tile, tile_start, valid, lane);
  // the keys either side of the tile, for the heads of its first and after its last element
  Key before_tile{}, after_tile{};
  if (lane == 0 && tile_start > 0) before_tile = shard_keys[tile_start - 1];
  if (lane == 31 && in_shard(tile_start + kPassTile)) after_tile = shard_keys[tile_start + kPassTile];
  __syncwarp();

  const long long first = tile_start + static_cast<long long>(lane) * kI;
  // whether the lane's item j is in the shard (an int against the tile's count, not a position:
  // nothing 64-bit stays live across the look-back for it)
  const int lane_valid = valid - lane * kI;
  const auto mine = [&](int j) { return kFull || j < lane_valid; };
  Key keys[kI];
#pragma unroll
  for (int j = 0; j < kI; ++j) keys[j] = key_tile.blocked(lane, j);
  const unsigned heads = lane_heads<kFull>(p, keys, first, lane, before_tile, after_tile);

  // the lane's fold, then the lanes' inclusive folds across the warp
  P lane_fold = empty_pair<P>();
  if constexpr (kFull) {
    lane_fold = element_pair<P>(p, kExclusive, heads & 1u, keys[0], value_tile.blocked(lane, 0));
#pragma unroll
    for (int j = 1; j < kI; ++j) fold_item<kExclusive>(p, lane_fold, (heads >> j) & 1u, keys[j], value_tile.blocked(lane, j));
  } else {
#pragma unroll
    for (int j = 0; j < kI; ++j) {
      if (mine(j)) {
        lane_fold = Segmented()(
            lane_fold, element_pair<P>(p, kExclusive, (heads >> j) & 1u, keys[j], value_tile.blocked(lane, j)));
      }
    }
  }
  const Prefixes<P> before = warp_prefixes<kReduce, kFull>(p, shared, tile, warp, lane, lane_fold);
  P running = Segmented()(before.tile, before.lane);

  if constexpr (kReduce) {
    // the run ends in the lanes before (the lane's first output) and in the tile (lane 31's)
    // (no item past the shard's end has bit j + 1)
    const int rank = outputs_before(p, tile, lane, __popc(heads >> 1));
    Key* out_keys = static_cast<Key*>(p.tile_keys);
    Value* out_values = static_cast<Value*>(p.tile_values);
    long long at = tile_start + rank;
#pragma unroll
    for (int j = 0; j < kI; ++j) {
      if (mine(j)) {
        running = Segmented()(running, element_pair<P>(p, false, (heads >> j) & 1u, key_tile.blocked(lane, j),
                                                       value_tile.blocked(lane, j)));
        if ((heads >> (j + 1)) & 1u) {  // the run's first key (the pair's) and its fold
          out_keys[at] = running.key;
          out_values[at] = running.value;
          ++at;
        }
      }
    }
  } else {
    const Value init = *reinterpret_cast<const Value*>(p.init);
#pragma unroll
    for (int j = 0; j < kI; ++j) {
      if (mine(j)) {
        const bool head = (heads >> j) & 1u;
        Value& slot = value_tile.blocked(lane, j);  // the lane's own: it takes the result
        const Value before = running.value;
        if (kFull && j > 0) {
          fold_item<kExclusive>(p, running, head, Key{}, slot);
        } else {
          running = Segmented()(running, element_pair<P>(p, kExclusive, head, Key{}, slot));
        }
        if constexpr (kExclusive) {
          slot = head ? init : before;  // a run's head: init (its pair held op(init, value))
        } else {
          slot = running.value;
        }
      }
    }
    __syncwarp();  // every lane's results are in the tile
    Value values[kI];
    value_tile.get_striped(lane, values);
    Value* out = static_cast<Value*>(p.out_values) + tile_start;
    if (valid == kPassTile) {
      cub::StoreDirectStriped<32>(lane, out, values);
    } else {
      cub::StoreDirectStriped<32>(lane, out, values, valid);
    }
  }
}

// reduce_by_key's full tiles (one_pass_tile's kFull body for the other modes), one fold of the
// lane's items instead of two. A run that both starts (a head) and ends in the lane's items is
// complete there: its first key and fold are written as the fold passes its end, before the
// look-back, at the tile's output position tile_start + rank + (the outputs before it in the
// lane), which the heads alone give. Only the lane's first run, where item 0 is no head,
// needs what comes before the lane: its fold over items 0 .. e (e: the lane's first run end)
// waits for the look-back in registers (values over 16 bytes: in the warp's shared memory),
// with whether there is one (the run may also go on past the lane, and then the lanes after
// hold its end); its output, the prefix's first key and op(prefix, that fold), is written
// after it, at tile_start + rank. Nothing else is read again: no second pass. So that run's
// values associate as prefix . (v0 . v1 ... ve), not ((prefix . v0) . v1) ... as the scans and
// the checked tile fold them; the association is still fixed by the shard's size (where the
// lanes and tiles fall), so the outputs are the same bits run after run. The lane's fold that
// the warp scans and the look-back publishes is the same as the other bodies' (items left to
// right, the same association). The keys and values are loaded striped into the warp's
// shared-memory tiles (16-byte vectors where both arrays are aligned), as the scans load them,
// and read from there blocked into registers once. (Loading each lane's share straight into
// registers as blocked 16-byte vectors, half of each sector a load instruction, was slower on
// an H100: 1.239 against 1.201 ms for 2^28 int32 keys in runs of 64.)
//
// The next full tile `tile`'s keys, values and the keys either side of it, copied into the
// warp's (swizzled) tiles and edges; the warp's one group of copies in flight.
template <class K = Key, class V = Value>  // templates: instantiated only where a module prefetches
__device__ __forceinline__ void prefetch_tile(const ByKeyParams& p, PassShared<Pair>& shared, long long tile, int warp,
                                              int lane) {
  const long long tile_start = tile * kPassTile;
  const Key* shard_keys = static_cast<const Key*>(p.keys);
  // 16-byte copies where both arrays are 16-byte aligned, else 4-byte ones (shards off the
  // vector alignment; elements of 4 bytes or more are 4-byte aligned)
  const bool vectors = vectors_aligned(p);
  SwizzledTile<K>::prefetch(shared.keys[warp], lane, shard_keys + tile_start, vectors);
  SwizzledTile<V>::prefetch(shared.values[warp], lane, static_cast<const Value*>(p.values) + tile_start, vectors);
  if (lane == 0 && tile_start > 0) copy_async<sizeof(Key)>(&shared.edges[warp][0], shard_keys + tile_start - 1);
  if (lane == 31) copy_async<sizeof(Key)>(&shared.edges[warp][1], shard_keys + tile_start + kPassTile);
  copy_async_commit();
}

// kPrefetched: the tile was copied in by prefetch_tile (swizzled, with its edges); once the
// lanes have read it into registers, the warp's tile of the next group (`next`) is copied
// into the same shared memory where it is a full tile: this body reads its tile no more
// (values of at most 16 bytes: no stash). Otherwise the striped loads (`next` unused). (K, V:
// Key and Value as template parameters, so that a module that cannot prefetch never
// instantiates SwizzledTile for its types.)
template <bool kPrefetched, class K = Key, class V = Value>
__device__ __forceinline__ void one_pass_reduce_full_tile(const ByKeyParams& p, PassShared<Pair>& shared,
                                                          long long tile, int warp, int lane, long long next) {
  constexpr int kI = kLaneItems;
  const long long tile_start = tile * kPassTile;
  const long long first = tile_start + static_cast<long long>(lane) * kI;
  const Key* shard_keys = static_cast<const Key*>(p.keys);
  Key keys[kI];
  Value values[kI];
  WarpTile<Key>& key_tile = shared.keys[warp];
  WarpTile<Value>& value_tile = shared.values[warp];
  // the keys either side of the tile (a full tile has an element after it in the shard)
  Key before_tile{}, after_tile{};
  if constexpr (kPrefetched) {
    copy_async_wait();
    __syncwarp();  // every lane's copies are in
    SwizzledTile<K>::blocked(key_tile, lane, keys);
    SwizzledTile<V>::blocked(value_tile, lane, values);
    if (lane == 0 && tile_start > 0) before_tile = shared.edges[warp][0];
    if (lane == 31) after_tile = shared.edges[warp][1];
    __syncwarp();  // every lane has read the tile before the next one's copies land in it
    if (next < p.num_tiles && (next + 1) * kPassTile < p.n) {
      prefetch_tile<K, V>(p, shared, next, warp, lane);
    }
  } else {
    load_tile<true>(p, key_tile, value_tile, tile_start, kPassTile, lane);
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kI; ++j) {
      keys[j] = key_tile.blocked(lane, j);
      values[j] = value_tile.blocked(lane, j);
    }
    if (lane == 0 && tile_start > 0) before_tile = shard_keys[tile_start - 1];
    if (lane == 31) after_tile = shard_keys[tile_start + kPassTile];
  }
  const unsigned heads = lane_heads<true>(p, keys, first, lane, before_tile, after_tile);

  // the run ends (bit j: item j ends its run) in the lanes before (the lane's first output)
  // and in the tile (lane 31's)
  const unsigned ends = heads >> 1;
  const int rank = outputs_before(p, tile, lane, __popc(ends));

  // The lane's fold, writing each run that starts and ends in the lane: those are the run
  // ends after a head, all of them where item 0 is one, else all but the first (`complete`);
  // the first then ends the run that came in, whose fold is kept (`partial`). The lane's
  // outputs are its rank's onwards, the partial run's first.
  const unsigned complete = (heads & 1u) ? ends : ends & (ends - 1u);
  const bool partial = complete != ends;
  Key* const out_keys = static_cast<Key*>(p.tile_keys) + (tile_start + rank);
  Value* const out_values = static_cast<Value*>(p.tile_values) + (tile_start + rank);
  int written = partial ? 1 : 0;
  Pair lane_fold = element_pair<Pair>(p, false, heads & 1u, keys[0], values[0]);
  Value partial_value = values[0];
#pragma unroll
  for (int j = 0; j < kI; ++j) {
    if (j > 0) fold_item<false>(p, lane_fold, (heads >> j) & 1u, keys[j], values[j]);
    if ((ends >> j) & 1u) {  // rare where runs are long: one test an item on the way
      if ((complete >> j) & 1u) {  // the run's first key (its head's) and its fold
        out_keys[written] = lane_fold.key;
        out_values[written] = lane_fold.value;
        ++written;
      } else {
        partial_value = lane_fold.value;
      }
    }
  }

  // Values wider than 16 bytes wait for the look-back in the warp's value tile (the lane's
  // slot; every lane has read its items from it), where registers would spill.
  constexpr bool kStash = sizeof(Value) > 16;
  Value& stash = shared.values[warp].items[lane];
  if constexpr (kStash) {
    __syncwarp();
    if (partial) stash = partial_value;
  }

  const Prefixes<Pair> before = warp_prefixes<true, true>(p, shared, tile, warp, lane, lane_fold);

  // The run that came into the lane: Segmented's combine of what comes before the lane with
  // the partial run's pair (valid, no head), so the prefix's first key and op(prefix, partial);
  // where nothing comes before it (the shard's first element continues the shard before's
  // run, which the fix-up after the gather joins) the pair's own, item 0's key, read again.
  if (partial) {
    if constexpr (kStash) partial_value = stash;
    Pair run = Segmented()(before.tile, before.lane);
    if (run.flags & kValid) {
      Value folded;
      csj_op(&run.value, &partial_value, &folded);
      run.value = folded;
    } else {
      run.key = shard_keys[first];
      run.value = partial_value;
    }
    out_keys[0] = run.key;
    out_values[0] = run.value;
  }
}

// A shard's last tile: the checked body, called (not inlined) so that the full tiles' body
// keeps its registers (both inlined, reduce_by_key's spilled under the 64-register bound).
template <int kMode>
__device__ __noinline__ void one_pass_last_tile(const ByKeyParams& p,
                                                PassShared<PairOf<kMode == kByKeyReduce>>& shared, long long tile,
                                                int warp, int lane) {
  one_pass_tile<kMode, false>(p, shared, tile, warp, lane);
}

// The scans' single pass: a block takes kByKeyPassWarps consecutive tiles from the counter, a
// warp each, and each warp runs the full tiles' body or, for a shard's last tile, the checked
// one.
template <int kMode>
__device__ __forceinline__ void one_pass_grouped(const ByKeyParams& p) {
  static_assert(kMode != kByKeyReduce, "reduce_by_key's single pass is persistent (one_pass_persistent)");
  __shared__ PassShared<PairOf<kMode == kByKeyReduce>> shared;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  if (threadIdx.x == 0) shared.first_tile = static_cast<long long>(atomicAdd(p.tile_counter, 1ULL)) * kByKeyPassWarps;
  __syncthreads();
  const long long tile = shared.first_tile + warp;
  if (tile >= p.num_tiles) return;
  if ((tile + 1) * kPassTile < p.n) {
    one_pass_tile<kMode, true>(p, shared, tile, warp, lane);
  } else {
    one_pass_last_tile<kMode>(p, shared, tile, warp, lane);
  }
}

// reduce_by_key's single pass, persistent: a block of any grid size loops over groups of
// kByKeyPassWarps consecutive tiles taken from the counter, a warp a tile of each group, and
// claims its next group a turn ahead, so that each warp copies its next tile in
// (prefetch_tile, cp.async) while it works on the current one (one shared buffer a warp: the
// reduce body reads its tile into registers at once). Thread 0 claims, and the barrier each
// turn needs anyway publishes the claim (claims[turn]; the other slot was read before the
// last barrier). No deadlock: a warp takes its tiles in increasing order and every claimed
// group is processed by a resident block (a block claims only while it runs, and leaves only
// once its claimed group is past the shard). Take the smallest tile m that has not published
// its first record (its aggregate; a look-back group's last tile: its local fold, after waiting
// for its group's aggregates alone): its block holds it in a group after all of its groups
// below m (a block may briefly hold three: thread 0 claims while the other warps finish the
// group before), whose tiles have all published, as every tile below m has; so their
// look-backs (which wait only for earlier tiles' first records) end, the turns' barriers pass
// and m is processed (a tile publishes its aggregate before it waits). The shard's last group (its last
// tile: the checked body, not prefetched) is a block's last turn, taken after the loop with
// no claim and no barrier, as the grouped pass takes a group (which keeps the call's
// registers: the checked body spilled when called from inside the loop). Any grid size is
// correct: blocks beyond the groups claim one past the shard and leave; the host launches
// min(groups, resident blocks) for speed. Nothing but the turn (in shared memory, each
// thread's own) is carried across a tile's body: the 64-register bound holds with no stack.
template <class K = Key, class V = Value>  // K, V: as one_pass_reduce_full_tile's
__device__ __forceinline__ void one_pass_persistent(const ByKeyParams& p) {
  __shared__ PassShared<Pair> shared;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  // values over 16 bytes keep the stash in their tile; 12-, 24-, 32-byte elements are not
  // whole 16-byte chunks: those modules loop without the prefetch
  constexpr bool kPrefetch = WarpTile<Key>::kVectors && WarpTile<Value>::kVectors && sizeof(Value) <= 16;
  // the first tile of the group a turn processes, read from its slot when needed (nothing is
  // carried across a tile's body in registers)
  const auto first_of = [&](int slot) { return *static_cast<volatile long long*>(&shared.claims[slot]); };
  volatile unsigned char& turn = shared.turns[threadIdx.x];  // the thread's own: no barrier
  turn = 0;
  if (threadIdx.x == 0) shared.claims[0] = static_cast<long long>(atomicAdd(p.tile_counter, 1ULL)) * kByKeyPassWarps;
  __syncthreads();
  if (first_of(0) >= p.num_tiles) return;
  if constexpr (kPrefetch) {
    const long long tile = first_of(0) + warp;
    if (tile < p.num_tiles && (tile + 1) * kPassTile < p.n) {
      prefetch_tile<K, V>(p, shared, tile, warp, lane);
    }
  }
  // every group but the shard's last, whose full tiles prefetch the warp's next ones
  while (first_of(turn) + kByKeyPassWarps < p.num_tiles) {
    const long long tile = first_of(turn) + warp;  // full: the shard's last tile is in the last group
    turn ^= 1;
    if (threadIdx.x == 0) shared.claims[turn] = static_cast<long long>(atomicAdd(p.tile_counter, 1ULL)) * kByKeyPassWarps;
    __syncthreads();  // the claim is in; every warp has read claims[turn ^ 1]'s group
    // prefetched by the warp's tile before it, or before the loop
    one_pass_reduce_full_tile<kPrefetch>(p, shared, tile, warp, lane, first_of(turn) + warp);
    if (first_of(turn) >= p.num_tiles) return;
  }
  // the shard's last group, the block's last: as without the prefetch, but for its full tiles'
  // loads (prefetched, next: none)
  const long long tile = first_of(turn) + warp;
  if (tile >= p.num_tiles) return;
  if ((tile + 1) * kPassTile < p.n) {
    one_pass_reduce_full_tile<kPrefetch>(p, shared, tile, warp, lane, p.num_tiles);
  } else {
    one_pass_last_tile<kByKeyReduce>(p, shared, tile, warp, lane);
  }
}

template <int kMode>
__device__ __forceinline__ void one_pass(const ByKeyParams& p) {
  if constexpr (kMode == kByKeyReduce) {
    one_pass_persistent(p);
  } else {
    one_pass_grouped<kMode>(p);
  }
}

// After a shard's single pass, which began with no carry: what runs into it from the shards
// before (*p.carry, their totals folded in place order) applied to the elements of its first
// run, out = op(carry, out), for the scans; the association stays fixed (the carry, then the
// shard's own left-to-right fold). Tile t holds some of the first run only when no tile before
// it has a head (head_through(t - 1) says, from the records), so the blocks stop at the first
// tile with one.
struct Earliest {
  __device__ __forceinline__ long long operator()(long long a, long long b) const { return a < b ? a : b; }
};

template <bool kExclusive>
__device__ __forceinline__ void fix_first_run(const ByKeyParams& p) {
  using R = PairOf<false>;
  using ReduceFirst = cub::BlockReduce<long long, kByKeyBlock>;
  __shared__ typename ReduceFirst::TempStorage temp;
  __shared__ long long first_head;
  const Pair carry = read_record(*p.carry).pair;
  if (!(carry.flags & kValid)) return;
  const int t = static_cast<int>(threadIdx.x);
  const Key* keys = static_cast<const Key*>(p.keys);
  Value* out = static_cast<Value*>(p.out_values);
  for (long long tile = blockIdx.x; tile < p.num_tiles; tile += gridDim.x) {
    if (tile > 0 && head_through<R>(p, tile - 1)) return;
    const long long tile_start = tile * kPassTile;
    const long long end = min(p.n, tile_start + kPassTile);
    long long mine = end;  // the tile's first head, block-striped
    for (long long at = tile_start + t; at < end; at += kByKeyBlock) {
      const bool head = at == 0 ? p.prev_key == nullptr || !same_run(*static_cast<const Key*>(p.prev_key), keys[0])
                                : !same_run(keys[at - 1], keys[at]);
      if (head && at < mine) mine = at;
    }
    const long long block_first = ReduceFirst(temp).Reduce(mine, Earliest());
    if (t == 0) first_head = block_first;
    __syncthreads();
    const long long stop = first_head;
    for (long long at = tile_start + t; at < stop; at += kByKeyBlock) {  // coalesced
      if (kExclusive && at == 0) {
        out[at] = carry.value;  // the pass had nothing before it
      } else {
        Value fixed;
        csj_op(&carry.value, &out[at], &fixed);
        out[at] = fixed;
      }
    }
    if (stop < end) return;  // the first run ends in this tile
    __syncthreads();
  }
}

}  // namespace

#if defined(CSJ_BY_KEY_INCLUSIVE)
extern "C" __global__ void __launch_bounds__(kByKeyBlock)
    csj_by_key_one_pass_fix_inclusive(const __grid_constant__ ByKeyParams p) {
  fix_first_run<false>(p);
}
#endif

#if defined(CSJ_BY_KEY_EXCLUSIVE)
extern "C" __global__ void __launch_bounds__(kByKeyBlock)
    csj_by_key_one_pass_fix_exclusive(const __grid_constant__ ByKeyParams p) {
  fix_first_run<true>(p);
}
#endif

// reduce_by_key's counterpart, one thread: the run that comes in from the shards before and
// ends here is the shard's first output; it takes the carry's first key and op(carry, its fold
// here). (A shard where no run ends has no output; its total already passed the run on.)
#if defined(CSJ_BY_KEY_REDUCE)
extern "C" __global__ void csj_by_key_one_pass_fix_reduce(const __grid_constant__ ByKeyParams p) {
  if (threadIdx.x != 0 || blockIdx.x != 0 || *p.run_count == 0 || p.prev_key == nullptr) return;
  const Pair carry = read_record(*p.carry).pair;
  if (!(carry.flags & kValid) || !same_run(*static_cast<const Key*>(p.prev_key), *static_cast<const Key*>(p.keys))) {
    return;
  }
  Key* out_keys = static_cast<Key*>(p.out_keys);
  Value* out_values = static_cast<Value*>(p.out_values);
  out_keys[0] = carry.key;
  Value fixed;
  csj_op(&carry.value, &out_values[0], &fixed);
  out_values[0] = fixed;
}
#endif

// reduce_by_key after its single pass and the scan of the tiles' counts: each tile's outputs
// from its place in the scratch to their place in the result. A warp takes kGatherTiles
// consecutive tiles, whose outputs are consecutive in the result, and copies them in rounds
// of 32 x kUnroll: each lane finds the tiles of its kUnroll outputs by binary searches of the
// tiles' first outputs (in shared memory) and loads all of them before it stores any, so a
// lane has kUnroll loads in flight. (A warp a tile, each lane copying its tile's every 32nd
// output, took 112 us under ncu for the 2^22 outputs of 2^28 int32 keys in runs of 64 on an
// H100, 168 for runs of ~16: a warp had its tile's few loads in flight, behind the two reads
// of the tile's place; 32 tiles a warp with one load a lane at a time lost for runs of ~16.)
constexpr int kGatherTiles = kByKeyGatherTiles;
static_assert(kGatherTiles > 0 && kGatherTiles <= 32 && (kGatherTiles & (kGatherTiles - 1)) == 0,
              "the gather's binary search takes a power of two of tiles, a lane each at most");

#if defined(CSJ_BY_KEY_REDUCE)
extern "C" __global__ void __launch_bounds__(kByKeyBlock)
    csj_by_key_one_pass_gather(const __grid_constant__ ByKeyParams p) {
  constexpr int kUnroll = sizeof(Key) + sizeof(Value) <= 16 ? 8 : 4;
  __shared__ long long starts[kByKeyPassWarps][kGatherTiles + 1];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const long long first = (static_cast<long long>(blockIdx.x) * kByKeyPassWarps + warp) * kGatherTiles;
  if (first >= p.num_tiles) return;
  const int tiles = static_cast<int>(min(static_cast<long long>(kGatherTiles), p.num_tiles - first));
  long long* const start = starts[warp];  // tile first + j's first output, j = 0 .. tiles
  if (lane < tiles) start[lane] = p.tile_ends[first + lane];
  if (lane == 0) start[tiles] = p.tile_ends[first + tiles];  // tile_ends holds num_tiles + 1
  __syncwarp();
  const long long begin = start[0];
  const long long count = start[tiles] - begin;
  const Key* tile_keys = static_cast<const Key*>(p.tile_keys);
  const Value* tile_values = static_cast<const Value*>(p.tile_values);
  Key* const out_keys = static_cast<Key*>(p.out_keys) + begin;
  Value* const out_values = static_cast<Value*>(p.out_values) + begin;
  for (long long round = 0; round < count; round += 32 * kUnroll) {
    Key keys[kUnroll];
    Value values[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const long long i = round + lane + 32 * u;
      if (i < count) {
        const long long output = begin + i;
        int j = 0;  // the last tile whose first output is at or before this one (its outputs hold it)
#pragma unroll
        for (int step = kGatherTiles / 2; step > 0; step /= 2) {
          if (j + step < tiles && start[j + step] <= output) j += step;
        }
        const long long from = (first + j) * kPassTile + (output - start[j]);
        keys[u] = tile_keys[from];
        values[u] = tile_values[from];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const long long i = round + lane + 32 * u;
      if (i < count) {
        out_keys[i] = keys[u];
        out_values[i] = values[u];
      }
    }
  }
}
#endif

#if defined(CSJ_BY_KEY_INCLUSIVE)
extern "C" __global__ void __launch_bounds__(kByKeyBlock, kPassBlocks)
    csj_by_key_one_pass_inclusive(const __grid_constant__ ByKeyParams p) {
  one_pass<kByKeyInclusive>(p);
}
#endif

#if defined(CSJ_BY_KEY_EXCLUSIVE)
extern "C" __global__ void __launch_bounds__(kByKeyBlock, kPassBlocks)
    csj_by_key_one_pass_exclusive(const __grid_constant__ ByKeyParams p) {
  one_pass<kByKeyExclusive>(p);
}
#endif

#if defined(CSJ_BY_KEY_REDUCE)
extern "C" __global__ void __launch_bounds__(kByKeyBlock, kPassBlocks)
    csj_by_key_one_pass_reduce(const __grid_constant__ ByKeyParams p) {
  one_pass<kByKeyReduce>(p);
}
#endif

// The run heads as a selection: class 0 where an element starts a run of equal keys (the
// shard's first element unless the key before it, SelectParams::before, shares its run),
// class 1 elsewhere; the payloads (the keys, the values) are compacted to their heads. One
// read of the keys for the counts and one for the scatter, where a flags array would be
// written and read twice more.
__device__ __forceinline__ int head_class(const SelectParams& p, const Key* keys, long long local) {
  const Key key = keys[local];
  if (local == 0) return p.before == nullptr || !same_run(*static_cast<const Key*>(p.before), key) ? 0 : 1;
  return same_run(keys[local - 1], key) ? 1 : 0;
}

#if defined(CSJ_BY_KEY_HEADS)
extern "C" __global__ void __launch_bounds__(kSelectBlock)
    csj_by_key_heads_count(const __grid_constant__ SelectParams p) {
  const Key* keys = static_cast<const Key*>(p.in);
  count_tile<kSelectPayloadItems>(p, [&](long long local) { return head_class(p, keys, local); });
}

extern "C" __global__ void __launch_bounds__(kSelectBlock)
    csj_by_key_heads_scatter(const __grid_constant__ SelectParams p) {
  const Key* keys = static_cast<const Key*>(p.in);
  scatter_payloads(p, [&](long long local) { return head_class(p, keys, local); });
}
#endif
