// Selections, the flagged compaction, the run heads' compaction and resharding
// (csj/select.hpp).
//
// The selection engine (kernels/select_params.hpp) runs per place in two halves around one
// host read: the counting pass and the device scan of the tiles' counts are queued on every
// place, then each place's totals are read (its stream synchronised): only now are the output
// shard sizes known, so the outputs are allocated here, with them; then the scatter pass
// writes every element to its class's output. The tiles' offsets stay in stream-ordered
// scratch between the halves. A select (one output) takes one pass where every device has
// room for its output at the shards' sizes: the output is allocated so, csj_select_single
// writes the kept elements and each shard's count, the counts are read (each stream
// synchronised once), and the output shrinks to them (ShardedArray::shrink_shards). A place
// without elements takes part in no launch.
//
// Resharding needs no kernel: each output shard is a concatenation of pieces of the input
// shards (their global ranges intersect), copied in global order with device-to-device or
// peer copies on the output place's stream.
#include "csj/select.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

#include "../kernels/builtin_kernels.hpp"
#include "../kernels/select_params.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"
#include "sort_common.hpp"

namespace csj {
namespace {

namespace k = kernels;
using detail::DeviceGuard;
using detail::KernelHandle;

struct SelectKernels {
  KernelHandle count, scatter;  // the two passes
  KernelHandle single;          // a select's single pass
};

struct SelectPlace {
  int device = 0;
  cudaStream_t stream = nullptr;
  k::SelectParams params{};
  detail::StreamScratch scratch;
  detail::StreamScratch before;  // the run heads: the key before the shard
  SelectKernels kernels;
};

// Per place (in group order), after the counting half: the element count of each class.
using ClassTotals = std::vector<std::array<std::int64_t, k::kSelectClasses>>;

// Tiles of `tile` elements covering `n`.
long long tiles_of(long long n, long long tile) { return (n + tile - 1) / tile; }

// `queue(p, place)` on every place with elements (its device current), which queues that
// place's work and returns where on the device its totals (one SelectCounts) will be; then
// the host read of every place's totals, each stream synchronised once.
template <class Queue>
ClassTotals read_totals(const PlaceGroup& group, std::vector<SelectPlace>& places, Queue queue) {
  const std::size_t count = places.size();
  detail::PinnedBuffer pinned(count * k::kSelectClasses * sizeof(long long));
  // after `pinned`: on a throw, the kernels already queued finish writing it before it goes
  const detail::SyncOnUnwind settle(group);
  auto* totals = reinterpret_cast<long long*>(pinned.data);
  std::fill(totals, totals + count * k::kSelectClasses, 0LL);
  for (std::size_t p = 0; p < count; ++p) {
    SelectPlace& place = places[p];
    if (place.params.n == 0) continue;
    DeviceGuard guard(place.device);
    const k::SelectCounts* shard_totals = queue(p, place);
    detail::check(cudaMemcpyAsync(totals + p * k::kSelectClasses, shard_totals, sizeof(k::SelectCounts),
                                  cudaMemcpyDeviceToHost, place.stream),
                  "reading select totals");
  }
  ClassTotals result(count);
  for (std::size_t p = 0; p < count; ++p) {
    SelectPlace& place = places[p];
    if (place.params.n > 0) {
      DeviceGuard guard(place.device);
      detail::check(cudaStreamSynchronize(place.stream), "synchronising select counts");
    }
    for (int c = 0; c < k::kSelectClasses; ++c) result[p][c] = totals[p * k::kSelectClasses + c];
  }
  return result;
}

// The counting half on every place, then the host read of the totals.
ClassTotals count_classes(const PlaceGroup& group, std::vector<SelectPlace>& places, long long tile) {
  return read_totals(group, places, [&](std::size_t p, SelectPlace& place) {
    const long long tiles = tiles_of(place.params.n, tile);
    const auto pool = reinterpret_cast<cudaMemPool_t>(group.memory_pool(p));
    place.params.tiles = tiles;
    place.scratch = detail::StreamScratch(static_cast<std::size_t>(tiles + 1) * sizeof(k::SelectCounts),
                                          place.stream, pool);
    place.params.tile_counts = static_cast<k::SelectCounts*>(place.scratch.get());
    k::SelectCounts* shard_totals = place.params.tile_counts + tiles;
    detail::check(cudaMemsetAsync(shard_totals, 0, sizeof(k::SelectCounts), place.stream), "clearing select totals");
    detail::launch(place.kernels.count, static_cast<unsigned>(tiles), k::kSelectBlock, place.stream,
                   place.params, "launching select count");
    detail::check(k::scan_select_counts(place.params.tile_counts, tiles, place.stream, pool),
                  "scanning select counts");
    return static_cast<const k::SelectCounts*>(shard_totals);
  });
}

void scatter(std::vector<SelectPlace>& places) {
  for (SelectPlace& place : places) {
    if (place.params.n == 0) continue;
    DeviceGuard guard(place.device);
    detail::launch(place.kernels.scatter, static_cast<unsigned>(place.params.tiles), k::kSelectBlock, place.stream,
                   place.params, "launching select scatter");
    place.scratch.free();
  }
}

std::vector<std::int64_t> class_sizes(const ClassTotals& totals, int cls) {
  std::vector<std::int64_t> sizes(totals.size());
  for (std::size_t p = 0; p < totals.size(); ++p) sizes[p] = totals[p][cls];
  return sizes;
}

std::shared_ptr<ShardedArray> allocate_like(const ShardedArray& like, std::vector<std::int64_t> sizes) {
  return ShardedArray::allocate(like.group(), std::move(sizes), like.dtype(), like.is_record() ? like.itemsize() : 0);
}

std::vector<SelectPlace> places_of(const ShardedArray& in) {
  const PlaceGroup& group = *in.group();
  std::vector<SelectPlace> places(group.size());
  for (std::size_t p = 0; p < places.size(); ++p) {
    places[p].device = group.device(p);
    places[p].stream = reinterpret_cast<cudaStream_t>(group.stream(p));
    places[p].params.in = reinterpret_cast<const void*>(in.shard_pointer(p));
    places[p].params.n = in.shard_size(p);
    places[p].params.index_base = in.index_base(p);
  }
  return places;
}

// CUB numbers its tile states with ints: shards of more tiles (2^33 elements of 4 bytes) take
// the two passes.
constexpr long long kMaxSinglePassTiles = 1LL << 30;

// Below this much output on a device the question costs more than the answer tells: a
// stream-ordered allocation that fails is a MemoryError all the same.
constexpr std::uint64_t kCheckedOutputs = std::uint64_t{64} << 20;

// Whether a select's single pass can run on every place: no shard of too many tiles, and room
// on every device for what it allocates before the counts are known (the output at the
// shards' sizes, the scratch) and for the exact-size copy of a shard that shrinks (under a
// quarter of it: shrink_shards), for all its places at once.
bool single_pass_fits(const ShardedArray& in, long long tile) {
  const PlaceGroup& group = *in.group();
  const auto item = static_cast<std::uint64_t>(in.itemsize());
  for (std::size_t p = 0; p < group.size(); ++p) {
    if (tiles_of(in.shard_size(p), tile) > kMaxSinglePassTiles) return false;
  }
  for (int device : group.unique_devices()) {
    std::uint64_t need = 0;
    std::size_t first = 0;
    bool any = false;
    for (std::size_t p = 0; p < group.size(); ++p) {
      const auto n = static_cast<std::uint64_t>(in.shard_size(p));
      if (group.device(p) != device || n == 0) continue;
      if (!any) first = p;
      any = true;
      const long long tiles = tiles_of(static_cast<long long>(n), tile);
      need += n * item + (n / 4 + 1) * item + k::count_lookback_scratch(tiles) + 1024;
    }
    if (!any || need < kCheckedOutputs) continue;
    DeviceGuard guard(device);
    if (!detail::has_room(reinterpret_cast<cudaMemPool_t>(group.memory_pool(first)), need)) return false;
  }
  return true;
}

// A select's single pass on every place (its kernel found): the output allocated at the
// shards' sizes, every place's pass queued, the counts read, the output shrunk to them.
// Scratch per place: the tile counter, the shard's count (one SelectCounts), the look-back's
// tile states (256-byte aligned, as CUB lays them out).
ArrayList select_single_pass(const ShardedArray& in, std::vector<SelectPlace>& places, long long tile) {
  constexpr std::size_t kTotalsAt = 64, kStatesAt = 256;
  const PlaceGroup& group = *in.group();
  std::shared_ptr<ShardedArray> kept = allocate_like(in, in.shard_sizes());
  for (std::size_t p = 0; p < places.size(); ++p) places[p].params.out[0] = reinterpret_cast<void*>(kept->shard_pointer(p));
  const ClassTotals totals = read_totals(group, places, [&](std::size_t p, SelectPlace& place) {
    const long long tiles = tiles_of(place.params.n, tile);
    place.params.tiles = tiles;
    place.scratch = detail::StreamScratch(kStatesAt + k::count_lookback_scratch(tiles), place.stream,
                                          reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)));
    auto* base = static_cast<unsigned char*>(place.scratch.get());
    place.params.next_tile = reinterpret_cast<unsigned long long*>(base);
    place.params.totals = reinterpret_cast<k::SelectCounts*>(base + kTotalsAt);
    place.params.tile_state = base + kStatesAt;
    detail::check(cudaMemsetAsync(base, 0, kStatesAt, place.stream), "clearing select's tile counter");
    detail::check(k::init_count_lookback_states(place.params.tile_state, tiles, place.stream),
                  "initialising select's look-back");
    detail::launch(place.kernels.single, static_cast<unsigned>(tiles), k::kSelectBlock, place.stream, place.params,
                   "launching select");
    return static_cast<const k::SelectCounts*>(place.params.totals);
  });
  for (SelectPlace& place : places) place.scratch.free();
  kept->shrink_shards(class_sizes(totals, 0));
  return {kept};
}

}  // namespace

ArrayList select(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in, int outputs,
                 bool single_pass) {
  const ArrayLeases leases({{&in, "a"}});
  const PlaceGroup& group = *in.group();
  if (outputs < 1 || outputs > k::kSelectClasses) {
    throw std::invalid_argument("outputs: expected 1 to 3, got " + std::to_string(outputs));
  }
  detail::check_libraries(libraries, group.size());
  const std::size_t item = in.itemsize();
  if (item < 4 || item > kMaxRecordSize || item % 4 != 0) {
    throw std::invalid_argument("a: cannot select elements of " + std::to_string(item) + " bytes");
  }
  const long long tile = k::select_tile(static_cast<int>(item));
  const long long single_tile = k::select_single_tile(static_cast<int>(item));
  const bool one_pass = outputs == 1 && single_pass && single_pass_fits(in, single_tile);
  std::vector<SelectPlace> places = places_of(in);
  for (std::size_t p = 0; p < places.size(); ++p) {  // every kernel found before anything is queued
    if (places[p].params.n == 0) continue;
    const int device = places[p].device;
    const KernelLibrary& library = *libraries[p];
    if (one_pass) {
      places[p].kernels.single = KernelHandle::linked(library.kernel("csj_select_single", device));
      // its tile staged in shared memory: 6 blocks a multiprocessor want the largest carveout
      if (item <= 8) detail::prefer_shared_memory(places[p].kernels.single, device);
    } else {
      // a select writes one class: its scatter needs no staging (select_jit.cu)
      places[p].kernels.count = KernelHandle::linked(library.kernel("csj_select_count", device));
      places[p].kernels.scatter =
          KernelHandle::linked(library.kernel(outputs == 1 ? "csj_select_keep" : "csj_select_scatter", device));
    }
  }
  const detail::SyncOnUnwind settle(group);
  if (one_pass) return select_single_pass(in, places, single_tile);
  const ClassTotals totals = count_classes(group, places, tile);
  ArrayList result;
  for (int c = 0; c < outputs; ++c) result.push_back(allocate_like(in, class_sizes(totals, c)));
  for (std::size_t p = 0; p < places.size(); ++p) {
    for (int c = 0; c < outputs; ++c) places[p].params.out[c] = reinterpret_cast<void*>(result[c]->shard_pointer(p));
  }
  scatter(places);
  return result;
}

namespace {

// The leases of a payload-moving selection: `in` (named `in_name`), which classifies, and
// `arrays`, which move.
ArrayLeases lease_payloads(const ShardedArray& in, const char* in_name, const ArrayList& arrays) {
  std::vector<ArrayLeases::Use> uses{{&in, in_name}};
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    if (!arrays[i]) throw std::invalid_argument("arrays: None");
    uses.push_back({arrays[i].get(), "arrays[" + std::to_string(i) + "]"});
  }
  return ArrayLeases(std::move(uses));
}

// `arrays`: 1 to kMaxSelectPayloads, each of `in`'s group and shard sizes, elements a
// multiple of 4 bytes.
void check_payloads(const ShardedArray& in, const char* in_name, const ArrayList& arrays) {
  if (arrays.empty() || arrays.size() > static_cast<std::size_t>(k::kMaxSelectPayloads)) {
    throw std::invalid_argument("arrays: expected 1 to " + std::to_string(k::kMaxSelectPayloads) + " arrays, got " +
                                std::to_string(arrays.size()));
  }
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const std::string what = "arrays[" + std::to_string(i) + "]";
    if (arrays[i]->group() != in.group()) throw std::invalid_argument(what + ": belongs to another PlaceGroup");
    if (arrays[i]->shard_sizes() != in.shard_sizes()) {
      throw std::invalid_argument(what + ": shard sizes differ from the " + in_name + "'");
    }
    if (arrays[i]->itemsize() % 4 != 0) throw std::invalid_argument(what + ": elements are not a multiple of 4 bytes");
  }
}

// Both halves of a payload-moving selection whose places have their kernels: the counts,
// then class 0's elements of every array moved to new arrays.
ArrayList compact_payloads(const PlaceGroup& group, std::vector<SelectPlace>& places, const ArrayList& arrays) {
  for (SelectPlace& place : places) {
    place.params.payloads = static_cast<int>(arrays.size());
  }
  for (std::size_t p = 0; p < places.size(); ++p) {
    for (std::size_t i = 0; i < arrays.size(); ++i) {
      places[p].params.payload_in[i] = reinterpret_cast<const void*>(arrays[i]->shard_pointer(p));
      places[p].params.payload_size[i] = static_cast<int>(arrays[i]->itemsize());
    }
  }
  const ClassTotals totals =
      count_classes(group, places, static_cast<long long>(k::kSelectBlock) * k::kSelectPayloadItems);
  ArrayList result;
  for (const auto& array : arrays) result.push_back(allocate_like(*array, class_sizes(totals, 0)));
  for (std::size_t p = 0; p < places.size(); ++p) {
    for (std::size_t i = 0; i < arrays.size(); ++i) {
      places[p].params.payload_out[i] = reinterpret_cast<void*>(result[i]->shard_pointer(p));
    }
  }
  scatter(places);
  return result;
}

}  // namespace

ArrayList select_flagged(const ShardedArray& flags, const ArrayList& arrays) {
  const ArrayLeases leases = lease_payloads(flags, "flags", arrays);
  const PlaceGroup& group = *flags.group();
  if (flags.is_record() || (flags.dtype() != DType::int32 && flags.dtype() != DType::uint32 &&
                            flags.dtype() != DType::int64 && flags.dtype() != DType::uint64)) {
    throw std::invalid_argument("flags: expected an integer array (int32, uint32, int64 or uint64)");
  }
  check_payloads(flags, "flags", arrays);
  const k::SelectFlagKernels builtin = k::builtin_select_flag_kernels(static_cast<int>(flags.itemsize()));
  std::vector<SelectPlace> places = places_of(flags);
  for (SelectPlace& place : places) {
    place.kernels.count = KernelHandle::builtin(builtin.count);
    place.kernels.scatter = KernelHandle::builtin(builtin.scatter);
  }
  const detail::SyncOnUnwind settle(group);
  return compact_payloads(group, places, arrays);
}

ArrayList select_heads(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                       const ArrayList& arrays) {
  const ArrayLeases leases = lease_payloads(keys, "keys", arrays);
  const PlaceGroup& group = *keys.group();
  detail::check_libraries(libraries, group.size());
  const std::size_t key_size = keys.itemsize();
  if (keys.is_record() || (key_size != 4 && key_size != 8)) {
    throw std::invalid_argument("keys: expected numbers of 4 or 8 bytes");
  }
  check_payloads(keys, "keys", arrays);
  std::vector<SelectPlace> places = places_of(keys);
  for (std::size_t p = 0; p < places.size(); ++p) {  // every kernel found before anything is queued
    if (places[p].params.n == 0) continue;
    const int device = places[p].device;
    places[p].kernels.count = KernelHandle::linked(libraries[p]->kernel("csj_by_key_heads_count", device));
    places[p].kernels.scatter = KernelHandle::linked(libraries[p]->kernel("csj_by_key_heads_scatter", device));
  }
  // The key before each non-empty shard but the first: the last of the nearest non-empty one
  // before it, read on the shard's stream once that one's stream has written it. Its stream
  // need not wait for the read: the totals' host read (count_classes) waits for every stream
  // before this call returns.
  const detail::SyncOnUnwind settle(group);
  long long previous = -1;
  for (std::size_t p = 0; p < places.size(); ++p) {
    SelectPlace& place = places[p];
    if (place.params.n == 0) continue;
    if (previous >= 0) {
      const SelectPlace& prior = places[static_cast<std::size_t>(previous)];
      DeviceGuard guard(place.device);
      place.before = detail::StreamScratch(16, place.stream, reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)));
      detail::wait_for(place.stream, prior.stream, prior.device);
      const auto* last = static_cast<const unsigned char*>(prior.params.in) +
                         static_cast<std::size_t>(prior.params.n - 1) * key_size;
      detail::copy_between(place.before.get(), place.device, last, prior.device, key_size, place.stream,
                           "copying the key before the shard");
      place.params.before = place.before.get();
    }
    previous = static_cast<long long>(p);
  }
  return compact_payloads(group, places, arrays);
}

std::shared_ptr<ShardedArray> redistribute(const ShardedArray& in, const std::vector<std::int64_t>& sizes) {
  const ArrayLeases leases({{&in, "a"}});
  const PlaceGroup& group = *in.group();
  const std::size_t count = group.size();
  if (sizes.size() != count) {
    throw std::invalid_argument("sizes: expected one shard size per place (" + std::to_string(count) + "), got " +
                                std::to_string(sizes.size()));
  }
  std::int64_t total = 0;
  for (std::int64_t size : sizes) {
    if (size < 0) throw std::invalid_argument("sizes: shard sizes must be non-negative");
    total += size;
  }
  if (total != in.size()) {
    throw std::invalid_argument("sizes: add up to " + std::to_string(total) + ", not a's size " +
                                std::to_string(in.size()));
  }
  auto out = allocate_like(in, sizes);
  const std::size_t item = in.itemsize();
  const detail::SyncOnUnwind settle(group);
  // which output places read each source place (its stream waits for them at the end)
  std::vector<std::vector<std::size_t>> readers(count);
  for (std::size_t q = 0; q < count; ++q) {
    const std::int64_t begin = out->shard_offset(q), end = begin + out->shard_size(q);
    if (begin == end) continue;
    const int device = group.device(q);
    const auto stream = reinterpret_cast<cudaStream_t>(group.stream(q));
    DeviceGuard guard(device);
    for (std::size_t p = 0; p < count; ++p) {
      const std::int64_t source_begin = in.shard_offset(p), source_end = source_begin + in.shard_size(p);
      const std::int64_t from = std::max(begin, source_begin), to = std::min(end, source_end);
      if (from >= to) continue;
      if (p != q) {
        detail::wait_for(stream, reinterpret_cast<cudaStream_t>(group.stream(p)), group.device(p));
        readers[p].push_back(q);
      }
      const auto* src = reinterpret_cast<const unsigned char*>(in.shard_pointer(p)) + (from - source_begin) * item;
      auto* dst = reinterpret_cast<unsigned char*>(out->shard_pointer(q)) + (from - begin) * item;
      detail::copy_keys(dst, device, src, group.device(p), static_cast<std::size_t>(to - from) * item, stream);
    }
  }
  for (std::size_t p = 0; p < count; ++p) {
    if (readers[p].empty()) continue;
    DeviceGuard guard(group.device(p));
    for (std::size_t q : readers[p]) {
      detail::wait_for(reinterpret_cast<cudaStream_t>(group.stream(p)), reinterpret_cast<cudaStream_t>(group.stream(q)),
                       group.device(q));
    }
  }
  return out;
}

}  // namespace csj
