#include "csj/place_group.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <mutex>
#include <numeric>
#include <set>
#include <tuple>
#include <stdexcept>
#include <utility>

#include "csj/errors.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"
#include "format.hpp"

namespace csj {
namespace {

using detail::check;

// Host NUMA node of a device from sysfs; 0 where the platform does not report one.
int numa_node_of(int device) {
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  std::string id(bus_id);
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return std::tolower(c); });
  // sysfs names carry a 4-digit domain ("0000:3b:00.0"); CUDA may print 8 digits.
  if (id.size() > 12 && id.find(':') == 8) id = id.substr(4);
  // stdio, not iostreams: the extension may share a process with other C++ runtimes whose
  // locale facets iostreams would touch.
  const std::string path = "/sys/bus/pci/devices/" + id + "/numa_node";
  std::FILE* file = std::fopen(path.c_str(), "r");
  if (!file) return 0;
  int node = -1;
  const int read = std::fscanf(file, "%d", &node);
  std::fclose(file);
  return read == 1 && node >= 0 ? node : 0;
}

}  // namespace

int visible_device_count() {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count == 0) {
    throw std::runtime_error("no CUDA GPU is visible on this machine");
  }
  return count;
}

std::uintptr_t pinned_host_alloc(std::size_t bytes) {
  void* address = nullptr;
  const cudaError_t status = cudaHostAlloc(&address, bytes, cudaHostAllocPortable);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw OutOfMemory("pinned host memory: " + std::to_string(bytes) + " bytes do not fit");
  }
  check(status, "cudaHostAlloc");
  return reinterpret_cast<std::uintptr_t>(address);
}

void pinned_host_free(std::uintptr_t address) {
  check(cudaFreeHost(reinterpret_cast<void*>(address)), "cudaFreeHost");
}

std::shared_ptr<PlaceGroup> PlaceGroup::by_devices(const std::optional<std::vector<int>>& devices) {
  if (devices && devices->empty()) {
    throw std::invalid_argument("devices: expected at least one device id, got an empty list");
  }
  const int count = visible_device_count();
  std::vector<int> chosen;
  if (devices) {
    chosen = *devices;
  } else {
    chosen.resize(count);
    std::iota(chosen.begin(), chosen.end(), 0);
  }
  for (int device : chosen) {
    if (device < 0 || device >= count) {
      throw std::invalid_argument("devices: unknown device id " + std::to_string(device) + " (" +
                                  std::to_string(count) + " visible: 0.." +
                                  std::to_string(count - 1) + ")");
    }
  }
  std::vector<int> domains;
  for (int device : chosen) domains.push_back(numa_node_of(device));
  return std::shared_ptr<PlaceGroup>(new PlaceGroup(std::move(chosen), std::move(domains)));
}

std::shared_ptr<PlaceGroup> PlaceGroup::by_locality_domains() {
  const int count = visible_device_count();
  std::vector<std::pair<int, int>> order;  // (domain, device)
  for (int device = 0; device < count; ++device) order.emplace_back(numa_node_of(device), device);
  std::stable_sort(order.begin(), order.end());
  std::vector<int> devices, domains;
  for (auto [domain, device] : order) {
    devices.push_back(device);
    domains.push_back(domain);
  }
  return std::shared_ptr<PlaceGroup>(new PlaceGroup(std::move(devices), std::move(domains)));
}

namespace {

// A pool of the library's own on `device`. It keeps freed memory cached (no release
// threshold) so that repeated calls never pay for cudaMalloc; release_cached_memory trims it.
cudaMemPool_t create_pool(int device) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
  std::uint64_t threshold = UINT64_MAX;
  const cudaError_t status =
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
  if (status != cudaSuccess) {
    cudaMemPoolDestroy(pool);
    check(status, "cudaMemPoolSetAttribute");
  }
  return pool;
}

// The pool of `device` shared by every live group: groups reuse each other's cached memory
// (one group's cache cannot starve another's allocations), and the pool is destroyed, its
// memory back to the driver, when the last group on the device goes. A new group after that
// (after a device reset, say) gets a new pool.
std::shared_ptr<void> shared_pool(int device, const detail::ContextStamp& context) {
  static std::mutex mutex;
  static std::map<std::pair<int, unsigned long long>, std::weak_ptr<void>> pools;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, context.id);
  if (std::shared_ptr<void> pool = pools[key].lock()) return pool;
  std::shared_ptr<void> pool(create_pool(device), [context](void* handle) {
    // deferred by the driver until frees still queued have run; a reset took it already
    if (!context.alive()) return;
    if (cudaMemPoolDestroy(static_cast<cudaMemPool_t>(handle)) != cudaSuccess) cudaGetLastError();
  });
  pools[key] = pool;
  return pool;
}

// Lets the current device (`device`) map `other`'s memory, once per pair per process: the
// driver keeps it enabled for the context's life, and asking again is an API error
// (cudaErrorPeerAccessAlreadyEnabled) that error-checking tools report. Another library in
// the process may have enabled it first; that answer is accepted too.
void enable_peer_access(int device, int other, unsigned long long context) {
  static std::mutex mutex;
  static std::set<std::tuple<int, int, unsigned long long>> enabled;  // a reset forgets it
  std::lock_guard<std::mutex> lock(mutex);
  if (enabled.count({device, other, context})) return;
  const cudaError_t status = cudaDeviceEnablePeerAccess(other, 0);
  if (status == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
  } else {
    check(status, "cudaDeviceEnablePeerAccess");
  }
  enabled.insert({device, other, context});
}

// The (CUcontext, id) pairs the CUDA-free header keeps, to and from a ContextStamp.
std::pair<std::uintptr_t, unsigned long long> stored(const detail::ContextStamp& stamp) {
  return {reinterpret_cast<std::uintptr_t>(stamp.context), stamp.id};
}

bool alive(const std::pair<std::uintptr_t, unsigned long long>& context) noexcept {
  return detail::ContextStamp{reinterpret_cast<CUcontext>(context.first), context.second}.alive();
}

}  // namespace

PlaceGroup::PlaceGroup(std::vector<int> devices, std::vector<int> domains)
    : devices_(std::move(devices)), domains_(std::move(domains)) {
  for (int device : devices_) {
    if (std::find(unique_devices_.begin(), unique_devices_.end(), device) == unique_devices_.end()) {
      unique_devices_.push_back(device);
    }
  }
  int max_device = *std::max_element(devices_.begin(), devices_.end());
  peer_.assign(max_device + 1, std::vector<bool>(max_device + 1, false));

  // A throw here leaves no destructor to run: give back what was made so far.
  try {
    // Peer access (kernels reading a neighbour's memory) and the group's pools.
    for (int device : unique_devices_) {
      detail::DeviceGuard guard(device);
      const detail::ContextStamp context = detail::ContextStamp::current();
      contexts_.push_back(stored(context));
      peer_[device][device] = true;
      pool_owners_.push_back(shared_pool(device, context));
      device_pools_.push_back(reinterpret_cast<std::uintptr_t>(pool_owners_.back().get()));
      for (int other : unique_devices_) {
        if (other == device) continue;
        int can = 0;
        check(cudaDeviceCanAccessPeer(&can, device, other), "cudaDeviceCanAccessPeer");
        if (!can) continue;
        enable_peer_access(device, other, context.id);
        peer_[device][other] = true;
      }
    }
    // Let each device read the pool of every peer it can reach.
    for (std::size_t owner = 0; owner < unique_devices_.size(); ++owner) {
      auto pool = reinterpret_cast<cudaMemPool_t>(device_pools_[owner]);
      for (int reader : unique_devices_) {
        if (reader == unique_devices_[owner] || !peer_[reader][unique_devices_[owner]]) continue;
        cudaMemAccessDesc access{};
        access.location.type = cudaMemLocationTypeDevice;
        access.location.id = reader;
        access.flags = cudaMemAccessFlagsProtReadWrite;
        check(cudaMemPoolSetAccess(pool, &access, 1), "cudaMemPoolSetAccess");
      }
    }
    for (int device : devices_) {
      const auto unique = std::find(unique_devices_.begin(), unique_devices_.end(), device);
      place_pools_.push_back(device_pools_[unique - unique_devices_.begin()]);
    }

    streams_.reserve(devices_.size());
    pass_counters_.reserve(devices_.size());
    for (int device : devices_) {
      detail::DeviceGuard guard(device);
      cudaStream_t stream;
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      streams_.push_back(reinterpret_cast<std::uintptr_t>(stream));
      // Allocated and zeroed in the stream's order: every kernel queued there later sees zero.
      void* counter = nullptr;
      check(cudaMallocFromPoolAsync(&counter, 16, reinterpret_cast<cudaMemPool_t>(place_pools_[streams_.size() - 1]),
                                    stream),
            "cudaMallocFromPoolAsync (pass counter)");
      pass_counters_.push_back(counter);
      check(cudaMemsetAsync(counter, 0, 16, stream), "cudaMemsetAsync (pass counter)");
      scan_states_.push_back(std::make_unique<ScanStates>());
    }
  } catch (...) {
    release_resources();
    throw;
  }
}

bool PlaceGroup::alive() const noexcept {
  return std::all_of(contexts_.begin(), contexts_.end(), [](const auto& context) { return csj::alive(context); });
}

bool PlaceGroup::device_alive(int device) const noexcept {
  for (std::size_t k = 0; k < unique_devices_.size() && k < contexts_.size(); ++k) {
    if (unique_devices_[k] == device) return csj::alive(contexts_[k]);
  }
  return false;
}

void PlaceGroup::check_alive() const {
  for (std::size_t k = 0; k < contexts_.size(); ++k) {
    if (csj::alive(contexts_[k])) continue;
    throw std::runtime_error("group: cuda:" + std::to_string(unique_devices_[k]) +
                             " was reset after the group was made (cudaDeviceReset, perhaps by "
                             "another library): the context that held the group's streams, memory "
                             "and arrays is gone. Make a new PlaceGroup and new arrays");
  }
}

unsigned long long PlaceGroup::context_id(int device) const {
  for (std::size_t k = 0; k < unique_devices_.size(); ++k) {
    if (unique_devices_[k] == device) return contexts_[k].second;
  }
  throw std::out_of_range("device " + std::to_string(device) + " is not in the group");
}

void* PlaceGroup::acquire_host_slot() const {
  check_alive();
  std::lock_guard<std::mutex> lock(slots_mutex_);
  if (free_slots_.empty()) {
    constexpr std::size_t kSlot = 64, kSlots = 64;
    void* chunk = nullptr;
    const detail::ContextStamp context = detail::ContextStamp::current();  // the chunk's owner
    check(cudaMallocHost(&chunk, kSlot * kSlots), "cudaMallocHost");
    pinned_chunks_.push_back(chunk);
    pinned_contexts_.push_back(stored(context));
    for (std::size_t slot = 0; slot < kSlots; ++slot) {
      free_slots_.push_back(static_cast<unsigned char*>(chunk) + slot * kSlot);
    }
  }
  void* slot = free_slots_.back();
  free_slots_.pop_back();
  return slot;
}

void PlaceGroup::release_host_slot(void* slot) const {
  std::lock_guard<std::mutex> lock(slots_mutex_);
  free_slots_.push_back(slot);
}

PlaceGroup::~PlaceGroup() { release_resources(); }

void PlaceGroup::release_resources() noexcept {
  // Arrays hold their group, so every array of the group is gone and its memory's frees are
  // queued. None of this waits: a stream with queued work is destroyed once the work has
  // run, and a pool with allocations still to be freed once they are.
  // What a reset device's context held is gone with it and its handles dangle: those are
  // only forgotten; the rest is given back.
  int previous = 0;
  cudaGetDevice(&previous);
  for (std::size_t place = 0; place < streams_.size(); ++place) {
    if (!device_alive(devices_[place])) continue;
    cudaSetDevice(devices_[place]);
    if (place < pass_counters_.size()) cudaFreeAsync(pass_counters_[place], reinterpret_cast<cudaStream_t>(streams_[place]));
    if (place < scan_states_.size() && scan_states_[place]->memory != nullptr) {
      cudaFreeAsync(scan_states_[place]->memory, reinterpret_cast<cudaStream_t>(streams_[place]));
    }
    cudaStreamDestroy(reinterpret_cast<cudaStream_t>(streams_[place]));
  }
  cudaSetDevice(previous);
  for (std::size_t k = 0; k < pinned_chunks_.size(); ++k) {
    if (csj::alive(pinned_contexts_[k])) cudaFreeHost(pinned_chunks_[k]);
  }
  streams_.clear();
  pass_counters_.clear();
  scan_states_.clear();
  pool_owners_.clear();  // the last group on a device destroys its pool
  device_pools_.clear();
  pinned_chunks_.clear();
  pinned_contexts_.clear();
  cudaGetLastError();
}

int PlaceGroup::device(std::size_t place) const {
  if (place >= devices_.size()) {
    throw std::out_of_range("place " + std::to_string(place) + " out of range for a group of " +
                            std::to_string(devices_.size()) + " places");
  }
  return devices_[place];
}

std::uintptr_t PlaceGroup::stream(std::size_t place) const {
  device(place);  // range check
  return streams_[place];
}

int PlaceGroup::locality_domain(std::size_t place) const {
  device(place);
  return domains_[place];
}

bool PlaceGroup::can_access_peer(int from, int to) const {
  if (from == to) return true;
  if (from < 0 || to < 0 || from >= static_cast<int>(peer_.size()) ||
      to >= static_cast<int>(peer_.size())) {
    return false;
  }
  return peer_[from][to];
}

std::pair<int, int> PlaceGroup::compute_capability(std::size_t place) const {
  const int id = device(place);
  int major = 0, minor = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, id), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, id), "cudaDeviceGetAttribute");
  return {major, minor};
}

void PlaceGroup::check_foreign_stream(std::size_t place, std::uintptr_t foreign_stream,
                                      const std::string& what) const {
  const int id = device(place);
  if (foreign_stream <= 2) return;  // none, or a default stream: whichever device is current
  const std::string refused = what + ": stream " + detail::hex_address(foreign_stream) +
                              " is not a live CUDA stream of device " + std::to_string(id);
  // Nothing is ever mapped in the lowest 64 KiB of a process (Linux's mmap_min_addr, Windows'
  // null region), nor at or above 2^57 (user space ends at 2^56 with x86-64's 5-level paging,
  // lower elsewhere), so no stream object lives there: refused before the driver sees it. A
  // -1 written as unsigned is the likeliest of such values.
  if (foreign_stream < 0x10000 || foreign_stream >= (std::uintptr_t{1} << 57)) {
    throw std::invalid_argument(refused);
  }
  check_alive();
  // The driver takes a stream handle on trust: a destroyed stream or an arbitrary value makes
  // this call (and any other that takes the handle) crash the process, so those cannot be
  // told apart here. What it does tell safely is which context a live stream belongs to: a
  // stream of another device, or of another context of this one, would fail the event we
  // record on it (events belong to the primary context) or wait for the wrong work.
  CUcontext owner = nullptr;
  if (detail::driver().cuStreamGetCtx(reinterpret_cast<CUstream>(foreign_stream), &owner) != CUDA_SUCCESS ||
      !owner) {
    throw std::invalid_argument(refused);
  }
  const auto unique = std::find(unique_devices_.begin(), unique_devices_.end(), id);
  const auto ours = reinterpret_cast<CUcontext>(contexts_[unique - unique_devices_.begin()].first);
  if (owner == ours) return;
  CUdevice owner_device = -1;
  if (detail::driver().cuCtxPushCurrent(owner) == CUDA_SUCCESS) {
    if (detail::driver().cuCtxGetDevice(&owner_device) != CUDA_SUCCESS) owner_device = -1;
    CUcontext popped = nullptr;
    detail::driver().cuCtxPopCurrent(&popped);
  }
  if (owner_device == id) {
    throw std::invalid_argument(refused + " in the context the group uses (its primary context): "
                                "it belongs to another context of that device");
  }
  throw std::invalid_argument(refused + (owner_device >= 0 ? " (it is a stream of device " +
                                                                 std::to_string(owner_device) + ")"
                                                           : std::string()));
}

void PlaceGroup::wait_for_stream(std::size_t place, std::uintptr_t foreign_stream) const {
  device(place);  // range check
  if (foreign_stream == 0 || foreign_stream == streams_[place]) return;
  check_alive();
  check_foreign_stream(place, foreign_stream, "stream");
  wait_for_checked_stream(place, foreign_stream);
}

namespace {

// Streams as CAI v3 and DLPack number them: 1 is the legacy default stream, 2 the per-thread
// default stream (of the calling thread), anything else a cudaStream_t.
cudaStream_t as_cuda_stream(std::uintptr_t foreign_stream) {
  return foreign_stream == 1   ? cudaStreamLegacy
         : foreign_stream == 2 ? cudaStreamPerThread
                               : reinterpret_cast<cudaStream_t>(foreign_stream);
}

}  // namespace

void PlaceGroup::wait_for_checked_stream(std::size_t place, std::uintptr_t foreign_stream) const {
  const int id = device(place);
  if (foreign_stream == 0 || foreign_stream == streams_[place]) return;
  check_alive();
  detail::DeviceGuard guard(id);
  detail::wait_for(reinterpret_cast<cudaStream_t>(streams_[place]), as_cuda_stream(foreign_stream), id);
}

void PlaceGroup::make_foreign_stream_wait(std::size_t place, std::uintptr_t foreign_stream) const {
  const int id = device(place);
  if (foreign_stream == 0 || foreign_stream == streams_[place]) return;
  check_alive();
  check_foreign_stream(place, foreign_stream, "stream");
  detail::DeviceGuard guard(id);
  // The event is recorded on our stream (of device `id`); the default streams are those of
  // `id` too, the device the guard makes current.
  detail::wait_for(as_cuda_stream(foreign_stream), reinterpret_cast<cudaStream_t>(streams_[place]), id);
}

void PlaceGroup::sync() const {
  check_alive();
  for (std::size_t place = 0; place < streams_.size(); ++place) {
    detail::DeviceGuard guard(devices_[place]);
    check(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(streams_[place])),
          "cudaStreamSynchronize");
  }
}

void PlaceGroup::release_cached_memory() const {
  sync();
  for (std::uintptr_t pool : device_pools_) {
    check(cudaMemPoolTrimTo(reinterpret_cast<cudaMemPool_t>(pool), 0), "cudaMemPoolTrimTo");
  }
}

std::uintptr_t PlaceGroup::memory_pool(std::size_t place) const {
  device(place);  // range check
  return place_pools_[place];
}

unsigned int* PlaceGroup::pass_counter(std::size_t place) const {
  device(place);  // range check
  return static_cast<unsigned int*>(pass_counters_[place]);
}

unsigned long long* PlaceGroup::scan_draw(std::size_t place) const {
  device(place);  // range check
  return reinterpret_cast<unsigned long long*>(static_cast<unsigned char*>(pass_counters_[place]) + 8);
}

PlaceGroup::ScanStates& PlaceGroup::scan_states(std::size_t place) const {
  device(place);  // range check
  return *scan_states_[place];
}

}  // namespace csj
