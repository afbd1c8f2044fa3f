// Internal: what the multi-place sort's steps share: pinned host buffers for their
// device-to-host reads, key copies between places, copy streams.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <vector>

#include "cuda_check.hpp"

namespace csj::detail {

// A process-wide free list of things made in a CUDA context (pinned buffers, copy streams),
// behind a lock and kept until exit. take() hands out the first spare that `fits`, dropping
// (never destroying) those whose context a device reset destroyed; give() puts one back.
// `Spare` has a ContextStamp member `context`; each Spare type has a list of its own.
template <class Spare>
class SpareList {
 public:
  template <class Fits>
  static std::optional<Spare> take(Fits fits) {
    std::lock_guard<std::mutex> lock(mutex());
    auto& list = spares();
    for (auto it = list.begin(); it != list.end();) {
      if (!it->context.alive()) {
        it = list.erase(it);
        continue;
      }
      if (fits(*it)) {
        Spare spare = *it;
        list.erase(it);
        return spare;
      }
      ++it;
    }
    return std::nullopt;
  }
  static void give(const Spare& spare) {
    std::lock_guard<std::mutex> lock(mutex());
    spares().push_back(spare);
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<Spare>& spares() {
    static std::vector<Spare> list;
    return list;
  }
};

// Pinned host memory for the sort's small host reads (splitter counts, key samples), reused
// across calls (cudaMallocHost costs far more than a sort's round trips) through a SpareList.
// Pinned memory belongs to the context it was made in: a buffer whose context a device reset
// destroyed is forgotten, never handed out again.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t bytes) {
    if (auto spare = Spares::take([bytes](const Spare& s) { return s.capacity >= bytes; })) {
      data = spare->data, capacity_ = spare->capacity, context_ = spare->context;
      return;
    }
    context_ = detail::ContextStamp::current();
    check(cudaMallocHost(reinterpret_cast<void**>(&data), bytes), "cudaMallocHost (sort counts)");
    capacity_ = bytes;
  }
  ~PinnedBuffer() { Spares::give({data, capacity_, context_}); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  unsigned char* data = nullptr;

 private:
  struct Spare {
    unsigned char* data;
    std::size_t capacity;
    detail::ContextStamp context;
  };
  using Spares = SpareList<Spare>;

  std::size_t capacity_ = 0;
  detail::ContextStamp context_;
};

// Queues a copy of `bytes` between two places' memory (copy_between, cuda_check.hpp).
inline void copy_keys(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                      cudaStream_t stream) {
  if (bytes != 0) copy_between(dst, dst_device, src, src_device, bytes, stream, "copying sort keys");
}

// Waits for `stream` of `device`, ignoring errors (for destructors and unwinding).
inline void synchronize_quietly(int device, cudaStream_t stream) noexcept {
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  cudaStreamSynchronize(stream);
  cudaSetDevice(previous);
  cudaGetLastError();
}

// A stream of its own on `device` for a sort's copies into a place. Streams are reused across
// calls through a SpareList, like PinnedBuffer's (making and destroying them cost
// ~0.01 ms of a two-place sort of 2^28 keys). Left by an exception, it waits for its copies
// before the buffers they touch go; otherwise copies still queued complete after it is
// handed back (a later sort's copies on the same stream queue behind them). A stream whose
// context a device reset destroyed is forgotten.
class CopyStream {
 public:
  explicit CopyStream(int device) : device_(device), exceptions_(std::uncaught_exceptions()) {
    DeviceGuard guard(device);
    context_ = ContextStamp::current();
    const unsigned long long context = context_.id;
    if (auto spare = Spares::take(
            [device, context](const Spare& s) { return s.device == device && s.context.id == context; })) {
      stream_ = spare->stream;
      return;
    }
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~CopyStream() {
    if (std::uncaught_exceptions() > exceptions_) synchronize_quietly(device_, stream_);
    Spares::give({stream_, device_, context_});
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
  using Spares = SpareList<Spare>;

  int device_;
  int exceptions_;
  ContextStamp context_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace csj::detail
