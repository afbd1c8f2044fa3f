// A 1-D array split into shards, shard i living on place i of its group.
// Placement (shard sizes and offsets) and the backing storage live here, once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "csj/dtype.hpp"
#include "csj/place_group.hpp"

namespace csj {

enum class Storage { separate, contiguous, adopted };

class ShardedArray {
 public:
  // The even split of n over `places`: the first n % places shards get one extra element.
  static std::vector<std::int64_t> even_sizes(std::int64_t n, std::size_t places);

  // One allocation per shard (stream-ordered, on the shard's device).
  static std::shared_ptr<ShardedArray> allocate(std::shared_ptr<PlaceGroup> group,
                                                std::vector<std::int64_t> sizes, DType dtype);
  // One virtual address range (CUDA VMM) whose physical pages follow the shards.
  static std::shared_ptr<ShardedArray> allocate_contiguous(std::shared_ptr<PlaceGroup> group,
                                                           std::vector<std::int64_t> sizes,
                                                           DType dtype);
  // Zero-copy over device buffers the caller owns, one per place; never freed here.
  static std::shared_ptr<ShardedArray> adopt(std::shared_ptr<PlaceGroup> group,
                                             const std::vector<std::uintptr_t>& pointers,
                                             std::vector<std::int64_t> sizes, DType dtype);

  ShardedArray(const ShardedArray&) = delete;
  ShardedArray& operator=(const ShardedArray&) = delete;
  ~ShardedArray();

  const std::shared_ptr<PlaceGroup>& group() const { return group_; }
  DType dtype() const { return dtype_; }
  Storage storage() const { return storage_; }
  std::int64_t size() const { return size_; }
  std::size_t num_shards() const { return shard_sizes_.size(); }
  const std::vector<std::int64_t>& shard_sizes() const { return shard_sizes_; }
  const std::vector<std::int64_t>& shard_offsets() const { return shard_offsets_; }
  std::int64_t shard_size(std::size_t shard) const;
  std::int64_t shard_offset(std::size_t shard) const;
  std::uintptr_t shard_pointer(std::size_t shard) const;
  // Base of the virtual range of a contiguous array (0 for other storage or when empty).
  std::uintptr_t base_pointer() const;
  // For contiguous arrays: the device that physically backs each granule-aligned chunk.
  std::vector<std::int64_t> physical_chunk_bytes() const { return chunk_bytes_; }

  // Whole-array copies through host memory of size() * itemsize bytes (synchronous).
  void copy_from_host(std::uintptr_t host, std::size_t nbytes);
  void copy_to_host(std::uintptr_t host, std::size_t nbytes) const;

  // Releases device memory now (owned storage); later use raises ValueError. Idempotent.
  void free();
  bool is_freed() const;
  // std::invalid_argument when freed.
  void check_alive(const char* what) const;
  std::string describe() const;

 private:
  ShardedArray(std::shared_ptr<PlaceGroup> group, std::vector<std::int64_t> sizes, DType dtype,
               Storage storage);
  void release_storage() noexcept;

  std::shared_ptr<PlaceGroup> group_;
  DType dtype_;
  Storage storage_;
  std::int64_t size_ = 0;
  std::vector<std::int64_t> shard_sizes_;
  std::vector<std::int64_t> shard_offsets_;
  std::vector<std::uintptr_t> shard_pointers_;

  // contiguous storage
  std::uintptr_t va_base_ = 0;
  std::size_t va_bytes_ = 0;
  std::vector<std::int64_t> chunk_bytes_;           // physical bytes per place, in place order
  std::vector<unsigned long long> chunk_handles_;   // CUmemGenericAllocationHandle per chunk

  mutable std::mutex mutex_;
  bool freed_ = false;
};

}  // namespace csj
