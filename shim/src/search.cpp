// searchsorted over sharded arrays (csj/search.hpp, search_driver.hpp). The global position
// of a query is the sum over the sorted shards of how many of each shard's elements go before
// it; the shards being sorted in global order, every shard before the first one whose last
// element does not go before the query counts whole and every shard after it not at all, so
// one shard needs a real search. Each place of `values` searches its own queries: it reads
// every sorted shard where it lies when it can (its own device's memory, or a peer's that
// the library allocated and the sorted array's group can map) and from a copy in its own
// memory otherwise (memory of another allocator, or devices without peer access). A table of
// every shard's last element and of every stride-th element of the sorted sequence, in the
// searching place's memory, is what each search block keeps in shared memory (search.cuh).
//
// Ordering: each searching place's stream waits for what is queued on the sorted shards'
// streams (a sort that has just returned is still merging), and each sorted shard's stream
// waits for the searches that read it, so that work queued there later cannot overwrite the
// shard under them.
#include "search_driver.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/search_params.hpp"
#include "csj/search.hpp"
#include "cuda_check.hpp"

namespace csj {
namespace detail {
namespace {

namespace kn = kernels;

constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

}  // namespace

// The library's own memory (pool allocations, contiguous ranges) is mapped for every device
// its group reaches by peer access; an adopted buffer's allocator is unknown, so it is read
// where it lies only on its own device.
bool readable(const ShardedArray& sorted, std::size_t p, int device) {
  const PlaceGroup& group = *sorted.group();
  const int owner = group.device(p);
  if (owner == device) return true;
  return sorted.storage() != Storage::adopted && group.can_access_peer(device, owner);
}

void check_search_arrays(const ShardedArray& sorted, const ShardedArray& values, const ShardedArray& out) {
  if (values.dtype() != sorted.dtype() || values.itemsize() != sorted.itemsize()) {
    throw std::invalid_argument(std::string("values: dtype ") + dtype_name(values.dtype()) +
                                " differs from sorted_a's " + dtype_name(sorted.dtype()));
  }
  if (out.dtype() != DType::int64) throw std::invalid_argument("out: expected an int64 array for the positions");
  if (out.group() != values.group()) throw std::invalid_argument("out: belongs to another PlaceGroup than values");
  if (out.shard_sizes() != values.shard_sizes()) throw std::invalid_argument("out: shard sizes differ from values'");
  if (&out == &sorted || &out == &values) throw std::invalid_argument("out: must be an array of its own");
}

void search_with(const SearchKernelFor& kernel_for, const ShardedArray& sorted, const ShardedArray& values,
                 ShardedArray& out, bool right) {
  const ArrayLeases leases({{&sorted, "sorted_a"}, {&values, "values"}, {&out, "out"}});
  check_search_arrays(sorted, values, out);

  const PlaceGroup& sorted_group = *sorted.group();
  const PlaceGroup& query_group = *values.group();
  const std::size_t item = sorted.itemsize();

  // the sorted shards with elements: the only ones a search lists
  std::vector<std::size_t> shards;
  for (std::size_t p = 0; p < sorted_group.size(); ++p) {
    if (sorted.shard_size(p) > 0) shards.push_back(p);
  }
  const long long total = sorted.size();
  const long long wanted_samples = std::min<long long>(kn::kSearchSampleBytes / static_cast<long long>(item), total);
  const long long stride = wanted_samples > 0 ? ceil_div(total, wanted_samples) : 1;
  const long long sample_count = ceil_div(total, stride);  // positions j * stride < total
  const long long entries = static_cast<long long>(shards.size()) + sample_count;
  if (entries * static_cast<long long>(item) > kn::kSearchSharedBytes) {
    throw std::invalid_argument("sorted_a: a search takes at most " +
                                std::to_string(kn::kSearchSharedBytes / item - sample_count) +
                                " shards with elements, got " + std::to_string(shards.size()));
  }

  // what is queued on each sorted shard's stream so far, for searches on other streams
  std::vector<std::optional<Event>> written(sorted_group.size());
  const auto sorted_stream = [&](std::size_t p) { return reinterpret_cast<cudaStream_t>(sorted_group.stream(p)); };
  const auto query_stream = [&](std::size_t r) { return reinterpret_cast<cudaStream_t>(query_group.stream(r)); };
  std::vector<std::size_t> searching;  // places of values with queries
  for (std::size_t r = 0; r < query_group.size(); ++r) {
    if (values.shard_size(r) > 0) searching.push_back(r);
  }
  for (std::size_t p : shards) {
    for (std::size_t r : searching) {
      if (sorted_stream(p) == query_stream(r)) continue;
      written[p].emplace(sorted_group.device(p));
      written[p]->record(sorted_stream(p));
      break;
    }
  }

  const auto fill = KernelHandle::builtin(kn::search_index_kernel());
  // on a throw, searches already queued may read shards of other places: they end first
  const SyncOnUnwind settle(query_group);
  std::vector<StreamScratch> scratch(query_group.size());
  std::vector<std::optional<Event>> searched(query_group.size());
  for (std::size_t r : searching) {
    const int device = query_group.device(r);
    const cudaStream_t stream = query_stream(r);
    DeviceGuard guard(device);
    for (std::size_t p : shards) {
      if (written[p] && sorted_stream(p) != stream) written[p]->wait(stream);
    }
    // memory: the shard list, the table, then copies of the shards it cannot read in place
    const std::size_t list_bytes = aligned(shards.size() * sizeof(kn::SearchShard));
    const std::size_t table_bytes = aligned(static_cast<std::size_t>(entries) * item);
    std::size_t bytes = list_bytes + table_bytes;
    for (std::size_t p : shards) {
      if (!readable(sorted, p, device)) bytes += aligned(static_cast<std::size_t>(sorted.shard_size(p)) * item);
    }
    scratch[r] = StreamScratch(std::max<std::size_t>(bytes, kAlign), stream,
                               reinterpret_cast<cudaMemPool_t>(query_group.memory_pool(r)));
    unsigned char* base = scratch[r].bytes();
    unsigned char* copies = base + list_bytes + table_bytes;
    std::vector<kn::SearchShard> list;
    for (std::size_t p : shards) {
      kn::SearchShard shard{};
      shard.n = sorted.shard_size(p);
      shard.offset = sorted.shard_offset(p);
      shard.first_sample = ceil_div(shard.offset, stride);
      shard.end_sample = std::min(sample_count, ceil_div(shard.offset + shard.n, stride));
      const auto* data = reinterpret_cast<const unsigned char*>(sorted.shard_pointer(p));
      if (readable(sorted, p, device)) {
        shard.data = data;
      } else {
        const std::size_t shard_bytes = static_cast<std::size_t>(shard.n) * item;
        check(cudaMemcpyPeerAsync(copies, device, data, sorted_group.device(p), shard_bytes, stream),
              "cudaMemcpyPeerAsync (searchsorted shard)");
        shard.data = copies;
        copies += aligned(shard_bytes);
      }
      list.push_back(shard);
    }
    if (!list.empty()) {
      // pageable memory: staged before the call returns, so `list` may go
      check(cudaMemcpyAsync(base, list.data(), list.size() * sizeof(kn::SearchShard), cudaMemcpyHostToDevice,
                            stream),
            "cudaMemcpyAsync (searchsorted shards)");
      kn::SearchIndexParams index{};
      index.shards = reinterpret_cast<const kn::SearchShard*>(base);
      index.shard_count = static_cast<int>(shards.size());
      index.item_size = static_cast<int>(item);
      index.stride = stride;
      index.sample_count = sample_count;
      index.table = base + list_bytes;
      launch(fill, static_cast<unsigned>(ceil_div(entries, kn::kSearchBlock)), kn::kSearchBlock, stream, index,
             "launching searchsorted table");
    }
    kn::SearchParams params{};
    params.queries = reinterpret_cast<const void*>(values.shard_pointer(r));
    params.count = values.shard_size(r);
    params.positions = reinterpret_cast<long long*>(out.shard_pointer(r));
    params.shards = reinterpret_cast<const kn::SearchShard*>(base);
    params.shard_count = static_cast<int>(shards.size());
    params.right = right ? 1 : 0;
    params.total = total;
    params.table = base + list_bytes;
    params.sample_count = sample_count;
    params.stride = stride;
    const KernelHandle search = kernel_for(r);
    const long long wanted = ceil_div(params.count, kn::kSearchBlock);
    const long long resident =
        static_cast<long long>(multiprocessors(device)) * blocks_per_multiprocessor(search, kn::kSearchBlock);
    launch(search, static_cast<unsigned>(std::min(wanted, resident)), kn::kSearchBlock, stream, params,
           "launching searchsorted", static_cast<unsigned>(entries * static_cast<long long>(item)));
    searched[r].emplace(device);
    searched[r]->record(stream);
  }
  // work queued later on a sorted shard's stream waits for every search that reads it
  for (std::size_t p : shards) {
    for (std::size_t r : searching) {
      if (sorted_stream(p) == query_stream(r)) continue;
      DeviceGuard guard(sorted_group.device(p));
      searched[r]->wait(sorted_stream(p));
    }
  }
}

}  // namespace detail

void searchsorted(const ShardedArray& sorted, const ShardedArray& values, ShardedArray& out, bool right) {
  sorted.check_scalar("sorted_a", "searchsorted");
  values.check_scalar("values", "searchsorted");
  const void* kernel = kernels::builtin_search_kernel(static_cast<int>(sorted.dtype()));
  if (!kernel) {
    throw std::invalid_argument(std::string("sorted_a: cannot search dtype ") + dtype_name(sorted.dtype()));
  }
  detail::search_with([kernel](std::size_t) { return detail::KernelHandle::builtin(kernel); }, sorted, values, out,
                      right);
}

}  // namespace csj
