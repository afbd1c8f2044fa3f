// Scans by key and reduce_by_key across places (csj/by_key.hpp), on the by-key engine
// (kernels/by_key_params.hpp says what each kernel does).
//
// Every non-empty shard is reduced to chunk records and a total on its own place; the only
// cross-place steps are small copies: each shard's neighbouring keys (the last key of the
// shard before, the first of the shard after, so runs crossing shards are seen) and, for
// every shard after the first, the earlier shards' totals, which its carry kernel folds in
// place order. reduce_by_key then reads each place's count of run ends to size its outputs;
// the scans need no host read. Across ranks (ByKeyEdges) the neighbouring keys come from the
// nearest ranks holding any, and the carries fold the earlier ranks' totals first: the first
// pass's totals go to the host once, for the caller to exchange. Before returning, every
// place's stream waits for the others (events, no host wait), so the scratch and the arrays
// they read across places stay until the copies are done.
#include "csj/by_key.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "../kernels/by_key_params.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"
#include "sort_common.hpp"

namespace csj {
namespace {

namespace k = kernels;
using detail::DeviceGuard;
using detail::KernelHandle;

struct ByKeyPlace {
  std::size_t place = 0;
  int device = 0;
  cudaStream_t stream = nullptr;
  k::ByKeyParams params{};
  detail::StreamScratch scratch;
  detail::StreamScratch sources;  // across ranks: the earlier ranks' totals, then this rank's
  const KernelLibrary* library = nullptr;
};

void check_arguments(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                     const ShardedArray& values) {
  const PlaceGroup& group = *keys.group();
  detail::check_libraries(libraries, group.size());
  if (keys.is_record() || (keys.itemsize() != 4 && keys.itemsize() != 8)) {
    throw std::invalid_argument("keys: expected numbers of 4 or 8 bytes");
  }
  const std::size_t value = values.itemsize();
  if (value != 4 && value != 8 && value != 12 && value != 16 && value != 24 && value != 32) {
    throw std::invalid_argument("values: expected elements of 4, 8, 12, 16, 24 or 32 bytes");
  }
  if (values.group() != keys.group()) throw std::invalid_argument("values: belongs to another PlaceGroup");
  if (values.shard_sizes() != keys.shard_sizes()) {
    throw std::invalid_argument("values: shard sizes differ from the keys'");
  }
}

// The first half on every non-empty place: the neighbouring keys copied in, the chunk
// records and the shard's total; then each later place's carry.
std::vector<ByKeyPlace> reduce_places(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                                      const ShardedArray& values, int mode, const std::string& init,
                                      const ByKeyEdges* edges) {
  const PlaceGroup& group = *keys.group();
  const std::size_t key_size = keys.itemsize();
  const int chunk_tiles = k::kByKeyChunkTiles;
  const long long chunk = k::by_key_chunk(static_cast<int>(key_size), static_cast<int>(values.itemsize()), chunk_tiles);
  std::vector<ByKeyPlace> places;
  const detail::SyncOnUnwind settle(group);  // after `places`: on a throw, queued copies finish first
  for (std::size_t p = 0; p < group.size(); ++p) {
    if (keys.shard_size(p) == 0) continue;
    ByKeyPlace item;
    item.place = p;
    item.device = group.device(p);
    item.stream = reinterpret_cast<cudaStream_t>(group.stream(p));
    item.library = libraries[p];
    places.push_back(std::move(item));
  }
  constexpr std::size_t kRecord = sizeof(k::ByKeyRecord);
  if (edges) {
    for (const std::string* key : {&edges->prev_key, &edges->next_key}) {
      if (!key->empty() && key->size() != key_size) {
        throw std::invalid_argument("edges: a neighbouring key of " + std::to_string(key->size()) +
                                    " bytes, the keys have " + std::to_string(key_size));
      }
    }
  }
  for (std::size_t i = 0; i < places.size(); ++i) {
    ByKeyPlace& item = places[i];
    const std::size_t p = item.place;
    DeviceGuard guard(item.device);
    k::ByKeyParams& params = item.params;
    params.keys = reinterpret_cast<const void*>(keys.shard_pointer(p));
    params.values = reinterpret_cast<const void*>(values.shard_pointer(p));
    params.n = keys.shard_size(p);
    params.mode = mode;
    params.chunk_tiles = chunk_tiles;
    params.num_chunks = (params.n + chunk - 1) / chunk;
    params.num_groups = (params.num_chunks + k::kByKeyGroup - 1) / k::kByKeyGroup;
    std::memcpy(params.init, init.data(), init.size());
    // chunks | groups | total | carry | earlier totals | previous key | next key
    const std::size_t records = static_cast<std::size_t>(params.num_chunks + params.num_groups) + 2 + i;
    item.scratch = detail::StreamScratch(records * kRecord + 16, item.stream,
                                         reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)));
    auto* base = static_cast<k::ByKeyRecord*>(item.scratch.get());
    params.chunks = base;
    params.groups = base + params.num_chunks;
    params.total = params.groups + params.num_groups;
    params.carry = i > 0 ? params.total + 1 : nullptr;
    params.sources = params.total + 2;
    unsigned char* neighbour_keys = item.scratch.bytes() + records * kRecord;
    if (i > 0) {
      const ByKeyPlace& before = places[i - 1];
      detail::wait_for(item.stream, before.stream, before.device);
      const std::uintptr_t last = keys.shard_pointer(before.place) +
                                  static_cast<std::uintptr_t>(keys.shard_size(before.place) - 1) * key_size;
      detail::check(cudaMemcpyPeerAsync(neighbour_keys, item.device, reinterpret_cast<const void*>(last),
                                        before.device, key_size, item.stream),
                    "cudaMemcpyPeerAsync (the key before the shard)");
      params.prev_key = neighbour_keys;
    } else if (edges && !edges->prev_key.empty()) {  // an earlier rank's last key
      detail::check(cudaMemcpyAsync(neighbour_keys, edges->prev_key.data(), key_size, cudaMemcpyHostToDevice,
                                    item.stream),
                    "cudaMemcpyAsync (the key before this rank's part)");
      params.prev_key = neighbour_keys;
    }
    if (i + 1 < places.size()) {
      const ByKeyPlace& after = places[i + 1];
      detail::wait_for(item.stream, after.stream, after.device);
      detail::check(cudaMemcpyPeerAsync(neighbour_keys + 8, item.device,
                                        reinterpret_cast<const void*>(keys.shard_pointer(after.place)), after.device,
                                        key_size, item.stream),
                    "cudaMemcpyPeerAsync (the key after the shard)");
      params.next_key = neighbour_keys + 8;
    } else if (edges && !edges->next_key.empty()) {  // a later rank's first key
      detail::check(cudaMemcpyAsync(neighbour_keys + 8, edges->next_key.data(), key_size, cudaMemcpyHostToDevice,
                                    item.stream),
                    "cudaMemcpyAsync (the key after this rank's part)");
      params.next_key = neighbour_keys + 8;
    }
  }
  // launched once every neighbour copy is queued, so no place's pass waits for another's
  for (ByKeyPlace& item : places) {
    DeviceGuard guard(item.device);
    detail::launch(KernelHandle::linked(item.library->kernel("csj_by_key_reduce", item.device)),
                   static_cast<unsigned>(item.params.num_chunks), k::kByKeyBlock, item.stream, item.params,
                   "launching by-key reduce");
    detail::launch(KernelHandle::linked(item.library->kernel("csj_by_key_chunks", item.device)),
                   static_cast<unsigned>(item.params.num_groups), k::kByKeyGroupThreads, item.stream, item.params,
                   "launching by-key chunk scan");
    detail::launch(KernelHandle::linked(item.library->kernel("csj_by_key_groups", item.device)), 1,
                   k::kByKeyGroupThreads, item.stream, item.params, "launching by-key group scan");
  }
  std::string prior;  // across ranks: the earlier ranks' totals, folded in front of this rank's
  if (edges && edges->totals) {
    detail::PinnedBuffer pinned(std::max<std::size_t>(places.size(), 1) * kRecord);
    const detail::SyncOnUnwind drain(group);  // after `pinned`: on a throw, its copies end before it goes back
    for (std::size_t i = 0; i < places.size(); ++i) {
      DeviceGuard guard(places[i].device);
      detail::check(cudaMemcpyAsync(pinned.data + i * kRecord, places[i].params.total, kRecord,
                                    cudaMemcpyDeviceToHost, places[i].stream),
                    "reading a shard's total");
    }
    for (const ByKeyPlace& item : places) {
      DeviceGuard guard(item.device);
      detail::check(cudaStreamSynchronize(item.stream), "synchronising the shards' totals");
    }
    prior = edges->totals(std::string(reinterpret_cast<const char*>(pinned.data), places.size() * kRecord));
    if (prior.size() % kRecord) {
      throw std::invalid_argument("edges: the earlier ranks' totals are not whole 64-byte records");
    }
  }
  const std::size_t earlier = prior.size() / kRecord;
  for (std::size_t i = earlier ? 0 : 1; i < places.size(); ++i) {
    ByKeyPlace& item = places[i];
    DeviceGuard guard(item.device);
    auto* sources = const_cast<k::ByKeyRecord*>(item.params.sources);
    if (earlier) {  // the earlier ranks' totals first, then this rank's shards before this one
      item.sources = detail::StreamScratch((earlier + i) * kRecord, item.stream,
                                           reinterpret_cast<cudaMemPool_t>(group.memory_pool(item.place)));
      sources = static_cast<k::ByKeyRecord*>(item.sources.get());
      detail::check(cudaMemcpyAsync(sources, prior.data(), prior.size(), cudaMemcpyHostToDevice, item.stream),
                    "cudaMemcpyAsync (the earlier ranks' totals)");
      item.params.sources = sources;
      item.params.carry = item.params.total + 1;
      sources += earlier;
    }
    for (std::size_t j = 0; j < i; ++j) {
      const ByKeyPlace& earlier = places[j];
      detail::wait_for(item.stream, earlier.stream, earlier.device);
      detail::check(cudaMemcpyPeerAsync(sources + j, item.device, earlier.params.total, earlier.device, kRecord,
                                        item.stream),
                    "cudaMemcpyPeerAsync (an earlier shard's total)");
    }
    item.params.count = static_cast<int>(earlier + i);
    detail::launch(KernelHandle::linked(item.library->kernel("csj_by_key_carry", item.device)), 1, 32,
                   item.stream, item.params, "launching by-key carry");
  }
  return places;
}

void sweep(std::vector<ByKeyPlace>& places) {
  for (ByKeyPlace& item : places) {
    DeviceGuard guard(item.device);
    const char* name = item.params.mode == k::kByKeyInclusive   ? "csj_by_key_sweep_inclusive"
                       : item.params.mode == k::kByKeyExclusive ? "csj_by_key_sweep_exclusive"
                                                                : "csj_by_key_sweep_reduce";
    detail::launch(KernelHandle::linked(item.library->kernel(name, item.device)),
                   static_cast<unsigned>(item.params.num_chunks), k::kByKeyBlock, item.stream, item.params,
                   "launching by-key sweep");
  }
  if (places.size() < 2) return;
  for (ByKeyPlace& waiter : places) {  // see the file's opening comment
    for (const ByKeyPlace& other : places) {
      if (&other != &waiter) detail::wait_for(waiter.stream, other.stream, other.device);
    }
  }
}

}  // namespace

void scan_by_key(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                 const ShardedArray& values, ShardedArray& out, bool exclusive, const std::string& init,
                 const ByKeyEdges* edges) {
  check_arguments(libraries, keys, values);
  if (out.group() != keys.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  if (out.shard_sizes() != values.shard_sizes()) throw std::invalid_argument("out: shard sizes differ from the values'");
  if (out.itemsize() != values.itemsize()) throw std::invalid_argument("out: element size differs from the values'");
  for (std::size_t p = 0; p < keys.num_shards(); ++p) {  // the sweep reads keys beyond its tile
    if (keys.shard_size(p) > 0 && out.shard_pointer(p) == keys.shard_pointer(p)) {
      throw std::invalid_argument("out: shares its memory with keys (scan into another array)");
    }
  }
  if (exclusive && init.size() != values.itemsize()) {
    throw std::invalid_argument("init: expected " + std::to_string(values.itemsize()) + " bytes");
  }
  const ArrayLeases leases({{&keys, "keys"}, {&values, "values"}, {&out, "out"}});
  std::vector<ByKeyPlace> places;
  const detail::SyncOnUnwind settle(*keys.group());  // after `places`: queued work drains first
  places = reduce_places(libraries, keys, values, exclusive ? k::kByKeyExclusive : k::kByKeyInclusive,
                         exclusive ? init : std::string(), edges);
  for (ByKeyPlace& item : places) item.params.out_values = reinterpret_cast<void*>(out.shard_pointer(item.place));
  sweep(places);
}

ArrayList reduce_by_key(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                        const ShardedArray& values, const ByKeyEdges* edges) {
  check_arguments(libraries, keys, values);
  const ArrayLeases leases({{&keys, "keys"}, {&values, "values"}});
  const PlaceGroup& group = *keys.group();
  detail::PinnedBuffer pinned(group.size() * sizeof(long long));
  std::vector<ByKeyPlace> places;
  const detail::SyncOnUnwind settle(group);  // after `places` and `pinned`: queued work drains first
  places = reduce_places(libraries, keys, values, k::kByKeyReduce, std::string(), edges);
  auto* ends = reinterpret_cast<long long*>(pinned.data);
  for (std::size_t i = 0; i < places.size(); ++i) {
    DeviceGuard guard(places[i].device);
    detail::check(cudaMemcpyAsync(ends + i, &places[i].params.total->tails, sizeof(long long), cudaMemcpyDeviceToHost,
                                  places[i].stream),
                  "reading the count of runs");
  }
  std::vector<std::int64_t> sizes(group.size(), 0);
  for (std::size_t i = 0; i < places.size(); ++i) {
    DeviceGuard guard(places[i].device);
    detail::check(cudaStreamSynchronize(places[i].stream), "synchronising the count of runs");
    sizes[places[i].place] = ends[i];
  }
  ArrayList result{ShardedArray::allocate(keys.group(), sizes, keys.dtype(), 0),
                   ShardedArray::allocate(values.group(), sizes, values.dtype(),
                                          values.is_record() ? values.itemsize() : 0)};
  for (ByKeyPlace& item : places) {
    item.params.out_keys = reinterpret_cast<void*>(result[0]->shard_pointer(item.place));
    item.params.out_values = reinterpret_cast<void*>(result[1]->shard_pointer(item.place));
  }
  sweep(places);
  return result;
}

}  // namespace csj
