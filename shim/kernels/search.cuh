// The searchsorted kernel body, one source for every way it is instantiated: with the
// numbers' own order (the built-in search of search.cu) and, through the same driver, with
// an order a comparator defines. `Less(x, y)` is true when x goes strictly before y; T is the
// element (a number, or any copyable value of the element's size).
//
// Each block first copies the table (every shard's last element, then every stride-th
// element of the sorted sequence, search_params.hpp) into shared memory: a query's first
// steps, the shard it falls in and then the samples around it, stay in shared memory, and
// only the last log2(stride) steps read the shard itself (the same device's memory, a peer's,
// or a copy).
#pragma once

#include <cuda/std/type_traits>

#include "search_params.hpp"

namespace csj::kernels {

// How many elements of the sorted sequence go before the query, `before(x)` saying whether
// x does (along a sorted sequence: true, then false).
template <class T, class Before>
__device__ __forceinline__ long long search_position(const SearchParams& p, const T* lasts, const T* samples,
                                                     Before before) {
  // the first shard whose last element does not go before the query holds the answer; the
  // shards before it go before the query whole
  int low = 0, high = p.shard_count;
  while (low < high) {
    const int mid = (low + high) / 2;
    if (before(lasts[mid])) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  if (low == p.shard_count) return p.total;
  const SearchShard shard = p.shards[low];
  // the first of the shard's samples that does not go before the query
  long long sample = shard.first_sample, end = shard.end_sample;
  while (sample < end) {
    const long long mid = sample + (end - sample) / 2;
    if (before(samples[mid])) {
      sample = mid + 1;
    } else {
      end = mid;
    }
  }
  // the answer lies after the sample before it and at most at that sample (or at the
  // shard's last element, which does not go before the query)
  long long first = sample > shard.first_sample ? (sample - 1) * p.stride - shard.offset + 1 : 0;
  long long last = sample < shard.end_sample ? sample * p.stride - shard.offset : shard.n - 1;
  const T* data = static_cast<const T*>(shard.data);
  while (first < last) {
    const long long mid = first + (last - first) / 2;
    if (before(data[mid])) {
      first = mid + 1;
    } else {
      last = mid;
    }
  }
  return shard.offset + first;
}

template <class T, class Less>
__device__ __forceinline__ void search_sorted(const SearchParams& p, const Less& less) {
  extern __shared__ __align__(16) unsigned char shared_table[];
  T* table = reinterpret_cast<T*>(shared_table);
  const T* from = static_cast<const T*>(p.table);
  const long long entries = p.shard_count + p.sample_count;
  for (long long i = threadIdx.x; i < entries; i += blockDim.x) table[i] = from[i];
  __syncthreads();
  const T* lasts = table;
  const T* samples = table + p.shard_count;
  const T* queries = static_cast<const T*>(p.queries);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  auto positions = [&](auto right) {
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count; i += stride) {
      const T query = queries[i];
      p.positions[i] = search_position(p, lasts, samples, [&](const T& x) {
        if constexpr (decltype(right)::value) {
          return !less(query, x);  // side "right": x is not after the query
        } else {
          return less(x, query);
        }
      });
    }
  };
  if (p.right) {
    positions(cuda::std::true_type{});
  } else {
    positions(cuda::std::false_type{});
  }
}

}  // namespace csj::kernels
