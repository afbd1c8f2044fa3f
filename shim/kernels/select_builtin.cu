// The flagged compaction's kernels, compiled into the shim (no operator to link): the
// selection engine's bodies (select.cuh) with each element's class read from a flags shard
// (4- or 8-byte integers: 0 where the flag is nonzero, 1 elsewhere) and, in place of the
// flags, up to kMaxSelectPayloads arrays of the same shard sizes moved, each of its own
// element size (a multiple of 4 bytes, copied a 4-byte word at a time). The by-key
// algorithms compact their run heads with it across ranks (one process classifies by the
// keys themselves, by_key_jit.cu). Also here, for every selection: the scan of the tiles'
// counts between the two passes (CUB's device scan), and reduce_by_key's of its tiles' run
// ends after its single pass, whose total (the count of runs) a one-thread kernel stores into
// host memory for the host to poll; and the initialisation of the tile states of a look-back
// over counts (count_lookback.cuh), which select's single pass takes its output positions
// from.
#include <cub/device/device_scan.cuh>

#include "builtin_kernels.hpp"
#include "count_lookback.cuh"
#include "select.cuh"

namespace csj::kernels {
namespace {

template <class Flag>
__global__ void __launch_bounds__(kSelectBlock) select_flags_count(const __grid_constant__ SelectParams params) {
  const Flag* flags = static_cast<const Flag*>(params.in);
  count_tile<kSelectPayloadItems>(params, [&](long long local) { return flags[local] != 0 ? 0 : 1; });
}

struct AddCounts {
  __device__ __forceinline__ SelectCounts operator()(const SelectCounts& a, const SelectCounts& b) const {
    SelectCounts sum;
#pragma unroll
    for (int c = 0; c < kSelectClasses; ++c) sum.count[c] = a.count[c] + b.count[c];
    return sum;
  }
};

template <class Flag>
__global__ void __launch_bounds__(kSelectBlock) select_flags_scatter(const __grid_constant__ SelectParams params) {
  const Flag* flags = static_cast<const Flag*>(params.in);
  scatter_payloads(params, [&](long long local) { return flags[local] != 0 ? 0 : 1; });
}

__global__ void __launch_bounds__(kSelectBlock) init_count_lookback_kernel(void* states, int tiles) {
  init_count_lookback(states, tiles);
}

}  // namespace

std::size_t count_lookback_scratch(long long tiles) {
  std::size_t bytes = 0;
  LookbackState::AllocationSize(static_cast<int>(tiles), bytes);
  return bytes;
}

cudaError_t init_count_lookback_states(void* states, long long tiles, cudaStream_t stream) {
  // one thread per tile state; CUB's padding (a warp's worth before tile 0) done by block 0
  const auto blocks = static_cast<unsigned>((tiles + kSelectBlock - 1) / kSelectBlock);
  init_count_lookback_kernel<<<blocks, kSelectBlock, 0, stream>>>(states, static_cast<int>(tiles));
  return cudaGetLastError();
}

SelectFlagKernels builtin_select_flag_kernels(int flag_size) {
  if (flag_size == 8) {
    return {reinterpret_cast<const void*>(&select_flags_count<unsigned long long>),
            reinterpret_cast<const void*>(&select_flags_scatter<unsigned long long>)};
  }
  return {reinterpret_cast<const void*>(&select_flags_count<unsigned>),
          reinterpret_cast<const void*>(&select_flags_scatter<unsigned>)};
}

namespace {

// `tiles + 1` counts replaced by their exclusive prefix in place, CUB's scratch from `pool`.
template <class Count, class Add>
cudaError_t scan_counts_in_place(Count* counts, long long tiles, Add add, Count zero, cudaStream_t stream,
                                 cudaMemPool_t pool) {
  const int items = static_cast<int>(tiles + 1);
  std::size_t bytes = 0;
  cudaError_t status = cub::DeviceScan::ExclusiveScan(nullptr, bytes, counts, counts, add, zero, items, stream);
  if (status != cudaSuccess) return status;
  void* temp = nullptr;
  status = cudaMallocFromPoolAsync(&temp, bytes, pool, stream);
  if (status != cudaSuccess) return status;
  status = cub::DeviceScan::ExclusiveScan(temp, bytes, counts, counts, add, zero, items, stream);
  const cudaError_t freed = cudaFreeAsync(temp, stream);
  return status != cudaSuccess ? status : freed;
}

struct AddEnds {
  __device__ __forceinline__ long long operator()(long long a, long long b) const { return a + b; }
};

}  // namespace

cudaError_t scan_select_counts(SelectCounts* counts, long long tiles, cudaStream_t stream, cudaMemPool_t pool) {
  const SelectCounts zero = {{0, 0, 0}};
  return scan_counts_in_place(counts, tiles, AddCounts(), zero, stream, pool);
}

cudaError_t scan_tile_ends(long long* ends, long long tiles, cudaStream_t stream, cudaMemPool_t pool) {
  return scan_counts_in_place(ends, tiles, AddEnds(), 0LL, stream, pool);
}

namespace {
__global__ void publish_count_kernel(const long long* count, volatile long long* host) {
  *host = *count;
  __threadfence_system();
}
}  // namespace

cudaError_t publish_count(const long long* count, long long* host, cudaStream_t stream) {
  publish_count_kernel<<<1, 1, 0, stream>>>(count, host);
  return cudaGetLastError();
}

}  // namespace csj::kernels
