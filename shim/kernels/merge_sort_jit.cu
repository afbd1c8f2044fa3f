// The merge sort with a user comparator (merge_sort.hpp): built to LTO-IR, one module per
// element size (CSJ_ELEMENT_SIZE: 4 and 8 for numbers, 4 to 32 for records), and linked at
// run time with the comparator's C-ABI wrapper that numba compiled, which reads both elements
// (records field by field) and applies the key, the comparator and the direction:
//   int csj_less(const void* a, const void* b)   // nonzero: *a goes strictly before *b
// The kernels move elements as opaque words of their size and order them through csj_less
// alone; after linking it is inlined, the pointers to registers gone.
//
// Block sort: cub::BlockMergeSort's stable sort of a tile per block, loaded and stored
// through CUB's warp-transposing block load and store. Merges: merge-path partitioning (the
// split of a merge into a partition kernel and a merge kernel follows CUB's DeviceMergeSort
// design; the tile shapes, merge_sort.hpp, and the code are ours): each output tile of a
// merge begins where its diagonal of the merge path crosses the boundary between the two
// runs, found by a binary search with the comparator; the merge block loads its two ranges
// into shared memory, each thread finds its own diagonal there and merges its items
// sequentially.
#include <cub/block/block_load.cuh>
#include <cub/block/block_merge_sort.cuh>
#include <cub/block/block_store.cuh>

#include "merge_sort.hpp"
#include "transform.cuh"

#if !defined(CSJ_ELEMENT_SIZE)
#error "CSJ_ELEMENT_SIZE must be defined"
#endif

extern "C" __device__ int csj_less(const void*, const void*);

namespace {

using namespace csj::kernels;

using Element = Word<CSJ_ELEMENT_SIZE>::type;

struct Less {
  __device__ __forceinline__ bool operator()(const Element& a, const Element& b) const {
    return csj_less(&a, &b) != 0;
  }
};

// How many elements of `first` come before diagonal `diag` of the stable merge of `first`
// (first_n elements) and `second` (second_n): the smallest i such that first[i] goes after
// second[diag - 1 - i]. Ties go to `first`.
template <class Offset>
__device__ __forceinline__ Offset merge_split(const Element* first, Offset first_n, const Element* second,
                                              Offset second_n, Offset diag) {
  Offset low = diag > second_n ? diag - second_n : 0;
  Offset high = diag < first_n ? diag : first_n;
  const Less less;
  while (low < high) {
    const Offset middle = low + (high - low) / 2;
    const Element a = first[middle];
    const Element b = second[diag - 1 - middle];
    if (less(b, a)) {
      high = middle;
    } else {
      low = middle + 1;
    }
  }
  return low;
}

// One merge an output tile belongs to, and where the tile starts on its merge path.
struct TileMerge {
  const Element* first;
  long long first_n;
  const Element* second;
  long long second_n;
  Element* out;
  long long diag;       // the tile's first output, within the merge
  bool last;            // the merge's last tile: its first run ends at first_n
};

template <int kTile>
__device__ __forceinline__ TileMerge tile_merge(const MergeParams& p, long long tile) {
  TileMerge merge;
  if (p.pass < 0) {
    merge.first = static_cast<const Element*>(p.in);
    merge.first_n = p.n;
    merge.second = static_cast<const Element*>(p.second);
    merge.second_n = p.second_n;
    merge.out = static_cast<Element*>(p.out);
    merge.diag = tile * kTile;
    merge.last = tile == p.tiles - 1;
    return merge;
  }
  const long long width = static_cast<long long>(kTile) << p.pass;
  const long long local = tile & ((2LL << p.pass) - 1);  // a merge has 2 << pass tiles
  const long long start = (tile - local) * kTile;
  const long long rest = p.n - start;
  merge.first = static_cast<const Element*>(p.in) + start;
  merge.first_n = rest < width ? rest : width;
  merge.second = merge.first + merge.first_n;
  merge.second_n = rest - merge.first_n < width ? rest - merge.first_n : width;
  merge.out = static_cast<Element*>(p.out) + start;
  merge.diag = local * kTile;
  merge.last = local == (2LL << p.pass) - 1 || tile == p.tiles - 1;
  return merge;
}

template <int kThreads, int kPer>
__device__ __forceinline__ void block_sort(const BlockSortParams& params) {
  using BlockLoad = cub::BlockLoad<Element, kThreads, kPer, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  using BlockStore = cub::BlockStore<Element, kThreads, kPer, cub::BLOCK_STORE_WARP_TRANSPOSE>;
  using BlockSort = cub::BlockMergeSort<Element, kThreads, kPer>;
  constexpr int kTile = kThreads * kPer;
  __shared__ union {
    typename BlockLoad::TempStorage load;
    typename BlockSort::TempStorage sort;
    typename BlockStore::TempStorage store;
  } shared;
  const long long base = static_cast<long long>(blockIdx.x) * kTile;
  const long long remaining = params.n - base;
  const int valid = remaining < kTile ? static_cast<int>(remaining) : kTile;
  const Element* in = static_cast<const Element*>(params.in) + base;
  Element* out = static_cast<Element*>(params.out) + base;
  Element keys[kPer];
  if (valid == kTile) {
    BlockLoad(shared.load).Load(in, keys);
  } else {
    BlockLoad(shared.load).Load(in, keys, valid, in[0]);  // the padding is never compared
  }
  __syncthreads();
  if (valid == kTile) {
    BlockSort(shared.sort).StableSort(keys, Less{});
  } else {
    BlockSort(shared.sort).StableSort(keys, Less{}, valid, keys[0]);
  }
  __syncthreads();
  if (valid == kTile) {
    BlockStore(shared.store).Store(out, keys);
  } else {
    BlockStore(shared.store).Store(out, keys, valid);
  }
}

template <int kThreads, int kPer>
__device__ __forceinline__ void merge_block(const MergeParams& params) {
  using BlockStore = cub::BlockStore<Element, kThreads, kPer, cub::BLOCK_STORE_WARP_TRANSPOSE>;
  constexpr int kTile = kThreads * kPer;
  // The tile's two ranges one after the other, and kPer elements of padding: the sequential
  // merge below reads the next element of a range before it knows whether the range goes on
  // (never compared then), which keeps its loop free of bounds branches; a thread past the
  // end of a partial tile steps through at most kPer elements beyond it.
  __shared__ union {
    Element tile[kTile + kPer];
    typename BlockStore::TempStorage store;
  } shared;
  const long long tile = blockIdx.x;
  const TileMerge merge = tile_merge<kTile>(params, tile);
  const long long total = merge.first_n + merge.second_n;
  const long long end = merge.diag + kTile < total ? merge.diag + kTile : total;
  const long long first_begin = params.partitions[tile];
  const long long first_end = merge.last ? merge.first_n : params.partitions[tile + 1];
  const long long second_begin = merge.diag - first_begin;
  const int count = static_cast<int>(end - merge.diag);
  const int first_count = static_cast<int>(first_end - first_begin);
  const int second_count = count - first_count;

  // global memory to registers (every load in flight at once), then to shared memory
  const Element* first = merge.first + first_begin;
  const Element* second = merge.second + second_begin;
  Element keys[kPer];
#pragma unroll
  for (int item = 0; item < kPer; ++item) {
    const int index = item * kThreads + static_cast<int>(threadIdx.x);
    if (count == kTile || index < count) {
      keys[item] = index < first_count ? first[index] : second[index - first_count];
    }
  }
#pragma unroll
  for (int item = 0; item < kPer; ++item) {
    const int index = item * kThreads + static_cast<int>(threadIdx.x);
    if (count == kTile || index < count) shared.tile[index] = keys[item];
  }
  __syncthreads();

  // this thread's items: where its diagonal crosses the two ranges, then a sequential merge
  const int diag = static_cast<int>(threadIdx.x) * kPer < count ? static_cast<int>(threadIdx.x) * kPer : count;
  int i = merge_split<int>(shared.tile, first_count, shared.tile + first_count, second_count, diag);
  int j = first_count + diag - i;
  const Less less;
  Element a = shared.tile[i];
  Element b = shared.tile[j];
#pragma unroll
  for (int item = 0; item < kPer; ++item) {
    const bool take_second = j < count && (i >= first_count || less(b, a));
    keys[item] = take_second ? b : a;
    if (take_second) {
      b = shared.tile[++j];
    } else {
      a = shared.tile[++i];
    }
  }
  __syncthreads();
  Element* out = merge.out + merge.diag;
  if (count == kTile) {
    BlockStore(shared.store).Store(out, keys);
  } else {
    BlockStore(shared.store).Store(out, keys, count);
  }
}

template <int kTile>
__device__ __forceinline__ void partition(const MergeParams& params) {
  const long long tile = static_cast<long long>(blockIdx.x) * kMergePartitionBlock + threadIdx.x;
  if (tile >= params.tiles) return;
  const TileMerge merge = tile_merge<kTile>(params, tile);
  const long long total = merge.first_n + merge.second_n;
  const long long diag = merge.diag < total ? merge.diag : total;
  params.partitions[tile] = merge_split(merge.first, merge.first_n, merge.second, merge.second_n, diag);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlockSortThreads)
    csj_merge_sort_block(const __grid_constant__ BlockSortParams params) {
  block_sort<kBlockSortThreads, block_sort_items(CSJ_ELEMENT_SIZE)>(params);
}

extern "C" __global__ void __launch_bounds__(kMergePartitionBlock)
    csj_merge_partition(const __grid_constant__ MergeParams params) {
  partition<merge_tile(CSJ_ELEMENT_SIZE)>(params);
}

extern "C" __global__ void __launch_bounds__(kMergeThreads)
    csj_merge(const __grid_constant__ MergeParams params) {
  merge_block<kMergeThreads, merge_items(CSJ_ELEMENT_SIZE)>(params);
}

extern "C" __global__ void __launch_bounds__(kMergeSearchBlock)
    csj_merge_search(const __grid_constant__ MergeSearchParams params) {
  const long long k = static_cast<long long>(blockIdx.x) * kMergeSearchBlock + threadIdx.x;
  MergeSearchSegment segment;
  long long j = k;
  if (params.segments) {
    const long long index = k >> params.segment_shift;
    if (index >= params.segment_count) return;
    segment = params.segments[index];
    j = k - (index << params.segment_shift);
  } else {
    segment = params.pivots;
  }
  if (j >= segment.count) return;
  const Element pivot =
      *reinterpret_cast<const Element*>(static_cast<const unsigned char*>(segment.pivots) + j * segment.pivot_stride);
  const Element* run = static_cast<const Element*>(params.run);
  const Less less;
  long long low = 0, high = params.n;
  while (low < high) {
    const long long middle = low + (high - low) / 2;
    const Element x = run[middle];
    const bool before = segment.upper ? !less(pivot, x) : less(x, pivot);
    if (before) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  params.counts[k] = params.accumulate ? params.counts[k] + low : low;
}
