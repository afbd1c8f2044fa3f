// The selection engine's JIT module (select_params.hpp, bodies in select.cuh): built to
// LTO-IR, one module per element size (CSJ_ELEMENT_SIZE: 4 and 8 for numbers, 4 to 32 for
// records), and linked at run time with the predicates' C-ABI wrapper that numba compiled,
// which reads the element (records field by field) and returns its class:
//   int csj_select_class(const void* element, long long global_index)
//   select / partition: 0 where pred(x), else 1; three_way_partition: 0 where first(x),
//   1 where second(x), else 2 (the index reaches operators that asked for it)
// The kernels move elements as opaque words of their size; after linking the wrapper is
// inlined, the pointer gone. The scatter and the single pass load their tiles through CUB's
// warp-transposing block load (coalesced reads into the blocked order the ranks need) and
// store them from shared memory, each class's elements in one contiguous run.
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
using Load = cub::BlockLoad<Element, kSelectBlock, kItems, cub::BLOCK_LOAD_WARP_TRANSPOSE>;

}  // namespace

extern "C" __global__ void __launch_bounds__(kSelectBlock)
    csj_select_count(const __grid_constant__ SelectParams params) {
  const Element* in = static_cast<const Element*>(params.in);
  count_tile<kItems>(params, [&](long long local) {
    const Element element = in[local];
    return csj_select_class(&element, params.index_base + local);
  });
}

// The tile starting at element `first` loaded (CUB's warp-transposing block load: coalesced
// reads into the blocked order the ranks need) and classified, -1 past the shard's end.
template <class Classes>
__device__ __forceinline__ void load_and_classify(const SelectParams& params, long long first,
                                                  Load::TempStorage& load_storage, Element (&items)[kItems],
                                                  Classes& classes) {
  const long long left = params.n - first;
  const int valid = left < kTile ? static_cast<int>(left) : kTile;
  const Element* in = static_cast<const Element*>(params.in) + first;
  if (valid == kTile) {
    Load(load_storage).Load(in, items);
  } else {
    Load(load_storage).Load(in, items, valid);
  }
#pragma unroll
  for (int item = 0; item < kItems; ++item) {
    const int local = static_cast<int>(threadIdx.x) * kItems + item;
    if (local < valid) classes.set(item, csj_select_class(&items[item], params.index_base + first + local));
  }
}

// The load's staging and the tile's slots share their shared memory: the load's storage is
// done with before the first slot is written, because stage_tile's block scan (raking, more
// than one warp) syncs the block in between.
static_assert(kSelectBlock > 32, "the block scan's barrier frees the load's storage");
union TileStorage {
  Load::TempStorage load;
  Element staged[kTile];  // the tile's elements by slot (select.cuh)
};

// At most 64 registers (4 blocks a multiprocessor): uncapped, the compiler took 99 and the
// scatter, two blocks a multiprocessor, was bound by instruction issue.
__device__ __forceinline__ void select_scatter(const SelectParams& params) {
  __shared__ TileStorage shared;
  const long long first = static_cast<long long>(blockIdx.x) * kTile;
  Element items[kItems];
  ItemClasses<kItems> classes;
  load_and_classify(params, first, shared.load, items, classes);
  scatter_tile<kItems>(
      params, classes, [&](int item, int slot) { shared.staged[slot] = items[item]; },
      [&](int slot, int cls, long long position) {
        static_cast<Element*>(params.out[cls])[position] = shared.staged[slot];
      });
}

extern "C" __global__ void __launch_bounds__(kSelectBlock, 4)
    csj_select_scatter(const __grid_constant__ SelectParams params) {
  select_scatter(params);
}

// The single pass (select_params.hpp): each block takes tiles from the counter until none is
// left. Taken in order, a tile's predecessors are all held by blocks already running, so its
// look-back always ends (the launch's blocks need not be resident together nor run in the
// order of their index). The grid is one wave; the counter hands out the rest.
// `Classes`: how a thread holds its items' classes (select.cuh says why there are two).
template <int Prefixes, class Classes>
__device__ __forceinline__ void select_single(const SelectParams& params) {
  using Lookback = SelectLookback<Prefixes>;
  __shared__ TileStorage shared;
  __shared__ typename Lookback::Prefix::TempStorage prefix_storage;
  __shared__ SelectCounts offset;
  __shared__ int taken;
  LookbackState state;
  state.Init(static_cast<int>(params.tiles), params.tile_state, 0);  // one array of words: nothing to size
  for (;;) {
    // the barrier also ends the previous tile's emit before its shared memory is reused
    if (threadIdx.x == 0) taken = static_cast<int>(atomicAdd(params.next_tile, 1u));
    __syncthreads();
    const int tile = taken;
    if (tile >= params.tiles) break;
    const long long first = static_cast<long long>(tile) * kTile;
    Element items[kItems];
    Classes classes;
    load_and_classify(params, first, shared.load, items, classes);
    const TileSlots slots = stage_tile<kItems>(params, classes, [&](int item, int slot) {
      shared.staged[slot] = items[item];
    });
    if (threadIdx.x < 32) look_back<Prefixes>(params, state, prefix_storage, tile, first, slots, offset);
    __syncthreads();
    emit_tile(slots, offset, [&](int slot, int cls, long long position) {
      static_cast<Element*>(params.out[cls])[position] = shared.staged[slot];
    });
  }
}

// select and partition: one looked-back count (class 0's)
extern "C" __global__ void __launch_bounds__(kSelectBlock, 4)
    csj_select_single(const __grid_constant__ SelectParams params) {
  select_single<1, ItemClasses<kItems>>(params);
}

// three_way_partition: two (classes 0 and 1, packed: shards of fewer than 2^32 elements)
extern "C" __global__ void __launch_bounds__(kSelectBlock, 4)
    csj_select_single3(const __grid_constant__ SelectParams params) {
  select_single<2, PackedClasses<kItems>>(params);
}
