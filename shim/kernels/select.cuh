// The selection engine's kernel bodies (select_params.hpp says what each launch does), shared
// by the JIT module (select_jit.cu: classes from a linked predicate, elements of one size),
// the built-in flagged compaction (select_builtin.cu: classes from 0/1 flags, several arrays
// moved) and the run heads (by_key_jit.cu: classes from the linked key equality, several
// arrays moved). Each caller says how an element gets its class and how it is written; counting,
// the ranks within a tile live here once.
//
// A thread's counts of the three classes travel packed in one 64-bit word, 21 bits each (a
// tile holds at most 4096 elements), so one block reduction or scan counts all three. The
// two passes scan the tiles' counts between them by CUB's device scan (select_builtin.cu); the
// single pass looks back over them (look_back below). Both share the tile's staging and
// emitting (stage_tile, emit_tile).
#pragma once

#include <cub/agent/single_pass_scan_operators.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "select_params.hpp"

namespace csj::kernels {

constexpr int kClassBits = 21;
constexpr unsigned long long kClassMask = (1ULL << kClassBits) - 1;

__device__ __forceinline__ unsigned long long class_unit(int cls) { return 1ULL << (kClassBits * cls); }
__device__ __forceinline__ long long class_field(unsigned long long packed, int cls) {
  return static_cast<long long>((packed >> (kClassBits * cls)) & kClassMask);
}

// csj_select_count: tile blockIdx.x's count per class. Elements are taken block-striped
// (adjacent threads, adjacent elements: coalesced); `class_of(local)` gives the class (0..2)
// of the shard's element `local`.
template <int Items, class ClassOf>
__device__ __forceinline__ void count_tile(const SelectParams& p, ClassOf class_of) {
  using Reduce = cub::BlockReduce<unsigned long long, kSelectBlock>;
  __shared__ typename Reduce::TempStorage storage;
  const long long first = static_cast<long long>(blockIdx.x) * kSelectBlock * Items;
  unsigned long long packed = 0;
#pragma unroll
  for (int item = 0; item < Items; ++item) {
    const long long local = first + item * kSelectBlock + threadIdx.x;
    if (local < p.n) packed += class_unit(class_of(local));
  }
  const unsigned long long total = Reduce(storage).Sum(packed);
  if (threadIdx.x == 0) {
    SelectCounts counts;
#pragma unroll
    for (int c = 0; c < kSelectClasses; ++c) counts.count[c] = class_field(total, c);
    p.tile_counts[blockIdx.x] = counts;
  }
}

// A thread's item classes as stage_tile reads them (classes[i]: -1 past the shard's end),
// in one of two forms: an int an item, or 2 bits an item in one word (the class + 1), which
// stays in one register across stage_tile's block scan where the ints take one each. Which
// fits 64 registers is the compiler's call: with 4-byte elements the ints spilled nothing
// in the select's single pass and the scatter but 184 bytes in the three-way single pass,
// where the packed word spills 8 (sm_90 links).
template <int Items>
struct ItemClasses {
  int cls[Items];
  __device__ __forceinline__ ItemClasses() {
#pragma unroll
    for (int item = 0; item < Items; ++item) cls[item] = -1;
  }
  __device__ __forceinline__ void set(int item, int value) { cls[item] = value; }
  __device__ __forceinline__ int operator[](int item) const { return cls[item]; }
};

template <int Items>
struct PackedClasses {
  static_assert(Items <= 16, "2 bits an item in one word");
  unsigned int bits = 0;
  __device__ __forceinline__ void set(int item, int value) {
    bits |= static_cast<unsigned int>(value + 1) << (2 * item);
  }
  __device__ __forceinline__ int operator[](int item) const {
    return static_cast<int>((bits >> (2 * item)) & 3u) - 1;
  }
};

// A tile's slots once staged (stage_tile): class 0's items take [0, base1), class 1's
// [base1, base2), class 2's [base2, filled); `end` is where the staged ones stop (the classes
// without an output are counted, not staged).
struct TileSlots {
  int base1, base2, filled, end;
};

// The first half of a tile's scatter, shared by both engines. Thread t holds the tile's items
// t * Items ... t * Items + Items - 1 (blocked: ranks in a thread's items follow the tile's
// order), `classes[i]` the class of its item i (-1 past the shard's end; an int array,
// ItemClasses or PackedClasses). Class c's items of the tile take the slots [base_c, base_c + count_c) in tile order: `stage(i, slot)` puts
// item i there (in shared memory), for the classes that have an output (SelectParams::out not
// null; the others are counted but neither staged nor emitted). The block must be synced
// before the slots are read (emit_tile).
template <int Items, class Classes, class Stage>
__device__ __forceinline__ TileSlots stage_tile(const SelectParams& p, const Classes& classes, Stage stage) {
  // Classes 0 .. written - 1 have outputs (select: class 0; partition: 0 and 1; else all).
  // An output shard is null only when it is empty, that is when this shard has no element
  // of its class, so a null among the first `written` is never stored through.
  const int written = p.out[2] != nullptr ? 3 : p.out[1] != nullptr ? 2 : 1;
  using Scan = cub::BlockScan<unsigned long long, kSelectBlock>;
  __shared__ typename Scan::TempStorage storage;
  unsigned long long packed = 0;
#pragma unroll
  for (int item = 0; item < Items; ++item) {
    if (classes[item] >= 0) packed += class_unit(classes[item]);
  }
  unsigned long long rank, tile_total;
  Scan(storage).ExclusiveSum(packed, rank, tile_total);
  TileSlots slots;
  slots.base1 = static_cast<int>(class_field(tile_total, 0));
  slots.base2 = slots.base1 + static_cast<int>(class_field(tile_total, 1));
  slots.filled = slots.base2 + static_cast<int>(class_field(tile_total, 2));
  slots.end = written == 1 ? slots.base1 : written == 2 ? slots.base2 : slots.filled;
#pragma unroll
  for (int item = 0; item < Items; ++item) {
    const int cls = classes[item];
    if (cls < 0 || cls >= written) continue;
    const int base = cls == 0 ? 0 : cls == 1 ? slots.base1 : slots.base2;
    stage(item, base + static_cast<int>(class_field(rank, cls)));
    rank += class_unit(cls);
  }
  return slots;
}

// The second half: `emit(slot, cls, position)` for every staged slot, adjacent threads on
// adjacent slots, with the position of its element in class `cls`'s output shard: the tile's
// offset in that class plus the rank in its class, so each class's stores are contiguous and
// coalesced whatever the selectivity.
template <class Emit>
__device__ __forceinline__ void emit_tile(const TileSlots& slots, const SelectCounts& offset, Emit emit) {
  for (int slot = static_cast<int>(threadIdx.x); slot < slots.end; slot += kSelectBlock) {
    const int cls = slot < slots.base1 ? 0 : slot < slots.base2 ? 1 : 2;
    const int base = cls == 0 ? 0 : cls == 1 ? slots.base1 : slots.base2;
    emit(slot, cls, offset.count[cls] + (slot - base));
  }
}

// csj_select_scatter (the two passes): tile blockIdx.x staged, then emitted at its offsets
// from the scan of the tiles' counts.
template <int Items, class Classes, class Stage, class Emit>
__device__ __forceinline__ void scatter_tile(const SelectParams& p, const Classes& classes, Stage stage, Emit emit) {
  const TileSlots slots = stage_tile<Items>(p, classes, stage);
  __syncthreads();
  emit_tile(slots, p.tile_counts[blockIdx.x], emit);
}

// ---- the single pass: decoupled look-back over the tiles' class counts -----------------------
//
// A tile's offsets in the outputs are the counts of the tiles before it. Select and partition
// look back over one count, class 0's (class 1's offset is the elements before the tile less
// class 0's); three_way_partition over two, packed in one word, 32 bits each, so shards of
// fewer than kPackedLookbackElements only (class 2's offset is what is left). Either way the looked-back
// value is one 64-bit word, which CUB's tile state keeps with its status in one 16-byte store:
// the look-back costs a three-way partition no more than a select. Counts are integers, so
// whatever association the look-back takes, the offsets are the same: deterministic.
using LookbackState = cub::ScanTileState<unsigned long long>;

struct AddLookback {
  __device__ __forceinline__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
    return a + b;
  }
};

template <int Prefixes>
struct SelectLookback {
  static_assert(Prefixes == 1 || Prefixes == 2, "one or two looked-back counts");
  using Prefix = cub::TilePrefixCallbackOp<unsigned long long, AddLookback, LookbackState>;

  // The tile's own counts of the looked-back classes.
  __device__ __forceinline__ static unsigned long long aggregate(const TileSlots& slots) {
    const auto first = static_cast<unsigned long long>(slots.base1);
    if constexpr (Prefixes == 1) {
      return first;
    } else {
      return first | static_cast<unsigned long long>(slots.base2 - slots.base1) << 32;
    }
  }
  // Every class's offset (or total) from the looked-back counts of `elements` elements.
  __device__ __forceinline__ static SelectCounts offsets(unsigned long long value, long long elements) {
    SelectCounts counts;
    if constexpr (Prefixes == 1) {
      counts.count[0] = static_cast<long long>(value);
      counts.count[1] = elements - counts.count[0];
      counts.count[2] = 0;
    } else {
      counts.count[0] = static_cast<long long>(value & 0xffffffffULL);
      counts.count[1] = static_cast<long long>(value >> 32);
      counts.count[2] = elements - counts.count[0] - counts.count[1];
    }
    return counts;
  }
};

// The single pass's step between stage_tile and emit_tile, run by the block's first warp: tile
// `tile` (`first` its first element) publishes its counts, looks back for the counts of the
// tiles before it (all taken, so started: the wait ends) and leaves its offsets in `offset`;
// the last tile also writes the shard's totals. The caller syncs the block before emit_tile.
template <int Prefixes>
__device__ __forceinline__ void look_back(const SelectParams& p, LookbackState& state,
                                          typename SelectLookback<Prefixes>::Prefix::TempStorage& storage, int tile,
                                          long long first, const TileSlots& slots, SelectCounts& offset) {
  using Lookback = SelectLookback<Prefixes>;
  const unsigned long long aggregate = Lookback::aggregate(slots);
  unsigned long long exclusive = 0;
  if (tile == 0) {
    if (threadIdx.x == 0) state.SetInclusive(0, aggregate);
  } else {
    typename Lookback::Prefix prefix(state, storage, AddLookback(), tile);
    exclusive = prefix(aggregate);
  }
  if (threadIdx.x == 0) {
    offset = Lookback::offsets(exclusive, first);
    if (tile == p.tiles - 1) *p.totals = Lookback::offsets(exclusive + aggregate, p.n);
  }
}

// The look-back's tile states before the pass: `tiles` of them invalid (and CUB's padding
// before tile 0), and the tile counter zeroed; one thread per tile.
__device__ __forceinline__ void init_lookback(void* storage, int tiles, unsigned int* next_tile) {
  LookbackState state;
  state.Init(tiles, storage, 0);  // one array of words: nothing to size
  state.InitializeStatus(tiles);
  if (blockIdx.x == 0 && threadIdx.x == 0) *next_tile = 0;
}

// The payload-moving selections' emit: class 0's element `local` of the shard (its index)
// copied from every payload array to `position` of that array's output, a 4-byte word at a
// time (each payload has its own element size).
__device__ __forceinline__ void copy_payloads(const SelectParams& p, long long local, long long position) {
  for (int k = 0; k < p.payloads; ++k) {
    const int words = p.payload_size[k] / 4;
    const unsigned* from = static_cast<const unsigned*>(p.payload_in[k]) + local * words;
    unsigned* to = static_cast<unsigned*>(p.payload_out[k]) + position * words;
    for (int w = 0; w < words; ++w) to[w] = from[w];
  }
}

// csj_select_scatter for the payload-moving selections (the flagged compaction, the run
// heads): `class_of(local)` gives each element's class as in count_tile; class 0's elements
// are staged by their tile-local index (each payload has its own element size), then every
// payload is copied from those indices to consecutive output positions.
template <class ClassOf>
__device__ __forceinline__ void scatter_payloads(const SelectParams& p, ClassOf class_of) {
  __shared__ int staged[kSelectBlock * kSelectPayloadItems];  // tile-local index by slot
  const long long tile_first = static_cast<long long>(blockIdx.x) * kSelectBlock * kSelectPayloadItems;
  const int first = static_cast<int>(threadIdx.x) * kSelectPayloadItems;
  int classes[kSelectPayloadItems];
#pragma unroll
  for (int item = 0; item < kSelectPayloadItems; ++item) {
    const long long local = tile_first + first + item;
    classes[item] = local < p.n ? class_of(local) : -1;
  }
  scatter_tile<kSelectPayloadItems>(
      p, classes, [&](int item, int slot) { staged[slot] = first + item; },
      [&](int slot, int cls, long long position) {
        if (cls == 0) copy_payloads(p, tile_first + staged[slot], position);
      });
}

}  // namespace csj::kernels
