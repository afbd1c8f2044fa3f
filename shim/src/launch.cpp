#include "launch.hpp"

#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

namespace csj::detail {

int multiprocessors(int device) {
  int count = 0;
  check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

int blocks_per_multiprocessor(const KernelHandle& kernel, int block) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, int> known;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const auto key = std::make_tuple(kernel.function, device, block);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = known.find(key);
    if (found != known.end()) return found->second;
  }
  int blocks = 0;
  if (kernel.api == KernelHandle::Api::driver) {
    CUfunction function = nullptr;
    check(driver().cuKernelGetFunction(&function, reinterpret_cast<CUkernel>(const_cast<void*>(kernel.function))),
          "cuKernelGetFunction");
    check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, function, block, 0),
          "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  } else {
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel.function, block, 0),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  }
  blocks = blocks > 0 ? blocks : 1;
  std::lock_guard<std::mutex> lock(mutex);
  known.emplace(key, blocks);
  return blocks;
}

void prefer_shared_memory(const KernelHandle& kernel, int device) {
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;
  const std::lock_guard<std::mutex> hold(mutex);
  if (!done.insert({kernel.function, device}).second) return;
  if (kernel.api == KernelHandle::Api::driver) {
    CUdevice handle = 0;
    if (driver().cuDeviceGet(&handle, device) == CUDA_SUCCESS) {
      driver().cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100,
                                    static_cast<CUkernel>(const_cast<void*>(kernel.function)), handle);
    }
  } else if (cudaFuncSetAttribute(kernel.function, cudaFuncAttributePreferredSharedMemoryCarveout, 100) !=
             cudaSuccess) {
    cudaGetLastError();  // the refusal's own error, left for no later call to find
  }
}

}  // namespace csj::detail
