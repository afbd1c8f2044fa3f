// The sort engine (see sort_engine.hpp): one instantiation of CUB's radix sort and merge of
// keys alone per element type and direction (sort_pairs.cuh: with values), plus the small
// kernels of the multi-place sort (splitter counting, key samples, NaN canonicalisation).
#include <cub/device/device_merge.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cuda/std/limits>
#include <cuda/std/type_traits>

#include "builtin_kernels.hpp"
#include "cub_count.cuh"
#include "ordered_key.cuh"
#include "sort_engine.hpp"

namespace csj::kernels {
namespace {

// One thread per (boundary, candidate): how many keys of the sorted run lie below the
// candidate (a lower bound by binary search on ordered keys).
template <class T, bool Descending>
__global__ void __launch_bounds__(kSplitterBlock) splitter_kernel(const __grid_constant__ SplitterParams p) {
  const long long slot = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (slot >= static_cast<long long>(p.boundaries) * p.candidates) return;
  const int boundary = static_cast<int>(slot / p.candidates);
  const unsigned long long j = static_cast<unsigned long long>(slot % p.candidates);
  const auto candidate = static_cast<Bits<T>>(p.bases[boundary] + (j << p.shift));
  const T* keys = static_cast<const T*>(p.keys);
  long long low = 0, high = p.n;
  while (low < high) {
    const long long mid = low + (high - low) / 2;
    if (ordered_key<T, Descending>(keys[mid]) < candidate) low = mid + 1;
    else high = mid;
  }
  p.counts[slot] = static_cast<unsigned long long>(low);
}

template <class T>
__global__ void canonicalize_nan_kernel(const __grid_constant__ KeysParams p) {
  T* data = static_cast<T*>(p.keys);
  const T* in = p.in ? static_cast<const T*>(p.in) : data;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    const T value = in[i];
    if (value != value) {
      data[i] = cuda::std::numeric_limits<T>::quiet_NaN();
    } else if (p.in) {
      data[i] = value;
    }
  }
}

// A 64-bit mix (splitmix64's finaliser) for the sample positions.
__device__ __forceinline__ unsigned long long mix(unsigned long long x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T, bool Descending>
__global__ void sample_kernel(const __grid_constant__ SampleParams p) {
  const long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= p.count) return;
  const long long low = j * p.n / p.count, high = (j + 1) * p.n / p.count;
  const long long at = low + static_cast<long long>(mix(static_cast<unsigned long long>(j)) %
                                                    static_cast<unsigned long long>(high - low));
  static_cast<Bits<T>*>(p.ordered)[j] = ordered_key<T, Descending>(static_cast<const T*>(p.keys)[at]);
}

template <class T, bool Descending>
cudaError_t radix_sort(void* temp, std::size_t& temp_bytes, void* current, void* alternate, long long n,
                       bool* current_is_alternate, cudaStream_t stream) {
  cub::DoubleBuffer<T> keys(static_cast<T*>(current), static_cast<T*>(alternate));
  const cudaError_t status = with_count(n, [&](auto count) {
    if constexpr (Descending) {
      return cub::DeviceRadixSort::SortKeysDescending(temp, temp_bytes, keys, count, 0, int(sizeof(T) * 8), stream);
    } else {
      return cub::DeviceRadixSort::SortKeys(temp, temp_bytes, keys, count, 0, int(sizeof(T) * 8), stream);
    }
  });
  if (current_is_alternate) *current_is_alternate = keys.selector != 0;
  return status;
}

template <class T, bool Descending>
cudaError_t radix_sort_into(void* temp, std::size_t& temp_bytes, const void* in, void* out, long long n,
                            cudaStream_t stream) {
  const T* keys_in = static_cast<const T*>(in);
  T* keys_out = static_cast<T*>(out);
  return with_count(n, [&](auto count) {
    if constexpr (Descending) {
      return cub::DeviceRadixSort::SortKeysDescending(temp, temp_bytes, keys_in, keys_out, count, 0,
                                                      int(sizeof(T) * 8), stream);
    } else {
      return cub::DeviceRadixSort::SortKeys(temp, temp_bytes, keys_in, keys_out, count, 0, int(sizeof(T) * 8),
                                            stream);
    }
  });
}

template <class T, bool Descending>
cudaError_t merge(void* temp, std::size_t& temp_bytes, const void* first, long long first_n,
                  const void* second, long long second_n, void* out, cudaStream_t stream) {
  return cub::DeviceMerge::MergeKeys(temp, temp_bytes, static_cast<const T*>(first), first_n,
                                     static_cast<const T*>(second), second_n, static_cast<T*>(out),
                                     OrderedLess<T, Descending>{}, stream);
}

template <class T, bool Descending>
SortEngine make_engine() {
  SortEngine engine{};
  engine.key_bits = static_cast<int>(sizeof(T) * 8);
  engine.sort = &radix_sort<T, Descending>;
  engine.sort_into = &radix_sort_into<T, Descending>;
  engine.merge = &merge<T, Descending>;
  engine.splitter_kernel = reinterpret_cast<const void*>(&splitter_kernel<T, Descending>);
  if constexpr (cuda::std::is_floating_point_v<T>) {
    engine.canonicalize_kernel = reinterpret_cast<const void*>(&canonicalize_nan_kernel<T>);
  }
  engine.sample_kernel = reinterpret_cast<const void*>(&sample_kernel<T, Descending>);
  return engine;
}

}  // namespace

const SortEngine* sort_engine(int dtype, bool descending) {
  // Built on first use; function-local statics are initialised once, thread-safely.
  return with_dtype(dtype, [descending](auto zero) -> const SortEngine* {
    using T = decltype(zero);
    static const SortEngine ascending_engine = make_engine<T, false>();
    static const SortEngine descending_engine = make_engine<T, true>();
    return descending ? &descending_engine : &ascending_engine;
  });
}

const PairsEngine* pairs_engine(int dtype, bool descending, int value_bytes) {
  if (value_bytes == 4) return pairs_engine_4(dtype, descending);
  if (value_bytes == 8) return pairs_engine_8(dtype, descending);
  return nullptr;
}

}  // namespace csj::kernels
