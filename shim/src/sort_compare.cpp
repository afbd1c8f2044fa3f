// The sort with a user comparator (csj/sort_compare.hpp): a stable merge sort whose kernels
// nvJitLink linked with the comparator (merge_sort.hpp).
//
// One place (or one shard with elements) sorts where it lies: in place, or from the input
// shard into the output shard (the input left as it was), through a scratch buffer from the
// group's stream-ordered pool, all of it queued on the place's stream.
//
// Several places take the multi-place sort's steps (sort_steps.hpp) with the comparator's
// order (sort_compare_order.hpp): each place merge-sorts its shard into a run buffer of its
// own, the cuts of every output shard and chunk come from the co-ranking of the runs by the
// comparator, and the exchange copies and merges the pieces into the shards as the radix sort
// does. The cuts are exact from the search alone (no samples: they need ordered keys).
#include "csj/sort_compare.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda_check.hpp"
#include "launch.hpp"
#include "merge_sort.hpp"
#include "sort_compare_order.hpp"
#include "sort_steps.hpp"

namespace csj {
namespace {

using detail::DeviceGuard;
using detail::SortPlace;

constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

void check_arguments(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                     const ShardedArray& out) {
  if (in.group() != out.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  if (in.shard_sizes() != out.shard_sizes()) throw std::invalid_argument("out: shard sizes differ from a's");
  if (in.dtype() != out.dtype() || in.itemsize() != out.itemsize()) {
    throw std::invalid_argument("out: dtype differs from a's");
  }
  detail::check_libraries(libraries, in.group()->size());
}

// Lays out a place's memory for a sort over several places (current device: the place's;
// place.n > 0): its run, then storage that holds the local sort's second buffer and
// partitions while it runs, and afterwards the merges' partitions, the receive buffer (pieces
// from other devices, written only once the run is sorted) and the merge levels' buffer.
void reserve_scratch(SortPlace& place, cudaMemPool_t pool, std::size_t item, bool receive, bool levels) {
  const std::size_t run = aligned(static_cast<std::size_t>(place.n) * item);
  place.merge_temp_bytes = detail::merge_temp_bytes(place.n, item);
  place.receive_keys = receive ? detail::receive_capacity(place.n) : 0;
  const std::size_t receive_bytes = aligned(static_cast<std::size_t>(place.receive_keys) * item);
  const std::size_t after_sort = aligned(place.merge_temp_bytes) + receive_bytes + (levels ? run : 0);
  place.temp_bytes = std::max(detail::merge_sort_scratch_bytes(place.n, item), after_sort);
  place.scratch = detail::StreamScratch(run + place.temp_bytes, place.stream, pool);
  place.run = place.scratch.bytes();
  place.temp = place.run + run;
  unsigned char* rest = place.temp + aligned(place.merge_temp_bytes);
  if (receive) {
    place.receive = rest;
    rest += receive_bytes;
  }
  if (levels) place.between = rest;
}

// One place holds every element: sorted where it lies.
void sort_one_place(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in, ShardedArray& out,
                    std::size_t p) {
  const PlaceGroup& group = *in.group();
  const long long n = in.shard_size(p);
  const std::size_t item = in.itemsize();
  const int device = group.device(p);
  DeviceGuard guard(device);
  const auto stream = reinterpret_cast<cudaStream_t>(group.stream(p));
  const detail::MergeSortKernels kernels = detail::merge_sort_kernels(*libraries[p], device, item);
  // freed on the stream after the sort's last kernel, also when a launch throws
  detail::StreamScratch scratch(detail::merge_sort_scratch_bytes(n, item), stream,
                                reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)));
  detail::queue_merge_sort(kernels, reinterpret_cast<const void*>(in.shard_pointer(p)),
                           reinterpret_cast<void*>(out.shard_pointer(p)), n, scratch.get(), stream);
}

}  // namespace

void sort_compare(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in, ShardedArray& out) {
  const ArrayLeases leases({{&in, "a"}, {&out, "out"}});
  check_arguments(libraries, in, out);
  const PlaceGroup& group = *in.group();
  const std::size_t count = group.size();
  const std::size_t item = in.itemsize();
  std::size_t non_empty = 0, last = 0;
  for (std::size_t p = 0; p < count; ++p) {
    if (in.shard_size(p) == 0) continue;
    ++non_empty;
    last = p;
  }
  if (non_empty == 0) return;
  if (non_empty == 1) {
    sort_one_place(libraries, in, out, last);
    return;
  }

  std::vector<detail::MergeSortKernels> kernels(count);
  std::vector<int> devices(count);
  for (std::size_t p = 0; p < count; ++p) {
    devices[p] = group.device(p);
    kernels[p] = detail::merge_sort_kernels(*libraries[p], devices[p], item);
  }
  bool receive = false;  // pieces on another device travel into a receive buffer
  for (std::size_t q = 0; q < count; ++q) {
    for (std::size_t p = 0; p < count; ++p) {
      if (in.shard_size(q) > 0 && in.shard_size(p) > 0 && devices[q] != devices[p]) receive = true;
    }
  }
  const bool levels = non_empty > 2;  // merge levels (three or more pieces) through a buffer of one shard
  const detail::SortChunks chunks = detail::chunk_layout(out.shard_sizes(), out.shard_offsets(), out.size());

  // 1. local sorts into the runs: every place's memory first, then the sorts queued back to
  //    back, so that the places start together
  std::vector<SortPlace> places(count);
  for (std::size_t p = 0; p < count; ++p) {
    SortPlace& place = places[p];
    place.n = in.shard_size(p);
    place.device = devices[p];
    place.stream = reinterpret_cast<cudaStream_t>(group.stream(p));
    if (place.n == 0) continue;
    place.shard = reinterpret_cast<unsigned char*>(out.shard_pointer(p));
    DeviceGuard guard(place.device);
    reserve_scratch(place, reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)), item, receive, levels);
  }
  for (std::size_t p = 0; p < count; ++p) {
    SortPlace& place = places[p];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    place.input = reinterpret_cast<const unsigned char*>(in.shard_pointer(p));
    detail::queue_merge_sort(kernels[p], place.input, place.run, place.n, place.temp, place.stream);
    place.ready.emplace(place.device);
    place.ready->record(place.stream);
  }

  // 2.-4. the cuts, the exchange and the merges into the shards; copies and merges may read
  // across places when something throws: they end before any place's scratch goes
  const detail::SyncOnUnwind settle(group);
  const detail::CompareOrder order(std::move(kernels), std::move(devices));
  detail::exchange_and_merge(order, places, group, detail::Lanes{item, 0}, chunks, nullptr);
}

}  // namespace csj
