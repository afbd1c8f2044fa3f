// The selection engine's kernel bodies (select_params.hpp says what each launch does), shared
// by the JIT module (select_jit.cu: classes from a linked predicate, elements of one size) and
// the built-in flagged compaction (select_builtin.cu: classes from 0/1 flags, several arrays
// moved). Each caller says how an element gets its class and how it is written; counting,
// the scan of the tiles' counts and the ranks within a tile live here once.
//
// A thread's counts of the three classes travel packed in one 64-bit word, 21 bits each (a
// tile holds at most 4096 elements), so one block reduction or scan counts all three.
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

struct AddCounts {
  __device__ __forceinline__ SelectCounts operator()(const SelectCounts& a, const SelectCounts& b) const {
    SelectCounts sum;
#pragma unroll
    for (int c = 0; c < kSelectClasses; ++c) sum.count[c] = a.count[c] + b.count[c];
    return sum;
  }
};

// csj_select_scan, one block of kSelectScanBlock threads: the tiles' counts replaced by their
// exclusive prefix (each tile's first position in every class's output), and the totals.
__device__ __forceinline__ void scan_tiles(const SelectParams& p) {
  using Scan = cub::BlockScan<SelectCounts, kSelectScanBlock>;
  __shared__ typename Scan::TempStorage storage;
  __shared__ SelectCounts carry;
  const SelectCounts zero = {{0, 0, 0}};
  if (threadIdx.x == 0) carry = zero;
  __syncthreads();
  for (long long base = 0; base < p.tiles; base += kSelectScanBlock) {
    const long long tile = base + threadIdx.x;
    const SelectCounts counts = tile < p.tiles ? p.tile_counts[tile] : zero;
    SelectCounts prefix, aggregate;
    Scan(storage).ExclusiveScan(counts, prefix, zero, AddCounts(), aggregate);
    if (tile < p.tiles) p.tile_counts[tile] = AddCounts()(carry, prefix);
    __syncthreads();
    if (threadIdx.x == 0) carry = AddCounts()(carry, aggregate);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
#pragma unroll
    for (int c = 0; c < kSelectClasses; ++c) p.totals[c] = carry.count[c];
  }
}

// csj_select_scatter's ranks: thread t holds the tile's items t * Items ... t * Items +
// Items - 1 (blocked: ranks in a thread's items follow the tile's order), `classes[i]` the
// class of its item i (-1 past the shard's end). `write(i, cls, position)` stores item i at
// `position` of class `cls`'s output shard.
template <int Items, class Write>
__device__ __forceinline__ void scatter_tile(const SelectParams& p, const int (&classes)[Items], Write write) {
  using Scan = cub::BlockScan<unsigned long long, kSelectBlock>;
  __shared__ typename Scan::TempStorage storage;
  unsigned long long packed = 0;
#pragma unroll
  for (int item = 0; item < Items; ++item) {
    if (classes[item] >= 0) packed += class_unit(classes[item]);
  }
  unsigned long long rank;
  Scan(storage).ExclusiveSum(packed, rank);
  const SelectCounts offset = p.tile_counts[blockIdx.x];
#pragma unroll
  for (int item = 0; item < Items; ++item) {
    const int cls = classes[item];
    if (cls < 0) continue;
    write(item, cls, offset.count[cls] + class_field(rank, cls));
    rank += class_unit(cls);
  }
}

}  // namespace csj::kernels
