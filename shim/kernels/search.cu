// searchsorted's built-in kernels: the search over numbers in their own order (search.cuh
// with the ordered keys of ordered_key.cuh: NaNs last and all equal, -0.0 == 0.0, as numpy),
// one instance per dtype, and the fill of the table every search keeps in shared memory,
// which only moves elements and serves any search.
#include "builtin_kernels.hpp"
#include "ordered_key.cuh"
#include "search.cuh"

namespace csj::kernels {
namespace {

template <class T>
__global__ void __launch_bounds__(kSearchBlock) builtin_search(const __grid_constant__ SearchParams p) {
  search_sorted<T>(p, OrderedLess<T, false>{});
}

// Entry i < shard_count: shard i's last element; entry shard_count + j: the element at global
// position j * stride, in the last shard that starts at or before it.
__global__ void __launch_bounds__(kSearchBlock) fill_search_table(const __grid_constant__ SearchIndexParams p) {
  const long long entry = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (entry >= p.shard_count + p.sample_count) return;
  const int words = p.item_size / 4;
  const SearchShard* shard;
  long long local;
  if (entry < p.shard_count) {
    shard = p.shards + entry;
    local = shard->n - 1;
  } else {
    const long long position = (entry - p.shard_count) * p.stride;
    int low = 0, high = p.shard_count - 1;
    while (low < high) {
      const int mid = (low + high + 1) / 2;
      if (p.shards[mid].offset <= position) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    shard = p.shards + low;
    local = position - shard->offset;
  }
  const auto* from = static_cast<const unsigned int*>(shard->data) + local * words;
  auto* to = static_cast<unsigned int*>(p.table) + entry * words;
  for (int w = 0; w < words; ++w) to[w] = from[w];
}

}  // namespace

const void* builtin_search_kernel(int dtype) {
  return with_dtype(dtype, [](auto zero) { return reinterpret_cast<const void*>(&builtin_search<decltype(zero)>); });
}

const void* search_index_kernel() { return reinterpret_cast<const void*>(&fill_search_table); }

}  // namespace csj::kernels
