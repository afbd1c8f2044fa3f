// Internal: pinned host buffers for the sort's device-to-host reads, kept for reuse.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
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

}  // namespace csj::detail
