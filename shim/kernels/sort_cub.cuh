// What the sort's CUB instantiations share (sort.cu: keys alone; sort_pairs.cuh: keys with
// values): the ordered key their merges compare by, and the count type their radix sorts take.
#pragma once

#include <cuda/std/limits>

#include "ordered_key.cuh"

namespace csj::kernels {

// CUB's radix sort takes its offset type from the type of the key count: 32-bit offsets give
// its onesweep pass 20 keys per thread against 19 with 64-bit ones, and the sort is about 2%
// faster (H200, 2^27 int32 keys: 2.683 against 2.740 ms). Shards that fit take them.
template <class Sort>
cudaError_t with_count(long long n, Sort&& sort) {
  if (n <= cuda::std::numeric_limits<int>::max()) return sort(static_cast<int>(n));
  return sort(n);
}

}  // namespace csj::kernels
