#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "../kernels/builtin_kernels.hpp"
#include "csj/reduce.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"

namespace csj {

std::vector<long long> histogram_even(const ShardedArray& in, int num_bins, const std::string& edges) {
  namespace k = kernels;
  using detail::check;
  in.check_scalar("a", "histogram_even");
  if (num_bins <= 0) throw std::invalid_argument("num_bins: expected a positive number of bins");
  const std::size_t edge_size = in.dtype() == DType::float32 ? 4 : 8;
  if (edges.size() != (static_cast<std::size_t>(num_bins) + 1) * edge_size) {
    throw std::invalid_argument("edges: expected num_bins + 1 edges of the bin dtype");
  }
  const ArrayLeases leases({{&in, "a"}});
  const PlaceGroup& group = *in.group();
  const auto kernel = detail::KernelHandle::builtin(k::builtin_histogram_kernel(static_cast<int>(in.dtype())));
  const std::size_t count_bytes = static_cast<std::size_t>(num_bins) * sizeof(unsigned long long);
  const std::size_t edge_bytes = (edges.size() + 15) / 16 * 16;
  // Shared memory: the edges, then per-warp sub-histograms when they fit (warps then never
  // contend for a counter), else one per block, else counts go straight to global memory.
  const std::size_t bins_bytes = static_cast<std::size_t>(num_bins) * sizeof(unsigned int);
  const bool edges_in_shared = edge_bytes <= static_cast<std::size_t>(k::kHistogramSharedBytes);
  const std::size_t room = edges_in_shared ? k::kHistogramSharedBytes - edge_bytes : k::kHistogramSharedBytes;
  int copies = 0;
  std::size_t counter_bytes = 0;
  if (bins_bytes * k::kHistogramWarps <= room) {
    copies = k::kHistogramWarps, counter_bytes = bins_bytes * k::kHistogramWarps;
  } else if (bins_bytes <= room) {
    copies = 1, counter_bytes = bins_bytes;
  }
  const int bins_offset = edges_in_shared ? static_cast<int>(edge_bytes) : 0;
  const auto shared = static_cast<unsigned>(bins_offset + counter_bytes);

  std::vector<std::vector<unsigned long long>> partial(group.size());
  std::vector<detail::StreamScratch> scratches(group.size());
  const detail::SyncOnUnwind settle(group);  // no copy into `partial` outlives it
  // every place's kernel first: the copies into pageable memory below make the host wait
  for (std::size_t place = 0; place < group.size(); ++place) {
    const long long n = in.shard_size(place);
    if (n == 0) continue;
    const auto stream = reinterpret_cast<cudaStream_t>(group.stream(place));
    detail::DeviceGuard guard(group.device(place));
    const int sms = detail::multiprocessors(group.device(place));
    // each place's scratch is used on its own stream only: a stream-ordered free is safe
    // whenever a step throws
    detail::StreamScratch& scratch = scratches[place];
    scratch = detail::StreamScratch(edge_bytes + count_bytes, stream,
                                    reinterpret_cast<cudaMemPool_t>(group.memory_pool(place)));
    unsigned char* base = scratch.bytes();
    check(cudaMemcpyAsync(base, edges.data(), edges.size(), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (edges)");
    check(cudaMemsetAsync(base + edge_bytes, 0, count_bytes, stream), "cudaMemsetAsync");
    k::HistogramParams params{};
    params.in = reinterpret_cast<const void*>(in.shard_pointer(place));
    params.n = n;
    params.edges = base;
    params.counts = reinterpret_cast<unsigned long long*>(base + edge_bytes);
    params.num_bins = num_bins;
    params.edges_in_shared = edges_in_shared ? 1 : 0;
    params.copies = copies;
    params.bins_offset = bins_offset;
    const long long blocks = (n + k::kHistogramBlock - 1) / k::kHistogramBlock;
    const auto grid = static_cast<unsigned>(std::min<long long>(blocks, static_cast<long long>(sms) * 8));
    detail::launch(kernel, grid, k::kHistogramBlock, stream, params, "launching histogram", shared);
  }
  for (std::size_t place = 0; place < group.size(); ++place) {
    if (!scratches[place]) continue;
    const auto stream = reinterpret_cast<cudaStream_t>(group.stream(place));
    detail::DeviceGuard guard(group.device(place));
    partial[place].resize(num_bins);
    check(cudaMemcpyAsync(partial[place].data(), scratches[place].bytes() + edge_bytes, count_bytes,
                          cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (counts)");
    scratches[place].free();
  }
  group.sync();
  std::vector<long long> counts(num_bins, 0);
  for (const auto& place_counts : partial) {
    for (std::size_t bin = 0; bin < place_counts.size(); ++bin) counts[bin] += static_cast<long long>(place_counts[bin]);
  }
  return counts;
}

}  // namespace csj
