// Internal: the launches of the comparator merge sort's linked kernels (merge_sort_jit.cu,
// tiles and parameters in kernels/merge_sort.hpp), each queued on one stream of the current
// device: the local sort of one buffer, the merge of two sorted arrays, and the pivot
// search. The sort with a comparator (sort_compare.cpp) composes them per place; the
// multi-place steps reuse the merge and the search.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "launch.hpp"

namespace csj {
class KernelLibrary;
}

namespace csj::kernels {
struct MergeSearchSegment;
}

namespace csj::detail {

// One place's linked merge sort module (for `device`), for elements of `element_size` bytes
// (the size the module was built for: Python picks the module by the element size).
struct MergeSortKernels {
  KernelHandle block_sort, partition, merge, search;
  std::size_t element_size = 0;
};
MergeSortKernels merge_sort_kernels(const KernelLibrary& library, int device, std::size_t element_size);

// Scratch bytes a local sort of n elements needs: a second buffer of n elements and one
// partition per tile.
std::size_t merge_sort_scratch_bytes(long long n, std::size_t element_size);

// Queues the stable sort of `in` (n elements) into `out`, which may be `in`; `in` is left as
// it was otherwise. `scratch` holds merge_sort_scratch_bytes(n) (256-byte aligned). The block
// sort writes whichever of `out` and the scratch buffer makes the last merge pass end in
// `out`.
void queue_merge_sort(const MergeSortKernels& kernels, const void* in, void* out, long long n, void* scratch,
                      cudaStream_t stream);

// Temporary bytes a merge of `total` elements needs (one partition per output tile).
std::size_t merge_temp_bytes(long long total, std::size_t element_size);

// Queues the stable merge of the sorted arrays `first` and `second` into `out` (ties take
// `first`'s elements first); `temp` holds merge_temp_bytes(first_n + second_n).
void queue_merge(const MergeSortKernels& kernels, const void* first, long long first_n, const void* second,
                 long long second_n, void* out, void* temp, cudaStream_t stream);

// Queues counts[k] (+)= how many elements x of the sorted `run` (n elements) go before pivot k,
// at pivots + k * pivot_stride bytes, for k < count: less(x, pivot), or with `upper`
// !less(pivot, x); `accumulate` adds to what counts[k] holds. `counts` may be pinned host memory.
void queue_search(const MergeSortKernels& kernels, const void* run, long long n, const void* pivots,
                  long long pivot_stride, long long count, long long* counts, bool upper, bool accumulate,
                  cudaStream_t stream);

// Queues the search of `segment_count` segments of pivots (the table in device or pinned
// host memory, each segment at most 1 << segment_shift pivots) in one launch: segment s's
// pivot j counted into counts[(s << segment_shift) + j].
void queue_search_segments(const MergeSortKernels& kernels, const void* run, long long n,
                           const kernels::MergeSearchSegment* segments, int segment_count, int segment_shift,
                           long long* counts, cudaStream_t stream);

}  // namespace csj::detail
