#include "cuda_check.hpp"

#include <exception>
#include <utility>

#include "csj/place_group.hpp"
#include "driver_api.hpp"

namespace csj::detail {

void throw_cuda_error(cudaError_t status, const char* what) {
  std::string message = std::string(what) + ": " + cudaGetErrorName(status) + " (" +
                        cudaGetErrorString(status) + ")";
  cudaGetLastError();  // clear the sticky-free error so the next call starts clean
  switch (status) {
    case cudaErrorMemoryAllocation:
      throw std::bad_alloc();
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
      throw std::runtime_error(message +
                               "; no usable NVIDIA driver and GPU are visible on this machine");
    case cudaErrorInvalidDevice:
      throw std::invalid_argument(message);
    default:
      throw std::runtime_error(message);
  }
}

void throw_driver_error(CUresult status, const char* what) {
  if (status == CUDA_ERROR_OUT_OF_MEMORY) throw std::bad_alloc();
  const char* text = "unknown driver error";
  if (driver().cuGetErrorString) driver().cuGetErrorString(status, &text);
  throw std::runtime_error(std::string(what) + ": CUresult " + std::to_string(status) + " (" +
                           text + ")");
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ == device) return;
  // A thread with no current context reads device 0; putting that back would make device
  // 0's primary context (on every rank of a job with a GPU each), so there is nothing to
  // restore then and `device` stays current.
  CUcontext current = nullptr;
  if (driver().cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == nullptr) previous_ = -1;
  check(cudaSetDevice(device), "cudaSetDevice");
}

DeviceGuard::~DeviceGuard() {
  if (previous_ < 0) return;
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
}

ContextStamp ContextStamp::current() {
  check(cudaFree(nullptr), "initialising the device");  // makes the primary context current
  ContextStamp stamp;
  check(driver().cuCtxGetCurrent(&stamp.context), "cuCtxGetCurrent");
  if (!stamp.context) throw std::runtime_error("no CUDA context is current on this thread");
  check(driver().cuCtxGetId(stamp.context, &stamp.id), "cuCtxGetId");
  return stamp;
}

bool ContextStamp::alive() const noexcept {
  if (!context) return false;
  unsigned long long now = 0;
  try {
    // a destroyed context answers CUDA_ERROR_CONTEXT_IS_DESTROYED; a primary context made
    // again after a reset keeps its handle but has a new id
    return driver().cuCtxGetId(context, &now) == CUDA_SUCCESS && now == id;
  } catch (...) {  // no driver: nothing made in a context can be alive
    return false;
  }
}

void* allocate_async(std::size_t bytes, cudaStream_t stream, cudaMemPool_t pool) {
  void* pointer = nullptr;
  check(cudaMallocFromPoolAsync(&pointer, bytes, pool, stream), "cudaMallocFromPoolAsync");
  return pointer;
}

namespace {
// What `pool` keeps cached beyond its allocations.
std::uint64_t pool_slack(cudaMemPool_t pool) {
  std::uint64_t reserved = 0, used = 0;
  check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved), "cudaMemPoolGetAttribute");
  check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used), "cudaMemPoolGetAttribute");
  return reserved > used ? reserved - used : 0;
}

// The driver's free memory on the current device.
std::uint64_t driver_free() {
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}
}  // namespace

std::uint64_t available_memory(cudaMemPool_t pool) { return driver_free() + pool_slack(pool); }

bool has_room(cudaMemPool_t pool, std::uint64_t bytes) {
  const std::uint64_t slack = pool_slack(pool);
  return bytes <= slack || bytes <= driver_free() + slack;
}

bool may_spin() {
  unsigned flags = 0;
  if (cudaGetDeviceFlags(&flags) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return !(flags & cudaDeviceScheduleBlockingSync);
}

StreamScratch::StreamScratch(std::size_t bytes, cudaStream_t stream, cudaMemPool_t pool)
    : pointer_(allocate_async(bytes, stream, pool)), stream_(stream) {}

StreamScratch::StreamScratch(StreamScratch&& other) noexcept
    : pointer_(std::exchange(other.pointer_, nullptr)), stream_(other.stream_) {}

StreamScratch& StreamScratch::operator=(StreamScratch&& other) noexcept {
  if (this != &other) {
    free_noexcept();
    pointer_ = std::exchange(other.pointer_, nullptr);
    stream_ = other.stream_;
  }
  return *this;
}

void StreamScratch::free() {
  if (!pointer_) return;
  void* pointer = std::exchange(pointer_, nullptr);
  check(cudaFreeAsync(pointer, stream_), "cudaFreeAsync");
}

void StreamScratch::free_noexcept() noexcept {
  if (!pointer_) return;
  // stream-ordered: the memory returns to its pool after the work queued on stream_
  if (cudaFreeAsync(std::exchange(pointer_, nullptr), stream_) != cudaSuccess) cudaGetLastError();
}

Event::Event(int device) : device_(device) {
  DeviceGuard guard(device);
  check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
}

Event::~Event() {
  // safe with work still waiting on it: the event's resources go once that work has run
  if (event_ && cudaEventDestroy(event_) != cudaSuccess) cudaGetLastError();
}

void Event::record(cudaStream_t stream) {
  DeviceGuard guard(device_);
  check(cudaEventRecord(event_, stream), "cudaEventRecord");
}

void Event::wait(cudaStream_t waiter) const {
  check(cudaStreamWaitEvent(waiter, event_, 0), "cudaStreamWaitEvent");
}

void wait_for(cudaStream_t waiter, cudaStream_t producer, int producer_device) {
  if (waiter == producer) return;  // a stream is ordered after itself
  Event event(producer_device);
  event.record(producer);
  event.wait(waiter);
}

SyncOnUnwind::SyncOnUnwind(const PlaceGroup& group)
    : group_(group), exceptions_(std::uncaught_exceptions()) {}

SyncOnUnwind::~SyncOnUnwind() {
  if (std::uncaught_exceptions() <= exceptions_) return;
  for (std::size_t place = 0; place < group_.size(); ++place) {
    // a broken context fails at once; the error is already on its way up
    if (cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(group_.stream(place))) != cudaSuccess) {
      cudaGetLastError();
    }
  }
}

}  // namespace csj::detail
