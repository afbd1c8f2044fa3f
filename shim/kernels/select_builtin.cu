// The flagged compaction's kernels, compiled into the shim (no operator to link): the
// selection engine's bodies (select.cuh) with each element's class read from a flags shard
// (4- or 8-byte integers: 0 where the flag is nonzero, 1 elsewhere) and, in place of the
// flags, up to kMaxSelectPayloads arrays of the same shard sizes moved, each of its own
// element size (a multiple of 4 bytes, copied a 4-byte word at a time). The by-key
// algorithms compact their run heads (keys and values) with it.
#include "builtin_kernels.hpp"
#include "select.cuh"

namespace csj::kernels {
namespace {

constexpr int kFlagItems = 8;

template <class Flag>
__global__ void __launch_bounds__(kSelectBlock) select_flags_count(const __grid_constant__ SelectParams params) {
  const Flag* flags = static_cast<const Flag*>(params.in);
  count_tile<kFlagItems>(params, [&](long long local) { return flags[local] != 0 ? 0 : 1; });
}

__global__ void __launch_bounds__(kSelectScanBlock) select_flags_scan(const __grid_constant__ SelectParams params) {
  scan_tiles(params);
}

template <class Flag>
__global__ void __launch_bounds__(kSelectBlock) select_flags_scatter(const __grid_constant__ SelectParams params) {
  const Flag* flags = static_cast<const Flag*>(params.in);
  const long long first = static_cast<long long>(blockIdx.x) * kSelectBlock * kFlagItems +
                          static_cast<long long>(threadIdx.x) * kFlagItems;
  int classes[kFlagItems];
#pragma unroll
  for (int item = 0; item < kFlagItems; ++item) {
    const long long local = first + item;
    classes[item] = local < params.n ? (flags[local] != 0 ? 0 : 1) : -1;
  }
  scatter_tile<kFlagItems>(params, classes, [&](int item, int cls, long long position) {
    if (cls != 0) return;
    const long long local = first + item;
    for (int k = 0; k < params.payloads; ++k) {
      const int words = params.payload_size[k] / 4;
      const unsigned* from = static_cast<const unsigned*>(params.payload_in[k]) + local * words;
      unsigned* to = static_cast<unsigned*>(params.payload_out[k]) + position * words;
      for (int w = 0; w < words; ++w) to[w] = from[w];
    }
  });
}

}  // namespace

SelectFlagKernels builtin_select_flag_kernels(int flag_size) {
  if (flag_size == 8) {
    return {reinterpret_cast<const void*>(&select_flags_count<unsigned long long>),
            reinterpret_cast<const void*>(&select_flags_scan),
            reinterpret_cast<const void*>(&select_flags_scatter<unsigned long long>)};
  }
  return {reinterpret_cast<const void*>(&select_flags_count<unsigned>),
          reinterpret_cast<const void*>(&select_flags_scan),
          reinterpret_cast<const void*>(&select_flags_scatter<unsigned>)};
}

}  // namespace csj::kernels
