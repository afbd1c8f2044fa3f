// The pairs engines (sort_engine.hpp's PairsEngine): CUB's radix sort and merge of keys that
// carry values, one instantiation per key type, direction and value width. Included by one
// translation unit per width (sort_pairs4.cu, sort_pairs8.cu) with CSJ_PAIRS_VALUE the value
// type: each is as costly to compile as sort.cu, and the build runs them side by side.
#pragma once

#include <cub/device/device_merge.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "builtin_kernels.hpp"
#include "cub_count.cuh"
#include "ordered_key.cuh"
#include "sort_engine.hpp"

namespace csj::kernels::pairs {

template <class K, class V, bool Descending>
cudaError_t radix_sort(void* temp, std::size_t& temp_bytes, void* keys, void* keys_alternate, void* values,
                       void* values_alternate, long long n, bool* current_is_alternate, cudaStream_t stream) {
  cub::DoubleBuffer<K> key_buffers(static_cast<K*>(keys), static_cast<K*>(keys_alternate));
  cub::DoubleBuffer<V> value_buffers(static_cast<V*>(values), static_cast<V*>(values_alternate));
  const cudaError_t status = with_count(n, [&](auto count) {
    if constexpr (Descending) {
      return cub::DeviceRadixSort::SortPairsDescending(temp, temp_bytes, key_buffers, value_buffers, count, 0,
                                                       int(sizeof(K) * 8), stream);
    } else {
      return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, key_buffers, value_buffers, count, 0,
                                             int(sizeof(K) * 8), stream);
    }
  });
  // CUB moves both lanes together: their selectors agree
  if (current_is_alternate) *current_is_alternate = key_buffers.selector != 0;
  return status;
}

template <class K, class V, bool Descending>
cudaError_t radix_sort_into(void* temp, std::size_t& temp_bytes, const void* keys_in, void* keys_out,
                            const void* values_in, void* values_out, long long n, cudaStream_t stream) {
  const K* ki = static_cast<const K*>(keys_in);
  K* ko = static_cast<K*>(keys_out);
  const V* vi = static_cast<const V*>(values_in);
  V* vo = static_cast<V*>(values_out);
  return with_count(n, [&](auto count) {
    if constexpr (Descending) {
      return cub::DeviceRadixSort::SortPairsDescending(temp, temp_bytes, ki, ko, vi, vo, count, 0,
                                                       int(sizeof(K) * 8), stream);
    } else {
      return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ki, ko, vi, vo, count, 0, int(sizeof(K) * 8),
                                             stream);
    }
  });
}

template <class K, class V, bool Descending>
cudaError_t merge(void* temp, std::size_t& temp_bytes, const void* first_keys, const void* first_values,
                  long long first_n, const void* second_keys, const void* second_values, long long second_n,
                  void* out_keys, void* out_values, cudaStream_t stream) {
  return cub::DeviceMerge::MergePairs(temp, temp_bytes, static_cast<const K*>(first_keys),
                                      static_cast<const V*>(first_values), first_n,
                                      static_cast<const K*>(second_keys), static_cast<const V*>(second_values),
                                      second_n, static_cast<K*>(out_keys), static_cast<V*>(out_values),
                                      OrderedLess<K, Descending>{}, stream);
}

template <class K, class V, bool Descending>
PairsEngine make_engine() {
  return {&radix_sort<K, V, Descending>, &radix_sort_into<K, V, Descending>, &merge<K, V, Descending>};
}

template <class V>
const PairsEngine* engine_for(int dtype, bool descending) {
  // built on first use; function-local statics are initialised once, thread-safely
  return with_dtype(dtype, [descending](auto zero) -> const PairsEngine* {
    using K = decltype(zero);
    static const PairsEngine ascending_engine = make_engine<K, V, false>();
    static const PairsEngine descending_engine = make_engine<K, V, true>();
    return descending ? &descending_engine : &ascending_engine;
  });
}

}  // namespace csj::kernels::pairs
