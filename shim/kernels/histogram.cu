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

// A value's bin as estimated (`keep`: in range and not NaN; `sure`: the estimate is the bin),
// with no branch, so that a thread estimates a run of values before it settles any.
template <class T>
__device__ __forceinline__ int estimate(T value, const Bins<T>& bins, bool& keep, bool& sure) {
  using B = BinType<T>;
  const B x = static_cast<B>(value);
  keep = x >= bins.lower && x <= bins.upper;  // false for NaN
  const B position = fma(x, bins.scale, bins.offset);
  const B whole = floor(position);
  const B fraction = position - whole;
  const int bin = static_cast<int>(whole);
  sure = fraction >= bins.margin && fraction <= B(1) - bins.margin &&
         static_cast<unsigned>(bin) < static_cast<unsigned>(bins.num_bins);
  return bin;
}

// A kept value near a bin boundary: its bin settled against the edges, from the estimate.
template <class T>
__device__ __forceinline__ int settle(T value, int bin, const BinType<T>* edges, int num_bins) {
  using B = BinType<T>;
  const B x = static_cast<B>(value);
  bin = min(max(bin, 0), num_bins - 1);
  while (bin > 0 && x < edges[bin]) --bin;
  while (bin < num_bins - 1 && x >= edges[bin + 1]) ++bin;
  return bin;
}

// Where a counted value goes: a shared sub-histogram (the lane's column of the block's, with
// kShift = 5, or the warp's copy, or the block's) or the global counts; atomics either way.
// add_if(bin, keep) counts bin when keep. With a column per lane (kShift = 5) every lane adds,
// 1 or 0 (to its column of bin 0 when not keeping), so that no branch surrounds the atomic and
// no two lanes meet on a counter; a copy shared by a warp's lanes adds only what it keeps.
template <int kShift>
struct SharedCounters {
  unsigned int* bins;  // this thread's copy, at its column
  __device__ __forceinline__ void add_if(int bin, bool keep) const {
    if constexpr (kShift > 0) {
      atomicAdd(bins + (keep ? bin << kShift : 0), static_cast<unsigned int>(keep));
    } else if (keep) {
      atomicAdd(bins + bin, 1u);
    }
  }
};
struct GlobalCounters {
  unsigned long long* counts;
  __device__ __forceinline__ void add_if(int bin, bool keep) const {
    if (keep) atomicAdd(counts + bin, 1ull);
  }
};

// K values (a vector's): every bin estimated first, the rare unsure ones settled (a branch
// per vector, not per value), then the kept ones counted.
template <int K, class T, class Sink>
__device__ __forceinline__ void count_values(const T* values, const BinType<T>* edges, const Bins<T>& range,
                                             const Sink& sink) {
  int bins[K];
  bool keep[K];
  bool unsure = false;
#pragma unroll
  for (int i = 0; i < K; ++i) {
    bool sure;
    bins[i] = estimate<T>(values[i], range, keep[i], sure);
    unsure |= keep[i] && !sure;
  }
  if (unsure) {
#pragma unroll
    for (int i = 0; i < K; ++i) {
      if (keep[i]) bins[i] = settle<T>(values[i], bins[i], edges, range.num_bins);
    }
  }
#pragma unroll
  for (int i = 0; i < K; ++i) sink.add_if(bins[i], keep[i]);
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
      count_values<kPerVector, T>(reinterpret_cast<const T*>(&first), edges, range, sink);
      count_values<kPerVector, T>(reinterpret_cast<const T*>(&second), edges, range, sink);
    }
    for (; v < vectors; v += threads) {
      const uint4 last = __ldcs(in + v);
      count_values<kPerVector, T>(reinterpret_cast<const T*>(&last), edges, range, sink);
    }
    done = vectors * kPerVector;
  }
  for (long long i = done + thread; i < p.n; i += threads) count_values<1, T>(data + i, edges, range, sink);
}

// The last block to finish (HistogramParams::done) hands the counts to the host: every
// block's atomics are in `counts` once it has counted itself in, so it reads them, leaves
// `counts` and `done` at zero for the next call and stores each count with the ticket in its
// host word. The host hands the slot on once every word shows the ticket, so the resets (device
// memory, next read by a kernel on this device) are made visible on the device first: each
// thread fences between its resets and its words, thread 0 resetting `done` and always storing
// word 0 (num_bins >= 1). That a device-scope fence orders them for the host's observation as
// well is the GPU's behaviour (its memory's point of coherence), which the reduce's hand-over
// relies on too; the words need no system-wide fence, each being one 8-byte store.
// (No static shared memory here: the host plans all 48 KiB as dynamic shared memory.)
__device__ __forceinline__ void hand_over(const HistogramParams& p) {
  // The block's atomics precede thread 0's fence through the barrier, so that one fence orders
  // them all before the block counts itself in (as a grid barrier does), not one a thread.
  __syncthreads();
  bool arrived_last = false;
  if (threadIdx.x == 0) {
    __threadfence();
    arrived_last = atomicAdd(p.done, 1u) == gridDim.x - 1;
  }
  const bool last = __syncthreads_or(arrived_last);
  if (!last) return;
  __threadfence();
  static_assert(kHistogramSlotBins % kHistogramBlock == 0, "a slot's bins are whole rounds of the block");
  constexpr int kBinsPerThread = kHistogramSlotBins / kHistogramBlock;
  unsigned long long counted[kBinsPerThread];
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    const int bin = threadIdx.x + i * kHistogramBlock;
    if (bin >= p.num_bins) break;
    counted[i] = __ldcg(p.counts + bin);
    p.counts[bin] = 0;
  }
  if (threadIdx.x == 0) *p.done = 0;
  __threadfence();
  volatile unsigned long long* words = p.host_counts;
#pragma unroll
  for (int i = 0; i < kBinsPerThread; ++i) {
    const int bin = threadIdx.x + i * kHistogramBlock;
    if (bin >= p.num_bins) break;
    words[bin] = p.ticket << kHistogramTicketShift | counted[i];
  }
}

// Dynamic shared memory: the edges (when edges_in_shared), then `copies` sub-histograms of
// `columns` 32-bit counters a bin. With a column per lane the lanes of a warp never contend
// for a counter or meet on a bank, whatever the data (one bin or many); per-warp copies, where
// 32 columns do not fit, keep warps from contending (measured on an H200, 64 bins, when every
// value was settled against the edges: 0.61 of cupy sum's bandwidth, against 0.49 with a
// 16-bit counter per thread and bin updated without atomics; with the margin test in estimate,
// 0.72-0.83).
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
  for (int slot = threadIdx.x; slot < p.copies * p.num_bins * p.columns; slot += blockDim.x) bins[slot] = 0;
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
    if (p.columns > 1) {
      count_into(SharedCounters<5>{bins + threadIdx.x % 32});
    } else {
      count_into(SharedCounters<0>{bins + (p.copies > 1 ? (threadIdx.x / 32) * p.num_bins : 0)});
    }
    __syncthreads();
    // A lone block handing its counts over stores them to the host words itself: `counts` and
    // `done` are never touched, so they read zero for the next call as they did for this one.
    const bool alone = p.done && gridDim.x == 1;
    // a bin's columns read from its own starting bank, so that a warp's 32 bins meet on none
    for (int bin = threadIdx.x; bin < p.num_bins; bin += blockDim.x) {
      unsigned long long total = 0;
      for (int c = 0; c < p.copies; ++c) {
        const unsigned int* counters = bins + (c * p.num_bins + bin) * p.columns;
        for (int column = 0; column < p.columns; ++column) total += counters[(column + bin) & (p.columns - 1)];
      }
      if (alone) {
        static_cast<volatile unsigned long long*>(p.host_counts)[bin] = p.ticket << kHistogramTicketShift | total;
      } else if (total) {
        atomicAdd(p.counts + bin, total);
      }
    }
    if (alone) return;
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
