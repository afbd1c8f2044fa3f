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
// memory, each class's elements in one contiguous run. A select (class 0 kept, nothing else
// written) takes csj_select_keep instead: no shared staging, see there.
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

// csj_select_keep: the scatter of a select, one output (class 0). Each warp takes its own run
// of kItems * 32 elements of the tile, a warp-wide load at a time (coalesced, no transpose),
// and ranks the kept ones by ballot: a first loop over its registers counts them, one barrier
// gives every warp the count of the warps before it, a second loop writes each round's kept
// elements at consecutive positions (the warp's stores of a round are contiguous; its rounds
// follow each other). Global order holds: warps, rounds and lanes follow the element order.
// Against select_scatter's shared staging and packed three-class scan, a few instructions an
// element: the general scatter was bound by instruction issue.
__device__ __forceinline__ void select_keep(const SelectParams& params) {
  constexpr int kWarps = kSelectBlock / 32;
  constexpr int kWarpSpan = kItems * 32;
  __shared__ int warp_kept[kWarps];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const long long first = static_cast<long long>(blockIdx.x) * kTile + static_cast<long long>(warp) * kWarpSpan;
  const long long left = params.n - first;  // may be <= 0 in the last tile
  const Element* in = static_cast<const Element*>(params.in) + first;
  Element items[kItems];
  unsigned kept = 0;  // bit i: this lane's item i is kept
  if (left >= kWarpSpan) {
#pragma unroll
    for (int item = 0; item < kItems; ++item) items[item] = in[item * 32 + lane];
#pragma unroll
    for (int item = 0; item < kItems; ++item) {
      const long long local = first + item * 32 + lane;
      kept |= static_cast<unsigned>(csj_select_class(&items[item], params.index_base + local) == 0) << item;
    }
  } else {
#pragma unroll
    for (int item = 0; item < kItems; ++item) {
      const int offset = item * 32 + lane;
      if (offset < left) {
        items[item] = in[offset];
        kept |= static_cast<unsigned>(csj_select_class(&items[item], params.index_base + first + offset) == 0)
                << item;
      }
    }
  }
  int count = 0;
#pragma unroll
  for (int item = 0; item < kItems; ++item) count += __popc(__ballot_sync(0xffffffffu, (kept >> item) & 1u));
  if (lane == 0) warp_kept[warp] = count;
  __syncthreads();
  long long position = params.tile_counts[blockIdx.x].count[0];
  for (int w = 0; w < warp; ++w) position += warp_kept[w];
  if (count == 0) return;
  Element* out = static_cast<Element*>(params.out[0]) + position;
  const unsigned below = (1u << lane) - 1u;
#pragma unroll
  for (int item = 0; item < kItems; ++item) {
    const unsigned round = __ballot_sync(0xffffffffu, (kept >> item) & 1u);
    if ((kept >> item) & 1u) out[__popc(round & below)] = items[item];
    out += __popc(round);
  }
}

extern "C" __global__ void __launch_bounds__(kSelectBlock)
    csj_select_keep(const __grid_constant__ SelectParams params) {
  select_keep(params);
}
