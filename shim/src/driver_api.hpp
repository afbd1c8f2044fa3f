// Internal: driver API entry points, fetched through the (statically linked) runtime so that
// the extension imports on machines without libcuda. Calls before a driver exists throw
// std::runtime_error.
#pragma once

#include <cuda.h>

namespace csj::detail {

struct DriverApi {
  decltype(&::cuGetErrorString) cuGetErrorString = nullptr;
  decltype(&::cuMemAddressReserve) cuMemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) cuMemAddressFree = nullptr;
  decltype(&::cuMemCreate) cuMemCreate = nullptr;
  decltype(&::cuMemRelease) cuMemRelease = nullptr;
  decltype(&::cuMemMap) cuMemMap = nullptr;
  decltype(&::cuMemUnmap) cuMemUnmap = nullptr;
  decltype(&::cuMemSetAccess) cuMemSetAccess = nullptr;
  decltype(&::cuMemGetAllocationGranularity) cuMemGetAllocationGranularity = nullptr;
  decltype(&::cuLibraryLoadData) cuLibraryLoadData = nullptr;
  decltype(&::cuLibraryUnload) cuLibraryUnload = nullptr;
  decltype(&::cuLibraryGetKernel) cuLibraryGetKernel = nullptr;
  decltype(&::cuLaunchKernel) cuLaunchKernel = nullptr;
  decltype(&::cuKernelGetFunction) cuKernelGetFunction = nullptr;
  decltype(&::cuKernelSetAttribute) cuKernelSetAttribute = nullptr;
  decltype(&::cuOccupancyMaxActiveBlocksPerMultiprocessor) cuOccupancyMaxActiveBlocksPerMultiprocessor = nullptr;
  decltype(&::cuCtxGetCurrent) cuCtxGetCurrent = nullptr;
  decltype(&::cuCtxGetId) cuCtxGetId = nullptr;
  decltype(&::cuCtxPushCurrent) cuCtxPushCurrent = nullptr;
  decltype(&::cuCtxPopCurrent) cuCtxPopCurrent = nullptr;
  decltype(&::cuCtxGetDevice) cuCtxGetDevice = nullptr;
  decltype(&::cuDeviceGet) cuDeviceGet = nullptr;
  decltype(&::cuDevicePrimaryCtxGetState) cuDevicePrimaryCtxGetState = nullptr;
  decltype(&::cuStreamGetCtx) cuStreamGetCtx = nullptr;
  decltype(&::cuPointerGetAttributes) cuPointerGetAttributes = nullptr;
};

// Loaded once, thread-safely.
const DriverApi& driver();

}  // namespace csj::detail
