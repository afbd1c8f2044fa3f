// Internal: turn CUDA runtime / driver status codes into the exceptions the bindings map
// (std::invalid_argument -> ValueError, std::bad_alloc -> MemoryError,
//  std::runtime_error -> RuntimeError).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <new>
#include <stdexcept>
#include <string>

namespace csj::detail {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* what);
[[noreturn]] void throw_driver_error(CUresult status, const char* what);

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw_cuda_error(status, what);
}

inline void check(CUresult status, const char* what) {
  if (status != CUDA_SUCCESS) throw_driver_error(status, what);
}

// Makes `device` current on this thread for the scope, restoring the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace csj::detail
