// Segmented reduce across places. Each place folds the segment pieces its shard holds, one
// block (or, for short pieces, one warp) per piece, with the reduce's in-kernel combine and
// association (csj_segmented_reduce, reduce.cuh): the segments that begin in its shard
// (init first) and, before them, the tail of a segment that began on an earlier shard (its
// "head" piece, no init). The pieces go to their places in the result (evenly split over
// the group) with peer copies; a segment spanning shards is then finished on its result
// place by csj_fold over its pieces in place order, so the answer is deterministic.
#include "csj/segmented.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <stdexcept>
#include <utility>

#include "../kernels/params.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"

namespace csj {
namespace {

using detail::check;
using detail::KernelHandle;
namespace k = kernels;

cudaStream_t stream_of(const PlaceGroup& group, std::size_t place) {
  return reinterpret_cast<cudaStream_t>(group.stream(place));
}

cudaMemPool_t pool_of(const PlaceGroup& group, std::size_t place) {
  return reinterpret_cast<cudaMemPool_t>(group.memory_pool(place));
}

// What one place folds: pieces [first, last) of the global segments (first = the segment
// it continues when `head`), written to `pieces` in that order.
struct PlaceWork {
  std::size_t place = 0;
  long long first = 0;
  long long last = 0;
  bool head = false;
  detail::StreamScratch memory;  // the pieces, then the offsets the kernel reads
  unsigned char* pieces = nullptr;
};

void check_arguments(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                     const std::int64_t* offsets, std::size_t num_offsets, const ShardedArray& out,
                     int acc_size, const std::string& init) {
  const PlaceGroup& group = *in.group();
  detail::check_libraries(libraries, group.size());
  if (acc_size != 4 && acc_size != 8 && acc_size != 12 && acc_size != 16 && acc_size != 24 && acc_size != 32) {
    throw std::invalid_argument("acc_size: expected 4, 8, 12, 16, 24 or 32, got " + std::to_string(acc_size));
  }
  if (init.size() != static_cast<std::size_t>(acc_size)) {
    throw std::invalid_argument("init: expected " + std::to_string(acc_size) + " bytes");
  }
  if (num_offsets < 1 || (num_offsets > 1 && !offsets)) {
    throw std::invalid_argument("offsets: expected S + 1 positions, at least one");
  }
  // non-decreasing positions lie in [0, len(a)] when both ends do
  for (std::size_t s = 1; s < num_offsets; ++s) {
    if (offsets[s] < offsets[s - 1]) {
      throw std::invalid_argument("offsets: positions must be non-decreasing; offsets[" + std::to_string(s) +
                                  "] is " + std::to_string(offsets[s]));
    }
  }
  if (offsets[0] < 0 || offsets[num_offsets - 1] > in.size()) {
    throw std::invalid_argument("offsets: positions must lie in [0, len(a)]");
  }
  if (out.group() != in.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  if (out.size() != static_cast<std::int64_t>(num_offsets - 1)) {
    throw std::invalid_argument("out: expected one element per segment");
  }
  if (static_cast<int>(out.itemsize()) != acc_size) {
    throw std::invalid_argument("out: element size differs from the accumulator's");
  }
}

// Average piece length below which a warp, not a block, folds each piece: under half a
// block tile (8 warps x 32 lanes x 64 bytes) most of a block's warps would sit idle; from
// there on (4096 float32 a segment: one block tile) a block streams it with 16-byte loads.
bool per_warp(long long elements, long long pieces, std::size_t itemsize) {
  const long long lane_items = k::reduce_lane_items(itemsize <= 8 ? static_cast<int>(itemsize) : 4);
  return elements < pieces * k::kReduceWarps * 32 * lane_items / 2;
}

// `place`'s stream waits for the work queued so far on every other place's.
void wait_for_others(const PlaceGroup& group, std::size_t place) {
  for (std::size_t other = 0; other < group.size(); ++other) {
    if (other != place) detail::wait_for(stream_of(group, place), stream_of(group, other), group.device(other));
  }
}

// The result place holding segment `s`, and its index there.
std::pair<std::size_t, long long> result_slot(const ShardedArray& out, long long s) {
  const std::vector<std::int64_t>& offsets = out.shard_offsets();
  std::size_t place =
      static_cast<std::size_t>(std::upper_bound(offsets.begin(), offsets.end(), s) - offsets.begin()) - 1;
  while (out.shard_size(place) == 0) --place;  // empty shards share the next one's offset
  return {place, s - out.shard_offset(place)};
}

}  // namespace

void segmented_reduce(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                      const std::int64_t* offsets, std::size_t num_offsets, ShardedArray& out,
                      int acc_size, const std::string& init) {
  check_arguments(libraries, in, offsets, num_offsets, out, acc_size, init);
  const ArrayLeases leases({{&in, "a"}, {&out, "out"}});
  const PlaceGroup& group = *in.group();
  const long long segments = static_cast<long long>(num_offsets) - 1;
  if (segments == 0) return;
  const std::int64_t* begins = offsets;  // offsets[0, S): where each segment begins
  const std::size_t acc = static_cast<std::size_t>(acc_size);

  // Which pieces each non-empty shard holds (the last one also takes the empty segments
  // at len(a), which begin in no shard).
  std::vector<PlaceWork> work;
  std::size_t last_place = group.size();
  for (std::size_t place = 0; place < in.num_shards(); ++place) {
    if (in.shard_size(place) > 0) last_place = place;
  }
  for (std::size_t place = 0; place < in.num_shards(); ++place) {
    const long long lo = in.shard_offset(place);
    const long long hi = lo + in.shard_size(place);
    if (hi == lo) continue;
    PlaceWork item;
    item.place = place;
    const long long starts = std::lower_bound(begins, begins + segments, lo) - begins;
    item.last = place == last_place ? segments : std::lower_bound(begins, begins + segments, hi) - begins;
    item.head = starts > 0 && offsets[starts] > lo;
    item.first = starts - (item.head ? 1 : 0);
    if (item.last > item.first) work.push_back(std::move(item));
  }

  std::vector<detail::StreamScratch> staging;  // pieces copied for places without peer access
  const detail::SyncOnUnwind settle(group);    // declared after the scratch: queued work drains first
  if (work.empty()) {  // len(a) == 0: every segment is empty
    std::string values;
    for (long long s = 0; s < segments; ++s) values += init;
    for (std::size_t place = 0; place < out.num_shards(); ++place) {
      if (out.shard_size(place) == 0) continue;
      detail::DeviceGuard guard(group.device(place));
      check(cudaMemcpyAsync(reinterpret_cast<void*>(out.shard_pointer(place)),
                            values.data() + out.shard_offset(place) * acc, out.shard_size(place) * acc,
                            cudaMemcpyHostToDevice, stream_of(group, place)),
            "cudaMemcpyAsync (init)");
    }
  }

  for (PlaceWork& item : work) {
    const std::size_t place = item.place;
    const int device = group.device(place);
    const cudaStream_t stream = stream_of(group, place);
    detail::DeviceGuard guard(device);
    // This place writes into other places' result shards (the kernel, or the copies below),
    // which were allocated in their own streams' order: it waits for those streams first.
    wait_for_others(group, place);
    const long long count = item.last - item.first;
    if (count > INT_MAX) throw std::invalid_argument("offsets: more than 2^31 - 1 segments in one shard");
    const std::size_t piece_bytes = (static_cast<std::size_t>(count) * acc + 15) / 16 * 16;
    const std::size_t offset_bytes = static_cast<std::size_t>(count + 1) * sizeof(long long);
    // Pieces that all land in one result shard on this device are written there by the
    // kernel (a shard without a head piece: one place, or aligned segments); the others
    // wait in scratch for their peer copies.
    const auto [first_target, first_index] = result_slot(out, item.first);
    const bool direct = !item.head && group.device(first_target) == device &&
                        first_index + count <= out.shard_size(first_target);
    item.memory = detail::StreamScratch((direct ? 0 : piece_bytes) + offset_bytes, stream, pool_of(group, place));
    item.pieces = direct ? reinterpret_cast<unsigned char*>(out.shard_pointer(first_target)) + first_index * acc
                         : item.memory.bytes();
    long long* local_offsets =
        reinterpret_cast<long long*>(item.memory.bytes() + (direct ? 0 : piece_bytes));
    // The kernel reads positions as indices (against index_base): an array whose indices
    // start past 0 (a rank's part of a multi-process array) has its positions shifted.
    std::vector<std::int64_t> shifted;
    const std::int64_t* positions = offsets + item.first;
    if (in.index_origin() != 0) {
      shifted.assign(positions, positions + count + 1);
      for (std::int64_t& position : shifted) position += in.index_origin();
      positions = shifted.data();
    }
    check(cudaMemcpyAsync(local_offsets, positions, offset_bytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (offsets)");

    k::SegmentedParams params{};
    params.in = reinterpret_cast<const void*>(in.shard_pointer(place));
    params.n = in.shard_size(place);
    params.index_base = in.index_base(place);
    params.offsets = local_offsets;
    params.count = count;
    params.pieces = item.pieces;
    params.per_warp = per_warp(params.n, count, in.itemsize()) ? 1 : 0;
    params.head = item.head ? 1 : 0;
    std::memcpy(params.init, init.data(), acc);
    if (in.is_record()) {  // records are reached from the shard's global base (reduce_jit.cu)
      const std::uintptr_t base = in.global_base(place);
      std::memcpy(params.map_value, &base, sizeof(base));
    }
    const unsigned grid = params.per_warp ? static_cast<unsigned>((count + k::kReduceWarps - 1) / k::kReduceWarps)
                                          : static_cast<unsigned>(count);
    const KernelHandle kernel = KernelHandle::linked(libraries[place]->kernel("csj_segmented_reduce", device));
    detail::launch(kernel, grid, k::kReduceBlock, stream, params, "launching segmented_reduce");

    // The segments that begin here go to their result places (a spanning one is finished
    // there by the fold below, after this copy).
    long long s = direct ? item.last : item.first + (item.head ? 1 : 0);
    while (s < item.last) {
      const auto [target, index] = result_slot(out, s);
      const long long run = std::min<long long>(item.last - s, out.shard_size(target) - index);
      check(cudaMemcpyPeerAsync(reinterpret_cast<unsigned char*>(out.shard_pointer(target)) + index * acc,
                                group.device(target), item.pieces + (s - item.first) * acc, device,
                                static_cast<std::size_t>(run) * acc, stream),
            "cudaMemcpyPeerAsync (segment results)");
      s += run;
    }
  }

  // Segments spanning shards: their pieces in place order (the first, with init, where the
  // segment begins; then each later shard's head piece).
  std::map<long long, std::vector<std::pair<const PlaceWork*, long long>>> spanning;
  for (const PlaceWork& item : work) {
    if (item.head) spanning[item.first].push_back({&item, 0});
  }
  for (auto& [s, tails] : spanning) {
    for (const PlaceWork& item : work) {
      if (!(item.head && item.first == s) && item.first <= s && s < item.last) {
        tails.insert(tails.begin(), {&item, s - item.first});
        break;
      }
    }
  }
  for (const auto& [s, pieces] : spanning) {
    const auto [target, index] = result_slot(out, s);
    const int device = group.device(target);
    const cudaStream_t stream = stream_of(group, target);
    detail::DeviceGuard guard(device);
    if (pieces.size() > static_cast<std::size_t>(k::kMaxFoldValues)) {
      throw std::invalid_argument("a: a segment spans more than " + std::to_string(k::kMaxFoldValues) + " shards");
    }
    k::FoldParams fold{};
    staging.emplace_back(pieces.size() * acc, stream, pool_of(group, target));
    for (std::size_t j = 0; j < pieces.size(); ++j) {
      const PlaceWork& item = *pieces[j].first;
      const int source = group.device(item.place);
      detail::wait_for(stream, stream_of(group, item.place), source);
      const unsigned char* piece = item.pieces + pieces[j].second * acc;
      if (group.can_access_peer(device, source)) {
        fold.sources[j] = piece;
      } else {
        unsigned char* copy = staging.back().bytes() + j * acc;
        check(cudaMemcpyPeerAsync(copy, device, piece, source, acc, stream), "cudaMemcpyPeerAsync (piece)");
        fold.sources[j] = copy;
      }
    }
    fold.prefixes = nullptr;
    fold.total = reinterpret_cast<unsigned char*>(out.shard_pointer(target)) + index * acc;
    fold.count = static_cast<int>(pieces.size());
    fold.has_init = 0;
    const KernelHandle kernel = KernelHandle::linked(libraries[target]->kernel("csj_fold", device));
    detail::launch(kernel, 1, 32, stream, fold, "launching fold (segments spanning shards)");
  }

  // No host wait: every place's stream waits for every other's, so a result copied into a
  // place's shard is there before that place's next work, and a place's pieces, which the
  // folds read, are freed (on its stream) only after them.
  if (group.size() < 2) return;
  for (std::size_t waiter = 0; waiter < group.size(); ++waiter) {
    detail::DeviceGuard guard(group.device(waiter));
    wait_for_others(group, waiter);
  }
}

}  // namespace csj
