// The multi-place sorts (csj/sort.hpp): sort and sort_by_key, the driver that composes their
// steps (sort_steps.hpp); sort_by_key's values ride along in every step, the same code moving
// a second lane:
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
// Lays out a place's memory (current device: the place's; place.n > 0): a run of keys (and
// values) and storage, carved one after another out of one allocation.
class Carve {
 public:
  explicit Carve(std::size_t& total) : total_(total) {}
  // Reserves `bytes` (aligned) and returns its offset.
  std::size_t take(std::size_t bytes) {
    const std::size_t at = total_;
    total_ += aligned(bytes);
    return at;
  }

 private:
  std::size_t& total_;
};

void reserve_scratch(const k::SortEngine& engine, const k::PairsEngine* pairs, SortPlace& place, cudaMemPool_t pool,
                     const detail::Lanes& lanes, const SortNeeds& needs) {
  const std::size_t keys = static_cast<std::size_t>(place.n) * lanes.key;
  const std::size_t values = static_cast<std::size_t>(place.n) * lanes.value;
  std::size_t sort_temp = 0;
  // offsets into `temp` of what it holds once the run is sorted (several places)
  std::size_t receive_at = 0, receive_values_at = 0, between_at = 0, between_values_at = 0;
  if (needs.several) {
    if (pairs) {
      check(pairs->sort_into(nullptr, sort_temp, nullptr, nullptr, nullptr, nullptr, place.n, place.stream),
            "cub::DeviceRadixSort::SortPairs");
    } else {
      check(engine.sort_into(nullptr, sort_temp, nullptr, nullptr, place.n, place.stream), "cub::DeviceRadixSort");
    }
    const detail::RadixOrder order(engine, pairs);
    const detail::RunPiece first{nullptr, nullptr, place.n - place.n / 2, place.device};
    const detail::RunPiece second{nullptr, nullptr, place.n / 2, place.device};
    order.merge(nullptr, place.merge_temp_bytes, first, second, nullptr, nullptr, place.stream);
    std::size_t after = 0;
    Carve carve(after);
    carve.take(place.merge_temp_bytes);
    place.receive_keys = needs.receive ? detail::receive_capacity(place.n) : 0;
    if (needs.receive) {
      receive_at = carve.take(static_cast<std::size_t>(place.receive_keys) * lanes.key);
      receive_values_at = carve.take(static_cast<std::size_t>(place.receive_keys) * lanes.value);
    }
    if (needs.levels) {
      between_at = carve.take(keys);
      between_values_at = carve.take(values);
    }
    place.temp_bytes = std::max(sort_temp, after);
  } else if (pairs) {
    check(pairs->sort(nullptr, sort_temp, nullptr, nullptr, nullptr, nullptr, place.n, nullptr, place.stream),
          "cub::DeviceRadixSort::SortPairs");
    place.temp_bytes = sort_temp;
  } else {
    check(engine.sort(nullptr, sort_temp, nullptr, nullptr, place.n, nullptr, place.stream), "cub::DeviceRadixSort");
    place.temp_bytes = sort_temp;
  }
  std::size_t total = 0;
  Carve carve(total);
  const std::size_t run_at = carve.take(keys);
  const std::size_t run_values_at = carve.take(values);
  const std::size_t temp_at = carve.take(place.temp_bytes);
  place.scratch = detail::StreamScratch(total, place.stream, pool);
  place.run = place.scratch.bytes() + run_at;
  if (pairs) place.run_values = place.scratch.bytes() + run_values_at;
  place.temp = place.scratch.bytes() + temp_at;
  if (needs.several) {
    if (needs.receive) {
      place.receive = place.temp + receive_at;
      if (pairs) place.receive_values = place.temp + receive_values_at;
    }
    if (needs.levels) {
      place.between = place.temp + between_at;
      if (pairs) place.between_values = place.temp + between_values_at;
    }
  }
}

// The keys `in` sorted into `out` (which may be `in`), carrying `values_in` into
// `values_out` (both null for sort; either may be the other) with the pairs engine.
// The engine for `in`'s keys, or std::invalid_argument naming `what`.
const k::SortEngine& engine_for(const ShardedArray& in, bool descending, const char* what) {
  const k::SortEngine* engine = k::sort_engine(static_cast<int>(in.dtype()), descending);
  if (!engine) throw std::invalid_argument(std::string(what) + ": cannot sort dtype " + dtype_name(in.dtype()));
  return *engine;
}

void sort_lanes(const k::SortEngine& key_engine, const ShardedArray& in, ShardedArray& out,
                const ShardedArray* values_in, ShardedArray* values_out, bool descending) {
  const k::SortEngine* engine = &key_engine;
  const k::PairsEngine* pairs = nullptr;
  detail::Lanes lanes{in.itemsize(), 0};
  if (values_in) {
    lanes.value = values_in->itemsize();
    pairs = k::pairs_engine(static_cast<int>(in.dtype()), descending, static_cast<int>(lanes.value));
    if (!pairs) {
      throw std::invalid_argument("values: elements of " + std::to_string(lanes.value) +
                                  " bytes; the pairs sort moves values of 4 or 8 bytes");
    }
  }

  const PlaceGroup& group = *in.group();
  const std::size_t count = group.size();
  const std::size_t item = lanes.key;
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
    if (values_out) place.shard_values = reinterpret_cast<unsigned char*>(values_out->shard_pointer(p));
    DeviceGuard guard(place.device);
    reserve_scratch(*engine, pairs, place, reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)), lanes, needs);
  }
  for (std::size_t p = 0; p < count; ++p) {
    SortPlace& place = places[p];
    if (place.n == 0) continue;
    DeviceGuard guard(place.device);
    const unsigned char* input = detail::queue_sort_input(
        *engine, place, reinterpret_cast<const unsigned char*>(in.shard_pointer(p)), &in != &out, needs.several, item);
    const unsigned char* values =
        values_in ? detail::queue_values_input(place, reinterpret_cast<const unsigned char*>(values_in->shard_pointer(p)),
                                               values_in != values_out, needs.several, lanes.value)
                  : nullptr;
    if (needs.several) {
      detail::queue_run_sort(*engine, pairs, place, input, values, sample);
    } else {
      detail::sort_shard_in_place(*engine, pairs, place, lanes);
    }
  }
  if (!needs.several) return;  // one shard holds every key: sorted in place

  // copies and merges may read across places when something throws: they end before any
  // place's scratch goes
  const detail::SyncOnUnwind settle(group);
  std::optional<detail::SampledCuts> sampled;
  if (sample) sampled.emplace(*engine, detail::sample_sources(places), switches.sigmas);
  detail::exchange_and_merge(detail::RadixOrder(*engine, pairs), places, group, lanes, chunks,
                             sampled ? &*sampled : nullptr);
}

}  // namespace

void sort(const ShardedArray& in, ShardedArray& out, bool descending) {
  const ArrayLeases leases({{&in, "a"}, {&out, "out"}});
  if (in.group() != out.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  if (in.shard_sizes() != out.shard_sizes()) throw std::invalid_argument("out: shard sizes differ from a's");
  in.check_scalar("a", "sort");
  if (in.dtype() != out.dtype()) throw std::invalid_argument("out: dtype differs from a's");
  sort_lanes(engine_for(in, descending, "a"), in, out, nullptr, nullptr, descending);
}

void sort_by_key(const ShardedArray& keys, ShardedArray& out_keys, const ShardedArray& values,
                 ShardedArray& out_values, bool descending) {
  const ArrayLeases leases({{&keys, "keys"}, {&out_keys, "out_keys"}, {&values, "values"}, {&out_values, "out_values"}});
  const auto same_shape = [&keys](const ShardedArray& other, const char* what) {
    if (other.group() != keys.group()) throw std::invalid_argument(std::string(what) + ": belongs to another PlaceGroup than keys");
    if (other.shard_sizes() != keys.shard_sizes()) {
      throw std::invalid_argument(std::string(what) + ": shard sizes differ from keys'");
    }
  };
  same_shape(out_keys, "out_keys");
  same_shape(values, "values");
  same_shape(out_values, "out_values");
  keys.check_scalar("keys", "sort_by_key");
  if (keys.dtype() != out_keys.dtype()) throw std::invalid_argument("out_keys: dtype differs from keys'");
  if (values.itemsize() != out_values.itemsize()) {
    throw std::invalid_argument("out_values: element size differs from values'");
  }
  // one buffer both sorted as keys and moved as values, or written twice, would be garbage
  const auto overlaps = [](const ShardedArray& a, const ShardedArray& b) { return &a == &b; };
  if (overlaps(keys, values) || overlaps(keys, out_values) || overlaps(out_keys, values) ||
      overlaps(out_keys, out_values)) {
    throw std::invalid_argument("values: the keys' and the values' arrays must be distinct");
  }
  sort_lanes(engine_for(keys, descending, "keys"), keys, out_keys, &values, &out_values, descending);
}

}  // namespace csj
