// searchsorted in the order of a user comparator (csj::search_compare, csj/search.hpp). The
// numeric searchsorted (search.cpp) finds the one shard that matters from a table of ordered
// keys; a comparator gives no keys, so here a query's position is simply the sum over the
// sorted shards of how many of each shard's elements go before it, each shard counted by
// the comparator's own binary search kernel (csj_merge_search, merge_sort_jit.cu): one launch
// per (query place, sorted shard with elements), the counts accumulated into the positions.
// Performance is not the aim; the launches per place are the number of sorted shards.
//
// Each place of `values` searches its own queries on its own stream with its own linked
// module, reading every sorted shard where it lies when it can (its own device's memory, or
// a peer's that the library allocated and the sorted array's group can map) and from a copy
// in its own memory otherwise. Ordering as search.cpp: each searching stream waits for what
// is queued on the sorted shards' streams, and each sorted shard's stream waits for the
// searches that read it.
#include <cuda_runtime.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "csj/search.hpp"
#include "cuda_check.hpp"
#include "merge_sort.hpp"
#include "search_driver.hpp"

namespace csj {
namespace {

using detail::DeviceGuard;
using detail::Event;
using detail::check;

using detail::readable;

constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

void search_compare(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& sorted,
                    const ShardedArray& values, ShardedArray& out, bool right) {
  const ArrayLeases leases({{&sorted, "sorted_a"}, {&values, "values"}, {&out, "out"}});
  detail::check_search_arrays(sorted, values, out);
  const PlaceGroup& sorted_group = *sorted.group();
  const PlaceGroup& query_group = *values.group();
  if (libraries.size() != query_group.size()) {
    throw std::invalid_argument("libraries: expected one per place of values (" +
                                std::to_string(query_group.size()) + "), got " + std::to_string(libraries.size()));
  }
  for (const KernelLibrary* library : libraries) {
    if (!library) throw std::invalid_argument("libraries: None");
  }
  const std::size_t item = sorted.itemsize();

  std::vector<std::size_t> shards;  // the sorted shards with elements
  for (std::size_t p = 0; p < sorted_group.size(); ++p) {
    if (sorted.shard_size(p) > 0) shards.push_back(p);
  }
  std::vector<std::size_t> searching;  // places of values with queries
  for (std::size_t r = 0; r < query_group.size(); ++r) {
    if (values.shard_size(r) > 0) searching.push_back(r);
  }
  const auto sorted_stream = [&](std::size_t p) { return reinterpret_cast<cudaStream_t>(sorted_group.stream(p)); };
  const auto query_stream = [&](std::size_t r) { return reinterpret_cast<cudaStream_t>(query_group.stream(r)); };
  // the modules first: a load or link error throws before anything is queued
  std::vector<detail::MergeSortKernels> kernels(query_group.size());
  for (std::size_t r : searching) {
    DeviceGuard guard(query_group.device(r));
    kernels[r] = detail::merge_sort_kernels(*libraries[r], query_group.device(r), item);
  }

  // what is queued on each sorted shard's stream so far, for searches on other streams
  std::vector<std::optional<Event>> written(sorted_group.size());
  for (std::size_t p : shards) {
    for (std::size_t r : searching) {
      if (sorted_stream(p) == query_stream(r)) continue;
      DeviceGuard guard(sorted_group.device(p));
      written[p].emplace(sorted_group.device(p));
      written[p]->record(sorted_stream(p));
      break;
    }
  }

  // on a throw, searches already queued may read shards of other places: they end first
  const detail::SyncOnUnwind settle(query_group);
  std::vector<detail::StreamScratch> scratch(query_group.size());
  std::vector<std::optional<Event>> searched(query_group.size());
  for (std::size_t r : searching) {
    const int device = query_group.device(r);
    const cudaStream_t stream = query_stream(r);
    DeviceGuard guard(device);
    auto* positions = reinterpret_cast<long long*>(out.shard_pointer(r));
    const long long count = values.shard_size(r);
    if (shards.empty()) {
      check(cudaMemsetAsync(positions, 0, static_cast<std::size_t>(count) * sizeof(long long), stream),
            "cudaMemsetAsync (searchsorted positions)");
      continue;
    }
    for (std::size_t p : shards) {
      if (written[p] && sorted_stream(p) != stream) written[p]->wait(stream);
    }
    std::size_t bytes = 0;  // copies of the shards this place cannot read in place
    for (std::size_t p : shards) {
      if (!readable(sorted, p, device)) bytes += aligned(static_cast<std::size_t>(sorted.shard_size(p)) * item);
    }
    unsigned char* copies = nullptr;
    if (bytes) {
      scratch[r] = detail::StreamScratch(bytes, stream, reinterpret_cast<cudaMemPool_t>(query_group.memory_pool(r)));
      copies = scratch[r].bytes();
    }
    const void* queries = reinterpret_cast<const void*>(values.shard_pointer(r));
    bool first = true;
    for (std::size_t p : shards) {
      const long long n = sorted.shard_size(p);
      const void* run = reinterpret_cast<const void*>(sorted.shard_pointer(p));
      if (!readable(sorted, p, device)) {
        const std::size_t shard_bytes = static_cast<std::size_t>(n) * item;
        check(cudaMemcpyPeerAsync(copies, device, run, sorted_group.device(p), shard_bytes, stream),
              "cudaMemcpyPeerAsync (searchsorted shard)");
        run = copies;
        copies += aligned(shard_bytes);
      }
      detail::queue_search(kernels[r], run, n, queries, static_cast<long long>(item), count, positions, right,
                           !first, stream);
      first = false;
    }
    searched[r].emplace(device);
    searched[r]->record(stream);
  }
  // work queued later on a sorted shard's stream waits for every search that reads it
  for (std::size_t p : shards) {
    for (std::size_t r : searching) {
      if (!searched[r] || sorted_stream(p) == query_stream(r)) continue;
      DeviceGuard guard(sorted_group.device(p));
      searched[r]->wait(sorted_stream(p));
    }
  }
}

}  // namespace csj
