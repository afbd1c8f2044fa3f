// The comparator merge sort's tile sizes and parameter blocks, shared by its LTO-IR module
// (merge_sort_jit.cu, one per element size) and the host driver (sort_compare.cpp). Plain
// C++ (no CUDA types) so both sides agree on the layout.
//
// The sort of one shard: each block sorts a tile of kBlockSortThreads x block_sort_items(size)
// elements (csj_merge_sort_block), then pass after pass runs of width w (a block-sort tile,
// then twice that, ...) are merged pairwise into the other of two buffers: a partition kernel finds, by
// a binary search along each output tile's diagonal of the merge path, where the tile starts
// in the first run (csj_merge_partition), and one block per output tile of kMergeThreads x
// merge_items(size) elements merges its two ranges through shared memory (csj_merge). The
// same two kernels merge two sorted arrays of any lengths (MergeParams::pass < 0).
// csj_merge_search counts, for many pivots, the elements of a sorted run that go before each.
// Ties take the first run (or the elements before the pivot, for an upper bound): the sort is
// stable.
#pragma once

namespace csj::kernels {

// Items per thread of the block sort: CUB's merge sort tuning for sm_60 and later (17 4-byte
// items, fewer of larger elements, at least 1).
constexpr int block_sort_items(int element_size) {
  return element_size <= 4 ? 17 : (17 * 4) / element_size < 1 ? 1 : (17 * 4) / element_size;
}

// The tile shapes (measured on an H200, 2^26 int64 and a comparator, against CUB's 256 x 8
// for both steps: docs/performance.md): the block sort runs 512 threads a block, which sorts
// tiles twice as long for about the same time per element, and the merges of elements of 8
// bytes or more take twice the block sort's items per thread on 256 threads, so that their
// tiles are as long as the block sort's and each merge pass has half the blocks and half the
// partitions. For 2^26 8-byte elements: tiles of 4096, 14 merge passes. 4-byte elements keep
// 17 items per merging thread (34 would cost occupancy): their block-sorted runs are two merge
// tiles long, and their merge passes start at pass 1.
constexpr int kBlockSortThreads = 512;
constexpr int kMergeThreads = 256;
constexpr int merge_items(int element_size) {
  return element_size <= 4 ? block_sort_items(element_size) : 2 * block_sort_items(element_size);
}
constexpr long long block_sort_tile(int element_size) {
  return static_cast<long long>(kBlockSortThreads) * block_sort_items(element_size);
}
constexpr long long merge_tile(int element_size) {
  return static_cast<long long>(kMergeThreads) * merge_items(element_size);
}
// The first merge pass: the block-sorted runs are merge_tile << first_merge_pass long.
constexpr int first_merge_pass(int element_size) {
  return block_sort_tile(element_size) == merge_tile(element_size) ? 0 : 1;
}
// Every element size the modules are built for sorts into runs of whole merge tiles.
constexpr bool runs_of_merge_tiles() {
  for (int size = 4; size <= 32; size += 4) {
    if (block_sort_tile(size) != merge_tile(size) << first_merge_pass(size)) return false;
  }
  return true;
}
static_assert(runs_of_merge_tiles(), "block-sort tiles must be whole merge tiles");

constexpr int kMergePartitionBlock = 256;
constexpr int kMergeSearchBlock = 256;

// csj_merge_sort_block: every tile of `in` sorted into the same place of `out` (which may be
// `in`); one block per block-sort tile.
struct BlockSortParams {
  const void* in;
  void* out;
  long long n;
};

// csj_merge_partition (one thread per output tile) and csj_merge (one block per output tile).
// pass >= 0: a merge pass over the n elements of `in`, whose runs of w = tile << pass
// elements are merged pairwise, [2gw, 2gw + w) with [2gw + w, 2gw + 2w), into the same
// place of `out` (tiles of a merge by shifts: no 64-bit division in the kernels); w is
// merge_tile << pass.
// pass < 0: `in` (n elements) and `second` (second_n) merged into `out`.
// partitions[t]: how many elements of its first run come before output tile t of its
// merge (written by the partition kernel, read by the merge kernel).
struct MergeParams {
  const void* in;
  long long n;
  int pass;
  const void* second;
  long long second_n;
  void* out;
  long long* partitions;
  long long tiles;
};

// csj_merge_search, one thread per pivot: how many elements x of the sorted `run` go before
// the pivot: those with less(x, pivot) (a lower bound), or with `upper` those with
// !less(pivot, x) (an upper bound). Pivots come in segments, each `count` elements at
// pivots + j * pivot_stride bytes: elements copied one after another, or spaced out in a run
// (read where they lie, on the device or a peer).
struct MergeSearchSegment {
  const void* pivots;
  long long pivot_stride;
  long long count;
  int upper;
};

// One segment (`segments` null): pivot j's count goes to counts[j]. Several (the co-ranking
// of a multi-place sort): segment s (of segment_count, the table where it lies: device or
// pinned host memory) has its pivot j searched by thread (s << segment_shift) + j, which
// writes counts[(s << segment_shift) + j]. accumulate != 0 adds the count to what counts[]
// holds (a pivot's rank over several runs, searched one after another on one stream).
// `counts` may lie in pinned host memory.
struct MergeSearchParams {
  const void* run;
  long long n;
  MergeSearchSegment pivots;
  const MergeSearchSegment* segments;
  int segment_count;
  int segment_shift;
  long long* counts;
  int accumulate;
};

}  // namespace csj::kernels
