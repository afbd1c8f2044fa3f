// The selection engine's JIT module (select_params.hpp, bodies in select.cuh): built to
// LTO-IR, one module per element size (CSJ_ELEMENT_SIZE: 4 and 8 for numbers, 4 to 32 for
// records), and linked at run time with the predicates' C-ABI wrapper that numba compiled,
// which reads the element (records field by field) and returns its class:
//   int csj_select_class(const void* element, long long global_index)
//   select / partition: 0 where pred(x), else 1; three_way_partition: 0 where first(x),
//   1 where second(x), else 2 (the index reaches operators that asked for it)
// The kernels move elements as opaque words of their size; after linking the wrapper is
// inlined, the pointer gone. The scatter loads its tile through CUB's warp-transposing block
// load (coalesced reads into the blocked order the ranks need) and stores it from shared
// memory, each class's elements in one contiguous run.
#include <cub/block/block_load.cuh>

#include "select.cuh"
#include "transform.cuh"

#if !defined(CSJ_ELEMENT_SIZE)
#error "CSJ_ELEMENT_SIZE must be defined"
#endif

extern "C" __device__ int csj_select_class(const void*, long long);

namespace {

using namespace csj::kernels;

using Element = Word<CSJ_ELEMENT_SIZE>::type;
constexpr int kItems = select_items(CSJ_ELEMENT_SIZE);
constexpr int kTile = kSelectBlock * kItems;

}  // namespace

extern "C" __global__ void __launch_bounds__(kSelectBlock)
    csj_select_count(const __grid_constant__ SelectParams params) {
  const Element* in = static_cast<const Element*>(params.in);
  count_tile<kItems>(params, [&](long long local) {
    const Element element = in[local];
    return csj_select_class(&element, params.index_base + local);
  });
}

// At most 64 registers (4 blocks a multiprocessor): uncapped, the compiler took 99 and the
// scatter, two blocks a multiprocessor, was bound by instruction issue. The load's staging
// and the tile's slots share their shared memory.
__device__ __forceinline__ void select_scatter(const SelectParams& params) {
  using Load = cub::BlockLoad<Element, kSelectBlock, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;
  // the load's storage is done with before the first slot is written: scatter_tile's block
  // scan (raking, more than one warp) syncs the block in between
  static_assert(kSelectBlock > 32, "the block scan's barrier frees the load's storage");
  __shared__ union {
    typename Load::TempStorage load;
    Element staged[kTile];  // the tile's elements by slot (select.cuh)
  } shared;
  auto& load_storage = shared.load;
  auto& staged = shared.staged;
  const long long first = static_cast<long long>(blockIdx.x) * kTile;
  const long long left = params.n - first;
  const int valid = left < kTile ? static_cast<int>(left) : kTile;
  const Element* in = static_cast<const Element*>(params.in) + first;
  Element items[kItems];
  if (valid == kTile) {
    Load(load_storage).Load(in, items);
  } else {
    Load(load_storage).Load(in, items, valid);
  }
  int classes[kItems];
#pragma unroll
  for (int item = 0; item < kItems; ++item) {
    const int local = static_cast<int>(threadIdx.x) * kItems + item;
    classes[item] = local < valid ? csj_select_class(&items[item], params.index_base + first + local) : -1;
  }
  scatter_tile<kItems>(
      params, classes, [&](int item, int slot) { staged[slot] = items[item]; },
      [&](int slot, int cls, long long position) {
        static_cast<Element*>(params.out[cls])[position] = staged[slot];
      });
}

extern "C" __global__ void __launch_bounds__(kSelectBlock, 4)
    csj_select_scatter(const __grid_constant__ SelectParams params) {
  select_scatter(params);
}
