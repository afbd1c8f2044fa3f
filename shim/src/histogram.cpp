#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "../kernels/builtin_kernels.hpp"
#include "csj/errors.hpp"
#include "csj/reduce.hpp"
#include "cuda_check.hpp"
#include "format.hpp"
#include "launch.hpp"
#include "slot_pool.hpp"

namespace csj {
namespace {

using detail::check;

// One place's device scratch: the edges (padded to 16 bytes), then its counts.
struct ScratchLayout {
  std::size_t edge_size;   // bytes per edge: float32 edges for float32 data, float64 otherwise
  std::size_t edge_bytes;  // padded
  std::size_t count_bytes;
  std::size_t total() const { return edge_bytes + count_bytes; }
};

ScratchLayout scratch_layout(const ShardedArray& in, int num_bins) {
  ScratchLayout layout{};
  layout.edge_size = in.dtype() == DType::float32 ? 4 : 8;
  layout.edge_bytes = ((static_cast<std::size_t>(num_bins) + 1) * layout.edge_size + 15) / 16 * 16;
  layout.count_bytes = static_cast<std::size_t>(num_bins) * sizeof(unsigned long long);
  return layout;
}

// Below this much scratch on a device the question costs more than the answer tells: a
// stream-ordered allocation that fails is a MemoryError all the same, only a bare one.
constexpr std::uint64_t kCheckedScratch = std::uint64_t{64} << 20;

// check_histogram_memory without the lease (the caller holds one).
void check_memory(const ShardedArray& in, int num_bins, const ScratchLayout& layout) {
  const PlaceGroup& group = *in.group();
  const std::uint64_t per_place = layout.total();
  for (int device : group.unique_devices()) {
    // every place's scratch is held at once (all kernels are queued before any count is read)
    std::uint64_t places = 0;
    std::size_t first = 0;
    for (std::size_t place = group.size(); place-- > 0;) {
      if (group.device(place) != device || in.shard_size(place) == 0) continue;
      ++places;
      first = place;
    }
    const std::uint64_t need = per_place * places;
    if (places == 0 || need < kCheckedScratch) continue;
    detail::DeviceGuard guard(device);
    const auto pool = reinterpret_cast<cudaMemPool_t>(group.memory_pool(first));
    if (detail::has_room(pool, need)) continue;
    const std::uint64_t available = detail::available_memory(pool);
    const std::string name = "device " + std::to_string(device);
    throw OutOfMemory("num_bins: " + std::to_string(num_bins) + " bins need " +
                      detail::memory_amount(per_place) + " of device memory per place" +
                      (places > 1 ? ", " + detail::memory_amount(need) + " on " + name + " (" +
                                        std::to_string(places) + " places)"
                                  : std::string()) +
                      "; " + name + " has " + detail::memory_amount(available) + " free");
  }
}

// Slots of the one-launch path, for up to kHistogramSlotBins bins: device counts and an
// arrival counter that read zero between uses (the kernel's last block resets them, see
// HistogramParams::done), and pinned, device-visible host memory for the words the counts are
// handed over in. Slots come in batches per device (of the group's context), are reused across
// calls and kept until exit; one that saw a failure is dropped, its counters unknown.
class HistogramSlots {
 public:
  struct Slot {
    int device = -1;
    unsigned long long context = 0;
    unsigned long long* counts = nullptr;  // device
    unsigned int* done = nullptr;          // device
    // pinned, mapped (also their device address): ticket << kHistogramTicketShift | count;
    // word 0 shows the last ticket stored, or 0 after a lease whose kernel was never queued
    volatile unsigned long long* words = nullptr;
  };

  static Slot acquire(const PlaceGroup& group, int device) {
    const unsigned long long context = group.context_id(device);
    return pool().acquire(device, context, [&](std::vector<Slot>& free_slots) { add_batch(device, context, free_slots); });
  }

  static void release(const Slot& slot) { pool().release(slot); }

 private:
  static void add_batch(int device, unsigned long long context, std::vector<Slot>& free_slots) {
    constexpr std::size_t kSlots = 8;
    constexpr std::size_t kCountBytes = kernels::kHistogramSlotBins * sizeof(unsigned long long);
    constexpr std::size_t kDeviceBytes = kCountBytes + 256;  // the counts, then the counter
    const detail::SlotMemory batch = detail::allocate_slot_memory(device, kDeviceBytes * kSlots, kCountBytes * kSlots,
                                                                  "preparing the histogram slots");
    unsigned char* memory = batch.device;
    unsigned char* host = batch.host;
    for (std::size_t i = 0; i < kSlots; ++i) {
      Slot slot;
      slot.device = device;
      slot.context = context;
      slot.counts = reinterpret_cast<unsigned long long*>(memory + i * kDeviceBytes);
      slot.done = reinterpret_cast<unsigned int*>(memory + i * kDeviceBytes + kCountBytes);
      slot.words = reinterpret_cast<volatile unsigned long long*>(host + i * kCountBytes);
      slot.words[0] = 0;
      free_slots.push_back(slot);
    }
  }

  static detail::SlotPool<Slot>& pool() {
    static detail::SlotPool<Slot> slots;
    return slots;
  }
};

// A slot held for one call. It goes back to the pool when its kernel was never queued or
// stored every word (its counters are at zero again); after a kernel that did not finish it
// is dropped. The call's SyncOnUnwind has drained the streams before this runs on a throw.
struct LeasedHistogramSlot {
  LeasedHistogramSlot(const PlaceGroup& group, int device, int num_bins)
      : slot(HistogramSlots::acquire(group, device)), words(slot.words, num_bins) {}
  ~LeasedHistogramSlot() {
    if (!launched || words.stored()) HistogramSlots::release(slot);
  }
  LeasedHistogramSlot(const LeasedHistogramSlot&) = delete;
  LeasedHistogramSlot& operator=(const LeasedHistogramSlot&) = delete;
  long long count(int bin) const { return static_cast<long long>(words.payload(bin)); }
  HistogramSlots::Slot slot;
  detail::TicketedWords<kernels::kHistogramTicketShift, 64 - kernels::kHistogramTicketShift> words;
  bool launched = false;
};

// Blocks of at least kHistogramThreadItems elements a thread, twice that once the grid
// holds two blocks a multiprocessor (each block zeroes, merges and adds its sub-histogram
// once), at most kHistogramBlocksPerSM a multiprocessor. Kernel times on one H100, 64 bins of
// float32, against 16 items and 8 blocks: 2^22 elements 12.7 -> 10.9-11.6 us (512 blocks),
// 2^24 28.9 -> 28.2, 2^28 352 -> 346 (2^20 unchanged: 256 blocks either way).
long long histogram_grid(long long n, int sms) {
  constexpr long long kBlockItems = static_cast<long long>(kernels::kHistogramBlock) * kernels::kHistogramThreadItems;
  const long long fine = (n + kBlockItems - 1) / kBlockItems;
  const long long coarse = (n + 2 * kBlockItems - 1) / (2 * kBlockItems);
  const long long most = static_cast<long long>(sms) * kernels::kHistogramBlocksPerSM;
  return std::min({fine, std::max(coarse, 2LL * sms), most});
}

}  // namespace

void check_histogram_memory(const ShardedArray& in, int num_bins) {
  in.check_scalar("a", "histogram_even");
  if (num_bins <= 0) throw std::invalid_argument("num_bins: expected a positive number of bins");
  const ArrayLeases leases({{&in, "a"}});
  check_memory(in, num_bins, scratch_layout(in, num_bins));
}

void histogram_even(const ShardedArray& in, int num_bins, const void* edges, std::size_t edge_bytes,
                    long long* counts, std::size_t count_bytes) {
  namespace k = kernels;
  in.check_scalar("a", "histogram_even");
  if (num_bins <= 0) throw std::invalid_argument("num_bins: expected a positive number of bins");
  const ScratchLayout layout = scratch_layout(in, num_bins);
  if (edge_bytes != (static_cast<std::size_t>(num_bins) + 1) * layout.edge_size) {
    throw std::invalid_argument("edges: expected num_bins + 1 edges of the bin dtype");
  }
  if (count_bytes != static_cast<std::size_t>(num_bins) * sizeof(long long)) {
    throw std::invalid_argument("counts: expected room for num_bins int64 counts");
  }
  const ArrayLeases leases({{&in, "a"}});
  check_memory(in, num_bins, layout);
  const PlaceGroup& group = *in.group();
  const auto kernel = detail::KernelHandle::builtin(k::builtin_histogram_kernel(static_cast<int>(in.dtype())));
  const std::size_t padded_edges = layout.edge_bytes;
  // Shared memory: the edges, then the block's sub-histogram with a column per lane up to
  // kHistogramColumnBins bins (no two lanes of a warp contend for a counter), else one per warp
  // when it fits (warps never contend), else one per block, else counts go straight to global
  // memory.
  const std::size_t bins_bytes = static_cast<std::size_t>(num_bins) * sizeof(unsigned int);
  const bool edges_in_shared = padded_edges <= static_cast<std::size_t>(k::kHistogramSharedBytes);
  const bool edges_inline = edges_in_shared && edge_bytes <= sizeof(k::HistogramParams::inline_edges);
  const std::size_t room = edges_in_shared ? k::kHistogramSharedBytes - padded_edges : k::kHistogramSharedBytes;
  int copies = 0;
  int columns = 1;
  if (num_bins <= k::kHistogramColumnBins && bins_bytes * 32 <= room) {
    copies = 1, columns = 32;
  } else if (bins_bytes * k::kHistogramWarps <= room) {
    copies = k::kHistogramWarps;
  } else if (bins_bytes <= room) {
    copies = 1;
  }
  const std::size_t counter_bytes = bins_bytes * copies * columns;
  const int bins_offset = edges_in_shared ? static_cast<int>(padded_edges) : 0;
  const auto shared = static_cast<unsigned>(bins_offset + counter_bytes);

  // Up to kHistogramSlotBins bins, each place's kernel hands its counts over in a slot (no
  // memset, no copy, a spin on the slot's words); more bins take scratch, a memset and a copy.
  const bool slot_bins = num_bins <= k::kHistogramSlotBins;
  std::vector<std::unique_ptr<LeasedHistogramSlot>> slots(group.size());
  // The first place's counts land in `counts` itself, each further place's in one host buffer
  // and are added from there: host memory for two sets of counts, whatever the group's size.
  std::vector<unsigned long long> staging;
  std::vector<detail::StreamScratch> scratches(group.size());
  const detail::SyncOnUnwind settle(group);  // no copy into `counts` or `staging` outlives it
  // every place's kernel first: the copies into pageable memory below make the host wait
  for (std::size_t place = 0; place < group.size(); ++place) {
    const long long n = in.shard_size(place);
    if (n == 0) continue;
    const auto stream = reinterpret_cast<cudaStream_t>(group.stream(place));
    detail::DeviceGuard guard(group.device(place));
    const int sms = detail::multiprocessors(group.device(place));
    k::HistogramParams params{};
    // edges that fit travel in the launch's parameters, not by a copy from pageable memory
    if (edges_inline) std::memcpy(params.inline_edges, edges, edge_bytes);
    // a count below 2^48 fits a handed-over word with its ticket
    const bool in_slots = slot_bins && n < (1ll << k::kHistogramTicketShift);
    if (!edges_inline || !in_slots) {
      // each place's scratch is used on its own stream only: a stream-ordered free is safe
      // whenever a step throws
      detail::StreamScratch& scratch = scratches[place];
      scratch = detail::StreamScratch(layout.total(), stream,
                                      reinterpret_cast<cudaMemPool_t>(group.memory_pool(place)));
      unsigned char* base = scratch.bytes();
      if (!edges_inline) {
        check(cudaMemcpyAsync(base, edges, edge_bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (edges)");
        params.edges = base;
      }
      if (!in_slots) {
        check(cudaMemsetAsync(base + padded_edges, 0, layout.count_bytes, stream), "cudaMemsetAsync");
        params.counts = reinterpret_cast<unsigned long long*>(base + padded_edges);
      }
    }
    if (in_slots) {
      slots[place] = std::make_unique<LeasedHistogramSlot>(group, group.device(place), num_bins);
      const HistogramSlots::Slot& slot = slots[place]->slot;
      params.counts = slot.counts;
      params.done = slot.done;
      params.host_counts = const_cast<unsigned long long*>(slot.words);
      params.ticket = slots[place]->words.ticket();
    }
    params.in = reinterpret_cast<const void*>(in.shard_pointer(place));
    params.n = n;
    params.num_bins = num_bins;
    params.edges_in_shared = edges_in_shared ? 1 : 0;
    params.copies = copies;
    params.columns = columns;
    params.bins_offset = bins_offset;
    const auto grid = static_cast<unsigned>(histogram_grid(n, sms));
    detail::launch(kernel, grid, k::kHistogramBlock, stream, params, "launching histogram", shared);
    if (slots[place]) slots[place]->launched = true;
  }
  bool first = true;
  for (std::size_t place = 0; place < group.size(); ++place) {
    if (slots[place]) {
      LeasedHistogramSlot& lease = *slots[place];
      const auto stream = reinterpret_cast<cudaStream_t>(group.stream(place));
      detail::DeviceGuard guard(group.device(place));
      if (!detail::wait_until_stored([&] { return lease.words.stored(); }, stream, "waiting for the histogram")) {
        throw std::runtime_error("histogram_even: the kernel stored no counts");
      }
      for (int bin = 0; bin < num_bins; ++bin) counts[bin] = (first ? 0LL : counts[bin]) + lease.count(bin);
      scratches[place].free();
      first = false;
      continue;
    }
    if (!scratches[place]) continue;
    const auto stream = reinterpret_cast<cudaStream_t>(group.stream(place));
    detail::DeviceGuard guard(group.device(place));
    if (!first && staging.empty()) staging.resize(num_bins);
    // unsigned long long and long long counts share their bits (no bin reaches 2^63)
    void* into = first ? static_cast<void*>(counts) : static_cast<void*>(staging.data());
    check(cudaMemcpyAsync(into, scratches[place].bytes() + padded_edges, layout.count_bytes,
                          cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (counts)");
    scratches[place].free();
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (!first) {
      for (std::size_t bin = 0; bin < staging.size(); ++bin) counts[bin] += static_cast<long long>(staging[bin]);
    }
    first = false;
  }
  if (first) std::fill(counts, counts + num_bins, 0LL);  // every shard empty
}

}  // namespace csj
