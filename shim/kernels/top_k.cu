// The top-k engine (see top_k_engine.hpp): the radix-select passes, the gather of the
// candidates and their output, per element type and direction, and CUB's sort of the
// candidates per key width. Passes and the gather read the shard in 16-byte vectors; a
// pass's counts go to shared memory, then once per block and bin to global memory, and the
// last block to finish picks the next bucket, so that the host queues every pass at once
// and waits only for the result.
#include <cooperative_groups.h>

#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "builtin_kernels.hpp"
#include "cub_count.cuh"
#include "ordered_key.cuh"
#include "top_k_engine.hpp"

namespace csj::kernels {
namespace {

namespace cg = cooperative_groups;

// Calls f(element, local index) for every element of the shard, spread over the grid: the
// elements before the first 16-byte boundary one per thread, then 16-byte vectors (two in
// flight per thread), then the tail.
template <class T, class F>
__device__ __forceinline__ void for_each_element(const void* in, long long n, F&& f) {
  const T* data = static_cast<const T*>(in);
  constexpr int kPerVector = 16 / sizeof(T);
  const long long thread = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long threads = static_cast<long long>(gridDim.x) * blockDim.x;
  const auto address = reinterpret_cast<unsigned long long>(data);
  long long head = static_cast<long long>(((16 - (address & 15)) & 15) / sizeof(T));
  if (head > n) head = n;
  if (thread < head) f(data[thread], thread);
  const long long vectors = (n - head) / kPerVector;
  const uint4* body = reinterpret_cast<const uint4*>(data + head);
  long long v = thread;
  for (; v + threads < vectors; v += 2 * threads) {
    const uint4 first = body[v];
    const uint4 second = body[v + threads];
    const T* a = reinterpret_cast<const T*>(&first);
    const T* b = reinterpret_cast<const T*>(&second);
#pragma unroll
    for (int i = 0; i < kPerVector; ++i) f(a[i], head + v * kPerVector + i);
#pragma unroll
    for (int i = 0; i < kPerVector; ++i) f(b[i], head + (v + threads) * kPerVector + i);
  }
  if (v < vectors) {
    const uint4 last = body[v];
    const T* a = reinterpret_cast<const T*>(&last);
#pragma unroll
    for (int i = 0; i < kPerVector; ++i) f(a[i], head + v * kPerVector + i);
  }
  for (long long i = head + vectors * kPerVector + thread; i < n; i += threads) f(data[i], i);
}

// The gather's test on (select key, local index): the element lies in the bucket or in a
// better one (a smaller prefix).
struct Bucket {
  unsigned long long key_prefix, index_prefix;
  int key_shift, index_shift;  // how far the known bits lie from the bottom
  bool by_key, by_index;       // whether any bits of each are known

  __device__ __forceinline__ Bucket(const SelectState& state, int key_bits, int index_bits)
      : key_prefix(state.key_prefix),
        index_prefix(state.index_prefix),
        key_shift(key_bits - state.key_known),
        index_shift(index_bits - state.index_known),
        by_key(state.key_known > 0),
        by_index(state.index_known > 0) {}

  __device__ __forceinline__ bool selects(unsigned long long key, unsigned long long index) const {
    if (by_key) {
      const unsigned long long prefix = key >> key_shift;
      if (prefix != key_prefix) return prefix < key_prefix;
    }
    if (by_index) {
      const unsigned long long prefix = index >> index_shift;
      if (prefix != index_prefix) return prefix < index_prefix;
    }
    return true;
  }
};

using BinScan = cub::BlockScan<unsigned long long, kSelectBlock>;

// The last block of a pass: the bin where the k-th element of the bucket lies becomes the
// bucket; the selection is done once that bucket is small enough to gather whole, or wanted
// whole, or every bit is known. Leaves the bins and the arrival counter zero for the next pass.
// The state is read again here rather than kept from the pass's start: registers held over
// the loop over the shard would cost that loop its occupancy.
__device__ __noinline__ void choose_bucket(const SelectPassParams& p, bool first, bool by_index,
                                           BinScan::TempStorage& scan) {
  constexpr int kPerThread = kSelectBins / kSelectBlock;
  const int bins = 1 << p.width;
  SelectState* state = p.state;
  // read by every thread before the scan's barriers, written by one thread after them
  const auto need = static_cast<unsigned long long>(first ? p.k : state->need);
  unsigned long long counts[kPerThread];
  unsigned long long sum = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int bin = threadIdx.x * kPerThread + j;
    counts[j] = bin < bins ? __ldcg(p.bins + bin) : 0;  // L2: the other blocks' atomics
    sum += counts[j];
  }
  unsigned long long below = 0;
  BinScan(scan).ExclusiveSum(sum, below);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    if (below < need && need <= below + counts[j]) {
      const unsigned long long bin = threadIdx.x * kPerThread + j;
      int key_known = state->key_known, index_known = state->index_known;
      if (!by_index) {
        state->key_prefix = (state->key_prefix << p.width) | bin;
        key_known += p.width;
      } else {
        state->index_prefix = (state->index_prefix << p.width) | bin;
        index_known += p.width;
      }
      const auto wanted = static_cast<long long>(need - below);
      const auto boundary = static_cast<long long>(counts[j]);
      state->key_known = key_known;
      state->index_known = index_known;
      state->need = wanted;
      state->boundary = boundary;
      state->done = boundary <= p.limit || boundary == wanted ||
                    (key_known == p.key_bits && index_known == p.index_bits);
    }
    below += counts[j];
  }
  __syncthreads();  // every count is read
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int bin = threadIdx.x * kPerThread + j;
    if (bin < bins) p.bins[bin] = 0;
  }
  if (threadIdx.x == 0) *p.arrivals = 0;
}

// One pass (SelectPassKind). Specialised by kind, so that the loop over the shard tests and
// counts in the key's own width and holds no more than it needs.
template <class T, bool Largest, SelectPassKind Kind>
__global__ void __launch_bounds__(kSelectBlock, 3) select_pass_kernel(const __grid_constant__ SelectPassParams p) {
  using K = Bits<T>;
  __shared__ unsigned int bins[kSelectBins];
  __shared__ BinScan::TempStorage scan;
  __shared__ bool last;
  const SelectState state = *p.state;
  if (state.done) return;
  const int count = 1 << p.width;
  for (int bin = threadIdx.x; bin < count; bin += blockDim.x) bins[bin] = 0;
  __syncthreads();
  const auto key_prefix = static_cast<K>(state.key_prefix);
  const int key_shift = p.key_bits - state.key_known;
  const unsigned long long index_prefix = state.index_prefix;
  const int index_shift = p.index_bits - state.index_known;
  const bool by_index = state.index_known > 0;
  const unsigned int mask = (1u << p.width) - 1;
  const int shift = p.shift;
  for_each_element<T>(p.in, p.n, [&](T value, long long index) {
    const K key = ordered_key<T, Largest>(value);
    unsigned int bin;
    if constexpr (Kind == SelectPassKind::first) {
      bin = static_cast<unsigned int>(key >> shift) & mask;
    } else if constexpr (Kind == SelectPassKind::key) {
      if ((key >> key_shift) != key_prefix) return;
      bin = static_cast<unsigned int>(key >> shift) & mask;
    } else {
      const auto position = static_cast<unsigned long long>(index);
      if (key != key_prefix || (by_index && (position >> index_shift) != index_prefix)) return;
      bin = static_cast<unsigned int>(position >> shift) & mask;
    }
    atomicAdd(&bins[bin], 1u);
  });
  __syncthreads();
  for (int bin = threadIdx.x; bin < count; bin += blockDim.x) {
    if (bins[bin]) atomicAdd(p.bins + bin, static_cast<unsigned long long>(bins[bin]));
  }
  __threadfence();  // this block's counts are visible before it counts as arrived
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(p.arrivals, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  choose_bucket(p, Kind == SelectPassKind::first, Kind == SelectPassKind::index, scan);
}

template <class T, bool Largest>
__global__ void __launch_bounds__(kSelectBlock) select_gather_kernel(const __grid_constant__ SelectGatherParams p) {
  using K = Bits<T>;
  const SelectState state = *p.state;
  const Bucket bucket(state, p.key_bits, p.index_bits);
  K* keys = static_cast<K*>(p.keys);
  for_each_element<T>(p.in, p.n, [&](T value, long long index) {
    const K key = ordered_key<T, Largest>(value);
    if (!bucket.selects(key, static_cast<unsigned long long>(index))) return;
    // one atomic per warp for the lanes that append together
    const cg::coalesced_group lanes = cg::coalesced_threads();
    unsigned long long slot = 0;
    if (lanes.thread_rank() == 0) slot = atomicAdd(p.count, static_cast<unsigned long long>(lanes.size()));
    slot = lanes.shfl(slot, 0) + lanes.thread_rank();
    if (slot < static_cast<unsigned long long>(p.capacity)) {
      keys[slot] = key;
      p.indices[slot] = static_cast<unsigned long long>(index);
    }
  });
}

template <class T>
__global__ void select_emit_kernel(const __grid_constant__ SelectEmitParams p) {
  using K = Bits<T>;
  const T* in = static_cast<const T*>(p.in);
  const K* keys = static_cast<const K*>(p.keys);
  T* values = static_cast<T*>(p.out_values);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; j < p.count; j += stride) {
    const unsigned long long index = p.indices[j];
    p.out_keys[j] = keys[j];
    p.out_indices[j] = p.offset + static_cast<long long>(index);
    values[j] = in[index];
  }
}

template <class K>
cudaError_t sort_candidates(void* temp, std::size_t& temp_bytes, void* const keys[2],
                            unsigned long long* const indices[2], long long n, int index_bits, int* key_current,
                            int* index_current, cudaStream_t stream) {
  cub::DoubleBuffer<K> by_key(static_cast<K*>(keys[0]), static_cast<K*>(keys[1]));
  cub::DoubleBuffer<unsigned long long> by_index(indices[0], indices[1]);
  // one bit above the indices' own: an unused slot's all-ones index sorts after every index
  const int index_end = index_bits + 1;
  constexpr int key_end = static_cast<int>(sizeof(K) * 8);
  if (!temp) {
    std::size_t first = 0, second = 0;
    cudaError_t status = with_count(n, [&](auto count) {
      return cub::DeviceRadixSort::SortPairs(nullptr, first, by_index, by_key, count, 0, index_end, stream);
    });
    if (status != cudaSuccess) return status;
    status = with_count(n, [&](auto count) {
      return cub::DeviceRadixSort::SortPairs(nullptr, second, by_key, by_index, count, 0, key_end, stream);
    });
    temp_bytes = first > second ? first : second;
    return status;
  }
  // CUB's radix sort is stable: by index first, then by key, orders ties by index
  cudaError_t status = with_count(n, [&](auto count) {
    return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, by_index, by_key, count, 0, index_end, stream);
  });
  if (status != cudaSuccess) return status;
  status = with_count(n, [&](auto count) {
    return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, by_key, by_index, count, 0, key_end, stream);
  });
  *key_current = by_key.selector;
  *index_current = by_index.selector;
  return status;
}

template <class T, bool Largest>
TopKEngine make_engine() {
  TopKEngine engine{};
  engine.key_bits = static_cast<int>(sizeof(T) * 8);
  engine.pass_kernels[0] = reinterpret_cast<const void*>(&select_pass_kernel<T, Largest, SelectPassKind::first>);
  engine.pass_kernels[1] = reinterpret_cast<const void*>(&select_pass_kernel<T, Largest, SelectPassKind::key>);
  engine.pass_kernels[2] = reinterpret_cast<const void*>(&select_pass_kernel<T, Largest, SelectPassKind::index>);
  engine.gather_kernel = reinterpret_cast<const void*>(&select_gather_kernel<T, Largest>);
  engine.emit_kernel = reinterpret_cast<const void*>(&select_emit_kernel<T>);
  engine.sort = &sort_candidates<Bits<T>>;
  return engine;
}

}  // namespace

const TopKEngine* top_k_engine(int dtype, bool largest) {
  // Built on first use; function-local statics are initialised once, thread-safely.
  return with_dtype(dtype, [largest](auto zero) -> const TopKEngine* {
    using T = decltype(zero);
    static const TopKEngine largest_engine = make_engine<T, true>();
    static const TopKEngine smallest_engine = make_engine<T, false>();
    return largest ? &largest_engine : &smallest_engine;
  });
}

}  // namespace csj::kernels
