// Internal: what both multi-place sorts (sort.cpp, sort_partition.cpp) use: pinned host
// buffers for their device-to-host reads, key copies between places, copy streams.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <exception>
#include <mutex>
#include <vector>

#include "cuda_check.hpp"

namespace csj::detail {

// Pinned host memory for the sort's small device-to-host reads (splitter counts, bucket
// sizes), reused across calls (cudaMallocHost costs far more than a sort's round trips): buffers go back to a process-wide free list, behind a
// lock, and are kept until exit. Pinned memory belongs to the context it was made in: a
// buffer whose context a device reset destroyed is forgotten, never handed out again.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      auto& free_list = spare();
      for (auto it = free_list.begin(); it != free_list.end();) {
        if (!it->context.alive()) {
          it = free_list.erase(it);
          continue;
        }
        if (it->capacity >= bytes) {
          data = it->data, capacity_ = it->capacity, context_ = it->context;
          free_list.erase(it);
          return;
        }
        ++it;
      }
    }
    context_ = detail::ContextStamp::current();
    check(cudaMallocHost(reinterpret_cast<void**>(&data), bytes), "cudaMallocHost (sort counts)");
    capacity_ = bytes;
  }
  ~PinnedBuffer() {
    std::lock_guard<std::mutex> lock(mutex());
    spare().push_back({data, capacity_, context_});
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  unsigned char* data = nullptr;

 private:
  struct Spare {
    unsigned char* data;
    std::size_t capacity;
    detail::ContextStamp context;
  };
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<Spare>& spare() {
    static std::vector<Spare> buffers;
    return buffers;
  }

  std::size_t capacity_ = 0;
  detail::ContextStamp context_;
};

// Queues a copy of `bytes` between two places' memory: a device-to-device copy on one device,
// a peer copy across two.
inline void copy_keys(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                      cudaStream_t stream) {
  if (bytes == 0) return;
  if (dst_device == src_device) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync (sort keys)");
  } else {
    check(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream), "cudaMemcpyPeerAsync (sort keys)");
  }
}

// A stream of its own on `device` for a sort's copies into a place. Streams are reused across
// calls from a process-wide free list, like PinnedBuffer's (making and destroying them cost
// ~0.01 ms of a two-place sort of 2^28 keys). Left by an exception, it waits for its copies
// before the buffers they touch go; otherwise copies still queued complete after it is
// handed back (a later sort's copies on the same stream queue behind them). A stream whose
// context a device reset destroyed is forgotten.
class CopyStream {
 public:
  explicit CopyStream(int device) : device_(device), exceptions_(std::uncaught_exceptions()) {
    DeviceGuard guard(device);
    context_ = ContextStamp::current();
    {
      std::lock_guard<std::mutex> lock(mutex());
      auto& free_list = spare();
      for (auto it = free_list.begin(); it != free_list.end();) {
        if (!it->context.alive()) {
          it = free_list.erase(it);
          continue;
        }
        if (it->device == device && it->context.id == context_.id) {
          stream_ = it->stream;
          free_list.erase(it);
          return;
        }
        ++it;
      }
    }
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~CopyStream() {
    if (std::uncaught_exceptions() > exceptions_) {
      int previous = 0;
      cudaGetDevice(&previous);
      cudaSetDevice(device_);
      cudaStreamSynchronize(stream_);
      cudaSetDevice(previous);
      cudaGetLastError();
    }
    std::lock_guard<std::mutex> lock(mutex());
    spare().push_back({stream_, device_, context_});
  }
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

 private:
  struct Spare {
    cudaStream_t stream;
    int device;
    ContextStamp context;
  };
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<Spare>& spare() {
    static std::vector<Spare> streams;
    return streams;
  }

  int device_;
  int exceptions_;
  ContextStamp context_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace csj::detail
