#include "launch.hpp"

#include <map>
#include <mutex>
#include <tuple>

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

}  // namespace csj::detail
