// How the shim's CUB calls take their element count. CUB's radix sort takes its offset type
// from the type of the count: 32-bit offsets give its onesweep pass 20 keys per thread
// against 19 with 64-bit ones, and the sort is about 2% faster (H200, 2^27 int32 keys: 2.683
// against 2.740 ms). Counts that fit take them. Shared by sort.cu, sort_pairs.cuh and top_k.cu.
#pragma once

#include <cuda/std/limits>

namespace csj::kernels {

template <class Call>
auto with_count(long long n, Call&& call) {
  if (n <= cuda::std::numeric_limits<int>::max()) return call(static_cast<int>(n));
  return call(n);
}

}  // namespace csj::kernels
