#include "driver_api.hpp"

#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace csj::detail {
namespace {

template <class Fn>
void load(Fn& slot, const char* symbol) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaError_t status =
      cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found);
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
    cudaGetLastError();
    throw std::runtime_error(std::string("CUDA driver entry point ") + symbol +
                             " is unavailable: no NVIDIA driver (>= 12.0) is visible on this "
                             "machine");
  }
  slot = reinterpret_cast<Fn>(address);
}

DriverApi load_all() {
  DriverApi api;
  load(api.cuGetErrorString, "cuGetErrorString");
  load(api.cuMemAddressReserve, "cuMemAddressReserve");
  load(api.cuMemAddressFree, "cuMemAddressFree");
  load(api.cuMemCreate, "cuMemCreate");
  load(api.cuMemRelease, "cuMemRelease");
  load(api.cuMemMap, "cuMemMap");
  load(api.cuMemUnmap, "cuMemUnmap");
  load(api.cuMemSetAccess, "cuMemSetAccess");
  load(api.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
  load(api.cuLibraryLoadData, "cuLibraryLoadData");
  load(api.cuLibraryUnload, "cuLibraryUnload");
  load(api.cuLibraryGetKernel, "cuLibraryGetKernel");
  load(api.cuLaunchKernel, "cuLaunchKernel");
  load(api.cuKernelGetFunction, "cuKernelGetFunction");
  load(api.cuKernelSetAttribute, "cuKernelSetAttribute");
  load(api.cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  load(api.cuCtxGetCurrent, "cuCtxGetCurrent");
  load(api.cuCtxGetId, "cuCtxGetId");
  load(api.cuCtxPushCurrent, "cuCtxPushCurrent");
  load(api.cuCtxPopCurrent, "cuCtxPopCurrent");
  load(api.cuCtxGetDevice, "cuCtxGetDevice");
  load(api.cuDeviceGet, "cuDeviceGet");
  load(api.cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState");
  load(api.cuStreamGetCtx, "cuStreamGetCtx");
  load(api.cuPointerGetAttributes, "cuPointerGetAttributes");
  return api;
}

}  // namespace

const DriverApi& driver() {
  // call_once retries when the loader throws (no driver yet), and is a single atomic load
  // on the hot path once loaded.
  static std::once_flag once;
  static DriverApi api;
  std::call_once(once, [] { api = load_all(); });
  return api;
}

}  // namespace csj::detail
