// The multi-place sort (csj/sort.hpp): the driver that composes its steps (sort_steps.hpp):
//   1. each place radix-sorts its shard into a run buffer of its own (one place alone sorts
//      in place), replayed from a CUDA graph once the same sort repeats (sort_local.cpp);
//   2. exact splitters: for every shard boundary (a global rank R) and every place, how many
//      of that place's sorted keys go before R, by a digit-by-digit search over the
//      ordered-key space whose ties are given out in place order, so that the split is
//      deterministic and each output shard gets exactly its size (sort_splitters.cpp);
//   3. the same search cuts each output shard into chunks; each shard is written chunk by
//      chunk by merging its pieces of every place's run (sort_merge.cpp), the pieces on other
//      devices copied in while earlier chunks merge, the first chunk's bulk while the search
//      still runs, within bounds of the cuts from samples of the keys taken during the local
//      sorts (shards of 2^25 keys and more: sort_sampled_cuts.cpp) or from the search's first
//      round (sort_exchange.cpp);
//   4. a run buffer goes only once every place that reads it has finished (sort_exchange.cpp).
// Here: the arguments' checks, the decisions that depend on the shards (several places or
// one, pieces that travel, merge levels, samples), the chunk layout, and each place's memory,
// laid out once for every step.
#include "csj/sort.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/sort_engine.hpp"
#include "cuda_check.hpp"
#include "sort_steps.hpp"

namespace csj {
namespace {

using detail::check;
using detail::DeviceGuard;
using detail::SortPlace;
namespace k = kernels;

constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// What a sort needs besides each place's local sort.
struct SortNeeds {
  bool several = false;  // two or more places hold keys: runs, splitters, merges
  bool receive = false;  // some of them on different devices: receive buffers
  bool levels = false;   // three or more: merge levels, through a buffer of one shard
};

// Lays out a place's memory (current device: the place's; place.n > 0). Once a place's run is
// sorted, its CUB storage (which holds a buffer of the shard's keys besides) takes the merges'
// storage, the receive buffer and the merge levels' buffer: a sort over several places needs
// about two shards of scratch per place (three with merge levels).
void reserve_scratch(const k::SortEngine& engine, SortPlace& place, cudaMemPool_t pool, std::size_t item,
                     const SortNeeds& needs) {
  const std::size_t keys = aligned(static_cast<std::size_t>(place.n) * item);
  std::size_t sort_temp = 0;
  if (needs.several) {
    check(engine.sort_into(nullptr, sort_temp, nullptr, nullptr, place.n, place.stream), "cub::DeviceRadixSort");
    check(engine.merge(nullptr, place.merge_temp_bytes, nullptr, place.n - place.n / 2, nullptr, place.n / 2,
                       nullptr, place.stream),
          "cub::DeviceMerge");
    place.receive_keys = needs.receive ? detail::receive_capacity(place.n) : 0;
    const std::size_t receive = aligned(static_cast<std::size_t>(place.receive_keys) * item);
    place.temp_bytes = std::max(sort_temp, aligned(place.merge_temp_bytes) + receive + (needs.levels ? keys : 0));
  } else {
    check(engine.sort(nullptr, sort_temp, nullptr, nullptr, place.n, nullptr, place.stream), "cub::DeviceRadixSort");
    place.temp_bytes = sort_temp;
  }
  place.scratch = detail::StreamScratch(keys + aligned(place.temp_bytes), place.stream, pool);
  place.run = place.scratch.bytes();
  place.temp = place.run + keys;
  if (needs.several) {
    unsigned char* after_merge_temp = place.temp + aligned(place.merge_temp_bytes);
    if (needs.receive) {
      place.receive = after_merge_temp;
      after_merge_temp += aligned(static_cast<std::size_t>(place.receive_keys) * item);
    }
    if (needs.levels) place.between = after_merge_temp;
  }
}

}  // namespace

void sort(const ShardedArray& in, ShardedArray& out, bool descending) {
  const ArrayLeases leases({{&in, "a"}, {&out, "out"}});
  if (in.group() != out.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  if (in.shard_sizes() != out.shard_sizes()) throw std::invalid_argument("out: shard sizes differ from a's");
  in.check_scalar("a", "sort");
  if (in.dtype() != out.dtype()) throw std::invalid_argument("out: dtype differs from a's");
  const k::SortEngine* engine = k::sort_engine(static_cast<int>(in.dtype()), descending);
  if (!engine) throw std::invalid_argument(std::string("a: cannot sort dtype ") + dtype_name(in.dtype()));

  const PlaceGroup& group = *in.group();
  const std::size_t count = group.size();
  const std::size_t item = in.itemsize();
  std::size_t non_empty = 0;
  for (std::size_t p = 0; p < count; ++p) non_empty += in.shard_size(p) > 0 ? 1 : 0;
  if (non_empty == 0) return;
  SortNeeds needs;
  needs.several = non_empty > 1;

  // The global ranks the runs are cut at: where each output shard, and each chunk of one,
  // starts, then the end.
  const detail::SortChunks chunks =
      needs.several ? detail::chunk_layout(out.shard_sizes(), out.shard_offsets(), out.size()) : detail::SortChunks{};

  // Pieces on another device are copied into a receive buffer (chunk by chunk, while earlier
  // chunks merge); pieces on the place's own device are merged where they lie.
  for (std::size_t q = 0; q < count && needs.several; ++q) {
    for (std::size_t p = 0; p < count; ++p) {
      if (in.shard_size(q) > 0 && in.shard_size(p) > 0 && group.device(q) != group.device(p)) needs.receive = true;
    }
  }
  // Merge levels (three or more pieces) go through a buffer of one shard.
  needs.levels = non_empty > 2;

  // 1. local sorts: every place's memory first, then the sorts queued back to back, so that
  //    the places start together
  std::vector<SortPlace> places(count);
  for (std::size_t p = 0; p < count; ++p) places[p].n = in.shard_size(p);
  const detail::SampleSwitches switches = detail::SampleSwitches::from_environment();
  const bool sample = needs.several && needs.receive && switches.wanted(in.shard_sizes());
  for (std::size_t p = 0; p < count; ++p) {
    SortPlace& place = places[p];
    place.device = group.device(p);
    place.stream = reinterpret_cast<cudaStream_t>(group.stream(p));
    if (place.n == 0) continue;
    place.shard = reinterpret_cast<unsigned char*>(out.shard_pointer(p));
    DeviceGuard guard(place.device);
    reserve_scratch(*engine, place, reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)), item, needs);
  }
  for (std::size_t p = 0; p < count; ++p) {
    SortPlace& place = places[p];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    const unsigned char* input = detail::queue_sort_input(
        *engine, place, reinterpret_cast<const unsigned char*>(in.shard_pointer(p)), &in != &out, needs.several, item);
    if (needs.several) {
      detail::queue_run_sort(*engine, place, input, sample);
    } else {
      detail::sort_shard_in_place(*engine, place, item);
    }
  }
  if (!needs.several) return;  // one shard holds every key: sorted in place

  // copies and merges may read across places when something throws: they end before any
  // place's scratch goes
  const detail::SyncOnUnwind settle(group);
  std::optional<detail::SampledCuts> sampled;
  if (sample) sampled.emplace(*engine, detail::sample_sources(places), switches.sigmas);
  detail::exchange_and_merge(*engine, places, group, item, chunks, sampled ? &*sampled : nullptr);
}

}  // namespace csj
