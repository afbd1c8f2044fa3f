// Segmented reduce across places, from positions on the host or on the device.
//
// Host positions (numpy; checked by check_segment_offsets first): each place folds the
// segment pieces its shard holds, one block (or, for short pieces, one warp) per piece, with
// the reduce's in-kernel combine and association (csj_segmented_reduce, reduce.cuh): the
// segments that begin in its shard (init first) and, before them, the tail of a segment that
// began on an earlier shard (its "head" piece, no init). Its slice of the positions reaches
// the device from pinned staging (PositionsStaging). The pieces go to their places in the
// result (evenly split over the group) with peer copies; a segment spanning shards is then
// finished on its result place by csj_fold over its pieces in place order, so the answer is
// deterministic.
//
// Device positions (an int64 ShardedArray): nothing about the positions is known on the
// host, so no place can be told which segments it holds. The first blocks of one place's
// fold check them (the folds clamp positions to the shard), and the call waits for the check's
// verdict at its end, so bad positions raise before a result is handed back. On one
// place the kernel reads them where they are, a block (or warp) a segment, and writes the
// result. On several, each place gets a copy of every position and folds every segment's
// piece of its shard (the blocks of segments that miss it leave at once) into S slots of its
// own, bare; then each result place folds, for its slots, init and the pieces of the places
// whose shard meets the segment, in place order (csj_segmented_fold): the host route's
// association (the same bits whenever both routes pick the same block or warp shape).
#include "csj/segmented.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <utility>

#include "../kernels/builtin_kernels.hpp"
#include "../kernels/params.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"
#include "sort_common.hpp"  // SpareList

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

// The checks both routes share (the positions' own come before: check_segment_offsets on
// the host, the check kernel on the device).
void check_common(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in, long long segments,
                  const ShardedArray& out, int acc_size, const std::string& init) {
  const PlaceGroup& group = *in.group();
  detail::check_libraries(libraries, group.size());
  if (acc_size != 4 && acc_size != 8 && acc_size != 12 && acc_size != 16 && acc_size != 24 && acc_size != 32) {
    throw std::invalid_argument("acc_size: expected 4, 8, 12, 16, 24 or 32, got " + std::to_string(acc_size));
  }
  if (init.size() != static_cast<std::size_t>(acc_size)) {
    throw std::invalid_argument("init: expected " + std::to_string(acc_size) + " bytes");
  }
  if (out.group() != in.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  if (out.size() != segments) throw std::invalid_argument("out: expected one element per segment");
  if (static_cast<int>(out.itemsize()) != acc_size) {
    throw std::invalid_argument("out: element size differs from the accumulator's");
  }
}

std::string position_at(std::size_t k) { return "offsets[" + std::to_string(k) + "]"; }

[[noreturn]] void throw_falling(std::size_t at, std::int64_t value, std::int64_t before) {
  throw std::invalid_argument("offsets: positions must be non-decreasing; " + position_at(at) + " = " +
                              std::to_string(value) + " comes after " + position_at(at - 1) + " = " +
                              std::to_string(before));
}

[[noreturn]] void throw_outside(std::size_t at, std::int64_t value, std::int64_t size) {
  throw std::invalid_argument("offsets: positions must lie in [0, len(a)] = [0, " + std::to_string(size) + "]; " +
                              position_at(at) + " is " + std::to_string(value));
}

// Average piece length below which a warp, not a block, folds each piece: two block tiles
// (8 warps x 32 lanes x 64 bytes each; 8192 float32). On an H200, 2^28 float32 (2026-12-02): a
// warp a piece took 274-284 us for pieces of 2^10 to 2^14 elements, a block 1385-1659 us at
// 2^10-2^11 and 365 at 2^12 (one tile: latency-bound), the same as a warp's at 2^13-2^14 and
// ahead from 2^16 on (275 against 293 us; 1024 pieces of 2^18: 273 against 356).
bool per_warp(long long elements, long long pieces, std::size_t itemsize) {
  const long long lane_items = k::reduce_lane_items(itemsize <= 8 ? static_cast<int>(itemsize) : 4);
  return elements < pieces * k::kReduceWarps * 32 * lane_items * 2;
}

// Blocks for `pieces` pieces, a block (or, per warp, a warp) each.
unsigned grid_for(long long pieces, bool warp) {
  const long long blocks = warp ? (pieces + k::kReduceWarps - 1) / k::kReduceWarps : pieces;
  if (blocks > INT_MAX) throw std::invalid_argument("offsets: more than 2^31 - 1 segments in one shard");
  return static_cast<unsigned>(blocks);
}

// Pinned host memory that one place's host positions reach its device from (and the device
// route's check stores its verdicts into): an asynchronous copy, where pageable memory costs
// the driver a staged copy the host waits for. Buffers are reused across calls through a
// SpareList; each carries an event recorded after the work that uses it and is handed out
// again only once that event has completed, so a call never overwrites positions that an
// earlier call's copy has still to read (the host may run many calls ahead of the device:
// past kMaxBuffers buffers made, a call waits for a busy one rather than pinning more). A
// buffer its user saw the last of (`idle()`: every verdict arrived) goes back needing no
// event. A buffer whose context a device reset destroyed is dropped, never reused (the
// SpareList asks each spare's context, one cuCtxGetId); a live one of the device serves the
// call, whose group works in the device's primary context, without asking which context is
// current (no cudaFree(nullptr) per call).
class PositionsStaging {
 public:
  // A buffer of at least `bytes` for the current device.
  explicit PositionsStaging(std::size_t bytes) {
    check(cudaGetDevice(&device_), "cudaGetDevice");
    const int device = device_;
    const auto fits = [&](const Spare& s) { return s.device == device && s.capacity >= bytes; };
    if (auto spare = Spares::take(
            [&](const Spare& s) { return fits(s) && (s.idle || cudaEventQuery(s.done) == cudaSuccess); })) {
      spare_ = *spare;
      spare_.idle = false;
      return;
    }
    if (made().load() >= kMaxBuffers) {
      if (auto spare = Spares::take(fits)) {
        spare_ = *spare;
        spare_.idle = false;
        const cudaError_t waited = cudaEventSynchronize(spare_.done);
        if (waited != cudaSuccess) {
          Spares::give(spare_);
          check(waited, "cudaEventSynchronize (offsets)");
        }
        return;
      }
    }
    ++made();
    spare_.device = device;
    spare_.context = detail::ContextStamp::current();
    check(cudaEventCreateWithFlags(&spare_.done, cudaEventDisableTiming), "cudaEventCreateWithFlags (offsets)");
    const cudaError_t allocated = cudaMallocHost(reinterpret_cast<void**>(&spare_.data), bytes);
    if (allocated != cudaSuccess) {
      cudaEventDestroy(spare_.done);
      check(allocated, "cudaMallocHost (offsets)");
    }
    spare_.capacity = bytes;
    // the address kernels store verdicts through, asked for once per buffer (not per call)
    const cudaError_t mapped = cudaHostGetDevicePointer(&spare_.mapped, spare_.data, 0);
    if (mapped != cudaSuccess) {
      cudaFreeHost(spare_.data);
      cudaEventDestroy(spare_.done);
      check(mapped, "cudaHostGetDevicePointer (verdict)");
    }
  }
  ~PositionsStaging() { Spares::give(spare_); }
  PositionsStaging(const PositionsStaging&) = delete;
  PositionsStaging& operator=(const PositionsStaging&) = delete;

  std::int64_t* data() const { return reinterpret_cast<std::int64_t*>(spare_.data); }
  volatile unsigned long long* data_words() const {
    return reinterpret_cast<volatile unsigned long long*>(spare_.data);
  }

  // The buffer as the current device addresses it (pinned memory is mapped under unified
  // addressing), for kernels that store into it (the device route's check verdicts).
  void* mapped() const { return spare_.mapped; }
  // What `stream` holds now may write the buffer: it stays busy until that is done.
  void written_by(cudaStream_t stream) { mark_busy(stream); }
  // Nothing queued will touch the buffer again (its user saw every write it waited for):
  // it goes back free, its event not asked.
  void idle() { spare_.idle = true; }

  // Queues the copy of the first `bytes` to `target` (the current device's memory) on
  // `stream`; the buffer stays busy until it is done.
  void copy_to(void* target, std::size_t bytes, cudaStream_t stream) {
    check(cudaMemcpyAsync(target, spare_.data, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (offsets)");
    mark_busy(stream);
  }

 private:
  // The buffer is busy until what `stream` holds now is done.
  void mark_busy(cudaStream_t stream) {
    const cudaError_t recorded = cudaEventRecord(spare_.done, stream);
    if (recorded != cudaSuccess) {  // no event to guard the copy: it must be over before the buffer goes back
      cudaStreamSynchronize(stream);
      check(recorded, "cudaEventRecord (offsets)");
    }
  }

  struct Spare {
    unsigned char* data = nullptr;
    void* mapped = nullptr;  // data as the device addresses it
    std::size_t capacity = 0;
    int device = -1;
    cudaEvent_t done = nullptr;
    bool idle = false;  // free whatever `done` says
    detail::ContextStamp context;
  };
  using Spares = detail::SpareList<Spare>;
  static constexpr int kMaxBuffers = 16;
  static std::atomic<int>& made() {
    static std::atomic<int> count{0};
    return count;
  }
  Spare spare_;
  int device_ = -1;
};

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

// Every result slot set to init (an empty array: every segment is empty).
void fill_with_init(const PlaceGroup& group, const ShardedArray& out, const std::string& init) {
  const std::size_t acc = init.size();
  std::string values;
  values.reserve(static_cast<std::size_t>(out.size()) * acc);
  for (long long s = 0; s < out.size(); ++s) values += init;
  for (std::size_t place = 0; place < out.num_shards(); ++place) {
    if (out.shard_size(place) == 0) continue;
    detail::DeviceGuard guard(group.device(place));
    check(cudaMemcpyAsync(reinterpret_cast<void*>(out.shard_pointer(place)),
                          values.data() + out.shard_offset(place) * acc, out.shard_size(place) * acc,
                          cudaMemcpyHostToDevice, stream_of(group, place)),
          "cudaMemcpyAsync (init)");
  }
}

// The device route's check of the S + 1 positions at `positions` (memory of `place`'s
// device): the first blocks of that place's fold (SegmentedParams::verdicts) or, where no
// fold runs, a kernel of its own check them in parts, each part's verdict stored into pinned
// host memory. Nothing is queued ahead of the folds (they clamp every position to the shard,
// so bad positions give wrong sums, never a read outside `a`), and `settle()`, the route's one
// host wait, polls the parts' words once everything is queued: it returns as soon as the
// checking blocks are done, with the folds still running, and bad positions raise before the
// call hands back a result. (A check kernel, its memset and its verdict's copy queued ahead of
// the folds cost their launches on the device; waiting for the verdict before queuing the
// folds left the device idle for the host's wake-up: 362 against 275 us for 2^16 segments
// on an H200.)
class DevicePositionsCheck {
 public:
  static constexpr unsigned kMaxParts = 64;  // 2^16 + 1 positions: 1025 a part, 4-5 loads a thread

  DevicePositionsCheck(const PlaceGroup& group, std::size_t place, const long long* positions, long long count,
                       long long size)
      : positions_(positions), count_(count), size_(size), device_(group.device(place)) {
    detail::DeviceGuard guard(device_);
    verdict_.emplace(kMaxParts * sizeof(unsigned long long));
    words_ = static_cast<unsigned long long*>(verdict_->mapped());
  }

  // Hands the check to the fold about to be launched on `place` with `grid` blocks.
  void into(k::SegmentedParams& params, unsigned grid) {
    params.verdicts = words_;
    params.size = size_;
    params.check_parts = static_cast<int>(arm(grid));
  }
  // After the launch that checks, on `stream`.
  void launched(cudaStream_t stream) {
    stream_ = stream;
    launched_ = true;
  }
  // Settled, the words went back idle; otherwise (a throw on the way, a check that gave no
  // verdict) they stay busy until what the checking stream holds now is done.
  ~DevicePositionsCheck() {
    if (!verdict_ || !launched_ || settled_) return;
    try {
      detail::DeviceGuard guard(device_);
      verdict_->written_by(stream_);
    } catch (...) {  // written_by waited for the stream where it could not record
    }
  }
  DevicePositionsCheck(const DevicePositionsCheck&) = delete;
  DevicePositionsCheck& operator=(const DevicePositionsCheck&) = delete;

  // Where no fold runs on `place`: the check's own kernel.
  void run_alone(cudaStream_t stream) {
    detail::DeviceGuard guard(device_);
    const long long wanted = (count_ + k::kPositionsCheckBlock - 1) / k::kPositionsCheckBlock;
    k::PositionsCheckParams params{};
    params.offsets = positions_;
    params.count = count_;
    params.size = size_;
    params.verdicts = words_;
    const unsigned grid = arm(static_cast<unsigned>(std::min<long long>(wanted, kMaxParts)));
    detail::launch(detail::KernelHandle::builtin(k::builtin_positions_check_kernel()), grid, k::kPositionsCheckBlock,
                   stream, params, "launching the offsets check");
    launched(stream);
  }

  // Waits for every part's verdict; bad positions raise ValueError naming the first one.
  // Every part stores its word once: with all of them seen, nothing queued writes the words
  // again, and they go back idle.
  void settle() {
    detail::DeviceGuard guard(device_);
    const volatile unsigned long long* words = verdict_->data_words();
    unsigned long long code = k::kPositionsGood;
    const auto all_stored = [&] {
      code = k::kPositionsGood;
      for (unsigned part = 0; part < parts_; ++part) {
        const unsigned long long word = words[part];
        if (word == k::kPositionsPending) return false;
        code = std::min(code, word);
      }
      return true;
    };
    // A launch that never ran leaves its words pending, and its stream finishes without them.
    if (!detail::spin_until_stored(all_stored, stream_, "segmented_reduce (the offsets check)")) {
      throw std::runtime_error("segmented_reduce: the offsets check left no verdict");
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    settled_ = true;
    verdict_->idle();
    if (code == k::kPositionsGood) return;
    // Bad positions (an error path, so plain synchronous reads of the ones the message quotes).
    const auto read = [&](long long k) {
      long long value = 0;
      check(cudaMemcpy(&value, positions_ + k, sizeof(value), cudaMemcpyDeviceToHost), "cudaMemcpy (offsets check)");
      return static_cast<std::int64_t>(value);
    };
    const auto at = static_cast<long long>(code);
    if (at < count_) throw_falling(static_cast<std::size_t>(at), read(at), read(at - 1));
    const long long end = at == count_ ? 0 : count_ - 1;
    throw_outside(static_cast<std::size_t>(end), read(end), size_);
  }

 private:
  // Parts for a launch of `grid` blocks, their words set pending (the buffer is idle: no
  // launch has it yet).
  unsigned arm(unsigned grid) {
    parts_ = std::max(1u, std::min(grid, kMaxParts));
    volatile unsigned long long* words = verdict_->data_words();
    for (unsigned part = 0; part < parts_; ++part) words[part] = k::kPositionsPending;
    std::atomic_thread_fence(std::memory_order_release);
    return parts_;
  }

  const long long* positions_;
  long long count_;
  long long size_;
  int device_;
  unsigned parts_ = 0;
  std::optional<PositionsStaging> verdict_;  // pinned, reused across calls
  unsigned long long* words_ = nullptr;      // verdict_ as the device addresses it
  cudaStream_t stream_ = nullptr;            // the checking launch's
  bool launched_ = false;                    // the checking launch is queued
  bool settled_ = false;                     // every verdict seen
};

}  // namespace

void check_segment_offsets(const std::int64_t* offsets, std::size_t count, std::int64_t size) {
  if (count < 1 || !offsets) throw std::invalid_argument("offsets: expected S + 1 positions (at least one), got none");
  // Blocks of a branch-free pass (which the compiler vectorises); the first block with a fall
  // is searched again for where it is.
  constexpr std::size_t kBlock = 4096;
  for (std::size_t begin = 1; begin < count; begin += kBlock) {
    const std::size_t end = std::min(count, begin + kBlock);
    bool falls = false;
    for (std::size_t s = begin; s < end; ++s) falls |= offsets[s] < offsets[s - 1];
    if (!falls) continue;
    for (std::size_t s = begin; s < end; ++s) {
      if (offsets[s] < offsets[s - 1]) throw_falling(s, offsets[s], offsets[s - 1]);
    }
  }
  // non-decreasing positions lie in [0, len(a)] when both ends do
  if (offsets[0] < 0) throw_outside(0, offsets[0], size);
  if (offsets[count - 1] > size) throw_outside(count - 1, offsets[count - 1], size);
}

void segmented_reduce(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                      const std::int64_t* offsets, std::size_t num_offsets, ShardedArray& out,
                      int acc_size, const std::string& init) {
  if (num_offsets < 1 || !offsets) {
    throw std::invalid_argument("offsets: expected S + 1 positions, at least one");
  }
  // The positions were checked by the caller (check_segment_offsets): this is the O(1) part
  // of that check, which keeps every search below inside the array whatever it was given.
  if (offsets[0] < 0 || offsets[num_offsets - 1] > in.size() || offsets[num_offsets - 1] < offsets[0]) {
    throw std::invalid_argument("offsets: positions must lie in [0, len(a)]");
  }
  check_common(libraries, in, static_cast<long long>(num_offsets) - 1, out, acc_size, init);
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
  if (work.empty()) fill_with_init(group, out, init);  // len(a) == 0: every segment is empty

  for (PlaceWork& item : work) {
    const std::size_t place = item.place;
    const int device = group.device(place);
    const cudaStream_t stream = stream_of(group, place);
    detail::DeviceGuard guard(device);
    // This place writes into other places' result shards (the kernel, or the copies below),
    // which were allocated in their own streams' order: it waits for those streams first.
    wait_for_others(group, place);
    const long long count = item.last - item.first;
    const bool warp = per_warp(in.shard_size(place), count, in.itemsize());
    const unsigned grid = grid_for(count, warp);
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
    // start past 0 (a rank's part of a multi-process array) has its positions shifted on
    // their way into the staging buffer.
    PositionsStaging staged(offset_bytes);
    const std::int64_t* positions = offsets + item.first;
    if (in.index_origin() != 0) {
      for (long long j = 0; j <= count; ++j) staged.data()[j] = positions[j] + in.index_origin();
    } else {
      std::memcpy(staged.data(), positions, offset_bytes);
    }
    staged.copy_to(local_offsets, offset_bytes, stream);

    k::SegmentedParams params{};
    params.in = reinterpret_cast<const void*>(in.shard_pointer(place));
    params.n = in.shard_size(place);
    params.index_base = in.index_base(place);
    params.offsets = local_offsets;
    params.count = count;
    params.pieces = item.pieces;
    params.per_warp = warp ? 1 : 0;
    params.head = item.head ? 1 : 0;
    std::memcpy(params.init, init.data(), acc);
    if (in.is_record()) {  // records are reached from the shard's global base (reduce_jit.cu)
      const std::uintptr_t base = in.global_base(place);
      std::memcpy(params.map_value, &base, sizeof(base));
    }
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


void segmented_reduce(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                      const ShardedArray& offsets, ShardedArray& out, int acc_size, const std::string& init) {
  if (offsets.group() != in.group()) throw std::invalid_argument("offsets: belongs to another PlaceGroup than a");
  if (offsets.dtype() != DType::int64) throw std::invalid_argument("offsets: expected an int64 ShardedArray");
  if (offsets.size() < 1) throw std::invalid_argument("offsets: expected S + 1 positions (at least one), got none");
  // A rank's part of a multi-process array (index_origin > 0) takes the host route: its
  // pieces are cut and carried between ranks from host positions.
  if (in.index_origin() != 0 || offsets.index_origin() != 0) {
    throw std::invalid_argument("offsets: positions on the device need a single-process group");
  }
  const long long segments = offsets.size() - 1;
  check_common(libraries, in, segments, out, acc_size, init);
  const PlaceGroup& group = *in.group();
  const std::size_t places = group.size();
  if (places > static_cast<std::size_t>(k::kMaxFoldValues)) {
    throw std::invalid_argument("a: positions on the device take at most " + std::to_string(k::kMaxFoldValues) +
                                " places");
  }
  const ArrayLeases leases({{&in, "a"}, {&offsets, "offsets"}, {&out, "out"}});
  const std::size_t acc = static_cast<std::size_t>(acc_size);

  std::vector<detail::StreamScratch> gathered(places);  // each place's copy of the positions
  std::vector<detail::StreamScratch> pieces(places);    // several places: each one's S slots
  std::vector<detail::StreamScratch> staging;           // pieces copied for places without peer access
  const detail::SyncOnUnwind settle(group);             // declared after the scratch: queued work drains first

  // Every place reads what other places' streams wrote or allocated (the positions, the
  // result shards): it waits for those streams first.
  if (places > 1) {
    for (std::size_t place = 0; place < places; ++place) {
      detail::DeviceGuard guard(group.device(place));
      wait_for_others(group, place);
    }
  }
  // The positions where `place` reads them: in place when one shard on its device holds them
  // all (always so on one place), else a copy of every shard in its own memory.
  std::size_t holder = places;
  for (std::size_t place = 0; place < offsets.num_shards(); ++place) {
    if (offsets.shard_size(place) == offsets.size()) holder = place;
  }
  std::vector<const long long*> positions(places, nullptr);
  const auto positions_on = [&](std::size_t place) {
    if (positions[place]) return positions[place];
    const int device = group.device(place);
    if (holder < places && group.device(holder) == device) {
      return positions[place] = reinterpret_cast<const long long*>(offsets.shard_pointer(holder));
    }
    const cudaStream_t stream = stream_of(group, place);
    detail::DeviceGuard guard(device);
    gathered[place] = detail::StreamScratch(static_cast<std::size_t>(offsets.size()) * sizeof(long long), stream,
                                            pool_of(group, place));
    for (std::size_t shard = 0; shard < offsets.num_shards(); ++shard) {
      if (offsets.shard_size(shard) == 0) continue;
      detail::copy_between(gathered[place].bytes() + offsets.shard_offset(shard) * sizeof(long long), device,
                           reinterpret_cast<const void*>(offsets.shard_pointer(shard)), group.device(shard),
                           static_cast<std::size_t>(offsets.shard_size(shard)) * sizeof(long long), stream,
                           "copying segment offsets");
    }
    return positions[place] = reinterpret_cast<const long long*>(gathered[place].bytes());
  };

  std::vector<std::size_t> holding;  // the places with elements
  for (std::size_t place = 0; place < in.num_shards(); ++place) {
    if (in.shard_size(place) > 0) holding.push_back(place);
  }
  const std::size_t checker = holding.empty() ? 0 : holding.front();
  DevicePositionsCheck verdict(group, checker, positions_on(checker), offsets.size(), in.size());
  if (segments == 0 || holding.empty()) verdict.run_alone(stream_of(group, checker));
  if (segments == 0) return verdict.settle();
  if (holding.empty()) {  // len(a) == 0: every segment is empty
    fill_with_init(group, out, init);
  }

  // The shape follows the average segment, len(a) / S: known without reading a position.
  const bool warp = per_warp(in.size(), segments, in.itemsize());
  const unsigned grid = grid_for(segments, warp);
  const bool alone = places == 1;  // the kernel writes the result itself
  for (const std::size_t place : holding) {
    const int device = group.device(place);
    const cudaStream_t stream = stream_of(group, place);
    detail::DeviceGuard guard(device);
    k::SegmentedParams params{};
    params.in = reinterpret_cast<const void*>(in.shard_pointer(place));
    params.n = in.shard_size(place);
    params.index_base = in.index_base(place);
    params.offsets = positions_on(place);
    params.count = segments;
    if (alone) {
      params.pieces = reinterpret_cast<void*>(out.shard_pointer(place));
    } else {
      pieces[place] = detail::StreamScratch(static_cast<std::size_t>(segments) * acc, stream, pool_of(group, place));
      params.pieces = pieces[place].get();
      params.bare = 1;
    }
    params.per_warp = warp ? 1 : 0;
    std::memcpy(params.init, init.data(), acc);
    if (in.is_record()) {  // records are reached from the shard's global base (reduce_jit.cu)
      const std::uintptr_t base = in.global_base(place);
      std::memcpy(params.map_value, &base, sizeof(base));
    }
    if (place == checker) verdict.into(params, grid);
    const KernelHandle kernel = KernelHandle::linked(libraries[place]->kernel("csj_segmented_reduce", device));
    detail::launch(kernel, grid, k::kReduceBlock, stream, params, "launching segmented_reduce");
    if (place == checker) verdict.launched(stream);
  }
  if (alone) return verdict.settle();

  // Each result place folds its slots from every place's pieces, in place order.
  for (std::size_t target = 0; target < places; ++target) {
    const long long count = out.shard_size(target);
    if (count == 0 || holding.empty()) continue;
    const long long first = out.shard_offset(target);
    const int device = group.device(target);
    const cudaStream_t stream = stream_of(group, target);
    detail::DeviceGuard guard(device);
    k::SegmentedFoldParams fold{};
    fold.offsets = positions_on(target);
    fold.first = first;
    fold.count = count;
    fold.out = reinterpret_cast<void*>(out.shard_pointer(target));
    fold.places = static_cast<int>(places);
    std::memcpy(fold.init, init.data(), acc);
    for (const std::size_t place : holding) {
      const int source = group.device(place);
      detail::wait_for(stream, stream_of(group, place), source);
      const unsigned char* slots = pieces[place].bytes() + static_cast<std::size_t>(first) * acc;
      if (group.can_access_peer(device, source)) {
        fold.pieces[place] = slots;
      } else {
        staging.emplace_back(static_cast<std::size_t>(count) * acc, stream, pool_of(group, target));
        detail::copy_between(staging.back().bytes(), device, slots, source, static_cast<std::size_t>(count) * acc,
                             stream, "copying segment pieces");
        fold.pieces[place] = staging.back().bytes();
      }
      fold.shard_begin[place] = in.index_base(place);
      fold.shard_end[place] = in.index_base(place) + in.shard_size(place);
    }
    const unsigned blocks = static_cast<unsigned>((count + k::kSegmentedFoldBlock - 1) / k::kSegmentedFoldBlock);
    const KernelHandle kernel = KernelHandle::linked(libraries[target]->kernel("csj_segmented_fold", device));
    detail::launch(kernel, blocks, k::kSegmentedFoldBlock, stream, fold, "launching segmented_reduce's fold");
  }

  // No host wait: as on the host route, every place's stream waits for every other's, so
  // each place's pieces (and positions), which the folds read, are freed on its stream only
  // after those folds, and the result is complete before any place's next work.
  for (std::size_t waiter = 0; waiter < places; ++waiter) {
    detail::DeviceGuard guard(group.device(waiter));
    wait_for_others(group, waiter);
  }
  verdict.settle();
}

}  // namespace csj
