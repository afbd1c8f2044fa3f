// Reused per-device memory for kernels that hand their result to the host themselves (the
// reduce's and the histogram's last block): device memory that reads zero between uses (the
// kernels reset what they count in) and pinned, device-visible host memory where the result
// and the word the host waits on land. One pool serves each kind of slot: slots are kept per
// (device, context id), so a reset device's old context never hands out memory that went with
// it; they come in batches, are reused across calls and kept until exit.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda_check.hpp"

namespace csj::detail {

// One batch's memory on `device`: `device_bytes` of device memory, zeroed, and `host_bytes`
// of pinned host memory mapped into the device's address space (with unified addressing its
// host address is also its device address).
struct SlotMemory {
  unsigned char* device = nullptr;
  unsigned char* host = nullptr;
};

inline SlotMemory allocate_slot_memory(int device, std::size_t device_bytes, std::size_t host_bytes,
                                       const char* what) {
  DeviceGuard guard(device);
  SlotMemory memory;
  check(cudaMalloc(reinterpret_cast<void**>(&memory.device), device_bytes), what);
  // Counters must read zero before any kernel counts in them: cudaMemset would queue on the
  // legacy stream, which the group's non-blocking streams do not wait for (and other
  // libraries' work may hold it back), so clear on a stream of our own and wait.
  cudaStream_t stream = nullptr;
  cudaError_t status = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (status == cudaSuccess) status = cudaMemsetAsync(memory.device, 0, device_bytes, stream);
  if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
  if (stream) cudaStreamDestroy(stream);
  if (status == cudaSuccess) {
    status = cudaHostAlloc(reinterpret_cast<void**>(&memory.host), host_bytes,
                           cudaHostAllocPortable | cudaHostAllocMapped);
  }
  if (status != cudaSuccess) {
    cudaFree(memory.device);
    check(status, what);
  }
  return memory;
}

// The free slots of one kind (a Slot has `device` and `context`), behind one mutex.
template <class Slot>
class SlotPool {
 public:
  // A free slot of `device` in the context `context`; `add_batch(free_slots)` fills the list
  // when it is empty.
  template <class AddBatch>
  Slot acquire(int device, unsigned long long context, AddBatch&& add_batch) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Slot>& free_slots = free_[{device, context}];
    if (free_slots.empty()) add_batch(free_slots);
    const Slot slot = free_slots.back();
    free_slots.pop_back();
    return slot;
  }

  void release(const Slot& slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[{slot.device, slot.context}].push_back(slot);
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, unsigned long long>, std::vector<Slot>> free_;
};

// The pinned host words one call's kernel hands its result over in, each stored whole as
// `ticket << Shift | payload` with the call's ticket (Shift + TicketBits = 64). Taking them
// (their last use over: nothing stores to them now) draws the next ticket from word 0, which
// shows the last one stored, and clears `count` words, so that a word left from an older call
// (more words, or the same ticket 2^TicketBits calls ago) never matches; 0 marks a cleared word.
template <int Shift, int TicketBits>
class TicketedWords {
  static_assert(Shift > 0 && TicketBits > 0 && Shift + TicketBits == 64,
                "a ticket fills the bits above a payload, both of them at least one bit");

 public:
  TicketedWords(volatile unsigned long long* words, int count) : words_(words), count_(count) {
    ticket_ = ((words[0] >> Shift) + 1) & ((1ull << TicketBits) - 1);
    if (ticket_ == 0) ticket_ = 1;
    for (int w = 0; w < count; ++w) words[w] = 0;
  }

  unsigned long long ticket() const { return ticket_; }

  // Every word shows the ticket (those seen to already are not looked at again).
  bool stored() {
    for (; checked_ < count_; ++checked_) {
      if (words_[checked_] >> Shift != ticket_) return false;
    }
    return true;
  }

  unsigned long long payload(int w) const { return words_[w] & ((1ull << Shift) - 1); }

 private:
  volatile unsigned long long* words_;
  int count_;
  int checked_ = 0;
  unsigned long long ticket_ = 0;
};

}  // namespace csj::detail
