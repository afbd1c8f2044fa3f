// Scans by key and reduce_by_key across places (csj/by_key.hpp), on the by-key engine
// (kernels/by_key_params.hpp says what each kernel does).
//
// Every non-empty shard takes the single pass on its own place (the section "the single
// pass" below), in one process and across ranks alike, so a from_mpi group folds what
// by_devices folds; where reduce_by_key's outputs at the shard's size do not fit, the two
// passes: every non-empty shard is reduced to chunk records and a total on its own place,
// then swept again. Either way the only cross-place steps are small copies: each shard's
// neighbouring keys (the last key of the shard before, the first of the shard after, so runs
// crossing shards are seen) and, for every shard after the first, the earlier shards'
// totals, which its carry kernel folds in place order. reduce_by_key then reads each place's
// count of run ends to size its outputs; the scans need no host read. Across ranks
// (ByKeyEdges) the neighbouring keys come from the nearest ranks holding any, and the carries
// fold the earlier ranks' totals first: the shards' totals go to the host once, for the
// caller to exchange. Before returning, every place's stream waits for the others (events, no
// host wait), so the scratch and the arrays they read across places stay until the copies are
// done.
#include "csj/by_key.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "../kernels/builtin_kernels.hpp"
#include "../kernels/by_key_params.hpp"
#include "../kernels/select_params.hpp"
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

// Across ranks: the neighbouring keys must be keys' size (or absent).
void check_edges(const ByKeyEdges* edges, const ShardedArray& keys) {
  if (!edges) return;
  for (const std::string* key : {&edges->prev_key, &edges->next_key}) {
    if (!key->empty() && key->size() != keys.itemsize()) {
      throw std::invalid_argument("edges: a neighbouring key of " + std::to_string(key->size()) +
                                  " bytes, the keys have " + std::to_string(keys.itemsize()));
    }
  }
}

// The non-empty places, in place order, with their devices, streams and libraries.
std::vector<ByKeyPlace> non_empty_places(const std::vector<const KernelLibrary*>& libraries,
                                         const ShardedArray& keys) {
  const PlaceGroup& group = *keys.group();
  std::vector<ByKeyPlace> places;
  for (std::size_t p = 0; p < group.size(); ++p) {
    if (keys.shard_size(p) == 0) continue;
    ByKeyPlace item;
    item.place = p;
    item.device = group.device(p);
    item.stream = reinterpret_cast<cudaStream_t>(group.stream(p));
    item.library = libraries[p];
    places.push_back(std::move(item));
  }
  return places;
}

// Queues the copies of place i's neighbouring keys into `neighbour_keys` (16 bytes of its
// scratch: the key before, the key after) and points its params at them: the last key of the
// non-empty shard before and the first of the one after, or across ranks the edges' keys.
void copy_neighbour_keys(std::vector<ByKeyPlace>& places, std::size_t i, const ShardedArray& keys,
                         const ByKeyEdges* edges, unsigned char* neighbour_keys) {
  ByKeyPlace& item = places[i];
  k::ByKeyParams& params = item.params;
  const std::size_t key_size = keys.itemsize();
  if (i > 0) {
    const ByKeyPlace& before = places[i - 1];
    detail::wait_for(item.stream, before.stream, before.device);
    const std::uintptr_t last = keys.shard_pointer(before.place) +
                                static_cast<std::uintptr_t>(keys.shard_size(before.place) - 1) * key_size;
    detail::copy_between(neighbour_keys, item.device, reinterpret_cast<const void*>(last), before.device, key_size,
                         item.stream, "copying the key before the shard");
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
    detail::copy_between(neighbour_keys + 8, item.device, reinterpret_cast<const void*>(keys.shard_pointer(after.place)),
                         after.device, key_size, item.stream, "copying the key after the shard");
    params.next_key = neighbour_keys + 8;
  } else if (edges && !edges->next_key.empty()) {  // a later rank's first key
    detail::check(cudaMemcpyAsync(neighbour_keys + 8, edges->next_key.data(), key_size, cudaMemcpyHostToDevice,
                                  item.stream),
                  "cudaMemcpyAsync (the key after this rank's part)");
    params.next_key = neighbour_keys + 8;
  }
}

// Queues, on every place after the first, the copies of the earlier places' totals (each
// params.total) into params.sources, behind `earlier` records already there, and the carry
// kernel that folds them into params.carry in place order.
void queue_carries(std::vector<ByKeyPlace>& places, std::size_t earlier) {
  for (std::size_t i = earlier ? 0 : 1; i < places.size(); ++i) {
    ByKeyPlace& item = places[i];
    DeviceGuard guard(item.device);
    auto* sources = const_cast<k::ByKeyRecord*>(item.params.sources) + earlier;
    for (std::size_t j = 0; j < i; ++j) {
      const ByKeyPlace& before = places[j];
      detail::wait_for(item.stream, before.stream, before.device);
      detail::copy_between(sources + j, item.device, before.params.total, before.device, sizeof(k::ByKeyRecord),
                           item.stream, "copying an earlier shard's total");
    }
    item.params.count = static_cast<int>(earlier + i);
    detail::launch(KernelHandle::linked(item.library->kernel("csj_by_key_carry", item.device)), 1, 32, item.stream,
                   item.params, "launching by-key carry");
  }
}

// Makes every place's stream wait for the others' (events, no host wait): what one place's
// copies read of another's scratch or arrays stays until they are done.
void wait_for_each_other(const std::vector<ByKeyPlace>& places) {
  if (places.size() < 2) return;
  for (const ByKeyPlace& waiter : places) {
    for (const ByKeyPlace& other : places) {
      if (&other != &waiter) detail::wait_for(waiter.stream, other.stream, other.device);
    }
  }
}

// Across ranks (edges with a totals exchange; every rank calls it, whether it holds elements
// or not): this rank's shard totals go to the host and out, the earlier ranks' come back into
// each place's params.sources, ahead of the room for this rank's earlier shards, and every
// place, its first included, gets a carry. Returns how many earlier records there are.
std::size_t take_earlier_totals(std::vector<ByKeyPlace>& places, const PlaceGroup& group, const ByKeyEdges* edges) {
  constexpr std::size_t kRecord = sizeof(k::ByKeyRecord);
  if (!edges || !edges->totals) return 0;
  std::string prior;
  {
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
  }
  if (prior.size() % kRecord) {
    throw std::invalid_argument("edges: the earlier ranks' totals are not whole 64-byte records");
  }
  const std::size_t earlier = prior.size() / kRecord;
  if (earlier) {  // the earlier ranks' totals first, then this rank's shards before each
    for (std::size_t i = 0; i < places.size(); ++i) {
      ByKeyPlace& item = places[i];
      DeviceGuard guard(item.device);
      item.sources = detail::StreamScratch((earlier + i) * kRecord, item.stream,
                                           reinterpret_cast<cudaMemPool_t>(group.memory_pool(item.place)));
      detail::check(cudaMemcpyAsync(item.sources.get(), prior.data(), prior.size(), cudaMemcpyHostToDevice, item.stream),
                    "cudaMemcpyAsync (the earlier ranks' totals)");
      item.params.sources = static_cast<k::ByKeyRecord*>(item.sources.get());
      item.params.carry = item.params.total + 1;
    }
  }
  return earlier;
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
  std::vector<ByKeyPlace> places = non_empty_places(libraries, keys);
  const detail::SyncOnUnwind settle(group);  // after `places`: on a throw, queued copies finish first
  constexpr std::size_t kRecord = sizeof(k::ByKeyRecord);
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
    copy_neighbour_keys(places, i, keys, edges, item.scratch.bytes() + records * kRecord);
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
  const std::size_t earlier = take_earlier_totals(places, group, edges);
  queue_carries(places, earlier);
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
  wait_for_each_other(places);  // see the file's opening comment
}

// ---- the single pass ------------------------------------------------------------------------
// Every non-empty shard takes the single pass on its own place (each tile read
// once, joined to the tiles before it by a look-back in the kernel), with no carry in; the
// neighbouring keys say which runs cross its edges. Then each later shard's carry (the earlier
// shards' totals folded in place order, as in the two passes) is applied to its first run by a
// fix-up kernel: for the scans, to the elements of that run (all of them only where a run
// spans the shard); for reduce_by_key, to its first output. reduce_by_key's outputs, whose
// size only the pass finds, are written to scratch of the shard's size, then copied to arrays
// of their size. Where a device has no room for that scratch, the two passes. Across ranks the
// same, the carries folding the earlier ranks' totals first (take_earlier_totals), the first
// shard's included.

// CSJ_X_BY_KEY=two_pass makes every call take the two passes, which otherwise serve only
// devices without room (an A/B and test switch; docs/performance.md).
bool two_pass_forced() {
  const char* text = std::getenv("CSJ_X_BY_KEY");
  return text != nullptr && std::strcmp(text, "two_pass") == 0;
}

constexpr std::size_t round_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// A place's single-pass scratch: tile counter | tile flags | reduce_by_key's run ends a tile |
// tile records (aggregates, inclusives) | total, carry, earlier totals | neighbouring keys |
// reduce_by_key's keys and values at the shard's size.
struct OnePassLayout {
  long long num_tiles = 0;
  std::size_t zeroed = 0;   // the counter, the flags, the run ends, the packed records: cleared before the launch
  std::size_t ends = 0;     // reduce_by_key: its tiles' run ends (num_tiles + 1 counts)
  std::size_t records = 0;  // where the tile records start
  std::size_t totals = 0;   // where the total, the carry and the earlier totals start
  std::size_t neighbours = 0;
  std::size_t keys = 0;     // reduce_by_key: where its keys and values go
  std::size_t values = 0;
  std::size_t total = 0;
};

OnePassLayout one_pass_layout(const ShardedArray& keys, const ShardedArray& values, std::size_t place,
                              std::size_t index, bool reduce) {
  const long long n = keys.shard_size(place);
  const long long tile = k::by_key_pass_tile(static_cast<int>(keys.itemsize()), static_cast<int>(values.itemsize()));
  const auto tiles = static_cast<std::size_t>((n + tile - 1) / tile);
  OnePassLayout layout;
  layout.num_tiles = static_cast<long long>(tiles);
  layout.ends = round_up(16 + tiles * sizeof(int));
  layout.records = layout.ends + (reduce ? round_up((tiles + 1) * sizeof(long long)) : 0);
  // the records' first 2 x 16 bytes a tile too: records of up to 16 bytes are packed with
  // their state (by_key_jit.cu's PackedSlots), all zero meaning "none yet"
  layout.zeroed = layout.records + 2 * tiles * 16;
  layout.totals = layout.records + round_up(2 * tiles * k::kByKeyTileRecord);
  layout.neighbours = layout.totals + (2 + index) * sizeof(k::ByKeyRecord);
  layout.keys = round_up(layout.neighbours + 16);
  layout.values = layout.keys + (reduce ? round_up(static_cast<std::size_t>(n) * keys.itemsize()) : 0);
  layout.total = layout.values + (reduce ? static_cast<std::size_t>(n) * values.itemsize() : 0);
  return layout;
}

// Below this much scratch on a device the question (the pool's cached memory, and where that
// is short cudaMemGetInfo, several microseconds) costs more than it tells: the single pass is
// taken, and a failing allocation is a MemoryError.
constexpr std::uint64_t kCheckedScratch = std::uint64_t{64} << 20;

// Whether every device has room for its places' scratch (reduce_by_key's holds outputs at the
// shard's size; the scans' is a few bytes a tile and is not checked).
bool fits(const ShardedArray& keys, const std::vector<ByKeyPlace>& places, const std::vector<OnePassLayout>& layouts) {
  const PlaceGroup& group = *keys.group();
  for (int device : group.unique_devices()) {
    std::uint64_t need = 0;
    std::size_t first = places.size();
    for (std::size_t i = 0; i < places.size(); ++i) {
      if (places[i].device != device) continue;
      need += layouts[i].total;
      if (first == places.size()) first = i;
    }
    if (first == places.size() || need < kCheckedScratch) continue;
    DeviceGuard guard(device);
    if (!detail::has_room(reinterpret_cast<cudaMemPool_t>(group.memory_pool(places[first].place)), need)) {
      return false;
    }
  }
  return true;
}

// The groups of tiles, the scans' single pass's grid: a tile a warp, kByKeyPassWarps consecutive
// tiles a block.
unsigned pass_blocks(const k::ByKeyParams& params) {
  return static_cast<unsigned>((params.num_tiles + k::kByKeyPassWarps - 1) / k::kByKeyPassWarps);
}

// The single pass's grid: pass_blocks for the scans (a block a group of tiles), and for
// reduce_by_key's persistent pass no more blocks than are resident at once, which loop over the
// groups (any grid is correct there; more blocks would only claim past the shard and leave).
unsigned single_pass_blocks(const KernelHandle& kernel, const k::ByKeyParams& params, int device) {
  const unsigned groups = pass_blocks(params);
  if (params.mode != k::kByKeyReduce) return groups;
  const long long resident =
      static_cast<long long>(detail::blocks_per_multiprocessor(kernel, k::kByKeyBlock)) * detail::multiprocessors(device);
  return static_cast<unsigned>(std::min<long long>(groups, std::max<long long>(resident, 1)));
}

// The single pass's fix-ups on every place after the first (across ranks with earlier totals,
// the first too), behind their carries.
void queue_fix_ups(std::vector<ByKeyPlace>& places, std::size_t earlier) {
  for (std::size_t i = earlier ? 0 : 1; i < places.size(); ++i) {
    ByKeyPlace& item = places[i];
    DeviceGuard guard(item.device);
    const bool reduce = item.params.mode == k::kByKeyReduce;
    const char* name = item.params.mode == k::kByKeyInclusive   ? "csj_by_key_one_pass_fix_inclusive"
                       : item.params.mode == k::kByKeyExclusive ? "csj_by_key_one_pass_fix_exclusive"
                                                                : "csj_by_key_one_pass_fix_reduce";
    // the scans' blocks stop at the first tile with a head, so a grid of a few waves costs little
    const unsigned grid = reduce ? 1 : static_cast<unsigned>(std::min<long long>(item.params.num_tiles, 1024));
    detail::launch(KernelHandle::linked(item.library->kernel(name, item.device)), grid,
                   reduce ? 32 : k::kByKeyBlock, item.stream, item.params, "launching the by-key fix-up");
  }
}

// What one_pass leaves to reduce_by_key's gather_runs: whether the fix-ups are due, and
// after how many earlier ranks' totals.
struct FixUps {
  bool due = false;
  std::size_t earlier = 0;
};

// Queues the single pass on every place of `places` (reduce_by_key: and the scan of its
// tiles' run ends); across ranks, exchanges the shards' totals (take_earlier_totals); then
// the carries and, for the scans, the fix-ups of the shards after the first (across ranks, of
// the first too where earlier ranks hold elements), which reduce_by_key queues after its
// gather. `out`: the scans' output (reduce_by_key's go to the scratch).
FixUps one_pass(std::vector<ByKeyPlace>& places, const std::vector<OnePassLayout>& layouts, const ShardedArray& keys,
              const ShardedArray& values, const ShardedArray* out, int mode, const std::string& init,
              const ByKeyEdges* edges) {
  const PlaceGroup& group = *keys.group();
  for (std::size_t i = 0; i < places.size(); ++i) {
    ByKeyPlace& item = places[i];
    const OnePassLayout& layout = layouts[i];
    DeviceGuard guard(item.device);
    k::ByKeyParams& params = item.params;
    params.keys = reinterpret_cast<const void*>(keys.shard_pointer(item.place));
    params.values = reinterpret_cast<const void*>(values.shard_pointer(item.place));
    params.n = keys.shard_size(item.place);
    params.mode = mode;
    std::memcpy(params.init, init.data(), init.size());
    params.num_tiles = layout.num_tiles;
    item.scratch = detail::StreamScratch(layout.total, item.stream,
                                         reinterpret_cast<cudaMemPool_t>(group.memory_pool(item.place)));
    unsigned char* base = item.scratch.bytes();
    params.tile_counter = reinterpret_cast<unsigned long long*>(base);
    params.tile_flags = reinterpret_cast<int*>(base + 16);
    params.tile_records = base + layout.records;
    auto* totals = reinterpret_cast<k::ByKeyRecord*>(base + layout.totals);
    params.total = places.size() > 1 || edges ? totals : nullptr;  // only the carries read it
    params.carry = i > 0 ? totals + 1 : nullptr;
    params.sources = totals + 2;
    if (mode == k::kByKeyReduce) {  // the result's pointers come once its size is known
      params.tile_ends = reinterpret_cast<long long*>(base + layout.ends);
      params.run_count = params.tile_ends + layout.num_tiles;
      params.tile_keys = base + layout.keys;
      params.tile_values = base + layout.values;
    } else {
      params.out_values = reinterpret_cast<void*>(out->shard_pointer(item.place));
    }
    copy_neighbour_keys(places, i, keys, edges, base + layout.neighbours);
    detail::check(cudaMemsetAsync(base, 0, layout.zeroed, item.stream), "cudaMemsetAsync (the by-key tile flags)");
  }
  // launched once every neighbour copy is queued, so no place's pass waits for another's
  for (ByKeyPlace& item : places) {
    DeviceGuard guard(item.device);
    const char* name = item.params.mode == k::kByKeyInclusive   ? "csj_by_key_one_pass_inclusive"
                       : item.params.mode == k::kByKeyExclusive ? "csj_by_key_one_pass_exclusive"
                                                                : "csj_by_key_one_pass_reduce";
    const KernelHandle pass = KernelHandle::linked(item.library->kernel(name, item.device));
    detail::launch(pass, single_pass_blocks(pass, item.params, item.device), k::kByKeyBlock, item.stream, item.params,
                   "launching the by-key single pass");
    if (item.params.mode == k::kByKeyReduce) {
      detail::check(k::scan_tile_ends(item.params.tile_ends, item.params.num_tiles, item.stream,
                                      reinterpret_cast<cudaMemPool_t>(group.memory_pool(item.place))),
                    "scanning reduce_by_key's run ends");
    }
  }
  const std::size_t earlier = take_earlier_totals(places, group, edges);
  if (places.size() < 2 && earlier == 0) return {};
  queue_carries(places, earlier);
  if (mode != k::kByKeyReduce) queue_fix_ups(places, earlier);
  return {true, earlier};
}

// reduce_by_key after one_pass, once its result is allocated: each place's outputs gathered
// into its shard of the result's keys and values, then the fix-ups one_pass left.
void gather_runs(std::vector<ByKeyPlace>& places, const ArrayList& result, const FixUps& fix_ups) {
  for (ByKeyPlace& item : places) {
    DeviceGuard guard(item.device);
    item.params.out_keys = reinterpret_cast<void*>(result[0]->shard_pointer(item.place));
    item.params.out_values = reinterpret_cast<void*>(result[1]->shard_pointer(item.place));
    const long long tiles_a_block = static_cast<long long>(k::kByKeyPassWarps) * k::kByKeyGatherTiles;
    detail::launch(KernelHandle::linked(item.library->kernel("csj_by_key_one_pass_gather", item.device)),
                   static_cast<unsigned>((item.params.num_tiles + tiles_a_block - 1) / tiles_a_block), k::kByKeyBlock,
                   item.stream, item.params,
                   "launching reduce_by_key's gather");
  }
  if (fix_ups.due) queue_fix_ups(places, fix_ups.earlier);
}

}  // namespace

void scan_by_key(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                 const ShardedArray& values, ShardedArray& out, bool exclusive, const std::string& init,
                 const ByKeyEdges* edges) {
  check_arguments(libraries, keys, values);
  check_edges(edges, keys);
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
  const int mode = exclusive ? k::kByKeyExclusive : k::kByKeyInclusive;
  if (!two_pass_forced()) {
    std::vector<ByKeyPlace> places = non_empty_places(libraries, keys);
    const detail::SyncOnUnwind settle(*keys.group());  // after `places`: queued work drains first
    std::vector<OnePassLayout> layouts;
    for (std::size_t i = 0; i < places.size(); ++i) {
      layouts.push_back(one_pass_layout(keys, values, places[i].place, i, false));
    }
    one_pass(places, layouts, keys, values, &out, mode, exclusive ? init : std::string(), edges);
    wait_for_each_other(places);  // see the file's opening comment
    return;
  }
  std::vector<ByKeyPlace> places;
  const detail::SyncOnUnwind settle(*keys.group());  // after `places`: queued work drains first
  places = reduce_places(libraries, keys, values, mode, exclusive ? init : std::string(), edges);
  for (ByKeyPlace& item : places) item.params.out_values = reinterpret_cast<void*>(out.shard_pointer(item.place));
  sweep(places);
}

ArrayList reduce_by_key(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                        const ShardedArray& values, const ByKeyEdges* edges) {
  check_arguments(libraries, keys, values);
  check_edges(edges, keys);
  const ArrayLeases leases({{&keys, "keys"}, {&values, "values"}});
  const PlaceGroup& group = *keys.group();
  detail::PinnedBuffer pinned(group.size() * sizeof(long long));
  if (!two_pass_forced()) {
    std::vector<ByKeyPlace> places = non_empty_places(libraries, keys);
    std::vector<OnePassLayout> layouts;
    for (std::size_t i = 0; i < places.size(); ++i) {
      layouts.push_back(one_pass_layout(keys, values, places[i].place, i, true));
    }
    // the outputs at the shard's size, then gathered into the result: where a device has
    // no room for that, the two passes, which size the outputs before writing them
    if (fits(keys, places, layouts)) {
      const detail::SyncOnUnwind settle(group);  // after `places` and `pinned`: queued work drains first
      const FixUps fix_ups = one_pass(places, layouts, keys, values, nullptr, k::kByKeyReduce, std::string(), edges);
      // Each place's count of runs, stored by a kernel behind its scan into pinned memory (one
      // address on every device under unified addressing) that the host polls: against a copy
      // and a stream synchronisation, the result is allocated and the gather queued about as
      // soon as the scan is done. A device set to block on synchronisation
      // (cudaDeviceScheduleBlockingSync) is waited for so, not spun on. A stream that finishes
      // with no count stored failed: its error is raised.
      volatile long long* runs = reinterpret_cast<volatile long long*>(pinned.data);
      for (std::size_t i = 0; i < places.size(); ++i) runs[i] = -1;
      void* mapped = nullptr;
      for (std::size_t i = 0; i < places.size(); ++i) {
        DeviceGuard guard(places[i].device);
        if (!mapped) detail::check(cudaHostGetDevicePointer(&mapped, pinned.data, 0), "cudaHostGetDevicePointer");
        detail::check(k::publish_count(places[i].params.run_count, static_cast<long long*>(mapped) + i,
                                       places[i].stream),
                      "reading the count of runs");
      }
      std::vector<std::int64_t> sizes(group.size(), 0);
      for (std::size_t i = 0; i < places.size(); ++i) {
        DeviceGuard guard(places[i].device);
        if (!detail::wait_until_stored([&] { return runs[i] >= 0; }, places[i].stream,
                                       "synchronising the count of runs")) {
          throw std::runtime_error("reduce_by_key: the count of runs was not stored");
        }
        sizes[places[i].place] = runs[i];
      }
      ArrayList result{ShardedArray::allocate(keys.group(), sizes, keys.dtype(), 0),
                       ShardedArray::allocate(values.group(), sizes, values.dtype(),
                                              values.is_record() ? values.itemsize() : 0)};
      gather_runs(places, result, fix_ups);
      wait_for_each_other(places);  // see the file's opening comment
      return result;
    }
  }
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
