// Order-preserving, deterministic reductions and scans (operators need be associative, not
// commutative, and every fold has a fixed association). One source for both instantiations:
// run-time linked operators (reduce_jit.cu) and built-in sum / min / max (reduce_builtin.cu).
//
// Operators follow the pointer convention:
//   Map: map(const In* value, long long global_index, Acc* out)   (input -> accumulator)
//   Op:  op(const Acc* a, const Acc* b, Acc* out)                  (a before b)
// Accumulators travel as raw 4- or 8-byte words.
//
// A scan across places is reduce-then-scan at every level: pass 1 (Reduction with prefixes)
// folds each block's chunk and gives each block its exclusive prefix; pass 2 (Scan) scans each
// chunk, tile by tile, seeded with it. (A barrier-free warp-level second pass measured slower.)
// A scan of one place with an accumulator of 4 or 8 bytes reads its input once (OnePassScan):
// a decoupled look-back whose fold over the tiles is a strict left fold, so the bits do not
// depend on which published prefix a look-back happened to find (CUB's look-back folds a window
// as a tree whose shape depends on timing).
#pragma once

#include <cub/block/block_exchange.cuh>
#include <cub/block/block_load.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/block/block_store.cuh>

#include "async_copy.cuh"
#include "params.hpp"
#include "transform.cuh"  // Word<>, aligned16

namespace csj::kernels {

template <class Map, class = void>
struct UsesValue : cuda::std::false_type {};
template <class Map>
struct UsesValue<Map, cuda::std::void_t<decltype(Map::kUsesValue)>>
    : cuda::std::bool_constant<Map::kUsesValue> {};

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
    const Acc other = shuffle_down(value, offset);
    if ((lane & (2 * offset - 1)) == 0 && lane + offset < valid) value = Combine<Op, Acc>()(value, other);
  }
  return value;
}

// The part [begin, end) of a block's chunk that warp `warp` owns: contiguous, in warp order,
// each starting on a 16-byte boundary of the input. Both scan passes cut chunks this way.
template <int InSize>
__device__ __forceinline__ void warp_part(long long block_begin, long long block_end, int warp,
                                          long long& begin, long long& end) {
  constexpr long long kAlign = 16 / InSize;
  long long part = (block_end - block_begin + kReduceWarps - 1) / kReduceWarps;
  part = (part + kAlign - 1) / kAlign * kAlign;
  begin = min(block_begin + warp * part, block_end);
  end = min(begin + part, block_end);
}

template <class Map, class Op, int InSize, int AccSize>
struct Reduction {
  using In = typename Word<InSize>::type;
  using Acc = typename Word<AccSize>::type;
  static constexpr int kLaneItems = reduce_lane_items(InSize);  // per lane per step
  static constexpr int kVectorItems = 16 / InSize;                // elements per 16-byte load
  static constexpr int kVectors = kLaneItems / kVectorItems;
  static constexpr long long kWarpTile = 32LL * kLaneItems;

  // Block tiles: the block's warps read one contiguous tile together (warp w its w-th
  // part), so a block streams through one region of memory as CUB's reductions do. Each
  // warp's part of each tile waits in shared memory, and every kWindow tiles warp 0 folds
  // the window in (tile, warp) order: element order, whatever the operator.
  static constexpr long long kBlockTile = kReduceWarps * kWarpTile;
  static constexpr int kWindow = 16;

  // Record accumulators (tuples) are costly to move between lanes (one shuffle per word).
  // Their warps pass each step's vectors through shared memory so that every lane holds a
  // contiguous run of kLaneItems elements, fold the run in the lane and the 32 runs once
  // across the warp (instead of once per vector). The loads stay coalesced; one padding
  // vector per eight keeps both the striped writes and the run reads free of bank conflicts.
  static constexpr bool kLaneRuns = AccSize > 8;
  static_assert(kVectors == 4, "the staging layout assumes four 16-byte vectors per lane");
  static constexpr int kStageVectors = 32 * kVectors + 32 * kVectors / 8;
  __device__ __forceinline__ static int stage_slot(int vector) { return vector + vector / 8; }

  using BlockScanT = cub::BlockScan<Acc, kReduceBlock, cub::BLOCK_SCAN_WARP_SCANS>;

  struct TempStorage {
    typename BlockScanT::TempStorage scan;
    Acc warp_values[kReduceWarps];
    int warp_valid[kReduceWarps];
    Acc parts[kWindow * kReduceWarps];
    uint4 stage[kLaneRuns ? kReduceWarps * kStageVectors : 1];
    bool is_last;
  };

  // Maps that declare `kUsesValue` also read the launch's runtime value (count's target).
  // The range folds below take any parameter block with the reduce's `in`, `index_base` and
  // `map_value` (ReduceParams, SegmentedParams), so the segmented kernel reads its own
  // grid-constant block rather than copying it into a ReduceParams first.
  template <class Params>
  __device__ __forceinline__ static Acc map(const Params& p, const In& value, long long index) {
    Acc out;
    if constexpr (UsesValue<Map>::value) {
      Map()(&value, index, &out, p.map_value);
    } else {
      Map()(&value, index, &out);
    }
    return out;
  }

  // A lane's fold of one 16-byte vector's elements, in order; `index` is its first element's.
  template <class Params>
  __device__ __forceinline__ static Acc fold_vector(const Params& p, const uint4& vector, long long index) {
    const In* items = reinterpret_cast<const In*>(&vector);
    Acc acc = map(p, items[0], index);
#pragma unroll
    for (int i = 1; i < kVectorItems; ++i) acc = Combine<Op, Acc>()(acc, map(p, items[i], index + i));
    return acc;
  }

  // Fold of [begin, end) by one warp, in order; valid in lane 0 when the range is non-empty.
  // Loads are warp-striped 16-byte vectors (coalesced); each vector's elements are folded by
  // its lane, then the 32 lanes' folds in lane order, so the association is fixed.
  template <class Params>
  __device__ __forceinline__ static Acc warp_range(const Params& p, long long begin, long long end) {
    const int lane = threadIdx.x & 31;
    const In* data = static_cast<const In*>(p.in);
    const bool aligned = aligned16(data + begin);
    Acc acc{};
    bool have = false;
    long long tile = begin;
    if (aligned && tile + kWarpTile <= end) {
      // double-buffered: the next step's loads are in flight while this one is folded
      const uint4* vectors = reinterpret_cast<const uint4*>(data + tile);
      uint4 loaded[kVectors];
#pragma unroll
      for (int j = 0; j < kVectors; ++j) loaded[j] = vectors[j * 32 + lane];
      for (; tile + kWarpTile <= end; tile += kWarpTile) {
        uint4 current[kVectors];
#pragma unroll
        for (int j = 0; j < kVectors; ++j) current[j] = loaded[j];
        if (tile + 2 * kWarpTile <= end) {
          const uint4* following = reinterpret_cast<const uint4*>(data + tile + kWarpTile);
#pragma unroll
          for (int j = 0; j < kVectors; ++j) loaded[j] = following[j * 32 + lane];
        }
#pragma unroll
        for (int j = 0; j < kVectors; ++j) {
          const long long index = p.index_base + tile + (static_cast<long long>(j) * 32 + lane) * kVectorItems;
          const Acc part = warp_fold<Op, Acc>(fold_vector(p, current[j], index), 32);
          acc = have ? Combine<Op, Acc>()(acc, part) : part;
          have = true;
        }
      }
    }
    if (aligned && tile < end) {
      // The rest, under one warp tile (a small reduce's whole range): its vectors are loaded
      // at once, then folded a step of 32 vectors at a time, a partial last vector element by
      // element. One load round trip, not one per 32 elements.
      const long long rest = end - tile;
      const uint4* vectors = reinterpret_cast<const uint4*>(data + tile);
      uint4 loaded[kVectors];
#pragma unroll
      for (int j = 0; j < kVectors; ++j) {
        const long long ends = (static_cast<long long>(j) * 32 + lane + 1) * kVectorItems;  // where it ends
        if (ends <= rest) loaded[j] = vectors[j * 32 + lane];
      }
#pragma unroll
      for (int j = 0; j < kVectors; ++j) {
        const long long step = static_cast<long long>(j) * 32 * kVectorItems;
        if (step >= rest) break;
        const long long mine = step + static_cast<long long>(lane) * kVectorItems;
        const long long lanes = (rest - step + kVectorItems - 1) / kVectorItems;  // lanes holding elements
        const int valid = lanes >= 32 ? 32 : static_cast<int>(lanes);
        const long long index = p.index_base + tile + mine;
        Acc value{};
        if (mine + kVectorItems <= rest) {  // fold_vector written out: called here, it reschedules
          // the 32-byte record kernels (identical results, other SASS, not measured)
          const In* items = reinterpret_cast<const In*>(&loaded[j]);
          value = map(p, items[0], index);
#pragma unroll
          for (int i = 1; i < kVectorItems; ++i) value = Combine<Op, Acc>()(value, map(p, items[i], index + i));
        } else if (mine < rest) {
          value = map(p, data[tile + mine], index);
          for (long long i = 1; mine + i < rest; ++i) {
            value = Combine<Op, Acc>()(value, map(p, data[tile + mine + i], index + i));
          }
        }
        const Acc part = warp_fold<Op, Acc>(value, valid);
        acc = have ? Combine<Op, Acc>()(acc, part) : part;
        have = true;
      }
      tile = end;
    }
    for (; tile < end; tile += 32) {  // an unaligned range, one element per lane
      const long long index = tile + lane;
      const int valid = end - tile >= 32 ? 32 : static_cast<int>(end - tile);
      Acc value{};
      if (index < end) value = map(p, data[index], p.index_base + index);
      const Acc part = warp_fold<Op, Acc>(value, valid);
      acc = have ? Combine<Op, Acc>()(acc, part) : part;
      have = true;
    }
    return acc;
  }

  // Loads one warp's kVectors 16-byte vectors of the block tile at `tile`.
  __device__ __forceinline__ static void load_part(const In* data, long long tile, int warp, int lane,
                                                   uint4 (&vectors)[kVectors]) {
    const uint4* part = reinterpret_cast<const uint4*>(data + tile + warp * kWarpTile);
#pragma unroll
    for (int j = 0; j < kVectors; ++j) vectors[j] = part[j * 32 + lane];
  }

  // Fold of one warp's part of a block tile, in element order; valid in lane 0.
  template <class Params>
  __device__ __forceinline__ static Acc fold_part(const Params& p, TempStorage& temp, long long tile,
                                                  int warp, int lane, const uint4 (&vectors)[kVectors]) {
    if constexpr (kLaneRuns) {
      uint4* stage = temp.stage + warp * kStageVectors;
#pragma unroll
      for (int j = 0; j < kVectors; ++j) stage[stage_slot(j * 32 + lane)] = vectors[j];
      __syncwarp();
      uint4 run[kVectors];
#pragma unroll
      for (int j = 0; j < kVectors; ++j) run[j] = stage[stage_slot(lane * kVectors + j)];
      __syncwarp();
      const long long first = p.index_base + tile + warp * kWarpTile + static_cast<long long>(lane) * kLaneItems;
      const In* items = reinterpret_cast<const In*>(run);
      Acc lane_acc = map(p, items[0], first);
#pragma unroll
      for (int i = 1; i < kLaneItems; ++i) lane_acc = Combine<Op, Acc>()(lane_acc, map(p, items[i], first + i));
      return warp_fold<Op, Acc>(lane_acc, 32);
    } else {
      Acc acc{};
#pragma unroll
      for (int j = 0; j < kVectors; ++j) {
        const long long index =
            p.index_base + tile + warp * kWarpTile + (static_cast<long long>(j) * 32 + lane) * kVectorItems;
        const Acc part = warp_fold<Op, Acc>(fold_vector(p, vectors[j], index), 32);
        acc = j == 0 ? part : Combine<Op, Acc>()(acc, part);
      }
      return acc;
    }
  }

  // Warp 0 folds the first `count` window parts in order into (acc, have) (lane 0's copy).
  __device__ __forceinline__ static void fold_window(TempStorage& temp, int count, int lane, Acc& acc, bool& have) {
    const int per_lane = (count + 31) / 32;
    const int first = lane * per_lane;
    const int last = min(first + per_lane, count);
    Acc value{};
    for (int k = first; k < last; ++k) value = k == first ? temp.parts[k] : Combine<Op, Acc>()(value, temp.parts[k]);
    const Acc window = warp_fold<Op, Acc>(value, (count + per_lane - 1) / per_lane);
    if (lane == 0) {
      acc = have ? Combine<Op, Acc>()(acc, window) : window;
      have = true;
    }
  }

  // The fold of [block_begin, block_end), valid in thread 0. Whole block tiles first (when
  // the data is 16-byte aligned), then the rest cut into one contiguous part per warp.
  // Called once per block: the last window's parts are not written again, so no barrier
  // follows its fold (a segment of one block tile pays one barrier, not two).
  template <class Params>
  __device__ __forceinline__ static Acc block_range(const Params& p, TempStorage& temp, long long block_begin,
                                                    long long block_end) {
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    const In* data = static_cast<const In*>(p.in);
    Acc acc{};
    bool have = false;
    long long tile = block_begin;
    if (aligned16(data + block_begin) && tile + kBlockTile <= block_end) {
      uint4 next[kVectors];
      load_part(data, tile, warp, lane, next);
      int slot = 0;
      for (; tile + kBlockTile <= block_end; tile += kBlockTile) {
        uint4 current[kVectors];
#pragma unroll
        for (int j = 0; j < kVectors; ++j) current[j] = next[j];
        if (tile + 2 * kBlockTile <= block_end) load_part(data, tile + kBlockTile, warp, lane, next);
        const Acc part = fold_part(p, temp, tile, warp, lane, current);
        if (lane == 0) temp.parts[slot * kReduceWarps + warp] = part;
        if (++slot == kWindow) {
          __syncthreads();
          if (warp == 0) fold_window(temp, kWindow * kReduceWarps, lane, acc, have);
          __syncthreads();
          slot = 0;
        }
      }
      if (slot > 0) {
        __syncthreads();
        if (warp == 0) fold_window(temp, slot * kReduceWarps, lane, acc, have);
      }
    }
    if (tile < block_end) {
      long long begin, end;
      warp_part<InSize>(tile, block_end, warp, begin, end);
      const Acc warp_total = warp_range(p, begin, end);
      if (lane == 0) {
        temp.warp_values[warp] = warp_total;
        temp.warp_valid[warp] = end > begin;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
#pragma unroll
        for (int w = 0; w < kReduceWarps; ++w) {
          if (!temp.warp_valid[w]) continue;
          acc = have ? Combine<Op, Acc>()(acc, temp.warp_values[w]) : temp.warp_values[w];
          have = true;
        }
      }
    }
    return acc;
  }

  __device__ static void run(const ReduceParams& p) {
    __shared__ TempStorage temp;
    const long long block_begin = static_cast<long long>(blockIdx.x) * p.chunk;
    const long long block_end = min(block_begin + p.chunk, p.n);
    const Acc block_total = block_range(p, temp, block_begin, block_end);

    if (gridDim.x == 1 && !p.prefixes && p.place_count <= 1) {
      // One block on one place (a small reduce): its total is the result, as fold_partials
      // would give for one partial, without the partial's round trip, the counter and the scan.
      if (threadIdx.x == 0) finish(p, block_total);
      return;
    }
    Acc* partials = static_cast<Acc*>(p.partials);
    if (threadIdx.x == 0) {
      partials[blockIdx.x] = block_total;
      __threadfence();
      temp.is_last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!temp.is_last) return;
    __threadfence();
    fold_partials(p, temp);
  }

  // The last block to finish folds every block's partial, in block order: each thread a
  // contiguous run of them (its loads all in flight at once), the runs scanned across the
  // block in thread order (a fixed association for a given grid). With prefixes (the first
  // pass of a scan), each block's exclusive prefix is written too. One thread folding the
  // partials alone waits out an L2 round trip per block: ~1000 of them on a full wave.
  __device__ static void fold_partials(const ReduceParams& p, TempStorage& temp) {
    constexpr int kMaxRun = AccSize > 8 ? 4 : 8;  // runs held in registers; longer ones reload
    const Acc* partials = static_cast<const Acc*>(p.partials);
    const int blocks = gridDim.x;
    const int per_thread = (blocks + kReduceBlock - 1) / kReduceBlock;
    const int runs = (blocks + per_thread - 1) / per_thread;  // threads with a non-empty run
    const int first = min(static_cast<int>(threadIdx.x) * per_thread, blocks);
    const int last = min(first + per_thread, blocks);
    Acc values[kMaxRun] = {};
#pragma unroll
    for (int i = 0; i < kMaxRun; ++i) {
      if (first + i < last) values[i] = load_cg(partials + first + i);
    }
    Acc run = values[0];
#pragma unroll
    for (int i = 1; i < kMaxRun; ++i) {
      if (first + i < last) run = Combine<Op, Acc>()(run, values[i]);
    }
    for (int b = first + kMaxRun; b < last; ++b) run = Combine<Op, Acc>()(run, load_cg(partials + b));
    Acc before;  // the runs of the threads before this one (undefined in thread 0)
    BlockScanT(temp.scan).ExclusiveScan(run, before, Combine<Op, Acc>());
    if (static_cast<int>(threadIdx.x) >= runs) return;
    const bool first_run = threadIdx.x == 0;
    if (p.prefixes) {  // prefixes[0] stays unset: the first block starts from the seed
      Acc* prefixes = static_cast<Acc*>(p.prefixes);
      Acc acc = before;
#pragma unroll
      for (int i = 0; i < kMaxRun; ++i) {
        if (first + i >= last) break;
        if (!first_run || i > 0) prefixes[first + i] = acc;
        acc = first_run && i == 0 ? values[0] : Combine<Op, Acc>()(acc, values[i]);
      }
      for (int b = first + kMaxRun; b < last; ++b) {
        prefixes[b] = acc;
        acc = Combine<Op, Acc>()(acc, load_cg(partials + b));
      }
    }
    if (static_cast<int>(threadIdx.x) != runs - 1) return;
    const Acc total = first_run ? run : Combine<Op, Acc>()(before, run);
    *p.counter = 0;
    if (p.place_count > 1) {
      combine_places(p, total);
      return;
    }
    // The host hands the slot on once it sees the result: the counter's reset (device
    // memory, next used by a kernel on this device) is visible on the device before that.
    if (p.handover) __threadfence();
    finish(p, total);
  }

  // One place's total, init applied: stored at `result`, or handed to the host word by word
  // with the call's ticket (ReduceParams::handover), each word one 8-byte store.
  __device__ __forceinline__ static void finish(const ReduceParams& p, const Acc& total) {
    const Acc value = with_init(p, total);
    if (!p.handover) {
      *static_cast<Acc*>(p.result) = value;
      return;
    }
    constexpr int kWords = handover_words(AccSize);
    unsigned int pieces[kWords] = {};
    memcpy(pieces, &value, AccSize);
    volatile unsigned long long* words = p.handover;
#pragma unroll
    for (int w = 0; w < kWords; ++w) words[w] = static_cast<unsigned long long>(p.ticket) << 32 | pieces[w];
  }

  // See ReduceParams::place_totals. The totals are read back in place order whatever the
  // order of arrival, so the result is deterministic.
  __device__ static void combine_places(const ReduceParams& p, const Acc& total) {
    Acc* totals = static_cast<Acc*>(p.place_totals);
    store_volatile(totals + p.place_index, total);
    __threadfence_system();
    if (atomicAdd_system(p.place_counter, 1u) != static_cast<unsigned int>(p.place_count - 1)) return;
    __threadfence_system();
    Acc acc = load_volatile<Acc>(totals);
    if (p.has_init) acc = Combine<Op, Acc>()(*reinterpret_cast<const Acc*>(p.init), acc);
    for (int k = 1; k < p.place_count; ++k) acc = Combine<Op, Acc>()(acc, load_volatile<Acc>(totals + k));
    store_volatile(p.final_result, acc);
    atomicExch_system(p.place_counter, 0u);
    __threadfence_system();
  }

  __device__ __forceinline__ static Acc with_init(const ReduceParams& p, const Acc& total) {
    return p.has_init ? Combine<Op, Acc>()(*reinterpret_cast<const Acc*>(p.init), total) : total;
  }
};

// Part `part` of `parts` of the positions' check (PositionsCheckParams' codes), by every thread
// of the block: its positions are read once, coalesced; only a violation costs an atomic (on
// shared memory). Thread 0 stores the part's verdict to host memory when the block is done.
__device__ __forceinline__ void check_positions_part(const long long* offsets, long long count, long long size,
                                                     int part, int parts, unsigned long long* verdicts) {
  __shared__ unsigned long long least;
  if (threadIdx.x == 0) least = kPositionsGood;
  __syncthreads();
  const long long stride = static_cast<long long>(parts) * blockDim.x;
  for (long long k = static_cast<long long>(part) * blockDim.x + threadIdx.x; k < count; k += stride) {
    const long long position = offsets[k];
    unsigned long long code = kPositionsGood;
    if (k > 0 && position < offsets[k - 1]) {
      code = static_cast<unsigned long long>(k);
    } else if (k == 0 && position < 0) {
      code = static_cast<unsigned long long>(count);
    } else if (k == count - 1 && position > size) {
      code = static_cast<unsigned long long>(count) + 1;
    }
    if (code != kPositionsGood) atomicMin(&least, code);
  }
  __syncthreads();
  if (threadIdx.x == 0) *static_cast<volatile unsigned long long*>(verdicts + part) = least;
}

// One accumulator per segment piece of a shard (SegmentedParams): a block folds its piece
// with Reduction::block_range (block tiles of 16-byte vectors, the reduce's association), or
// for short pieces each warp folds one with Reduction::warp_range. An empty piece costs its
// block (or warp) two loads of positions: it stores init (or, `bare`, nothing) and leaves.
// The first check_parts blocks check the positions first, when asked (SegmentedParams).
template <class Map, class Op, int InSize, int AccSize>
struct SegmentedReduction {
  using R = Reduction<Map, Op, InSize, AccSize>;
  using Acc = typename R::Acc;

  __device__ __forceinline__ static void bounds(const SegmentedParams& s, long long piece, long long& begin,
                                                long long& end) {
    begin = min(max(s.offsets[piece] - s.index_base, 0LL), s.n);
    end = min(max(s.offsets[piece + 1] - s.index_base, 0LL), s.n);
  }

  __device__ __forceinline__ static Acc finish(const SegmentedParams& s, long long piece, const Acc& folded) {
    if (s.bare || (s.head && piece == 0)) return folded;
    return Combine<Op, Acc>()(*reinterpret_cast<const Acc*>(s.init), folded);
  }

  __device__ static void run(const SegmentedParams& s) {
    __shared__ typename R::TempStorage temp;
    Acc* pieces = static_cast<Acc*>(s.pieces);
    long long begin, end;
    if (s.verdicts && static_cast<int>(blockIdx.x) < s.check_parts) {  // uniform across the block
      check_positions_part(s.offsets, s.count + 1, s.size, static_cast<int>(blockIdx.x), s.check_parts,
                           s.verdicts);
    }
    if (s.per_warp) {
      const long long piece = static_cast<long long>(blockIdx.x) * kReduceWarps + threadIdx.x / 32;
      if (piece >= s.count) return;  // the whole warp leaves together
      bounds(s, piece, begin, end);
      const bool lead = (threadIdx.x & 31) == 0;
      if (end <= begin) {  // uniform across the warp
        if (lead && !s.bare) pieces[piece] = *reinterpret_cast<const Acc*>(s.init);
        return;
      }
      const Acc folded = R::warp_range(s, begin, end);
      if (lead) pieces[piece] = finish(s, piece, folded);
    } else {
      const long long piece = blockIdx.x;
      bounds(s, piece, begin, end);
      if (end <= begin) {  // uniform across the block: no barrier is left waiting
        if (threadIdx.x == 0 && !s.bare) pieces[piece] = *reinterpret_cast<const Acc*>(s.init);
        return;
      }
      const Acc folded = R::block_range(s, temp, begin, end);
      if (threadIdx.x == 0) pieces[piece] = finish(s, piece, folded);
    }
  }
};

// The cross-place step of a segmented reduce from device positions (SegmentedFoldParams):
// one thread per result slot folds init and the places' pieces of its segment in place
// order, the association of the host route's csj_fold over a spanning segment's pieces.
template <class Op, int AccSize>
__device__ void segmented_fold(const SegmentedFoldParams& p) {
  using Acc = typename Word<AccSize>::type;
  const long long slot = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (slot >= p.count) return;
  const long long lo = p.offsets[p.first + slot];
  const long long hi = p.offsets[p.first + slot + 1];
  Acc acc = *reinterpret_cast<const Acc*>(p.init);
  for (int place = 0; place < p.places; ++place) {
    // the same test as SegmentedReduction::bounds' (end > begin) on that place
    if (!p.pieces[place] || max(lo, p.shard_begin[place]) >= min(hi, p.shard_end[place])) continue;
    acc = Combine<Op, Acc>()(acc, load_cg(static_cast<const Acc*>(p.pieces[place]) + slot));
  }
  static_cast<Acc*>(p.out)[slot] = acc;
}

template <class Op, int AccSize>
__device__ void fold(const FoldParams& p) {
  using Acc = typename Word<AccSize>::type;
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  Acc* prefixes = static_cast<Acc*>(p.prefixes);
  bool have = p.has_init != 0;
  Acc acc = *reinterpret_cast<const Acc*>(p.init);
  for (int k = 0; k < p.count; ++k) {
    if (prefixes) prefixes[k] = acc;
    const Acc value = load_cg(static_cast<const Acc*>(p.sources[k]));
    acc = have ? Combine<Op, Acc>()(acc, value) : value;
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
  using Exchange = cub::BlockExchange<In, kScanBlock, kItems>;
  using Store = cub::BlockStore<Acc, kScanBlock, kItems, cub::BLOCK_STORE_WARP_TRANSPOSE>;
  using BlockScanT = cub::BlockScan<Acc, kScanBlock, cub::BLOCK_SCAN_WARP_SCANS>;

  union TempStorage {
    typename Exchange::TempStorage exchange;
    typename Store::TempStorage store;
    typename BlockScanT::TempStorage scan;
  };

  // Striped (coalesced) loads straight into registers, so the next tile's loads are in
  // flight while this tile is scanned and stored.
  __device__ __forceinline__ static void load_striped(const In* in, long long remaining, In (&items)[kItems]) {
    if (remaining >= kTile) {
      cub::LoadDirectStriped<kScanBlock>(threadIdx.x, in, items);
    } else if (remaining > 0) {
      cub::LoadDirectStriped<kScanBlock>(threadIdx.x, in, items, static_cast<int>(remaining), in[0]);
    }
  }

  __device__ static void run(const ScanParams& p) {
    __shared__ TempStorage temp;
    const long long block_begin = static_cast<long long>(blockIdx.x) * p.chunk;
    const long long block_end = min(block_begin + p.chunk, p.n);
    // The block's seed: everything before its chunk, in a fixed association.
    bool have = p.has_seed != 0 || blockIdx.x > 0;
    RunningPrefix<Op, Acc> prefix{};
    const Acc seed = p.seed ? *static_cast<const Acc*>(p.seed) : *reinterpret_cast<const Acc*>(p.seed_value);
    if (blockIdx.x > 0) {
      const Acc before = static_cast<const Acc*>(p.prefixes)[blockIdx.x];
      prefix.running = p.has_seed ? Combiner()(seed, before) : before;
    } else if (p.has_seed) {
      prefix.running = seed;
    }
    const In* in = static_cast<const In*>(p.in);
    In next[kItems];
    load_striped(in + block_begin, block_end - block_begin, next);
    for (long long base = block_begin; base < block_end; base += kTile) {
      const long long remaining = block_end - base;
      const int valid = remaining >= kTile ? static_cast<int>(kTile) : static_cast<int>(remaining);
      In items[kItems];
#pragma unroll
      for (int i = 0; i < kItems; ++i) items[i] = next[i];
      load_striped(in + base + kTile, block_end - base - kTile, next);
      Exchange(temp.exchange).StripedToBlocked(items, items);
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
      if (valid == kTile) {
        Store(temp.store).Store(out, values);
      } else {
        Store(temp.store).Store(out, values, valid);
      }
      __syncthreads();
    }
  }
};

// ---- The scan of one place in one pass ---------------------------------------------------
// Each block draws one tile in order (so every tile before a running one has started and will
// publish), maps, loads and scans it, and learns what precedes it from the tiles' states: each
// tile publishes its aggregate at once, then its inclusive prefix once it knows it. The
// inclusive prefix of tile t is ((seed . agg(0)) . agg(1)) . ... . agg(t), a strict left fold:
// a look-back finds the nearest published inclusive prefix j and folds agg(j + 1) .. agg(t - 1)
// onto it from the left, which gives the same bits whichever j it found. So the result is the
// same bits run after run, as the two passes' are (a different association from theirs, fixed
// by n alone). The first warp reads the states of a window of 64 tiles at a time (two a lane,
// one L2 trip a window); lane 0 folds the staged window in order. The tiles' prefixes move
// forward by about a window per look-back, so the tiles are large (8192 elements of 4 bytes,
// 4096 where the input or the accumulator is 8 bytes wide) and the windows wide. Inside a tile,
// each thread folds its run of elements from the left, CUB's block scan (warp scans) joins the
// threads' folds seeded with the tile's exclusive prefix, and each thread scans its run from its
// own prefix: the association is fixed by the tile's shape, which the staged path (inputs and
// accumulators of one size: 256 threads, runs of 128 bytes) and the register path (512 threads,
// 8 or 16 elements a run) each keep.
struct alignas(16) TileState {
  unsigned long long value;  // the accumulator's bytes, low-aligned
  unsigned long long tag;    // (epoch + 1) << 1, | 1 once value is the inclusive prefix
};

__device__ __forceinline__ void store_state(TileState* slot, unsigned long long value, unsigned long long tag) {
  asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(slot), "l"(value), "l"(tag) : "memory");
}

__device__ __forceinline__ TileState load_state(const TileState* slot) {
  TileState state;
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(state.value), "=l"(state.tag)
               : "l"(slot)
               : "memory");
  return state;
}

template <class Map, class Op, int InSize, int AccSize>
struct OnePassScan {
  static_assert(one_pass_scans(InSize, AccSize), "4- or 8-byte elements, and a tile state holds 8 bytes");
  using In = typename Word<InSize>::type;
  using Acc = typename Word<AccSize>::type;
  static constexpr int kItems = one_pass_items(InSize, AccSize);
  static constexpr long long kTile = one_pass_tile(InSize, AccSize);
  static constexpr int kWindow = 32 * kOnePassReads;  // tiles a look-back reads at a time
  using Mask = unsigned long long;                    // a bit per tile of the window
  static_assert(kWindow <= 64, "a window's tiles fit a 64-bit mask");
  static constexpr Mask kAll = kWindow == 64 ? ~Mask{0} : (Mask{1} << (kWindow % 64)) - 1;
  using Combiner = Combine<Op, Acc>;
  static constexpr bool kStaged = one_pass_staged(InSize, AccSize);
  static constexpr int kBlock = one_pass_block(InSize, AccSize);
  using Exchange = cub::BlockExchange<In, kBlock, kItems>;
  using Store = cub::BlockStore<Acc, kBlock, kItems, cub::BLOCK_STORE_WARP_TRANSPOSE>;
  using BlockScanT = cub::BlockScan<Acc, kBlock, cub::BLOCK_SCAN_WARP_SCANS>;
  // The block's tile, drawn in order, and its launch's tag.
  struct Drawn {
    long long tile;
    unsigned long long tag;
  };

  struct TempStorage {
    union {
      typename Exchange::TempStorage exchange;
      typename Store::TempStorage store;
      typename BlockScanT::TempStorage scan;
    } steps;
    Acc stage[kWindow];  // the look-back's window, nearest tile first
    Drawn drawn;
  };

  // Whether each tile of the window (bit k: tile end - 1 - k; lane l reads k = l + 32 r)
  // satisfies the lanes' flags.
  __device__ __forceinline__ static Mask window_mask(const bool (&flags)[kOnePassReads]) {
    Mask mask = 0;
#pragma unroll
    for (int r = 0; r < kOnePassReads; ++r) mask |= static_cast<Mask>(__ballot_sync(0xffffffffu, flags[r])) << (32 * r);
    return mask;
  }

  // The first warp's prefix callback in the tile's block scan: publishes the tile's aggregate,
  // looks back, publishes its inclusive prefix and returns its exclusive one (lane 0's counts).
  struct LookBack {
    TileState* states;
    long long tile;
    unsigned long long tag;
    Acc* stage;

    __device__ __forceinline__ Acc operator()(const Acc& aggregate) const {
      const int lane = threadIdx.x & 31;
      if (lane == 0) store_state(states + tile, aggregate, tag);
      // Walk back a window at a time until one holds a published inclusive prefix (tile 0
      // publishes only that, so the walk ends there at the latest); within the window, every
      // tile up to the nearest such one must have published.
      long long end = tile;  // the window is tiles end - kWindow .. end - 1
      TileState state[kOnePassReads];
      Mask inclusives;
      for (;;) {
        bool seen[kOnePassReads], inclusive[kOnePassReads];
#pragma unroll
        for (int r = 0; r < kOnePassReads; ++r) {
          seen[r] = end - 1 - lane - 32 * r < 0;  // before tile 0: never folded (tile 0's prefix is nearer)
          inclusive[r] = false;
          state[r] = TileState{0, 0};
        }
        for (;;) {
#pragma unroll
          for (int r = 0; r < kOnePassReads; ++r) {
            if (!seen[r]) state[r] = load_state(states + (end - 1 - lane - 32 * r));
          }
#pragma unroll
          for (int r = 0; r < kOnePassReads; ++r) {
            if (!seen[r]) {
              seen[r] = (state[r].tag | 1) == (tag | 1);
              inclusive[r] = seen[r] && (state[r].tag & 1);
            }
          }
          inclusives = window_mask(inclusive);
          const Mask needed = inclusives ? ((inclusives & (0 - inclusives)) << 1) - 1 : kAll;
          if ((window_mask(seen) & needed) == needed) break;
        }
        if (inclusives) break;
        end -= kWindow;
      }
      // Fold from the nearest inclusive prefix toward the tile, the far window first, then
      // each nearer one read again (seen already, so published; a tile that has published its
      // inclusive prefix since starts the fold afresh from it: the same bits).
      Acc prefix{};
      for (;;) {
#pragma unroll
        for (int r = 0; r < kOnePassReads; ++r) stage[lane + 32 * r] = static_cast<Acc>(state[r].value);
        __syncwarp();
        if (lane == 0) {
          int from = kWindow - 1;
          if (inclusives) {
            const int nearest = __ffsll(static_cast<long long>(inclusives)) - 1;
            prefix = stage[nearest];
            from = nearest - 1;
          }
          for (int k = from; k >= 0; --k) prefix = Combiner()(prefix, stage[k]);
        }
        __syncwarp();
        end += kWindow;
        if (end > tile) break;
        bool inclusive[kOnePassReads];
#pragma unroll
        for (int r = 0; r < kOnePassReads; ++r) {
          state[r] = load_state(states + (end - 1 - lane - 32 * r));
          inclusive[r] = state[r].tag & 1;
        }
        inclusives = window_mask(inclusive);
      }
      if (lane == 0) store_state(states + tile, Combiner()(prefix, aggregate), tag | 1);
      return prefix;
    }
  };

  // Tile 0's callback: the seed, if any, is its exclusive prefix.
  struct FirstTile {
    TileState* states;
    unsigned long long tag;
    Acc seed;
    __device__ __forceinline__ Acc operator()(const Acc& aggregate) const {
      if ((threadIdx.x & 31) == 0) store_state(states, Combiner()(seed, aggregate), tag | 1);
      return seed;
    }
  };

  // The drawn tile: its index and tag, its first element and its element count (none past the
  // last tile).
  struct Tile {
    long long index;
    unsigned long long tag;
    long long base;
    int valid;
  };

  // Thread 0 draws the tile into `slot`; every thread returns it.
  __device__ __forceinline__ static Tile draw(const OnePassScanParams& p, Drawn& slot) {
    if (threadIdx.x == 0) {
      const unsigned long long drawn = atomicAdd(p.draw, 1ULL);
      const unsigned long long epoch = drawn >> kOnePassTileBits;
      const long long tile = static_cast<long long>(drawn & ((1ULL << kOnePassTileBits) - 1));
      // every tile is drawn: the next launch starts the next epoch from none drawn
      if (tile == p.num_tiles - 1) atomicExch(p.draw, (epoch + 1) << kOnePassTileBits);
      slot = Drawn{tile, (epoch + 1) << 1};
    }
    __syncthreads();
    const Drawn drawn = slot;
    const long long base = drawn.tile * kTile;
    const long long remaining = drawn.tile < p.num_tiles ? p.n - base : 0;
    return Tile{drawn.tile, drawn.tag, base, remaining >= kTile ? static_cast<int>(kTile) : static_cast<int>(remaining)};
  }

  __device__ static void run(const OnePassScanParams& p) {
    if constexpr (kStaged) {
      run_staged(p);
    } else {
      run_in_registers(p);
    }
  }

  // ---- The staged path: inputs and accumulators of one size --------------------------------
  // The tile (32 KiB) comes into shared memory by 16-byte asynchronous copies (cp.async: no
  // register holds the data), thread s's run of 128 bytes (kItems elements) at s * 128, its
  // eight 16-byte vectors swizzled (vector j at j ^ (s % 8)) so that both the striped copies in
  // and out and each thread's reads of its run are free of bank conflicts. A thread folds its
  // run (a left fold), the block scans the threads' folds (with the look-back for the tile's
  // prefix), and the thread reads its run again to scan it from its prefix, writing the
  // results over the inputs, which the block then stores striped. The map (an element's
  // conversion to the accumulator) runs in both readings.
  static constexpr int kPerVector = 16 / InSize;
  static constexpr int kVectors = kItems / kPerVector;  // a thread's run: eight vectors
  static_assert(!kStaged || kVectors == 8, "chunk_offset's swizzle spans runs of eight vectors");
  static constexpr int kChunks = static_cast<int>(kTile) / kPerVector;
  using StagedScan = cub::BlockScan<Acc, kBlock, cub::BLOCK_SCAN_WARP_SCANS>;

  struct StagedStorage {
    alignas(16) unsigned char tile[kTile * InSize];
    typename StagedScan::TempStorage scan;
    Acc stage[kWindow];  // the look-back's window, nearest tile first
    Drawn drawn;
  };

  // The shared-memory byte offset of 16-byte chunk c of the tile (thread c / 8's vector c % 8).
  __device__ __forceinline__ static unsigned chunk_offset(unsigned c) {
    return ((c >> 3) << 7) | ((((c & 7) ^ (c >> 3)) & 7) << 4);
  }

  __device__ static void run_staged(const OnePassScanParams& p) {
    __shared__ StagedStorage temp;
    TileState* states = static_cast<TileState*>(p.states);
    const auto [tile, tag, base, valid] = draw(p, temp.drawn);
    if (valid == 0) return;  // only if another launch shared the draw word: fail without writing
    const In* in = static_cast<const In*>(p.in) + base;
    // Chunks wholly in the tile travel by cp.async when the input is 16-byte aligned (a tile
    // keeps the array's alignment); the rest element by element, a partial tile's tail padded
    // with its first element (scanned, never stored), as the register path pads it.
    const int whole = reinterpret_cast<unsigned long long>(p.in) % 16 == 0 ? valid / kPerVector : 0;
#pragma unroll
    for (int k = 0; k < kChunks / kBlock; ++k) {
      const int c = static_cast<int>(threadIdx.x) + k * kBlock;
      unsigned char* to = temp.tile + chunk_offset(c);
      if (c < whole) {
        copy_async_16(to, in + c * kPerVector);
      } else {
#pragma unroll
        for (int w = 0; w < kPerVector; ++w) {
          const int i = c * kPerVector + w;
          *reinterpret_cast<In*>(to + w * InSize) = i < valid ? in[i] : in[0];
        }
      }
    }
    copy_async_wait_all();
    __syncthreads();
    const unsigned s = threadIdx.x;
    const long long first_index = p.index_base + base + static_cast<long long>(s) * kItems;
    auto vector_at = [&](int j) { return temp.tile + chunk_offset(s * kVectors + j); };  // the run's vector j
    Acc fold{};
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      In items[kPerVector];
      memcpy(items, vector_at(j), 16);
#pragma unroll
      for (int w = 0; w < kPerVector; ++w) {
        Acc value;
        Map()(&items[w], first_index + j * kPerVector + w, &value);
        fold = j == 0 && w == 0 ? value : Combiner()(fold, value);
      }
    }
    StagedScan scan(temp.scan);
    Acc prefix{};
    bool seeded = true;  // whether the thread's run follows a prefix
    if (tile > 0) {
      LookBack look_back{states, tile, tag, temp.stage};
      scan.ExclusiveScan(fold, prefix, Combiner(), look_back);
    } else if (p.has_seed) {
      FirstTile first{states, tag, *reinterpret_cast<const Acc*>(p.seed_value)};
      scan.ExclusiveScan(fold, prefix, Combiner(), first);
    } else {  // an unseeded inclusive scan's first tile: thread 0's run starts the scan
      Acc aggregate;
      scan.ExclusiveScan(fold, prefix, Combiner(), aggregate);
      if (threadIdx.x == 0) store_state(states, aggregate, tag | 1);
      seeded = threadIdx.x != 0;
    }
    Acc running = prefix;
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      unsigned char* at = vector_at(j);
      In items[kPerVector];
      memcpy(items, at, 16);
      Acc results[kPerVector];
#pragma unroll
      for (int w = 0; w < kPerVector; ++w) {
        Acc value;
        Map()(&items[w], first_index + j * kPerVector + w, &value);
        if (p.exclusive) {
          results[w] = running;
          running = Combiner()(running, value);
        } else {
          running = j == 0 && w == 0 && !seeded ? value : Combiner()(running, value);
          results[w] = running;
        }
      }
      memcpy(at, results, 16);
    }
    __syncthreads();
    Acc* out = static_cast<Acc*>(p.out) + base;
    const int stored = reinterpret_cast<unsigned long long>(p.out) % 16 == 0 ? valid / kPerVector : 0;
#pragma unroll
    for (int k = 0; k < kChunks / kBlock; ++k) {
      const int c = static_cast<int>(threadIdx.x) + k * kBlock;
      const unsigned char* from = temp.tile + chunk_offset(c);
      if (c < stored) {
        *reinterpret_cast<uint4*>(out + c * kPerVector) = *reinterpret_cast<const uint4*>(from);
      } else {
#pragma unroll
        for (int w = 0; w < kPerVector; ++w) {
          const int i = c * kPerVector + w;
          if (i < valid) out[i] = *reinterpret_cast<const Acc*>(from + w * AccSize);
        }
      }
    }
  }

  // ---- The register path: inputs and accumulators of different sizes ------------------------
  __device__ static void run_in_registers(const OnePassScanParams& p) {
    __shared__ TempStorage temp;
    TileState* states = static_cast<TileState*>(p.states);
    const auto [tile, tag, base, valid] = draw(p, temp.drawn);
    if (valid == 0) return;  // only if another launch shared the draw word: fail without writing
    const In* in = static_cast<const In*>(p.in) + base;
    In items[kItems];
    if (valid == kTile) {
      cub::LoadDirectStriped<kBlock>(threadIdx.x, in, items);
    } else {
      cub::LoadDirectStriped<kBlock>(threadIdx.x, in, items, valid, in[0]);
    }
    Exchange(temp.steps.exchange).StripedToBlocked(items, items);
    __syncthreads();
    Acc values[kItems];
    const long long first_index = p.index_base + base + static_cast<long long>(threadIdx.x) * kItems;
#pragma unroll
    for (int i = 0; i < kItems; ++i) Map()(&items[i], first_index + i, &values[i]);
    BlockScanT scan(temp.steps.scan);
    if (tile > 0) {
      LookBack look_back{states, tile, tag, temp.stage};
      if (p.exclusive) {
        scan.ExclusiveScan(values, values, Combiner(), look_back);
      } else {
        scan.InclusiveScan(values, values, Combiner(), look_back);
      }
    } else if (p.has_seed) {
      FirstTile first{states, tag, *reinterpret_cast<const Acc*>(p.seed_value)};
      if (p.exclusive) {
        scan.ExclusiveScan(values, values, Combiner(), first);
      } else {
        scan.InclusiveScan(values, values, Combiner(), first);
      }
    } else {  // an unseeded inclusive scan's first tile
      Acc aggregate;
      scan.InclusiveScan(values, values, Combiner(), aggregate);
      if (threadIdx.x == 0) store_state(states, aggregate, tag | 1);
    }
    __syncthreads();
    Acc* out = static_cast<Acc*>(p.out) + base;
    if (valid == kTile) {
      Store(temp.steps.store).Store(out, values);
    } else {
      Store(temp.steps.store).Store(out, values, valid);
    }
  }
};

}  // namespace csj::kernels
