#include "cuda_check.hpp"

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
  if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
}

}  // namespace csj::detail
