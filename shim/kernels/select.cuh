// The selection engine's kernel bodies (select_params.hpp says what each launch does), shared
// by the JIT module (select_jit.cu: classes from a linked predicate, elements of one size),
// the built-in flagged compaction (select_builtin.cu: classes from 0/1 flags, several arrays
// moved) and the run heads (by_key_jit.cu: classes from the linked key equality, several
// arrays moved). Each caller says how an element gets its class and how it is written; counting,
// the ranks within a tile live here once.
//
// A thread's counts of the three classes travel packed in one 64-bit word, 21 bits each (a
// tile holds at most 4096 elements), so one block reduction or scan counts all three. The
// tiles' counts are scanned between the two passes by CUB's device scan (select_builtin.cu).
#pragma once

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

// csj_select_scatter's slots: thread t holds the tile's items t * Items ... t * Items +
// Items - 1 (blocked: ranks in a thread's items follow the tile's order), `classes[i]` the
// class of its item i (-1 past the shard's end). Class c's items of the tile take the slots
// [base_c, base_c + count_c) in tile order (base_0 = 0, base_1 = count_0, base_2 = count_0 +
// count_1): `stage(i, slot)` puts item i there (in shared memory). Then, the block synced,
// `emit(slot, cls, position)` is called for every filled slot, adjacent threads on adjacent
// slots of the classes that have an output (SelectParams::out not null; the others are
// neither staged nor emitted), with the position of its element in class `cls`'s output
// shard: the tile's offset
// (tile_counts, scanned) plus the rank in its class, so each class's stores are contiguous
// and coalesced whatever the selectivity.
template <int Items, class Stage, class Emit>
__device__ __forceinline__ void scatter_tile(const SelectParams& p, const int (&classes)[Items], Stage stage,
                                             Emit emit) {
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
  const int base1 = static_cast<int>(class_field(tile_total, 0));
  const int base2 = base1 + static_cast<int>(class_field(tile_total, 1));
  const int filled = base2 + static_cast<int>(class_field(tile_total, 2));
#pragma unroll
  for (int item = 0; item < Items; ++item) {
    const int cls = classes[item];
    if (cls < 0 || cls >= written) continue;
    const int base = cls == 0 ? 0 : cls == 1 ? base1 : base2;
    stage(item, base + static_cast<int>(class_field(rank, cls)));
    rank += class_unit(cls);
  }
  __syncthreads();
  const SelectCounts offset = p.tile_counts[blockIdx.x];
  const int end = written == 1 ? base1 : written == 2 ? base2 : filled;
  for (int slot = static_cast<int>(threadIdx.x); slot < end; slot += kSelectBlock) {
    const int cls = slot < base1 ? 0 : slot < base2 ? 1 : 2;
    const int base = cls == 0 ? 0 : cls == 1 ? base1 : base2;
    emit(slot, cls, offset.count[cls] + (slot - base));
  }
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
