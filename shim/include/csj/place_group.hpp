// A place is one (device, stream) pair; a PlaceGroup is an ordered list of places.
// CUDA-free header: the bindings include it, streams travel as integers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace csj {

class PlaceGroup {
 public:
  // One place per listed device, in order; a device may repeat. nullopt: every visible device.
  static std::shared_ptr<PlaceGroup> by_devices(const std::optional<std::vector<int>>& devices);
  // Every visible device, ordered by host NUMA domain, then by device id.
  static std::shared_ptr<PlaceGroup> by_locality_domains();

  PlaceGroup(const PlaceGroup&) = delete;
  PlaceGroup& operator=(const PlaceGroup&) = delete;
  ~PlaceGroup();

  std::size_t size() const { return devices_.size(); }
  const std::vector<int>& devices() const { return devices_; }
  int device(std::size_t place) const;
  std::uintptr_t stream(std::size_t place) const;
  // Host NUMA domain of the place's device (0 where the platform does not say).
  int locality_domain(std::size_t place) const;
  const std::vector<int>& locality_domains() const { return domains_; }
  // Distinct devices of the group, in first-appearance order.
  const std::vector<int>& unique_devices() const { return unique_devices_; }
  // Whether kernels on device `from` can read memory of device `to` (true when equal).
  bool can_access_peer(int from, int to) const;
  // (major, minor) compute capability of the place's device.
  std::pair<int, int> compute_capability(std::size_t place) const;
  // std::invalid_argument naming `what` unless the place's stream can be made to wait for
  // `foreign_stream` (the `stream` of a __cuda_array_interface__ we consume): 0 (no stream),
  // 1 or 2 (the legacy and per-thread default streams), or a live stream of the place's
  // device in the context the group uses (the device's primary context). Queues nothing.
  void check_foreign_stream(std::size_t place, std::uintptr_t foreign_stream,
                            const std::string& what) const;
  // Makes the place's stream wait for work already queued on a foreign stream of its device
  // (checked first, as check_foreign_stream names "stream"). 0 means no stream: nothing to do.
  void wait_for_stream(std::size_t place, std::uintptr_t foreign_stream) const;
  // wait_for_stream for a stream that has already passed check_foreign_stream (adopt checks
  // every buffer's stream before it waits for any).
  void wait_for_checked_stream(std::size_t place, std::uintptr_t foreign_stream) const;
  // The other direction: makes a foreign stream of the place's device (1 and 2: the legacy and
  // per-thread default streams, else a live cudaStream_t, checked as check_foreign_stream names
  // "stream") wait for the work queued on the place's stream so far. What a consumer of a
  // shard (DLPack's __dlpack__(stream=...)) needs before it reads on its own stream. 0 means
  // no stream: nothing to do.
  void make_foreign_stream_wait(std::size_t place, std::uintptr_t foreign_stream) const;
  // Blocks until every place's stream has drained (call with the GIL released).
  void sync() const;
  // Waits for the places' streams, then returns the memory that the group's stream-ordered
  // pools keep cached for reuse to the driver.
  void release_cached_memory() const;
  // The library's stream-ordered memory pool on the place's device (a cudaMemPool_t), shared
  // by every group alive on that device. Every allocation of the library comes from these
  // pools: the device's default pool, which CuPy and torch may use too, is left as the
  // driver made it.
  std::uintptr_t memory_pool(std::size_t place) const;
  // A device word of the place's that reads zero between kernels: the block counter of a
  // kernel whose last block resets it (the reduce's first pass, which scans also run), so no
  // call clears one. Only work queued on the place's stream may use it: two users never
  // overlap.
  unsigned int* pass_counter(std::size_t place) const;
  // The draw word of a scan in one pass on the place (kernels::OnePassScanParams::draw), beside
  // the pass counter: zero at first, left by each such kernel ready for the next.
  unsigned long long* scan_draw(std::size_t place) const;
  // The tile states of a scan in one pass on the place (OnePassScanParams::states): device
  // memory that only those kernels write, zeroed when allocated and kept for the group's life,
  // so that no call clears it. A caller holds `mutex` from reading `memory` until its kernel is
  // queued; growing it (in the place's stream order) frees the old memory after the kernels
  // already queued there.
  struct ScanStates {
    std::mutex mutex;
    void* memory = nullptr;
    std::size_t bytes = 0;
  };
  ScanStates& scan_states(std::size_t place) const;

  // Whether the contexts the group was made in still exist: a device reset (by any library
  // in the process) destroys a device's context with the group's streams, pools and memory.
  bool alive() const noexcept;
  // The same for one of the group's devices (false for a device not in the group).
  bool device_alive(int device) const noexcept;
  // std::runtime_error naming the reset device unless alive(). Every call that would hand a
  // stream, pool or array of the group to the driver checks first.
  void check_alive() const;
  // Identity of the context of `device` (one of the group's) the group was made in.
  unsigned long long context_id(int device) const;

  // A 64-byte slot of pinned host memory for small device-to-host results (fast, truly
  // asynchronous copies). Thread-safe; give it back with release_host_slot.
  void* acquire_host_slot() const;
  void release_host_slot(void* slot) const;

 private:
  PlaceGroup(std::vector<int> devices, std::vector<int> domains);
  void release_resources() noexcept;

  std::vector<int> devices_;
  std::vector<int> domains_;
  std::vector<int> unique_devices_;
  std::vector<std::uintptr_t> streams_;
  std::vector<std::shared_ptr<void>> pool_owners_;  // keep the shared pools alive
  std::vector<std::uintptr_t> device_pools_;        // parallel to unique_devices_
  std::vector<std::uintptr_t> place_pools_;         // per place
  std::vector<void*> pass_counters_;                // per place, from its pool, on its stream
  std::vector<std::unique_ptr<ScanStates>> scan_states_;  // per place; memory as the counters'
  std::vector<std::vector<bool>> peer_;  // indexed by device id
  // per unique device: (CUcontext, its cuCtxGetId) at creation
  std::vector<std::pair<std::uintptr_t, unsigned long long>> contexts_;
  mutable std::mutex slots_mutex_;
  mutable std::vector<void*> pinned_chunks_;
  mutable std::vector<std::pair<std::uintptr_t, unsigned long long>> pinned_contexts_;  // per chunk
  mutable std::vector<void*> free_slots_;
};

// Number of visible devices; std::runtime_error that says why when there is no driver or GPU.
int visible_device_count();

// Page-locked host memory usable from every context (cudaHostAllocPortable), for staging data
// between the GPUs and a transport that reads host memory (MPI); OutOfMemory when none is left.
std::uintptr_t pinned_host_alloc(std::size_t bytes);
void pinned_host_free(std::uintptr_t address);

}  // namespace csj
