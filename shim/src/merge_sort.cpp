// The comparator merge sort's launches (merge_sort.hpp): a block sort of every tile, then
// about log2(tiles) merge passes ping-ponging between the output and a scratch buffer, each a
// partition kernel (one thread per output tile) and a merge kernel (one block per output
// tile); the same two kernels merge two arrays of any lengths; the pivot search.
#include "merge_sort.hpp"

#include <stdexcept>
#include <string>

#include "../kernels/merge_sort.hpp"
#include "csj/transform.hpp"

namespace csj::detail {
namespace {

namespace k = kernels;

constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Output tiles of a merge of n elements.
long long tiles_of(long long n, std::size_t element_size) {
  const long long tile = k::merge_tile(static_cast<int>(element_size));
  return (n + tile - 1) / tile;
}

unsigned grid_of(long long threads, int block) { return static_cast<unsigned>((threads + block - 1) / block); }

void queue_merge_launches(const MergeSortKernels& kernels, k::MergeParams& params, cudaStream_t stream) {
  launch(kernels.partition, grid_of(params.tiles, k::kMergePartitionBlock), k::kMergePartitionBlock, stream, params,
         "launching merge partitions");
  launch(kernels.merge, static_cast<unsigned>(params.tiles), k::kMergeThreads, stream, params,
         "launching merge");
}

}  // namespace

MergeSortKernels merge_sort_kernels(const KernelLibrary& library, int device, std::size_t element_size) {
  if (element_size < 4 || element_size > 32 || element_size % 4 != 0) {
    throw std::invalid_argument("a: cannot merge sort elements of " + std::to_string(element_size) + " bytes");
  }
  MergeSortKernels kernels;
  kernels.block_sort = KernelHandle::linked(library.kernel("csj_merge_sort_block", device));
  kernels.partition = KernelHandle::linked(library.kernel("csj_merge_partition", device));
  kernels.merge = KernelHandle::linked(library.kernel("csj_merge", device));
  kernels.search = KernelHandle::linked(library.kernel("csj_merge_search", device));
  kernels.element_size = element_size;
  return kernels;
}

std::size_t merge_sort_scratch_bytes(long long n, std::size_t element_size) {
  return aligned(static_cast<std::size_t>(n) * element_size) + merge_temp_bytes(n, element_size);
}

std::size_t merge_temp_bytes(long long total, std::size_t element_size) {
  return aligned(static_cast<std::size_t>(tiles_of(total, element_size)) * sizeof(long long));
}

void queue_merge_sort(const MergeSortKernels& kernels, const void* in, void* out, long long n, void* scratch,
                      cudaStream_t stream) {
  if (n == 0) return;
  const int item = static_cast<int>(kernels.element_size);
  const long long tiles = tiles_of(n, kernels.element_size);
  const long long block_tile = k::block_sort_tile(item);
  const int first = k::first_merge_pass(item);
  int passes = first;  // the block-sorted runs are merge tiles << first long
  while ((1LL << passes) < tiles) ++passes;
  void* other = scratch;
  auto* partitions = reinterpret_cast<long long*>(static_cast<unsigned char*>(scratch) +
                                                  aligned(static_cast<std::size_t>(n) * kernels.element_size));
  // an even number of passes ends where the block sort wrote
  void* sorted = (passes - first) % 2 == 0 ? out : other;
  k::BlockSortParams block{in, sorted, n};
  launch(kernels.block_sort, static_cast<unsigned>((n + block_tile - 1) / block_tile), k::kBlockSortThreads, stream,
         block, "launching merge sort tiles");
  for (int pass = first; pass < passes; ++pass) {
    void* into = sorted == out ? other : out;
    k::MergeParams params{};
    params.in = sorted;
    params.n = n;
    params.pass = pass;
    params.out = into;
    params.partitions = partitions;
    params.tiles = tiles;
    queue_merge_launches(kernels, params, stream);
    sorted = into;
  }
}

void queue_merge(const MergeSortKernels& kernels, const void* first, long long first_n, const void* second,
                 long long second_n, void* out, void* temp, cudaStream_t stream) {
  const long long total = first_n + second_n;
  if (total == 0) return;
  k::MergeParams params{};
  params.in = first;
  params.n = first_n;
  params.pass = -1;
  params.second = second;
  params.second_n = second_n;
  params.out = out;
  params.partitions = static_cast<long long*>(temp);
  params.tiles = tiles_of(total, kernels.element_size);
  queue_merge_launches(kernels, params, stream);
}

void queue_search(const MergeSortKernels& kernels, const void* run, long long n, const void* pivots,
                  long long pivot_stride, long long count, long long* counts, bool upper, bool accumulate,
                  cudaStream_t stream) {
  if (count == 0) return;
  k::MergeSearchParams params{};
  params.run = run;
  params.n = n;
  params.pivots = {pivots, pivot_stride, count, upper ? 1 : 0};
  params.counts = counts;
  params.accumulate = accumulate ? 1 : 0;
  launch(kernels.search, grid_of(count, k::kMergeSearchBlock), k::kMergeSearchBlock, stream, params,
         "launching merge search");
}

void queue_search_segments(const MergeSortKernels& kernels, const void* run, long long n,
                           const k::MergeSearchSegment* segments, int segment_count, int segment_shift,
                           long long* counts, cudaStream_t stream) {
  if (segment_count == 0) return;
  k::MergeSearchParams params{};
  params.run = run;
  params.n = n;
  params.segments = segments;
  params.segment_count = segment_count;
  params.segment_shift = segment_shift;
  params.counts = counts;
  launch(kernels.search, grid_of(static_cast<long long>(segment_count) << segment_shift, k::kMergeSearchBlock),
         k::kMergeSearchBlock, stream, params, "launching merge search");
}

}  // namespace csj::detail
