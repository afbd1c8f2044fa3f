// Internal: one launch path for kernels from a run-time linked library (driver API,
// CUkernel) and kernels compiled into the shim (runtime API, function pointer).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "driver_api.hpp"

namespace csj::detail {

struct KernelHandle {
  enum class Api { driver, runtime } api = Api::runtime;
  const void* function = nullptr;

  static KernelHandle linked(void* kernel) { return {Api::driver, kernel}; }
  static KernelHandle builtin(const void* kernel) { return {Api::runtime, kernel}; }
};

// Launches `kernel(*params)` (one parameter block, passed by value), with optional dynamic
// shared memory.
template <class Params>
void launch(const KernelHandle& kernel, unsigned grid, unsigned block, cudaStream_t stream,
            Params& params, const char* what, unsigned shared_bytes = 0) {
  void* args[] = {&params};
  if (kernel.api == KernelHandle::Api::driver) {
    check(driver().cuLaunchKernel(reinterpret_cast<CUfunction>(const_cast<void*>(kernel.function)),
                                  grid, 1, 1, block, 1, 1, shared_bytes, reinterpret_cast<CUstream>(stream),
                                  args, nullptr),
          what);
  } else {
    check(cudaLaunchKernel(kernel.function, dim3(grid), dim3(block), args, shared_bytes, stream), what);
  }
}

// Throws std::invalid_argument (naming `libraries`) unless it holds one library, not null,
// for each of `places` places.
template <class Library>
void check_libraries(const std::vector<const Library*>& libraries, std::size_t places) {
  if (libraries.size() != places) {
    throw std::invalid_argument("libraries: expected one per place (" + std::to_string(places) + "), got " +
                                std::to_string(libraries.size()));
  }
  for (const Library* library : libraries) {
    if (!library) throw std::invalid_argument("libraries: None");
  }
}

// Resident blocks per multiprocessor of the current device (at least 1): sizing grids to
// exactly one wave keeps every block's fixed share of work running concurrently. Cached per
// (kernel, device, block size): the answer never changes for a loaded kernel.
int blocks_per_multiprocessor(const KernelHandle& kernel, int block);

// Number of multiprocessors of `device`.
int multiprocessors(int device);

// Asks once per kernel and device for the largest shared-memory carveout, which kernels whose
// blocks stage tiles in shared memory need to fit their launch bounds' blocks a
// multiprocessor. It is a hint: a refusal is not an error of the call, and a kernel loaded later
// at an address seen before is not asked again, which costs speed at most.
void prefer_shared_memory(const KernelHandle& kernel, int device);

}  // namespace csj::detail
