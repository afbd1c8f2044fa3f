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

// The range and the bin width, read once per thread. A value's position in bins is
// estimated in the edges' precision (float for float32 data: fast); the estimate's error,
// and the edges' own rounding (np.linspace), stay well inside `margin` (a fraction of a
// bin), so an estimate farther than that from a bin boundary is the bin, and one nearer is
// settled against the edges themselves, as numpy does.
template <class T>
struct Bins {
  BinType<T> lower, upper;
  BinType<T> scale;   // num_bins / (upper - lower)
  BinType<T> offset;  // -lower * scale
  BinType<T> margin;
  int num_bins;
};

template <class T>
__device__ __forceinline__ Bins<T> make_bins(const BinType<T>* edges, int num_bins) {
  using B = BinType<T>;
  Bins<T> bins;
  bins.lower = edges[0];
  bins.upper = edges[num_bins];
  const double width = static_cast<double>(bins.upper) - static_cast<double>(bins.lower);
  bins.scale = static_cast<B>(num_bins / width);
  bins.offset = static_cast<B>(-static_cast<double>(bins.lower) * static_cast<double>(bins.scale));
  // In bins, the estimate's rounding (through scale, offset and the fma) and the edges'
  // distance from the exact grid are each at most a few epsilons of num_bins + M * scale,
  // M the largest magnitude in range: 16 times that is a wide margin. A margin of half a
  // bin or more (huge values, narrow bins) settles every value.
  const double eps = cuda::std::is_same_v<B, float> ? 1.1920928955078125e-7 : 2.220446049250313e-16;
  const double magnitude = fmax(fabs(static_cast<double>(bins.lower)), fabs(static_cast<double>(bins.upper)));
  const double margin = 16.0 * eps * (num_bins + 4.0 * magnitude * static_cast<double>(bins.scale));
  bins.margin = static_cast<B>(fmin(margin, 0.5));
  bins.num_bins = num_bins;
  return bins;
}

template <class T>
__device__ __forceinline__ int bin_of(T value, const BinType<T>* edges, const Bins<T>& bins, bool& keep) {
  using B = BinType<T>;
  const B x = static_cast<B>(value);
  keep = x >= bins.lower && x <= bins.upper;  // false for NaN
  if (!keep) return 0;
  const B position = fma(x, bins.scale, bins.offset);
  const B whole = floor(position);
  const B fraction = position - whole;
  int bin = static_cast<int>(whole);
  if (fraction >= bins.margin && fraction <= B(1) - bins.margin && bin >= 0 && bin < bins.num_bins) return bin;
  // near a boundary: settle against the edges
  bin = min(max(bin, 0), bins.num_bins - 1);
  while (bin > 0 && x < edges[bin]) --bin;
  while (bin < bins.num_bins - 1 && x >= edges[bin + 1]) ++bin;
  return bin;
}

// Where a counted value goes: a shared sub-histogram (per warp or per block) or the
// global counts; atomics either way.
struct SharedCounters {
  unsigned int* bins;
  __device__ __forceinline__ void add(int bin) const { atomicAdd(bins + bin, 1u); }
};
struct GlobalCounters {
  unsigned long long* counts;
  __device__ __forceinline__ void add(int bin) const { atomicAdd(counts + bin, 1ull); }
};

template <class T, class Sink>
__device__ __forceinline__ void count_value(T value, const BinType<T>* edges, const Bins<T>& range, const Sink& sink) {
  bool keep;
  const int bin = bin_of<T>(value, edges, range, keep);
  if (keep) sink.add(bin);
}

// Every element of the shard, 16-byte vectors (two in flight per thread) when aligned.
template <class T, class Sink>
__device__ __forceinline__ void count_all(const HistogramParams& p, const BinType<T>* edges, const Bins<T>& range,
                                          const Sink& sink) {
  const T* data = static_cast<const T*>(p.in);
  const long long thread = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long threads = static_cast<long long>(gridDim.x) * blockDim.x;
  long long done = 0;
  if ((reinterpret_cast<unsigned long long>(data) & 15) == 0) {
    constexpr int kPerVector = 16 / sizeof(T);
    const long long vectors = p.n / kPerVector;
    const uint4* in = reinterpret_cast<const uint4*>(data);
    long long v = thread;
    for (; v + threads < vectors; v += 2 * threads) {
      const uint4 first = __ldcs(in + v);
      const uint4 second = __ldcs(in + v + threads);
      const T* a = reinterpret_cast<const T*>(&first);
      const T* b = reinterpret_cast<const T*>(&second);
#pragma unroll
      for (int i = 0; i < kPerVector; ++i) count_value<T>(a[i], edges, range, sink);
#pragma unroll
      for (int i = 0; i < kPerVector; ++i) count_value<T>(b[i], edges, range, sink);
    }
    if (v < vectors) {
      const uint4 last = __ldcs(in + v);
      const T* a = reinterpret_cast<const T*>(&last);
#pragma unroll
      for (int i = 0; i < kPerVector; ++i) count_value<T>(a[i], edges, range, sink);
    }
    done = vectors * kPerVector;
  }
  for (long long i = done + thread; i < p.n; i += threads) count_value<T>(data[i], edges, range, sink);
}

// The last block to finish (HistogramParams::done) hands the counts to the host: every
// block's atomics are in `counts` once it has counted itself in, so it copies them to
// host_counts, leaves `counts` and `done` at zero for the next call, and stores the ticket
// after everything else is visible to the host.
// (No static shared memory here: the host plans all 48 KiB as dynamic shared memory.)
__device__ __forceinline__ void hand_over(const HistogramParams& p) {
  __threadfence();  // this thread's atomics, before the block counts itself in
  __syncthreads();
  const bool last = __syncthreads_or(threadIdx.x == 0 && atomicAdd(p.done, 1u) == gridDim.x - 1);
  if (!last) return;
  __threadfence();
  for (int bin = threadIdx.x; bin < p.num_bins; bin += blockDim.x) {
    p.host_counts[bin] = __ldcg(p.counts + bin);
    p.counts[bin] = 0;
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    *p.done = 0;
    __threadfence_system();
    *static_cast<volatile unsigned long long*>(p.ready) = p.ticket;
  }
}

// Dynamic shared memory: the edges (when edges_in_shared), then `copies` sub-histograms of
// 32-bit counters. Per-warp copies keep warps from contending for a counter (measured on an
// H200, 64 bins, when every value was settled against the edges: 0.61 of cupy sum's
// bandwidth, against 0.49 with a 16-bit counter per thread and bin updated without atomics;
// with the margin test in bin_of, 0.72-0.83).
template <class T>
__global__ void __launch_bounds__(kHistogramBlock) histogram_kernel(const __grid_constant__ HistogramParams p) {
  using B = BinType<T>;
  extern __shared__ __align__(16) unsigned char shared[];
  const B* edges = p.edges ? static_cast<const B*>(p.edges) : reinterpret_cast<const B*>(p.inline_edges);
  if (p.edges_in_shared) {
    B* shared_edges = reinterpret_cast<B*>(shared);
    for (int e = threadIdx.x; e <= p.num_bins; e += blockDim.x) shared_edges[e] = edges[e];
    edges = shared_edges;
  }
  auto* bins = reinterpret_cast<unsigned int*>(shared + p.bins_offset);
  for (int slot = threadIdx.x; slot < p.copies * p.num_bins; slot += blockDim.x) bins[slot] = 0;
  __syncthreads();
  const Bins<T> range = make_bins<T>(edges, p.num_bins);
  // one instance per kind of edge memory: with the edges known to be in shared memory the
  // settling loads are shared-memory loads, not generic ones
  auto count_into = [&](const auto& sink) {
    if (p.edges_in_shared) {
      count_all<T>(p, reinterpret_cast<const B*>(shared), range, sink);
    } else {
      count_all<T>(p, edges, range, sink);
    }
  };

  if (p.copies == 0) {
    count_into(GlobalCounters{p.counts});
  } else {
    count_into(SharedCounters{bins + (p.copies > 1 ? (threadIdx.x / 32) * p.num_bins : 0)});
    __syncthreads();
    for (int bin = threadIdx.x; bin < p.num_bins; bin += blockDim.x) {
      unsigned long long total = 0;
      for (int copy = 0; copy < p.copies; ++copy) total += bins[copy * p.num_bins + bin];
      if (total) atomicAdd(p.counts + bin, total);
    }
  }
  if (p.done) hand_over(p);
}

}  // namespace

const void* builtin_histogram_kernel(int dtype) {
  return with_dtype(dtype, [](auto tag) {
    return reinterpret_cast<const void*>(&histogram_kernel<decltype(tag)>);
  });
}

}  // namespace csj::kernels
