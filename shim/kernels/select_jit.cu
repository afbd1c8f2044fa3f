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
// written) takes csj_select_keep or, in one pass, csj_select_single: no shared staging, see
// select_keep.
#include <cub/block/block_load.cuh>

#include "count_lookback.cuh"
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
constexpr int kSingleItems = select_single_items(CSJ_ELEMENT_SIZE);

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

// A select's writes (one output, class 0), for its two passes' scatter (csj_select_keep) and
// its single pass (csj_select_single). Each warp takes its own run of Items * 32 elements, a
// warp-wide load at a time (coalesced, no transpose), and ranks the kept ones by ballot:
// load_kept counts them (the count is the same in every lane), write_kept writes each
// round's kept elements at consecutive positions from the warp's first (a round's stores are
// contiguous; the warp's rounds follow each other). Global order holds: warps, rounds and
// lanes follow the element order. Against select_scatter's shared staging and packed
// three-class scan, a few instructions an element: that scatter was bound by instruction issue.
constexpr int kWarps = kSelectBlock / 32;

template <int Items>
struct WarpKept {
  static constexpr int kSpan = Items * 32;  // the warp's run of elements
  Element items[Items];
  unsigned kept = 0;  // bit i: this lane's item i is kept
  int count = 0;      // the warp's kept elements
};

// The warp's run from the shard's element `first` (none when first >= n).
template <int Items>
__device__ __forceinline__ void load_kept(const SelectParams& params, long long first, WarpKept<Items>& warp) {
  static_assert(Items <= 32, "a lane's kept items are the bits of one word");
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const long long left = params.n - first;  // may be <= 0 in the last tile
  const Element* in = static_cast<const Element*>(params.in) + first;
  if (left >= WarpKept<Items>::kSpan) {
#pragma unroll
    for (int item = 0; item < Items; ++item) warp.items[item] = in[item * 32 + lane];
#pragma unroll
    for (int item = 0; item < Items; ++item) {
      const long long local = first + item * 32 + lane;
      warp.kept |= static_cast<unsigned>(csj_select_class(&warp.items[item], params.index_base + local) == 0) << item;
    }
  } else {
#pragma unroll
    for (int item = 0; item < Items; ++item) {
      const int offset = item * 32 + lane;
      if (offset < left) {
        warp.items[item] = in[offset];
        warp.kept |=
            static_cast<unsigned>(csj_select_class(&warp.items[item], params.index_base + first + offset) == 0)
            << item;
      }
    }
  }
#pragma unroll
  for (int item = 0; item < Items; ++item) warp.count += __popc(__ballot_sync(0xffffffffu, (warp.kept >> item) & 1u));
}

template <int Items>
__device__ __forceinline__ void write_kept(const SelectParams& params, long long position, const WarpKept<Items>& warp) {
  if (warp.count == 0) return;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  Element* out = static_cast<Element*>(params.out[0]) + position;
  const unsigned below = (1u << lane) - 1u;
#pragma unroll
  for (int item = 0; item < Items; ++item) {
    const unsigned round = __ballot_sync(0xffffffffu, (warp.kept >> item) & 1u);
    if ((warp.kept >> item) & 1u) out[__popc(round & below)] = warp.items[item];
    out += __popc(round);
  }
}

// A block's tile of Items * kSelectBlock elements: one barrier gives every warp the counts of
// the warps before it and `tile_base(warp_kept)` the tile's first output position (called by
// every thread after that barrier, with the warps' counts in shared memory; it returns the
// same value to all).
template <int Items, class TileBase>
__device__ __forceinline__ void select_keep(const SelectParams& params, long long tile, int (&warp_kept)[kWarps],
                                            TileBase tile_base) {
  const int warp_index = static_cast<int>(threadIdx.x) >> 5;
  WarpKept<Items> warp;
  load_kept(params, tile * (Items * kSelectBlock) + static_cast<long long>(warp_index) * WarpKept<Items>::kSpan, warp);
  if ((threadIdx.x & 31) == 0) warp_kept[warp_index] = warp.count;
  __syncthreads();
  long long position = tile_base(warp_kept);
  for (int w = 0; w < warp_index; ++w) position += warp_kept[w];
  write_kept(params, position, warp);
}

// The two passes' scatter of a select: the tile's position from the scanned counts.
extern "C" __global__ void __launch_bounds__(kSelectBlock)
    csj_select_keep(const __grid_constant__ SelectParams params) {
  __shared__ int warp_kept[kWarps];
  select_keep<kItems>(params, blockIdx.x, warp_kept,
                      [&](const int(&)[kWarps]) { return params.tile_counts[blockIdx.x].count[0]; });
}

// A select in one pass: tiles taken in order from a counter (every tile before a running one
// has started, so the look-back ends), the kept elements before a tile found by decoupled
// look-back over the tiles' counts (integers: the same positions whatever its timing), the
// shard's count written by the last tile for the host (select.cpp allocates the output at the
// shard's size and shrinks it to that count). Tiles of select_single_items a thread: for 4-
// and 8-byte elements at most 64 registers, 4 blocks a multiprocessor (test_select.py holds
// it to that); records keep 64 bytes a thread, 48 registers and 5 blocks.
// (Tiles by blockIdx.x, as CUB's single passes take them, saved nothing: 695-715 against
// 695-696 us for 2^28 float32 on an H200.)
constexpr int kSingleBlocks = kSingleItems * CSJ_ELEMENT_SIZE > 64 ? 4 : 5;

extern "C" __global__ void __launch_bounds__(kSelectBlock, kSingleBlocks)
    csj_select_single(const __grid_constant__ SelectParams params) {
  __shared__ int warp_kept[kWarps];
  __shared__ unsigned long long tile_shared;
  __shared__ long long base_shared;
  __shared__ CountPrefix::TempStorage lookback;
  if (threadIdx.x == 0) tile_shared = atomicAdd(params.next_tile, 1ULL);
  __syncthreads();
  const auto tile = static_cast<long long>(tile_shared);
  select_keep<kSingleItems>(params, tile, warp_kept, [&](const int(&counts)[kWarps]) {
    if (threadIdx.x < 32) {
      unsigned long long mine = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mine += static_cast<unsigned long long>(counts[w]);
      const unsigned long long before = count_before_tile(params.tile_state, tile, mine, lookback);
      if (threadIdx.x == 0) {
        base_shared = static_cast<long long>(before);
        if (tile == params.tiles - 1) params.totals->count[0] = static_cast<long long>(before + mine);
      }
    }
    __syncthreads();
    return base_shared;
  });
}
