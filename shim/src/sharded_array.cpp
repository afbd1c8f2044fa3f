#include "csj/sharded_array.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "../kernels/params.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"
#include "format.hpp"

namespace csj {
namespace {

using detail::check;
using detail::driver;

void validate_sizes(const std::vector<std::int64_t>& sizes, std::size_t places, std::size_t element) {
  if (sizes.size() != places) {
    throw std::invalid_argument("sizes: expected one size per place (" + std::to_string(places) +
                                "), got " + std::to_string(sizes.size()));
  }
  std::int64_t total = 0;
  for (std::size_t shard = 0; shard < sizes.size(); ++shard) {
    if (sizes[shard] < 0) {
      throw std::invalid_argument("sizes: shard " + std::to_string(shard) +
                                  " has negative size " + std::to_string(sizes[shard]));
    }
    // 2^60 elements is beyond any machine, and keeps byte counts of 8-byte items in range
    // (records: byte counts below 2^63)
    const std::int64_t limit = element <= 8 ? std::int64_t{1} << 60
                                            : std::numeric_limits<std::int64_t>::max() /
                                                  static_cast<std::int64_t>(element);
    if (sizes[shard] > limit - total) {
      throw std::invalid_argument("sizes: the total of " + std::to_string(places) +
                                  " shard sizes exceeds " +
                                  (element <= 8 ? std::string("2^60 elements")
                                                : "2^63 bytes of " + std::to_string(element) + "-byte records"));
    }
    total += sizes[shard];
  }
}

std::size_t round_up(std::size_t value, std::size_t granule) {
  return (value + granule - 1) / granule * granule;
}

// std::invalid_argument naming `what` unless all `bytes` from `pointer` are memory the driver
// allocated, not just the first: a __cuda_array_interface__ that claims more elements than
// its producer allocated would have kernels read and write past the allocation, into other
// buffers (small cudaMalloc allocations lie back to back) or off the mapped pages.
void check_extent(std::uintptr_t pointer, std::uint64_t bytes, const std::string& what) {
  const detail::DriverApi& api = driver();
  const auto address = static_cast<CUdeviceptr>(pointer);
  // The allocation holding the pointer: a cudaMalloc / pool / managed allocation's own bytes,
  // or for CUDA VMM the whole reserved range (cuMemAddressReserve), mapped or not.
  CUdeviceptr start = 0;
  std::size_t size = 0;
  CUpointer_attribute range_attributes[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                            CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* range_values[] = {&start, &size};
  if (api.cuPointerGetAttributes(2, range_attributes, range_values, address) != CUDA_SUCCESS ||
      start == 0 || address < start || address - start > size) {
    throw std::invalid_argument(what + ": the driver knows no allocation holding " +
                                detail::hex_address(pointer));
  }
  const std::uint64_t offset = address - start;
  if (bytes > size - offset) {
    throw std::invalid_argument(what + ": its " + std::to_string(bytes) +
                                " bytes run past the end of the allocation at " +
                                detail::hex_address(start) + " (" + std::to_string(size) + " bytes)" +
                                (offset ? ", starting " + std::to_string(offset) + " bytes into it"
                                        : std::string()));
  }
  // Within a VMM range only the mapped chunks are memory (the range of a growing pool, e.g.
  // torch's expandable segments, is mostly unmapped): walk the mappings to the end. For other
  // allocations the first mapping (the driver's page holding them) covers them already.
  CUpointer_attribute mapping_attributes[] = {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                              CU_POINTER_ATTRIBUTE_MAPPING_SIZE};
  const CUdeviceptr end = address + bytes;
  CUdeviceptr at = address;
  while (at < end) {
    void* base = nullptr;
    std::size_t mapped = 0;
    void* mapping_values[] = {&base, &mapped};
    const CUresult found = api.cuPointerGetAttributes(2, mapping_attributes, mapping_values, at);
    if (found != CUDA_SUCCESS || base == nullptr || mapped == 0) {
      if (at == address) return;  // a driver that does not report mappings: the range must do
      throw std::invalid_argument(what + ": its " + std::to_string(bytes) +
                                  " bytes run past the mapped memory of the range at " +
                                  detail::hex_address(start) + ": nothing is mapped at " +
                                  detail::hex_address(static_cast<std::uintptr_t>(at)));
    }
    const CUdeviceptr next = reinterpret_cast<CUdeviceptr>(base) + mapped;
    if (next <= at) return;  // not a mapping that holds `at`: nothing more to learn
    at = next;
  }
}

}  // namespace

std::vector<std::int64_t> ShardedArray::even_sizes(std::int64_t n, std::size_t places) {
  if (n < 0) throw std::invalid_argument("n: expected a non-negative size, got " + std::to_string(n));
  if (places == 0) throw std::invalid_argument("group: has no places");
  std::vector<std::int64_t> sizes(places, n / static_cast<std::int64_t>(places));
  const auto extra = static_cast<std::size_t>(n % static_cast<std::int64_t>(places));
  for (std::size_t shard = 0; shard < extra; ++shard) ++sizes[shard];
  return sizes;
}

ShardedArray::ShardedArray(std::shared_ptr<PlaceGroup> group, std::vector<std::int64_t> sizes,
                           DType dtype, std::size_t record_size, Storage storage)
    : group_(std::move(group)),
      dtype_(dtype),
      itemsize_(element_size(dtype, record_size)),
      storage_(storage),
      shard_sizes_(std::move(sizes)) {
  if (!group_) throw std::invalid_argument("group: expected a PlaceGroup, got None");
  group_->check_alive();
  validate_sizes(shard_sizes_, group_->size(), itemsize_);
  shard_offsets_.resize(shard_sizes_.size());
  std::exclusive_scan(shard_sizes_.begin(), shard_sizes_.end(), shard_offsets_.begin(),
                      std::int64_t{0});
  size_ = std::accumulate(shard_sizes_.begin(), shard_sizes_.end(), std::int64_t{0});
  shard_pointers_.assign(shard_sizes_.size(), 0);
}

std::shared_ptr<ShardedArray> ShardedArray::allocate(std::shared_ptr<PlaceGroup> group,
                                                     std::vector<std::int64_t> sizes,
                                                     DType dtype, std::size_t record_size) {
  std::shared_ptr<ShardedArray> array(
      new ShardedArray(std::move(group), std::move(sizes), dtype, record_size, Storage::separate));
  const PlaceGroup& places = *array->group_;
  const std::size_t element = array->itemsize_;
  for (std::size_t shard = 0; shard < array->num_shards(); ++shard) {
    const std::int64_t count = array->shard_sizes_[shard];
    if (count == 0) continue;
    detail::DeviceGuard guard(places.device(shard));
    // On failure the destructor of `array` frees the shards allocated so far.
    void* pointer = detail::allocate_async(static_cast<std::size_t>(count) * element,
                                           reinterpret_cast<cudaStream_t>(places.stream(shard)),
                                           reinterpret_cast<cudaMemPool_t>(places.memory_pool(shard)));
    array->shard_pointers_[shard] = reinterpret_cast<std::uintptr_t>(pointer);
  }
  return array;
}

std::shared_ptr<ShardedArray> ShardedArray::allocate_contiguous(std::shared_ptr<PlaceGroup> group,
                                                                std::vector<std::int64_t> sizes,
                                                                DType dtype, std::size_t record_size) {
  std::shared_ptr<ShardedArray> array(
      new ShardedArray(std::move(group), std::move(sizes), dtype, record_size, Storage::contiguous));
  const PlaceGroup& places = *array->group_;
  const std::size_t element = array->itemsize_;
  const std::size_t total = static_cast<std::size_t>(array->size_) * element;
  array->chunk_bytes_.assign(places.size(), 0);
  if (total == 0) return array;

  for (int reader : places.unique_devices()) {
    for (int owner : places.unique_devices()) {
      if (!places.can_access_peer(reader, owner)) {
        throw std::invalid_argument(
            "group: allocate_contiguous needs peer access between every pair of its devices; "
            "device " + std::to_string(reader) + " cannot access device " + std::to_string(owner));
      }
    }
  }

  const detail::DriverApi& api = driver();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  std::size_t granule = 0;
  for (int device : places.unique_devices()) {
    prop.location.id = device;
    std::size_t device_granule = 0;
    check(api.cuMemGetAllocationGranularity(&device_granule, &prop,
                                            CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
          "cuMemGetAllocationGranularity");
    granule = std::max(granule, device_granule);
  }
  const std::size_t reserved = round_up(total, granule);

  // Physical chunk boundaries: each shard's start rounded to the nearest granule, so place i
  // backs [boundary_i, boundary_{i+1}) on its own device.
  std::vector<std::size_t> boundary(places.size() + 1, 0);
  for (std::size_t place = 1; place < places.size(); ++place) {
    const std::size_t start = static_cast<std::size_t>(array->shard_offsets_[place]) * element;
    const std::size_t nearest = (start + granule / 2) / granule * granule;
    boundary[place] = std::clamp(nearest, boundary[place - 1], reserved);
  }
  boundary[places.size()] = reserved;

  CUdeviceptr base = 0;
  check(api.cuMemAddressReserve(&base, reserved, granule, 0, 0), "cuMemAddressReserve");
  array->va_base_ = static_cast<std::uintptr_t>(base);
  array->va_bytes_ = reserved;
  // From here on, a throw leaves cleanup to the destructor (release_storage).
  for (std::size_t place = 0; place < places.size(); ++place) {
    const std::size_t bytes = boundary[place + 1] - boundary[place];
    if (bytes == 0) continue;
    prop.location.id = places.device(place);
    CUmemGenericAllocationHandle handle = 0;
    check(api.cuMemCreate(&handle, bytes, &prop, 0), "cuMemCreate");
    array->chunk_handles_.push_back(handle);
    array->chunk_bytes_[place] = static_cast<std::int64_t>(bytes);
    check(api.cuMemMap(base + boundary[place], bytes, 0, handle, 0), "cuMemMap");
    // unmapped one by one on release: a failure half way leaves holes in the range
    array->mapped_offsets_.push_back(boundary[place]);
    array->mapped_bytes_.push_back(bytes);
  }
  std::vector<CUmemAccessDesc> access;
  for (int device : places.unique_devices()) {
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access.push_back(desc);
  }
  check(api.cuMemSetAccess(base, reserved, access.data(), access.size()), "cuMemSetAccess");
  for (std::size_t shard = 0; shard < array->num_shards(); ++shard) {
    if (array->shard_sizes_[shard] == 0) continue;
    array->shard_pointers_[shard] =
        array->va_base_ + static_cast<std::uintptr_t>(array->shard_offsets_[shard]) * element;
  }
  return array;
}

std::shared_ptr<ShardedArray> ShardedArray::adopt(std::shared_ptr<PlaceGroup> group,
                                                  const std::vector<std::uintptr_t>& pointers,
                                                  std::vector<std::int64_t> sizes, DType dtype,
                                                  std::size_t record_size,
                                                  const std::vector<std::uintptr_t>& streams) {
  if (group && pointers.size() != group->size()) {
    throw std::invalid_argument("buffers: expected one buffer per place (" +
                                std::to_string(group->size()) + "), got " +
                                std::to_string(pointers.size()));
  }
  if (!streams.empty() && streams.size() != pointers.size()) {
    throw std::invalid_argument("streams: expected one per buffer (" + std::to_string(pointers.size()) +
                                "), got " + std::to_string(streams.size()));
  }
  std::shared_ptr<ShardedArray> array(
      new ShardedArray(std::move(group), std::move(sizes), dtype, record_size, Storage::adopted));
  const std::size_t element = array->itemsize_;
  // what the kernels' word loads need (numbers and records alike; element <= 32 bytes)
  const auto alignment = static_cast<std::size_t>(kernels::element_alignment(static_cast<int>(element)));
  for (std::size_t shard = 0; shard < pointers.size(); ++shard) {
    if (array->shard_sizes_[shard] == 0) continue;
    const std::uintptr_t pointer = pointers[shard];
    const std::string what = "buffers[" + std::to_string(shard) + "]";
    if (pointer == 0) {
      throw std::invalid_argument(what + ": null data pointer");
    }
    if (pointer % alignment != 0) {
      throw std::invalid_argument(what + ": data pointer is not aligned to " +
                                  std::to_string(alignment) + " bytes");
    }
    cudaPointerAttributes attributes{};
    cudaError_t status = cudaPointerGetAttributes(&attributes, reinterpret_cast<void*>(pointer));
    if (status != cudaSuccess) {
      cudaGetLastError();
      throw std::invalid_argument(what + ": not a CUDA device pointer");
    }
    const int expected = array->group_->device(shard);
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
      throw std::invalid_argument(what + ": host memory, expected memory of device " +
                                  std::to_string(expected));
    }
    if (attributes.type == cudaMemoryTypeDevice && attributes.device != expected) {
      throw std::invalid_argument(what + ": lives on device " + std::to_string(attributes.device) +
                                  ", expected device " + std::to_string(expected) + " (place " +
                                  std::to_string(shard) + ")");
    }
    // validate_sizes keeps size * itemsize below 2^63
    check_extent(pointer, static_cast<std::uint64_t>(array->shard_sizes_[shard]) * element, what);
    array->shard_pointers_[shard] = pointer;
  }
  // Every stream is checked before any is waited for: a refused buffer leaves nothing queued.
  for (std::size_t place = 0; place < streams.size(); ++place) {
    array->group_->check_foreign_stream(place, streams[place],
                                        "buffers[" + std::to_string(place) + "]");
  }
  // Our streams start after whatever the producers queued on theirs (CAI v3 contract).
  for (std::size_t place = 0; place < streams.size(); ++place) {
    array->group_->wait_for_checked_stream(place, streams[place]);
  }
  return array;
}

ShardedArray::~ShardedArray() {
  if (!is_freed()) release_storage();
}

// Runs once: from free() (which then marks the array freed) or from the destructor of an
// array never freed. Shard pointers keep their values; freed_ guards every use.
void ShardedArray::release_storage() noexcept {
  // A device reset took its shards along with its context: those are only forgotten (and a
  // contiguous range, whose mappings span the devices, is left as it is).
  if (storage_ == Storage::separate) {
    for (std::size_t shard = 0; shard < shard_pointers_.size(); ++shard) {
      if (!shard_pointers_[shard] || !group_->device_alive(group_->devices()[shard])) continue;
      int previous = 0;
      cudaGetDevice(&previous);
      cudaSetDevice(group_->devices()[shard]);
      // stream-ordered: after the work queued on the shard's place, which is the only place
      // that writes the shard (readers on other places are waited for by the algorithms)
      cudaFreeAsync(reinterpret_cast<void*>(shard_pointers_[shard]),
                    reinterpret_cast<cudaStream_t>(group_->stream(shard)));
      cudaSetDevice(previous);
    }
  } else if (storage_ == Storage::contiguous && va_base_ && group_->alive()) {
    // Unmapping is not stream-ordered: it must wait for work still using the range.
    for (std::size_t place = 0; place < group_->size(); ++place) {
      int previous = 0;
      cudaGetDevice(&previous);
      cudaSetDevice(group_->devices()[place]);
      cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(group_->stream(place)));
      cudaSetDevice(previous);
    }
    const detail::DriverApi& api = driver();
    for (std::size_t chunk = 0; chunk < mapped_offsets_.size(); ++chunk) {
      api.cuMemUnmap(static_cast<CUdeviceptr>(va_base_ + mapped_offsets_[chunk]), mapped_bytes_[chunk]);
    }
    for (auto handle : chunk_handles_) api.cuMemRelease(handle);
    api.cuMemAddressFree(static_cast<CUdeviceptr>(va_base_), va_bytes_);
    mapped_offsets_.clear();
    mapped_bytes_.clear();
    chunk_handles_.clear();
  }
  cudaGetLastError();
}

std::int64_t ShardedArray::shard_size(std::size_t shard) const {
  if (shard >= num_shards()) {
    throw std::out_of_range("shard " + std::to_string(shard) + " out of range for " +
                            std::to_string(num_shards()) + " shards");
  }
  return shard_sizes_[shard];
}

std::int64_t ShardedArray::shard_offset(std::size_t shard) const {
  shard_size(shard);
  return shard_offsets_[shard];
}

void ShardedArray::set_index_origin(std::int64_t origin) {
  // the same bound as validate_sizes puts on a total: global indices stay far from overflow
  if (origin < 0 || origin > (std::int64_t{1} << 60) - size_) {
    throw std::invalid_argument("origin: expected a global index in [0, 2^60 - size], got " +
                                std::to_string(origin));
  }
  index_origin_ = origin;
}

std::int64_t ShardedArray::index_base(std::size_t shard) const {
  return index_origin_ + shard_offset(shard);
}

std::uintptr_t ShardedArray::global_base(std::size_t shard) const {
  // unsigned arithmetic: the base may wrap below zero, base + index * itemsize wraps back
  return shard_pointer(shard) - static_cast<std::uintptr_t>(index_base(shard)) * itemsize_;
}

std::uintptr_t ShardedArray::shard_pointer(std::size_t shard) const {
  shard_size(shard);
  check_alive("shard");
  return shard_pointers_[shard];
}

std::uintptr_t ShardedArray::base_pointer() const {
  check_alive("base_pointer");
  return va_base_;
}

void ShardedArray::copy_from_host(std::uintptr_t host, std::size_t nbytes) {
  copy_range_from_host(0, size_, host, nbytes);
}

void ShardedArray::copy_to_host(std::uintptr_t host, std::size_t nbytes) const {
  copy_range_to_host(0, size_, host, nbytes);
}

// Elements [start, stop) and host bytes, queued shard by shard (only the shards the range
// touches), then those places' streams waited for.
void ShardedArray::copy_range(std::int64_t start, std::int64_t stop, std::uintptr_t host, std::size_t nbytes,
                              bool to_host) const {
  const std::size_t element = itemsize_;
  if (start < 0 || stop < start || stop > size_) {
    throw std::invalid_argument("range: [" + std::to_string(start) + ", " + std::to_string(stop) +
                                ") is not within the array's " + std::to_string(size_) + " elements");
  }
  if (nbytes != static_cast<std::size_t>(stop - start) * element) {
    throw std::invalid_argument("host: expected " + std::to_string((stop - start) * element) + " bytes, got " +
                                std::to_string(nbytes));
  }
  std::vector<std::size_t> touched;
  for (std::size_t shard = 0; shard < num_shards(); ++shard) {
    const std::int64_t from = std::max(start, shard_offsets_[shard]);
    const std::int64_t to = std::min(stop, shard_offsets_[shard] + shard_sizes_[shard]);
    if (from >= to) continue;
    detail::DeviceGuard guard(group_->device(shard));
    auto* device = reinterpret_cast<unsigned char*>(shard_pointers_[shard]) + (from - shard_offsets_[shard]) * element;
    auto* on_host = reinterpret_cast<unsigned char*>(host) + (from - start) * element;
    const std::size_t bytes = static_cast<std::size_t>(to - from) * element;
    const auto stream = reinterpret_cast<cudaStream_t>(group_->stream(shard));
    if (to_host) {
      check(cudaMemcpyAsync(on_host, device, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (device to host)");
    } else {
      check(cudaMemcpyAsync(device, on_host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (host to device)");
    }
    touched.push_back(shard);
  }
  for (const std::size_t shard : touched) {
    detail::DeviceGuard guard(group_->device(shard));
    check(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(group_->stream(shard))), "cudaStreamSynchronize");
  }
}

void ShardedArray::copy_range_to_host(std::int64_t start, std::int64_t stop, std::uintptr_t host,
                                      std::size_t nbytes) const {
  ArrayLeases lease({{this, "copy_to_host"}});
  copy_range(start, stop, host, nbytes, true);
}

void ShardedArray::copy_range_from_host(std::int64_t start, std::int64_t stop, std::uintptr_t host,
                                        std::size_t nbytes) {
  ArrayLeases lease({{this, "copy_from_host"}});
  copy_range(start, stop, host, nbytes, false);
}

void copy_lanes(const ShardedArray& src, std::size_t src_offset, ShardedArray& dst, std::size_t dst_offset,
                std::size_t width) {
  const ArrayLeases leases({{&src, "src"}, {&dst, "dst"}});
  if (src.group() != dst.group()) throw std::invalid_argument("dst: belongs to another PlaceGroup than src");
  if (src.shard_sizes() != dst.shard_sizes()) throw std::invalid_argument("dst: shard sizes differ from src's");
  if (width == 0 || src_offset + width > src.itemsize() || dst_offset + width > dst.itemsize()) {
    throw std::invalid_argument("copy_lanes: the lane lies outside an element");
  }
  const PlaceGroup& group = *src.group();
  for (std::size_t shard = 0; shard < group.size(); ++shard) {
    const std::int64_t n = src.shard_size(shard);
    if (n == 0) continue;
    detail::DeviceGuard guard(group.device(shard));
    const auto stream = reinterpret_cast<cudaStream_t>(group.stream(shard));
    auto* to = reinterpret_cast<unsigned char*>(dst.shard_pointer(shard)) + dst_offset;
    const auto* from = reinterpret_cast<const unsigned char*>(src.shard_pointer(shard)) + src_offset;
    if (width == src.itemsize() && width == dst.itemsize()) {
      detail::check(cudaMemcpyAsync(to, from, static_cast<std::size_t>(n) * width, cudaMemcpyDeviceToDevice, stream),
                    "cudaMemcpyAsync (copy_lanes)");
    } else {
      detail::check(cudaMemcpy2DAsync(to, dst.itemsize(), from, src.itemsize(), width, static_cast<std::size_t>(n),
                                      cudaMemcpyDeviceToDevice, stream),
                    "cudaMemcpy2DAsync (copy_lanes)");
    }
  }
}

void ShardedArray::shrink_shards(const std::vector<std::int64_t>& sizes) {
  check_alive("shrink_shards");
  if (storage_ != Storage::separate) throw std::invalid_argument("shrink_shards: only separate storage shrinks");
  if (sizes.size() != shard_sizes_.size()) {
    throw std::invalid_argument("sizes: expected one size per shard (" + std::to_string(shard_sizes_.size()) +
                                "), got " + std::to_string(sizes.size()));
  }
  for (std::size_t shard = 0; shard < sizes.size(); ++shard) {
    if (sizes[shard] < 0 || sizes[shard] > shard_sizes_[shard]) {
      throw std::invalid_argument("sizes: shard " + std::to_string(shard) + " cannot shrink from " +
                                  std::to_string(shard_sizes_[shard]) + " to " + std::to_string(sizes[shard]) +
                                  " elements");
    }
  }
  for (std::size_t shard = 0; shard < sizes.size(); ++shard) {
    const std::int64_t kept = sizes[shard];
    // nothing allocated, or within four times what it keeps: a copy of what a selection kept
    // costs at most a sixth of the pass that wrote it, and a result near half its input (the
    // common case) never flips between copying and not from one call to the next
    if (shard_pointers_[shard] == 0 || (kept > 0 && kept * 4 >= shard_sizes_[shard])) continue;
    const auto stream = reinterpret_cast<cudaStream_t>(group_->stream(shard));
    detail::DeviceGuard guard(group_->device(shard));
    void* exact = nullptr;
    if (kept > 0) {
      exact = detail::allocate_async(static_cast<std::size_t>(kept) * itemsize_, stream,
                                     reinterpret_cast<cudaMemPool_t>(group_->memory_pool(shard)));
      const cudaError_t copied = cudaMemcpyAsync(exact, reinterpret_cast<const void*>(shard_pointers_[shard]),
                                                 static_cast<std::size_t>(kept) * itemsize_,
                                                 cudaMemcpyDeviceToDevice, stream);
      if (copied != cudaSuccess) {
        cudaFreeAsync(exact, stream);
        check(copied, "cudaMemcpyAsync (shrink_shards)");
      }
    }
    // the shard's own stream wrote it and copied it: the free waits for both
    check(cudaFreeAsync(reinterpret_cast<void*>(shard_pointers_[shard]), stream), "cudaFreeAsync (shrink_shards)");
    shard_pointers_[shard] = reinterpret_cast<std::uintptr_t>(exact);
  }
  // the sizes only now: a throw above leaves an array its caller drops (the destructor frees
  // every pointer, replaced or not)
  shard_sizes_ = sizes;
  std::exclusive_scan(shard_sizes_.begin(), shard_sizes_.end(), shard_offsets_.begin(), std::int64_t{0});
  size_ = std::accumulate(shard_sizes_.begin(), shard_sizes_.end(), std::int64_t{0});
}

void ShardedArray::free() {
  std::unique_lock<std::shared_mutex> lock(usage_);  // waits for calls holding a lease
  if (is_freed()) return;
  release_storage();
  freed_.store(true, std::memory_order_release);
}

namespace {

[[noreturn]] void throw_freed(const std::string& what) {
  throw std::invalid_argument(what + ": the array was freed with free()");
}

}  // namespace

void ShardedArray::check_alive(const char* what) const {
  if (is_freed()) throw_freed(what);
}

void ShardedArray::check_scalar(const char* what, const char* algorithm) const {
  if (is_record()) {
    throw std::invalid_argument(std::string(what) + ": " + algorithm +
                                " takes arrays of numbers, not records");
  }
}

ArrayLeases::ArrayLeases(std::vector<Use> uses) {
  std::stable_sort(uses.begin(), uses.end(), [](const Use& left, const Use& right) {
    return std::less<const ShardedArray*>()(left.array, right.array);
  });
  locks_.reserve(uses.size());
  const ShardedArray* previous = nullptr;
  const PlaceGroup* checked = nullptr;
  for (const Use& use : uses) {
    if (use.array == previous) continue;
    previous = use.array;
    locks_.emplace_back(use.array->usage_);
    if (use.array->is_freed()) throw_freed(use.what);
    if (use.array->group_.get() != checked) {  // nothing of a reset device's reaches the driver
      checked = use.array->group_.get();
      checked->check_alive();
    }
  }
}

std::string ShardedArray::describe(const std::string& dtype_label) const {
  const char* storage = storage_ == Storage::separate     ? "separate"
                        : storage_ == Storage::contiguous ? "contiguous"
                                                          : "adopted";
  std::string out = "ShardedArray(size=" + std::to_string(size_) + ", dtype=" +
                    (dtype_label.empty() ? std::string(dtype_name(dtype_)) : dtype_label) + ", " +
                    storage + ", shards=[";
  for (std::size_t shard = 0; shard < num_shards(); ++shard) {
    if (shard) out += ", ";
    out += std::to_string(shard_sizes_[shard]) + "@cuda:" + std::to_string(group_->devices()[shard]);
  }
  return out + "]" + (is_freed() ? ", freed" : "") + ")";
}

}  // namespace csj
