// A 1-D array split into shards, shard i living on place i of its group.
// Placement (shard sizes and offsets) and the backing storage live here, once.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
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

  // One allocation per shard (stream-ordered, on the shard's device). `record_size`: the
  // element size of a DType::record (0 for scalars, see element_size).
  static std::shared_ptr<ShardedArray> allocate(std::shared_ptr<PlaceGroup> group,
                                                std::vector<std::int64_t> sizes, DType dtype,
                                                std::size_t record_size = 0);
  // One virtual address range (CUDA VMM) whose physical pages follow the shards.
  static std::shared_ptr<ShardedArray> allocate_contiguous(std::shared_ptr<PlaceGroup> group,
                                                           std::vector<std::int64_t> sizes,
                                                           DType dtype, std::size_t record_size = 0);
  // Zero-copy over device buffers the caller owns, one per place; never freed here. Each
  // buffer must lie whole inside memory of its place's device (pointer, alignment, extent).
  // `streams` (empty, or one per buffer: 0 for none, as check_foreign_stream takes them) are
  // the producers' streams: all are checked, then each place's stream waits for its own.
  static std::shared_ptr<ShardedArray> adopt(std::shared_ptr<PlaceGroup> group,
                                             const std::vector<std::uintptr_t>& pointers,
                                             std::vector<std::int64_t> sizes, DType dtype,
                                             std::size_t record_size = 0,
                                             const std::vector<std::uintptr_t>& streams = {});

  ShardedArray(const ShardedArray&) = delete;
  ShardedArray& operator=(const ShardedArray&) = delete;
  ~ShardedArray();

  const std::shared_ptr<PlaceGroup>& group() const { return group_; }
  DType dtype() const { return dtype_; }
  // Bytes per element: the scalar's size, or the record's.
  std::size_t itemsize() const { return itemsize_; }
  bool is_record() const { return dtype_ == DType::record; }
  Storage storage() const { return storage_; }
  std::int64_t size() const { return size_; }
  std::size_t num_shards() const { return shard_sizes_.size(); }
  const std::vector<std::int64_t>& shard_sizes() const { return shard_sizes_; }
  const std::vector<std::int64_t>& shard_offsets() const { return shard_offsets_; }
  std::int64_t shard_size(std::size_t shard) const;
  std::int64_t shard_offset(std::size_t shard) const;
  // The global index of this array's element 0: 0 for an array of one process. An array that
  // is one process's part of a larger one (a multi-process group, cuda_sharded_jit/distributed)
  // starts where that process's first place starts. Set once, before any use.
  std::int64_t index_origin() const { return index_origin_; }
  void set_index_origin(std::int64_t origin);
  // index_origin() + shard_offset(shard): the global index of the shard's first element, as
  // the kernels' index_base parameters take it (operators that receive the index).
  std::int64_t index_base(std::size_t shard) const;
  std::uintptr_t shard_pointer(std::size_t shard) const;
  // shard_pointer(shard) - index_base(shard) * itemsize(), wrapping: element i of the
  // shard (global index index_base + i) lives at this base + global index * itemsize.
  // Operators that address their elements themselves (records) take it with the global index.
  std::uintptr_t global_base(std::size_t shard) const;
  // Base of the virtual range of a contiguous array (0 for other storage or when empty).
  std::uintptr_t base_pointer() const;
  // For contiguous arrays: the device that physically backs each granule-aligned chunk.
  std::vector<std::int64_t> physical_chunk_bytes() const { return chunk_bytes_; }

  // Whole-array copies through host memory of size() * itemsize bytes (synchronous).
  void copy_from_host(std::uintptr_t host, std::size_t nbytes);
  void copy_to_host(std::uintptr_t host, std::size_t nbytes) const;
  // The same for elements [start, stop) and (stop - start) * itemsize host bytes: only the
  // shards the range touches are copied, and only their places waited for (host indexing).
  void copy_range_from_host(std::int64_t start, std::int64_t stop, std::uintptr_t host, std::size_t nbytes);
  void copy_range_to_host(std::int64_t start, std::int64_t stop, std::uintptr_t host, std::size_t nbytes) const;

  // For an array an algorithm allocated larger than its result (separate storage, before
  // anyone else holds it): shard i now holds its first sizes[i] elements (at most its size).
  // A shard that keeps at least a quarter of its elements keeps its allocation (freed whole
  // later); one that keeps fewer is copied to an allocation of its new size and the old one
  // freed, both stream-ordered on the shard's place, so memory stays within four times the
  // elements kept.
  void shrink_shards(const std::vector<std::int64_t>& sizes);

  // Releases device memory now (owned storage); later use raises ValueError. Idempotent.
  // Waits for calls that hold a lease on the array (ArrayLeases) to finish queueing their
  // work; the memory itself is released stream-ordered, after that work.
  void free();
  bool is_freed() const { return freed_.load(std::memory_order_acquire); }
  // std::invalid_argument when freed.
  void check_alive(const char* what) const;
  // std::invalid_argument naming `what` when the elements are records, which `algorithm`
  // (a built-in kernel that knows only scalars) cannot take.
  void check_scalar(const char* what, const char* algorithm) const;
  // "ShardedArray(size=..., dtype=..., storage, shards=[...])"; `dtype_label` replaces the
  // dtype's name (Python describes a record's fields).
  std::string describe(const std::string& dtype_label = {}) const;

 private:
  friend class ArrayLeases;
  ShardedArray(std::shared_ptr<PlaceGroup> group, std::vector<std::int64_t> sizes, DType dtype,
               std::size_t record_size, Storage storage);
  void release_storage() noexcept;
  void copy_range(std::int64_t start, std::int64_t stop, std::uintptr_t host, std::size_t nbytes, bool to_host) const;

  std::shared_ptr<PlaceGroup> group_;
  DType dtype_;
  std::size_t itemsize_;
  Storage storage_;
  std::int64_t size_ = 0;
  std::int64_t index_origin_ = 0;
  std::vector<std::int64_t> shard_sizes_;
  std::vector<std::int64_t> shard_offsets_;
  std::vector<std::uintptr_t> shard_pointers_;

  // contiguous storage
  std::uintptr_t va_base_ = 0;
  std::size_t va_bytes_ = 0;
  std::vector<std::int64_t> chunk_bytes_;           // physical bytes per place, in place order
  std::vector<unsigned long long> chunk_handles_;   // CUmemGenericAllocationHandle per chunk
  std::vector<std::size_t> mapped_offsets_;         // offset of each chunk mapped so far
  std::vector<std::size_t> mapped_bytes_;

  // Algorithm calls hold it shared for as long as they use the shard pointers; free() takes
  // it exclusively. Pointers are never rewritten after construction: freed_ alone says
  // whether they may be used.
  mutable std::shared_mutex usage_;
  std::atomic<bool> freed_{false};
};

// Copies `width` bytes at `src_offset` of every element of `src` to `dst_offset` of the
// element of `dst` with the same index (same group and shard sizes), stream-ordered on each
// place: a field (a lane) of records in or out, or, with both offsets 0 and width the two
// itemsizes, a whole copy. For sort_by_key's values wider than 8 bytes, which travel a lane at
// a time.
void copy_lanes(const ShardedArray& src, std::size_t src_offset, ShardedArray& dst, std::size_t dst_offset,
                std::size_t width);

// Shared leases on the arrays one algorithm call uses, held for the whole call: free() on
// another thread waits until the call has queued its work, and an array already freed raises
// std::invalid_argument naming it ("a: the array was freed with free()"). An array listed
// twice (out aliasing an input) is leased once; leases are taken in address order, so calls
// sharing arrays cannot deadlock.
class ArrayLeases {
 public:
  struct Use {
    const ShardedArray* array;
    std::string what;  // the argument's name in errors
  };
  explicit ArrayLeases(std::vector<Use> uses);
  ArrayLeases(ArrayLeases&&) = default;
  ArrayLeases(const ArrayLeases&) = delete;
  ArrayLeases& operator=(const ArrayLeases&) = delete;

 private:
  std::vector<std::shared_lock<std::shared_mutex>> locks_;
};

}  // namespace csj
