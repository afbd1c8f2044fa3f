// Internal: turn CUDA runtime / driver status codes into the exceptions the bindings map
// (std::invalid_argument -> ValueError, std::bad_alloc -> MemoryError,
//  std::runtime_error -> RuntimeError), and the small owners that keep error paths from
// leaking: device guard, stream-ordered scratch memory, events.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>  // _mm_pause
#endif

#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace csj {
class PlaceGroup;
}

namespace csj::detail {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* what);
[[noreturn]] void throw_driver_error(CUresult status, const char* what);

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw_cuda_error(status, what);
}

inline void check(CUresult status, const char* what) {
  if (status != CUDA_SUCCESS) throw_driver_error(status, what);
}

// Makes `device` current on this thread for the scope, restoring the previous one (none, and
// `device` stays current, when the thread had no current context).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Which context a device's resources (streams, pools, memory, pinned buffers) were made in,
// able to say later whether that context still exists. A device reset (cudaDeviceReset by
// any library in the process) destroys the primary context and everything made in it; the
// runtime then makes a new one with a new id on the next call. Handles of the old one must
// not reach the driver again: some calls crash on them rather than fail.
struct ContextStamp {
  CUcontext context = nullptr;
  unsigned long long id = 0;
  // The current device's context (initialised if it was not).
  static ContextStamp current();
  // One driver call (cuCtxGetId), no lock.
  bool alive() const noexcept;
};

// `bytes` from `pool`, stream-ordered on `stream` (std::bad_alloc when the device is full).
void* allocate_async(std::size_t bytes, cudaStream_t stream, cudaMemPool_t pool);

// Bytes the current device can still give `pool`: the driver's free memory and what the pool
// keeps cached beyond its allocations (it serves from that before it asks the driver for
// more, so a second large call is not refused what the first left in the pool).
std::uint64_t available_memory(cudaMemPool_t pool);
// Whether `pool` can give `bytes` more on the current device (as available_memory counts):
// from what it keeps cached alone where that suffices, which a repeated call finds, and only
// otherwise with the driver's free memory (cudaMemGetInfo, several microseconds a call).
bool has_room(cudaMemPool_t pool, std::uint64_t bytes);

// Stream-ordered scratch memory that frees itself (cudaFreeAsync on the stream it was
// allocated on) when its owner goes out of scope, so a throw between allocation and the last
// use leaks nothing. Work queued on *other* streams that reads it must be waited for first
// (see SyncOnUnwind).
class StreamScratch {
 public:
  StreamScratch() = default;
  StreamScratch(std::size_t bytes, cudaStream_t stream, cudaMemPool_t pool);
  ~StreamScratch() { free_noexcept(); }
  StreamScratch(StreamScratch&& other) noexcept;
  StreamScratch& operator=(StreamScratch&& other) noexcept;
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  void* get() const { return pointer_; }
  unsigned char* bytes() const { return static_cast<unsigned char*>(pointer_); }
  explicit operator bool() const { return pointer_ != nullptr; }
  // Queues the free now (after the work already queued on the stream), reporting failure.
  void free();
  // Hands the memory to the caller, who frees it in some stream's order.
  void* release() { return std::exchange(pointer_, nullptr); }

 private:
  void free_noexcept() noexcept;

  void* pointer_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// A CUDA event (timing disabled) created on `device`, destroyed with its owner.
class Event {
 public:
  explicit Event(int device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Captures the work queued so far on `stream`, a stream of the event's device.
  void record(cudaStream_t stream);
  // Makes `waiter` (a stream of any device) wait for the captured work.
  void wait(cudaStream_t waiter) const;

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

// Makes `waiter` wait for the work queued so far on `producer`, a stream of
// `producer_device` (events belong to the device of the stream they are recorded on).
void wait_for(cudaStream_t waiter, cudaStream_t producer, int producer_device);

// Copies `bytes` from one place's memory to another's on `stream`, in a way a stream capture
// can record: a device-to-device copy on one device; across devices a peer copy, or while
// `stream` is capturing (a graph takes no peer-copy call) a copy in the unified address space.
inline void copy_between(void* dst, int dst_device, const void* src, int src_device, std::size_t bytes,
                         cudaStream_t stream, const char* what) {
  if (dst_device == src_device) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), what);
    return;
  }
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capturing), what);
  if (capturing != cudaStreamCaptureStatusNone) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream), what);
  } else {
    check(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream), what);
  }
}

// When its scope is left by an exception, waits for every place's stream of `group` before
// the scratch declared *earlier* in the scope is freed: work already queued on one place may
// still read or write another place's scratch (the cross-place fold, peer copies). Costs
// nothing on success.
class SyncOnUnwind {
 public:
  explicit SyncOnUnwind(const PlaceGroup& group);
  ~SyncOnUnwind();
  SyncOnUnwind(const SyncOnUnwind&) = delete;
  SyncOnUnwind& operator=(const SyncOnUnwind&) = delete;

 private:
  const PlaceGroup& group_;
  int exceptions_;
};

// A spinning wait's pause between two looks (the core's hint that it spins).
inline void relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Whether a wait on the current device may spin: not where the device is set to block on
// synchronisation (cudaDeviceScheduleBlockingSync), which asks waits to sleep. Not knowing,
// it spins (the failed query's error cleared, so no later launch check reports it).
bool may_spin();

// Spins until `stored()`: a look at pinned host memory (mapped under unified addressing) that
// work queued on `stream` stores into, so the host learns a value without a copy and a stream
// synchronisation behind it. Pauses between looks; every 4096 looks it asks the stream, so a
// failed stream raises its error (naming `what`). Returns false when the stream finished with
// nothing stored (the work that stores never ran).
template <class Stored>
bool spin_until_stored(Stored stored, cudaStream_t stream, const char* what) {
  for (unsigned spins = 1; !stored(); ++spins) {
    relax();
    if (spins % 4096 != 0) continue;
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaErrorNotReady) continue;
    check(state, what);
    return stored();
  }
  return true;
}

// spin_until_stored, where a device set to block on synchronisation (may_spin) is first
// waited for with cudaStreamSynchronize rather than spun on.
template <class Stored>
bool wait_until_stored(Stored stored, cudaStream_t stream, const char* what) {
  if (!may_spin()) check(cudaStreamSynchronize(stream), what);
  return spin_until_stored(stored, stream, what);
}

}  // namespace csj::detail
