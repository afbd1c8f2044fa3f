#include "csj/reduce.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include "../kernels/builtin_kernels.hpp"
#include "../kernels/params.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"
#include "slot_pool.hpp"

// A record array scans into its own layout, so its records must fit an accumulator.
static_assert(csj::kernels::kMaxAccSize >= static_cast<int>(csj::kMaxRecordSize),
              "records must fit the kernels' accumulator buffers");

namespace csj {
namespace {

using detail::check;
using detail::KernelHandle;
namespace k = kernels;

struct KernelSet {
  KernelHandle reduce, fold, scan;
  KernelHandle one_pass;  // OnePassScan: scans with inputs and accumulators of 4 or 8 bytes
};

// Each place's kernels from its library: csj_reduce and csj_fold, and with `with_scan`
// csj_scan. With `or_one_pass`, a library may hold the single pass instead (csj_scan_one_pass
// alone, which the Python package links for a scan of an array with at most one non-empty
// shard).
std::vector<KernelSet> linked_sets(const std::vector<const KernelLibrary*>& libraries,
                                   const PlaceGroup& group, bool with_scan, bool or_one_pass = false) {
  detail::check_libraries(libraries, group.size());
  std::vector<KernelSet> sets;
  for (std::size_t place = 0; place < libraries.size(); ++place) {
    const KernelLibrary* library = libraries[place];
    const int device = group.device(place);
    KernelSet set;
    if (or_one_pass && library->has("csj_scan_one_pass")) {
      set.one_pass = KernelHandle::linked(library->kernel("csj_scan_one_pass", device));
    } else {
      set.reduce = KernelHandle::linked(library->kernel("csj_reduce", device));
      set.fold = KernelHandle::linked(library->kernel("csj_fold", device));
      if (with_scan) set.scan = KernelHandle::linked(library->kernel("csj_scan", device));
    }
    sets.push_back(set);
  }
  return sets;
}

std::vector<KernelSet> builtin_sets(BuiltinReduction op, DType dtype, std::size_t places) {
  const k::BuiltinReduceKernels kernels =
      k::builtin_reduce_kernels(static_cast<k::BuiltinReduction>(op), static_cast<int>(dtype));
  KernelSet set{KernelHandle::builtin(kernels.reduce), KernelHandle::builtin(kernels.fold),
                KernelHandle::builtin(kernels.scan), KernelHandle::builtin(kernels.scan_one_pass)};
  return std::vector<KernelSet>(places, set);
}

void check_acc(int acc_size, const std::string& init) {
  // machine words, and aligned records (tuple accumulators) of up to four fields
  if (acc_size != 4 && acc_size != 8 && acc_size != 12 && acc_size != 16 && acc_size != 24 && acc_size != 32) {
    throw std::invalid_argument("acc_size: expected 4, 8, 12, 16, 24 or 32, got " + std::to_string(acc_size));
  }
  if (!init.empty() && init.size() != static_cast<std::size_t>(acc_size)) {
    throw std::invalid_argument("init: expected " + std::to_string(acc_size) + " bytes");
  }
}

cudaStream_t stream_of(const PlaceGroup& group, std::size_t place) {
  return reinterpret_cast<cudaStream_t>(group.stream(place));
}

cudaMemPool_t pool_of(const PlaceGroup& group, std::size_t place) {
  return reinterpret_cast<cudaMemPool_t>(group.memory_pool(place));
}

constexpr int kReduceBlocksPerMultiprocessor = 4;

// Reused memory of one place's part in a reduce, so that a call queues nothing but its
// kernel: per-block partials and the block counter, then the cross-place totals and their
// arrival counter (used by the slot of the group's first device), all in device memory and
// reading zero between uses (the kernels reset their counters), and a pinned,
// device-visible host word where the final result lands. Slots come in batches per device,
// are reused across calls and kept until exit; one that saw a failure is dropped rather
// than reused with a counter in an unknown state.
class ReduceSlots {
 public:
  struct Slot {
    int device = -1;
    unsigned long long context = 0;  // the id of the context its memory lives in
    void* partials = nullptr;
    unsigned int* counter = nullptr;
    unsigned blocks = 0;  // partials held: one wave of the reduce kernels on this device
    void* totals = nullptr;
    unsigned int* place_counter = nullptr;
    void* result = nullptr;
    // The words a one-place reduce's kernel hands its result over in (ReduceParams::handover;
    // word 0 shows the last ticket stored).
    volatile unsigned long long* handover = nullptr;
  };

  // A slot of the group's context on `device` (after a device reset, the old context's
  // slots are never handed out again: their memory went with it).
  static Slot acquire(const PlaceGroup& group, int device) {
    const unsigned long long context = group.context_id(device);
    return pool().acquire(device, context, [&](std::vector<Slot>& free_slots) { add_batch(device, context, free_slots); });
  }

  static void release(const Slot& slot) { pool().release(slot); }

  // Whether kernels on every one of `devices` can store to and count atomically in memory
  // of `home` (peer access with native atomics over the link, or the same device).
  static bool reachable(const PlaceGroup& group, int home, const std::vector<int>& devices) {
    for (int device : devices) {
      if (device == home) continue;
      if (!group.can_access_peer(device, home)) return false;
      std::lock_guard<std::mutex> lock(atomics_mutex());
      auto key = std::make_pair(device, home);
      auto found = atomics().find(key);
      if (found == atomics().end()) {
        int supported = 0;
        check(cudaDeviceGetP2PAttribute(&supported, cudaDevP2PAttrNativeAtomicSupported, device, home),
              "cudaDeviceGetP2PAttribute");
        found = atomics().emplace(key, supported != 0).first;
      }
      if (!found->second) return false;
    }
    return true;
  }

 private:
  static void add_batch(int device, unsigned long long context, std::vector<Slot>& free_slots) {
    constexpr std::size_t kSlots = 32;
    constexpr std::size_t kHandoverBytes = k::handover_words(k::kMaxAccSize) * 8;
    constexpr std::size_t kTotalsBytes = k::kMaxFoldValues * k::kMaxAccSize;
    const auto blocks = static_cast<unsigned>(detail::multiprocessors(device) * kReduceBlocksPerMultiprocessor);
    const std::size_t partial_bytes = (static_cast<std::size_t>(blocks) * k::kMaxAccSize + 255) / 256 * 256;
    const std::size_t slot_bytes = partial_bytes + 256 + kTotalsBytes + 256;
    const detail::SlotMemory batch = detail::allocate_slot_memory(
        device, slot_bytes * kSlots, (k::kMaxAccSize + kHandoverBytes) * kSlots, "preparing the reduce slots");
    unsigned char* memory = batch.device;
    unsigned char* host = batch.host;
    for (std::size_t i = 0; i < kSlots; ++i) {
      unsigned char* base = memory + i * slot_bytes;
      Slot slot;
      slot.device = device;
      slot.context = context;
      slot.partials = base;
      slot.counter = reinterpret_cast<unsigned int*>(base + partial_bytes);
      slot.blocks = blocks;
      slot.totals = base + partial_bytes + 256;
      slot.place_counter = reinterpret_cast<unsigned int*>(base + partial_bytes + 256 + kTotalsBytes);
      slot.result = host + i * k::kMaxAccSize;  // with unified addressing, also its device address
      slot.handover =
          reinterpret_cast<volatile unsigned long long*>(host + kSlots * k::kMaxAccSize + i * kHandoverBytes);
      for (int w = 0; w < k::handover_words(k::kMaxAccSize); ++w) slot.handover[w] = 0;
      free_slots.push_back(slot);
    }
  }

  static detail::SlotPool<Slot>& pool() {
    static detail::SlotPool<Slot> slots;
    return slots;
  }
  static std::mutex& atomics_mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<std::pair<int, int>, bool>& atomics() {
    static std::map<std::pair<int, int>, bool> known;
    return known;
  }
};

// A slot held for one call: back to the pool only after a clean run (after a failure its
// counters may never have been reset, so it is dropped).
struct LeasedSlot {
  LeasedSlot(const PlaceGroup& group, int device) : slot(ReduceSlots::acquire(group, device)) {}
  ~LeasedSlot() {
    if (clean) ReduceSlots::release(slot);
  }
  LeasedSlot(const LeasedSlot&) = delete;
  LeasedSlot& operator=(const LeasedSlot&) = delete;
  ReduceSlots::Slot slot;
  bool clean = false;
};

// How a shard is cut into one contiguous chunk per block (shared by both scan passes).
struct Chunking {
  long long chunk;
  unsigned grid;
};

// One wave of blocks (the fewer resident of the passes that share the chunks).
Chunking chunking(const KernelSet& kernels, bool with_scan, long long n, int device, int in_size,
                  int acc_size) {
  // a whole number of scan tiles, and of one 16-byte vector per lane for every warp
  const long long granule = std::max<long long>(k::scan_tile(acc_size), 8LL * 16 / in_size * 32);
  int resident = detail::blocks_per_multiprocessor(kernels.reduce, k::kReduceBlock);
  // A reduction streams fastest with few, long block streams: on an H200 four blocks of
  // 256 per multiprocessor read 2^28 float32 ~1% faster than a full-occupancy wave.
  if (!with_scan) resident = std::min(resident, kReduceBlocksPerMultiprocessor);
  if (with_scan) resident = std::min(resident, detail::blocks_per_multiprocessor(kernels.scan, k::kScanBlock));
  const long long blocks = static_cast<long long>(detail::multiprocessors(device)) * resident;
  long long chunk = (n + blocks - 1) / blocks;
  chunk = (chunk + granule - 1) / granule * granule;
  return {chunk, static_cast<unsigned>((n + chunk - 1) / chunk)};
}

// Per-place scratch of the first pass: per-block partials and prefixes, total, and the
// place's pass counter (PlaceGroup::pass_counter: the kernel's last block leaves it at zero,
// so no call clears it). Owned: freed on its place's stream when dropped.
struct PassScratch {
  detail::StreamScratch memory;
  void* partials = nullptr;
  void* prefixes = nullptr;
  unsigned int* counter = nullptr;
  void* result = nullptr;
  unsigned long long* handover = nullptr;  // ReduceParams::handover and ticket (one place, a host result)
  unsigned int ticket = 0;
};

PassScratch allocate_pass(const PlaceGroup& group, std::size_t place, unsigned grid, int acc_size,
                          bool with_prefixes) {
  const cudaStream_t stream = stream_of(group, place);
  const cudaMemPool_t pool = pool_of(group, place);
  const std::size_t block_bytes = (static_cast<std::size_t>(grid) * acc_size + 15) / 16 * 16;
  PassScratch scratch;
  scratch.memory = detail::StreamScratch(block_bytes * (with_prefixes ? 2 : 1) + 2 * k::kMaxAccSize, stream, pool);
  unsigned char* base = scratch.memory.bytes();
  scratch.partials = base;
  scratch.prefixes = with_prefixes ? base + block_bytes : nullptr;
  scratch.result = base + block_bytes * (with_prefixes ? 2 : 1);
  scratch.counter = group.pass_counter(place);
  return scratch;
}

// A reduce pass in a leased slot: nothing to allocate or clear, and the shard's result goes
// straight to the slot's host word.
PassScratch slot_pass(const ReduceSlots::Slot& slot) {
  PassScratch scratch;
  scratch.partials = slot.partials;
  scratch.counter = slot.counter;
  scratch.result = slot.result;
  return scratch;
}

// Queues the first pass over one shard: its total lands at scratch.result (and per-block
// exclusive prefixes at scratch.prefixes when allocated).
void reduce_shard(const KernelSet& kernels, const ShardedArray& in, std::size_t place,
                  const Chunking& cut, const PassScratch& scratch, const std::string& init = {},
                  const std::string& map_value = {}, const ReduceSlots::Slot* combine = nullptr,
                  int place_index = 0, int place_count = 0) {
  const PlaceGroup& group = *in.group();
  k::ReduceParams params{};
  params.in = reinterpret_cast<const void*>(in.shard_pointer(place));
  params.n = in.shard_size(place);
  params.index_base = in.index_base(place);
  params.chunk = cut.chunk;
  params.partials = scratch.partials;
  params.prefixes = scratch.prefixes;
  params.counter = scratch.counter;
  params.result = scratch.result;
  params.handover = scratch.handover;
  params.ticket = scratch.ticket;
  params.has_init = init.empty() ? 0 : 1;
  if (!init.empty()) std::memcpy(params.init, init.data(), init.size());
  std::memcpy(params.map_value, map_value.data(), std::min<std::size_t>(map_value.size(), 8));
  if (map_value.empty() && in.is_record()) {
    // Record inputs: kernels whose input words do not cover a record reach it through the
    // shard's global base (element i at base + global index * itemsize), see reduce_jit.cu.
    const std::uintptr_t base = in.global_base(place);
    std::memcpy(params.map_value, &base, sizeof(base));
  }
  if (combine) {
    params.place_totals = combine->totals;
    params.place_counter = combine->place_counter;
    params.final_result = combine->result;
    params.place_index = place_index;
    params.place_count = place_count;
  }
  detail::launch(kernels.reduce, cut.grid, k::kReduceBlock, stream_of(group, place), params,
                 "launching reduce");
}

// Runs the first pass on every listed place and folds their totals, in order, on place 0's
// stream into `staging` on place 0's device: [0, K) staged totals (places place 0's device
// cannot read), [K, 2K) exclusive prefixes, [2K] the total. Each place's scratch stays
// allocated (in `scratch`) for a second pass. For one place there is nothing to fold and
// `staging` stays empty. The caller owns every allocation, and must wait for the places on
// unwinding before dropping them (SyncOnUnwind): the fold reads other places' scratch.
void first_pass(const std::vector<KernelSet>& sets, const ShardedArray& in,
                const std::vector<std::size_t>& places, int acc_size, const std::string& init,
                bool with_prefixes, std::vector<PassScratch>& scratch, std::vector<Chunking>& cuts,
                detail::StreamScratch& staging, const std::string& map_value = {}) {
  const PlaceGroup& group = *in.group();
  const int home = group.device(0);
  const cudaStream_t home_stream = stream_of(group, 0);
  const std::size_t count = places.size();
  const int in_size = static_cast<int>(in.itemsize());
  std::optional<detail::Event> staging_ready;  // staging is allocated in home_stream's order
  if (count > 1) {
    detail::DeviceGuard guard(home);
    staging = detail::StreamScratch((2 * count + 1) * acc_size, home_stream, pool_of(group, 0));
    staging_ready.emplace(home);
    staging_ready->record(home_stream);
  }
  k::FoldParams fold{};
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t place = places[k];
    const int device = group.device(place);
    const cudaStream_t stream = stream_of(group, place);
    detail::DeviceGuard guard(device);
    cuts[k] = chunking(sets[place], with_prefixes, in.shard_size(place), device, in_size, acc_size);
    scratch[k] = allocate_pass(group, place, cuts[k].grid, acc_size, with_prefixes);
    reduce_shard(sets[place], in, place, cuts[k], scratch[k], {}, map_value);
    if (count == 1) return;
    if (group.can_access_peer(home, device)) {
      fold.sources[k] = scratch[k].result;  // read in place by the fold kernel
    } else {
      staging_ready->wait(stream);
      check(cudaMemcpyPeerAsync(staging.bytes() + k * acc_size, home, scratch[k].result, device,
                                acc_size, stream),
            "cudaMemcpyPeerAsync (shard total)");
      fold.sources[k] = staging.bytes() + k * acc_size;
    }
    detail::wait_for(home_stream, stream, device);  // the fold runs after this place's total
  }
  detail::DeviceGuard guard(home);
  fold.prefixes = staging.bytes() + count * acc_size;
  fold.total = staging.bytes() + 2 * count * acc_size;
  fold.count = static_cast<int>(count);
  fold.has_init = init.empty() ? 0 : 1;
  if (!init.empty()) std::memcpy(fold.init, init.data(), init.size());
  detail::launch(sets[0].fold, 1, 32, home_stream, fold, "launching fold");
}

// The places whose shards hold elements: the ones a cross-place fold combines (at most
// kMaxFoldValues of them).
std::vector<std::size_t> non_empty_places(const ShardedArray& array) {
  std::vector<std::size_t> places;
  for (std::size_t place = 0; place < array.num_shards(); ++place) {
    if (array.shard_size(place) > 0) places.push_back(place);
  }
  if (places.size() > static_cast<std::size_t>(k::kMaxFoldValues)) {
    throw std::invalid_argument("a: reductions combine at most " + std::to_string(k::kMaxFoldValues) +
                                " non-empty shards");
  }
  return places;
}

// Several places, combined by the reduce kernels themselves (ReduceParams::place_totals):
// each place counts its blocks in a slot of its own device, the totals meet in a slot of the
// group's first device; no fold launch, no cross-device events, nothing allocated or
// cleared. The host waits for every place's stream, then reads the result where the last
// place wrote it.
void combine_in_kernel(const std::vector<KernelSet>& sets, const ShardedArray& in,
                       const std::vector<std::size_t>& places, int acc_size, const std::string& init,
                       const std::string& map_value, ReduceResult& result) {
  const PlaceGroup& group = *in.group();
  const int in_size = static_cast<int>(in.itemsize());
  LeasedSlot home(group, group.device(0));
  std::vector<std::unique_ptr<LeasedSlot>> slots;
  for (std::size_t place : places) slots.push_back(std::make_unique<LeasedSlot>(group, group.device(place)));
  const detail::SyncOnUnwind settle(group);  // on a throw, queued work drains before the slots go
  for (std::size_t k = 0; k < places.size(); ++k) {
    const std::size_t place = places[k];
    const int device = group.device(place);
    detail::DeviceGuard guard(device);
    const Chunking cut = chunking(sets[place], false, in.shard_size(place), device, in_size, acc_size);
    if (cut.grid > slots[k]->slot.blocks) throw std::logic_error("reduce: more blocks than a slot holds");
    reduce_shard(sets[place], in, place, cut, slot_pass(slots[k]->slot), init, map_value, &home.slot,
                 static_cast<int>(k), static_cast<int>(places.size()));
  }
  for (std::size_t place : places) {
    detail::DeviceGuard guard(group.device(place));
    check(cudaStreamSynchronize(stream_of(group, place)), "cudaStreamSynchronize");
  }
  std::memcpy(result.value.data(), static_cast<const void*>(home.slot.result), acc_size);
  home.clean = true;
  for (auto& slot : slots) slot->clean = true;
}

// One place: the kernel applies init and hands the result over in the slot's host words,
// each with the call's ticket (ReduceParams::handover, TicketedWords), which the host spins on:
// on an H100 a launch and a stream synchronisation took 10.2 us a round trip, a launch and a
// spin on such a word 8.0. A device set to block on synchronisation is waited for so.
void reduce_one_place(const KernelSet& kernels, const ShardedArray& in, std::size_t place, int acc_size,
                      const std::string& init, const std::string& map_value, ReduceResult& result) {
  const PlaceGroup& group = *in.group();
  const int device = group.device(place);
  const cudaStream_t stream = stream_of(group, place);
  detail::DeviceGuard guard(device);
  LeasedSlot slot(group, device);
  const Chunking cut = chunking(kernels, false, in.shard_size(place), device, static_cast<int>(in.itemsize()),
                                acc_size);
  if (cut.grid > slot.slot.blocks) throw std::logic_error("reduce: more blocks than a slot holds");
  const detail::SyncOnUnwind settle(group);
  PassScratch pass = slot_pass(slot.slot);
  const int count = k::handover_words(acc_size);
  detail::TicketedWords<32, 32> words(slot.slot.handover, count);
  pass.handover = const_cast<unsigned long long*>(slot.slot.handover);
  pass.ticket = static_cast<unsigned int>(words.ticket());
  reduce_shard(kernels, in, place, cut, pass, init, map_value);
  if (!detail::wait_until_stored([&] { return words.stored(); }, stream, "waiting for the reduce result")) {
    throw std::runtime_error("reduce: the kernel stored no result");
  }
  unsigned int pieces[k::handover_words(k::kMaxAccSize)];
  for (int w = 0; w < count; ++w) pieces[w] = static_cast<unsigned int>(words.payload(w));
  std::memcpy(result.value.data(), pieces, acc_size);
  slot.clean = true;
}

// A pinned host slot of the group for one small result, given back when dropped.
class HostSlot {
 public:
  explicit HostSlot(const PlaceGroup& group) : group_(group), slot_(group.acquire_host_slot()) {}
  ~HostSlot() { group_.release_host_slot(slot_); }
  HostSlot(const HostSlot&) = delete;
  HostSlot& operator=(const HostSlot&) = delete;
  void* get() const { return slot_; }

 private:
  const PlaceGroup& group_;
  void* slot_;
};

ReduceResult reduce_impl(const std::vector<KernelSet>& sets, const ShardedArray& in, int acc_size,
                         const std::string& init, const std::string& map_value = {}) {
  check_acc(acc_size, init);
  const ArrayLeases leases({{&in, "a"}});
  const std::vector<std::size_t> places = non_empty_places(in);
  ReduceResult result;
  if (places.empty()) {
    result.valid = !init.empty();
    result.value = init;
    return result;
  }
  const PlaceGroup& group = *in.group();
  result.value.assign(acc_size, '\0');
  result.valid = true;
  if (places.size() == 1) {
    reduce_one_place(sets[places[0]], in, places[0], acc_size, init, map_value, result);
    return result;
  }
  std::vector<int> devices;
  for (std::size_t place : places) devices.push_back(group.device(place));
  if (ReduceSlots::reachable(group, group.device(0), devices)) {
    combine_in_kernel(sets, in, places, acc_size, init, map_value, result);
    return result;
  }
  // Declaration order is release order reversed: on a throw the places are waited for
  // first, then scratch is freed, then the slot (a copy into it may have been queued) goes.
  const HostSlot slot(group);
  std::vector<PassScratch> scratch(places.size());
  std::vector<Chunking> cuts(places.size());
  detail::StreamScratch staging;
  const detail::SyncOnUnwind settle(group);
  first_pass(sets, in, places, acc_size, init, false, scratch, cuts, staging, map_value);
  const cudaStream_t home_stream = stream_of(group, 0);
  {
    detail::DeviceGuard guard(group.device(0));
    check(cudaMemcpyAsync(slot.get(), staging.bytes() + 2 * places.size() * acc_size, acc_size,
                          cudaMemcpyDeviceToHost, home_stream),
          "cudaMemcpyAsync (result)");
    staging.free();
    check(cudaStreamSynchronize(home_stream), "cudaStreamSynchronize");
  }
  // the fold has read every place's total: their scratch can go
  for (std::size_t k = 0; k < places.size(); ++k) {
    detail::DeviceGuard guard(group.device(places[k]));
    scratch[k].memory.free();
  }
  std::memcpy(result.value.data(), slot.get(), acc_size);
  return result;
}

// reduce_into: the fold in stream-ordered scratch (no leased slot: nothing is waited for, so
// a slot could not be handed back safely), one place's kernel applying init, or first_pass's
// per-place totals folded in place order with init first, as combine_places folds them; the
// total then copied to every place's element of `out` on that place's stream.
void reduce_into_impl(const std::vector<KernelSet>& sets, const ShardedArray& in, int acc_size,
                      const std::string& init, ShardedArray& out, const std::string& map_value = {}) {
  check_acc(acc_size, init);
  const ArrayLeases leases({{&in, "a"}, {&out, "out"}});
  const PlaceGroup& group = *in.group();
  if (out.group() != in.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  for (std::size_t place = 0; place < out.num_shards(); ++place) {
    if (out.shard_size(place) != 1) {
      throw std::invalid_argument("out: expected one element on every place (a DeviceScalar's storage)");
    }
  }
  if (static_cast<int>(out.itemsize()) != acc_size) {
    throw std::invalid_argument("out: element size differs from the accumulator's");
  }
  const auto acc = static_cast<std::size_t>(acc_size);
  const std::vector<std::size_t> places = non_empty_places(in);
  if (places.empty()) {
    if (init.empty()) throw std::invalid_argument("a: empty, and no init to write");
    for (std::size_t place = 0; place < out.num_shards(); ++place) {
      detail::DeviceGuard guard(group.device(place));
      check(cudaMemcpyAsync(reinterpret_cast<void*>(out.shard_pointer(place)), init.data(), acc,
                            cudaMemcpyHostToDevice, stream_of(group, place)),
            "cudaMemcpyAsync (init)");
    }
    return;
  }
  std::vector<PassScratch> scratch(places.size());
  std::vector<Chunking> cuts(places.size());
  detail::StreamScratch staging;
  const detail::SyncOnUnwind settle(group);  // on a throw, queued work drains before scratch goes
  const void* total = nullptr;
  int total_device = 0;
  cudaStream_t total_stream = nullptr;
  if (places.size() == 1) {
    const std::size_t place = places[0];
    total_device = group.device(place);
    total_stream = stream_of(group, place);
    detail::DeviceGuard guard(total_device);
    cuts[0] = chunking(sets[place], false, in.shard_size(place), total_device, static_cast<int>(in.itemsize()),
                       acc_size);
    scratch[0] = allocate_pass(group, place, cuts[0].grid, acc_size, false);
    scratch[0].result = reinterpret_cast<void*>(out.shard_pointer(place));  // the fold writes its copy there
    reduce_shard(sets[place], in, place, cuts[0], scratch[0], init, map_value);
    total = scratch[0].result;
  } else {
    first_pass(sets, in, places, acc_size, init, false, scratch, cuts, staging, map_value);
    total_device = group.device(0);
    total_stream = stream_of(group, 0);
    total = staging.bytes() + 2 * places.size() * acc;
  }
  for (std::size_t place = 0; place < out.num_shards(); ++place) {
    if (reinterpret_cast<const void*>(out.shard_pointer(place)) == total) continue;  // written by the fold
    const int device = group.device(place);
    const cudaStream_t stream = stream_of(group, place);
    detail::DeviceGuard guard(device);
    detail::wait_for(stream, total_stream, total_device);
    detail::copy_between(reinterpret_cast<void*>(out.shard_pointer(place)), device, total, total_device, acc, stream,
                         "copying the result to every place");
  }
  // Every place's stream has waited for the total, so the fold has read every place's scratch;
  // the total's memory goes once every copy of it has been made.
  for (std::size_t place = 0; place < out.num_shards(); ++place) {
    const cudaStream_t stream = stream_of(group, place);
    if (stream != total_stream) detail::wait_for(total_stream, stream, group.device(place));
  }
  for (std::size_t k = 0; k < places.size(); ++k) {
    detail::DeviceGuard guard(group.device(places[k]));
    scratch[k].memory.free();
  }
  detail::DeviceGuard guard(total_device);
  staging.free();
}

// A scan of one place in one pass (OnePassScan): the kernel draws its tiles from the place's
// draw word and looks back over the place's tile states, which no call clears (each launch
// tags its states with a new epoch). A scan being captured into a graph gets zeroed states of
// its own in the graph instead: the place's may be reallocated before the graph is replayed.
void scan_one_pass(const KernelHandle& kernel, const ShardedArray& in, ShardedArray& out, std::size_t place,
                   long long tiles, int acc_size, const std::string& init, bool exclusive) {
  const PlaceGroup& group = *in.group();
  const cudaStream_t stream = stream_of(group, place);
  k::OnePassScanParams params{};
  params.in = reinterpret_cast<const void*>(in.shard_pointer(place));
  params.out = reinterpret_cast<void*>(out.shard_pointer(place));
  params.n = in.shard_size(place);
  params.index_base = in.index_base(place);
  params.num_tiles = tiles;
  params.draw = group.scan_draw(place);
  params.has_seed = init.empty() ? 0 : 1;
  params.exclusive = exclusive ? 1 : 0;
  if (!init.empty()) std::memcpy(params.seed_value, init.data(), acc_size);
  const std::size_t bytes = static_cast<std::size_t>(tiles) * 16;

  detail::DeviceGuard guard(group.device(place));
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capturing), "cudaStreamIsCapturing");
  detail::StreamScratch own;  // a captured scan's states
  std::unique_lock<std::mutex> lock;  // the place's states: held until the kernel that reads them is queued
  if (capturing != cudaStreamCaptureStatusNone) {
    own = detail::StreamScratch(bytes, stream, pool_of(group, place));
    check(cudaMemsetAsync(own.get(), 0, bytes, stream), "clearing a scan's tile states");
    params.states = own.get();
  } else {
    PlaceGroup::ScanStates& states = group.scan_states(place);
    lock = std::unique_lock<std::mutex>(states.mutex);
    if (states.bytes < bytes) {
      std::size_t grown = std::max<std::size_t>(states.bytes, 64 << 10);
      while (grown < bytes) grown *= 2;
      detail::StreamScratch memory(grown, stream, pool_of(group, place));
      check(cudaMemsetAsync(memory.get(), 0, grown, stream), "clearing a scan's tile states");
      if (states.memory != nullptr) check(cudaFreeAsync(states.memory, stream), "cudaFreeAsync (scan states)");
      states.memory = memory.release();
      states.bytes = grown;
    }
    params.states = states.memory;
  }
  if (k::one_pass_staged(static_cast<int>(in.itemsize()), acc_size)) {
    detail::prefer_shared_memory(kernel, group.device(place));  // six blocks' tiles a multiprocessor
  }
  detail::launch(kernel, static_cast<unsigned>(tiles), k::one_pass_block(static_cast<int>(in.itemsize()), acc_size),
                 stream, params, "launching scan");
  own.free();  // after the kernel, in stream order (nothing where the place's states served)
}

void scan_impl(const std::vector<KernelSet>& sets, const ShardedArray& in, ShardedArray& out,
               int acc_size, const std::string& init, bool exclusive) {
  check_acc(acc_size, init);
  const ArrayLeases leases({{&in, "a"}, {&out, "out"}});
  if (exclusive && init.empty()) throw std::invalid_argument("init: an exclusive scan needs one");
  if (in.group() != out.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  if (in.shard_sizes() != out.shard_sizes()) throw std::invalid_argument("out: shard sizes differ from a's");
  if (static_cast<int>(out.itemsize()) != acc_size) {
    throw std::invalid_argument("out: element size differs from the accumulator's");
  }
  const std::vector<std::size_t> places = non_empty_places(in);
  if (places.empty()) return;
  const KernelSet& first = sets[places[0]];
  if (places.size() == 1 && first.one_pass.function != nullptr) {
    const long long tile = k::one_pass_tile(static_cast<int>(in.itemsize()), acc_size);
    const long long tiles = (in.shard_size(places[0]) + tile - 1) / tile;
    if (tiles < (1LL << k::kOnePassTileBits)) {
      scan_one_pass(first.one_pass, in, out, places[0], tiles, acc_size, init, exclusive);
      return;
    }
  }
  if (first.scan.function == nullptr) {
    throw std::invalid_argument(
        "libraries: linked with the single-pass scan alone, which scans at most one non-empty shard of fewer than 2^" +
        std::to_string(k::kOnePassTileBits) + " tiles; " +
        (places.size() > 1 ? "`a` has " + std::to_string(places.size()) + " non-empty shards"
                           : "`a`'s shard holds " + std::to_string(in.shard_size(places[0])) + " elements"));
  }
  const PlaceGroup& group = *in.group();
  const int home = group.device(0);
  const cudaStream_t home_stream = stream_of(group, 0);

  std::vector<PassScratch> scratch(places.size());
  std::vector<Chunking> cuts(places.size());
  detail::StreamScratch staging;
  const detail::SyncOnUnwind settle(group);  // before any scratch is freed on a throw
  first_pass(sets, in, places, acc_size, init, true, scratch, cuts, staging);
  std::optional<detail::Event> folded;
  if (staging) {
    folded.emplace(home);
    folded->record(home_stream);
  }
  for (std::size_t k = 0; k < places.size(); ++k) {
    const std::size_t place = places[k];
    const int device = group.device(place);
    const cudaStream_t stream = stream_of(group, place);
    const bool seeded = k > 0 || !init.empty();
    detail::DeviceGuard guard(device);
    k::ScanParams params{};
    void* seed = nullptr;  // the first shard's seed (init) travels in the parameters
    if (k == 0 && seeded) {
      std::memcpy(params.seed_value, init.data(), acc_size);
    } else if (k > 0) {
      folded->wait(stream);
      unsigned char* prefix = staging.bytes() + (places.size() + k) * acc_size;
      if (group.can_access_peer(device, home)) {
        seed = prefix;  // read in place
      } else {
        seed = static_cast<unsigned char*>(scratch[k].result) + k::kMaxAccSize;  // spare slot after the total
        detail::copy_between(seed, device, prefix, home, acc_size, stream, "copying a shard's prefix");
      }
    }
    params.in = reinterpret_cast<const void*>(in.shard_pointer(place));
    params.out = reinterpret_cast<void*>(out.shard_pointer(place));
    params.n = in.shard_size(place);
    params.index_base = in.index_base(place);
    params.chunk = cuts[k].chunk;
    params.prefixes = scratch[k].prefixes;
    params.seed = seed;
    params.has_seed = seeded ? 1 : 0;
    params.exclusive = exclusive ? 1 : 0;
    detail::launch(sets[place].scan, cuts[k].grid, k::kScanBlock, stream, params, "launching scan");
    // the fold reads this place's total in place: free only after it ran
    if (k == 0 && folded) folded->wait(stream);
    scratch[k].memory.free();
    // staging is read until every place has its seed
    if (staging) detail::wait_for(home_stream, stream, device);
  }
  detail::DeviceGuard guard(home);
  staging.free();
}

// ---- Steps of a reduce or scan whose places span processes (reduce.hpp) ----

// What reduce computes on each place before it combines them: the same chunking, kernels and
// slots as reduce_one_place and combine_in_kernel, so the same per-place association.
std::vector<ReduceResult> partials_impl(const std::vector<KernelSet>& sets, const ShardedArray& in,
                                        int acc_size) {
  check_acc(acc_size, {});
  const ArrayLeases leases({{&in, "a"}});
  const PlaceGroup& group = *in.group();
  const std::vector<std::size_t> places = non_empty_places(in);
  std::vector<ReduceResult> results(in.num_shards());
  std::vector<std::unique_ptr<LeasedSlot>> slots;
  for (std::size_t place : places) slots.push_back(std::make_unique<LeasedSlot>(group, group.device(place)));
  const detail::SyncOnUnwind settle(group);  // on a throw, queued work drains before the slots go
  const int in_size = static_cast<int>(in.itemsize());
  for (std::size_t k = 0; k < places.size(); ++k) {
    const std::size_t place = places[k];
    const int device = group.device(place);
    detail::DeviceGuard guard(device);
    const Chunking cut = chunking(sets[place], false, in.shard_size(place), device, in_size, acc_size);
    if (cut.grid > slots[k]->slot.blocks) throw std::logic_error("reduce: more blocks than a slot holds");
    reduce_shard(sets[place], in, place, cut, slot_pass(slots[k]->slot));
  }
  for (std::size_t k = 0; k < places.size(); ++k) {
    const std::size_t place = places[k];
    detail::DeviceGuard guard(group.device(place));
    check(cudaStreamSynchronize(stream_of(group, place)), "cudaStreamSynchronize");
    results[place].valid = true;
    results[place].value.assign(static_cast<const char*>(slots[k]->slot.result), acc_size);
    slots[k]->clean = true;
  }
  return results;
}

FoldResult fold_impl(const std::vector<KernelSet>& sets, const PlaceGroup& group, int acc_size,
                     const std::vector<std::string>& values, const std::string& init) {
  check_acc(acc_size, init);
  const auto acc = static_cast<std::size_t>(acc_size);
  for (std::size_t k = 0; k < values.size(); ++k) {
    if (values[k].size() != acc) {
      throw std::invalid_argument("values: entry " + std::to_string(k) + " holds " +
                                  std::to_string(values[k].size()) + " bytes, expected " + std::to_string(acc));
    }
  }
  FoldResult result;
  result.total = init;
  const std::size_t count = values.size();
  if (count == 0) return result;
  // The first launch folds up to kMaxFoldValues values after init; each later one starts from
  // the previous total (its source 0) and folds kMaxFoldValues - 1 more: one left fold.
  constexpr auto kFirst = static_cast<std::size_t>(k::kMaxFoldValues);
  constexpr std::size_t kLater = kFirst - 1;
  const std::size_t launches = count <= kFirst ? 1 : 1 + (count - kFirst + kLater - 1) / kLater;
  const std::size_t area = kFirst * acc;  // one launch's prefixes
  std::string host;
  host.reserve(count * acc);
  for (const std::string& value : values) host += value;
  const int device = group.device(0);
  const cudaStream_t stream = stream_of(group, 0);
  detail::DeviceGuard guard(device);
  // [values][each launch's prefixes][each launch's total]
  detail::StreamScratch memory(count * acc + launches * (area + acc), stream, pool_of(group, 0));
  const detail::SyncOnUnwind settle(group);
  unsigned char* device_values = memory.bytes();
  unsigned char* areas = device_values + count * acc;
  unsigned char* totals = areas + launches * area;
  check(cudaMemcpyAsync(device_values, host.data(), count * acc, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (fold values)");
  std::vector<std::size_t> begins;
  for (std::size_t launch = 0, begin = 0; launch < launches; ++launch) {
    k::FoldParams params{};
    int source = 0;
    if (launch == 0) {
      params.has_init = init.empty() ? 0 : 1;
      if (!init.empty()) std::memcpy(params.init, init.data(), acc);
    } else {
      params.sources[source++] = totals + (launch - 1) * acc;
    }
    const std::size_t end = std::min(count, begin + (launch == 0 ? kFirst : kLater));
    for (std::size_t v = begin; v < end; ++v) params.sources[source++] = device_values + v * acc;
    params.count = source;
    params.prefixes = areas + launch * area;
    params.total = totals + launch * acc;
    detail::launch(sets[0].fold, 1, 32, stream, params, "launching fold");
    begins.push_back(begin);
    begin = end;
  }
  std::string folded(launches * (area + acc), '\0');
  check(cudaMemcpyAsync(folded.data(), areas, folded.size(), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (fold results)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  memory.free();
  result.prefixes.resize(count);
  for (std::size_t launch = 0; launch < launches; ++launch) {
    const std::size_t begin = begins[launch];
    const std::size_t end = launch + 1 < launches ? begins[launch + 1] : count;
    const std::size_t first_source = launch == 0 ? 0 : 1;
    for (std::size_t v = begin; v < end; ++v) {
      if (v == 0 && init.empty()) continue;  // nothing comes before the first value
      result.prefixes[v].assign(folded.data() + launch * area + (first_source + v - begin) * acc, acc);
    }
  }
  result.total.assign(folded.data() + launches * area + (launches - 1) * acc, acc);
  return result;
}

void scan_carried_impl(const std::vector<KernelSet>& sets, const ShardedArray& in, ShardedArray& out,
                       int acc_size, bool exclusive, const ScanCarry& carry) {
  check_acc(acc_size, {});
  const ArrayLeases leases({{&in, "a"}, {&out, "out"}});
  if (in.group() != out.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  if (in.shard_sizes() != out.shard_sizes()) throw std::invalid_argument("out: shard sizes differ from a's");
  if (static_cast<int>(out.itemsize()) != acc_size) {
    throw std::invalid_argument("out: element size differs from the accumulator's");
  }
  const std::vector<std::size_t> places = non_empty_places(in);
  const PlaceGroup& group = *in.group();
  const int in_size = static_cast<int>(in.itemsize());
  // Release order is declaration order reversed: on a throw (carry's included) the places
  // are waited for first, then scratch is freed, then the host slots the totals went to.
  std::vector<std::unique_ptr<HostSlot>> slots;
  std::vector<PassScratch> scratch(places.size());
  std::vector<Chunking> cuts(places.size());
  const detail::SyncOnUnwind settle(group);
  for (std::size_t k = 0; k < places.size(); ++k) {
    const std::size_t place = places[k];
    const int device = group.device(place);
    const cudaStream_t stream = stream_of(group, place);
    detail::DeviceGuard guard(device);
    cuts[k] = chunking(sets[place], true, in.shard_size(place), device, in_size, acc_size);
    scratch[k] = allocate_pass(group, place, cuts[k].grid, acc_size, true);
    reduce_shard(sets[place], in, place, cuts[k], scratch[k]);
    slots.push_back(std::make_unique<HostSlot>(group));
    check(cudaMemcpyAsync(slots[k]->get(), scratch[k].result, acc_size, cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (shard total)");
  }
  std::vector<ReduceResult> totals(in.num_shards());
  for (std::size_t k = 0; k < places.size(); ++k) {
    const std::size_t place = places[k];
    detail::DeviceGuard guard(group.device(place));
    check(cudaStreamSynchronize(stream_of(group, place)), "cudaStreamSynchronize");
    totals[place].valid = true;
    totals[place].value.assign(static_cast<const char*>(slots[k]->get()), acc_size);
  }
  const std::vector<std::string> seeds = carry(totals);
  if (seeds.size() != in.num_shards()) {
    throw std::invalid_argument("carry: expected one seed per place (" + std::to_string(in.num_shards()) +
                                "), got " + std::to_string(seeds.size()));
  }
  for (std::size_t place : places) {
    const std::string& seed = seeds[place];
    if (!seed.empty() && seed.size() != static_cast<std::size_t>(acc_size)) {
      throw std::invalid_argument("carry: seed " + std::to_string(place) + " holds " + std::to_string(seed.size()) +
                                  " bytes, expected " + std::to_string(acc_size));
    }
    if (exclusive && seed.empty()) {
      throw std::invalid_argument("carry: an exclusive scan needs a seed for every non-empty place");
    }
  }
  for (std::size_t k = 0; k < places.size(); ++k) {
    const std::size_t place = places[k];
    const std::string& seed = seeds[place];
    detail::DeviceGuard guard(group.device(place));
    k::ScanParams params{};
    if (!seed.empty()) std::memcpy(params.seed_value, seed.data(), seed.size());
    params.in = reinterpret_cast<const void*>(in.shard_pointer(place));
    params.out = reinterpret_cast<void*>(out.shard_pointer(place));
    params.n = in.shard_size(place);
    params.index_base = in.index_base(place);
    params.chunk = cuts[k].chunk;
    params.prefixes = scratch[k].prefixes;
    params.seed = nullptr;  // seed_value
    params.has_seed = seed.empty() ? 0 : 1;
    params.exclusive = exclusive ? 1 : 0;
    detail::launch(sets[place].scan, cuts[k].grid, k::kScanBlock, stream_of(group, place), params,
                   "launching scan");
    scratch[k].memory.free();
  }
}

}  // namespace

ReduceResult reduce(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                    int acc_size, const std::string& init) {
  return reduce_impl(linked_sets(libraries, *in.group(), false), in, acc_size, init);
}

ReduceResult reduce_builtin(BuiltinReduction op, const ShardedArray& in, const std::string& init) {
  in.check_scalar("a", "a built-in reduction");
  return reduce_impl(builtin_sets(op, in.dtype(), in.group()->size()), in,
                     static_cast<int>(in.itemsize()), init);
}

void reduce_into(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in, int acc_size,
                 const std::string& init, ShardedArray& out) {
  reduce_into_impl(linked_sets(libraries, *in.group(), false), in, acc_size, init, out);
}

void reduce_builtin_into(BuiltinReduction op, const ShardedArray& in, const std::string& init, ShardedArray& out) {
  in.check_scalar("a", "a built-in reduction");
  reduce_into_impl(builtin_sets(op, in.dtype(), in.group()->size()), in, static_cast<int>(in.itemsize()), init,
                   out);
}

long long count(const ShardedArray& in, const std::string& value) {
  in.check_scalar("a", "count");
  if (value.size() != in.itemsize()) throw std::invalid_argument("value: wrong size");
  const k::BuiltinReduceKernels kernels = k::builtin_count_kernels(static_cast<int>(in.dtype()));
  KernelSet set{KernelHandle::builtin(kernels.reduce), KernelHandle::builtin(kernels.fold), {}};
  const ReduceResult result =
      reduce_impl(std::vector<KernelSet>(in.group()->size(), set), in, 8, {}, value);
  long long total = 0;
  if (result.valid) std::memcpy(&total, result.value.data(), sizeof(total));
  return total;
}

void scan(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
          ShardedArray& out, int acc_size, const std::string& init, bool exclusive) {
  scan_impl(linked_sets(libraries, *in.group(), true, true), in, out, acc_size, init, exclusive);
}

void scan_builtin(BuiltinReduction op, const ShardedArray& in, ShardedArray& out,
                  const std::string& init, bool exclusive) {
  in.check_scalar("a", "a built-in scan");
  if (out.dtype() != in.dtype()) throw std::invalid_argument("out: dtype differs from a's");
  scan_impl(builtin_sets(op, in.dtype(), in.group()->size()), in, out,
            static_cast<int>(in.itemsize()), init, exclusive);
}

std::vector<ReduceResult> reduce_partials(const std::vector<const KernelLibrary*>& libraries,
                                          const ShardedArray& in, int acc_size) {
  return partials_impl(linked_sets(libraries, *in.group(), false), in, acc_size);
}

std::vector<ReduceResult> reduce_builtin_partials(BuiltinReduction op, const ShardedArray& in) {
  in.check_scalar("a", "a built-in reduction");
  return partials_impl(builtin_sets(op, in.dtype(), in.group()->size()), in, static_cast<int>(in.itemsize()));
}

FoldResult fold(const std::vector<const KernelLibrary*>& libraries, const PlaceGroup& group, int acc_size,
                const std::vector<std::string>& values, const std::string& init) {
  return fold_impl(linked_sets(libraries, group, false), group, acc_size, values, init);
}

FoldResult fold_builtin(BuiltinReduction op, DType dtype, const PlaceGroup& group,
                        const std::vector<std::string>& values, const std::string& init) {
  if (dtype == DType::record) throw std::invalid_argument("dtype: a built-in fold combines numbers, not records");
  return fold_impl(builtin_sets(op, dtype, group.size()), group, static_cast<int>(itemsize(dtype)), values,
                   init);
}

void scan_carried(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                  ShardedArray& out, int acc_size, bool exclusive, const ScanCarry& carry) {
  scan_carried_impl(linked_sets(libraries, *in.group(), true), in, out, acc_size, exclusive, carry);
}

void scan_builtin_carried(BuiltinReduction op, const ShardedArray& in, ShardedArray& out, bool exclusive,
                          const ScanCarry& carry) {
  in.check_scalar("a", "a built-in scan");
  if (out.dtype() != in.dtype()) throw std::invalid_argument("out: dtype differs from a's");
  scan_carried_impl(builtin_sets(op, in.dtype(), in.group()->size()), in, out, static_cast<int>(in.itemsize()),
                    exclusive, carry);
}

}  // namespace csj
