// histogram_even: numpy's bins (edges from np.linspace in the bin dtype, values outside
// [edges[0], edges[num_bins]] and NaN ignored, the last bin closed). Counting is exact
// integer addition, so the order of atomics does not change the result.
#include <cuda/std/type_traits>

#include <cstdint>

#include "builtin_kernels.hpp"

namespace csj::kernels {
namespace {

// numpy compares in the edges' dtype: float32 input keeps float32, others use float64.
template <class T>
using BinType = cuda::std::conditional_t<cuda::std::is_same_v<T, float>, float, double>;

template <class T>
__device__ __forceinline__ int bin_of(T value, const BinType<T>* edges, int num_bins, bool& keep) {
  using B = BinType<T>;
  const B x = static_cast<B>(value);
  keep = x >= edges[0] && x <= edges[num_bins];  // false for NaN
  if (!keep) return 0;
  const double scale = num_bins / (static_cast<double>(edges[num_bins]) - static_cast<double>(edges[0]));
  long long bin = static_cast<long long>((static_cast<double>(x) - static_cast<double>(edges[0])) * scale);
  bin = bin < 0 ? 0 : (bin >= num_bins ? num_bins - 1 : bin);
  // the estimate may be one off at an edge: settle it against the edges themselves
  while (bin > 0 && x < edges[bin]) --bin;
  while (bin < num_bins - 1 && x >= edges[bin + 1]) ++bin;
  return static_cast<int>(bin);
}

template <class T>
__global__ void __launch_bounds__(kHistogramBlock) histogram_kernel(const __grid_constant__ HistogramParams p) {
  extern __shared__ unsigned int shared_bins[];
  const T* data = static_cast<const T*>(p.in);
  const auto* edges = static_cast<const BinType<T>*>(p.edges);
  const bool in_shared = p.num_bins <= kHistogramSharedBins;
  if (in_shared) {
    for (int bin = threadIdx.x; bin < p.num_bins; bin += blockDim.x) shared_bins[bin] = 0;
    __syncthreads();
  }
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    bool keep;
    const int bin = bin_of<T>(data[i], edges, p.num_bins, keep);
    if (!keep) continue;
    if (in_shared) {
      atomicAdd(shared_bins + bin, 1u);
    } else {
      atomicAdd(p.counts + bin, 1ull);
    }
  }
  if (in_shared) {
    __syncthreads();
    for (int bin = threadIdx.x; bin < p.num_bins; bin += blockDim.x) {
      if (shared_bins[bin]) atomicAdd(p.counts + bin, static_cast<unsigned long long>(shared_bins[bin]));
    }
  }
}

}  // namespace

const void* builtin_histogram_kernel(int dtype) {
  return with_dtype(dtype, [](auto tag) {
    return reinterpret_cast<const void*>(&histogram_kernel<decltype(tag)>);
  });
}

}  // namespace csj::kernels
