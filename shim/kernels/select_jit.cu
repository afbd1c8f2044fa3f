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
// written) takes csj_select_keep or, in one pass, csj_select_single, which ranks as select_keep
// does (4- and 8-byte elements read from a tile staged in shared memory by a bulk copy).
#include <cub/block/block_load.cuh>
#include <cuda/barrier>

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

// The warp's kept elements: the set bits of every lane's `kept` (the same in every lane).
template <int Items>
__device__ __forceinline__ int kept_count(unsigned kept) {
  int count = 0;
#pragma unroll
  for (int item = 0; item < Items; ++item) count += __popc(__ballot_sync(0xffffffffu, (kept >> item) & 1u));
  return count;
}

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
  warp.count = kept_count<Items>(warp.kept);
}

// The lanes' kept elements, in order from the warp's output `position`: round `item` writes
// each lane's item `item` (`item_at(item)`) where its bit of `kept` is set.
template <int Items, class ItemAt>
__device__ __forceinline__ void write_kept(const SelectParams& params, long long position, unsigned kept,
                                           ItemAt item_at) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  Element* out = static_cast<Element*>(params.out[0]) + position;
  const unsigned below = (1u << lane) - 1u;
#pragma unroll
  for (int item = 0; item < Items; ++item) {
    const unsigned round = __ballot_sync(0xffffffffu, (kept >> item) & 1u);
    if ((kept >> item) & 1u) out[__popc(round & below)] = item_at(item);
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
  if (warp.count == 0) return;
  write_kept<Items>(params, position, warp.kept, [&](int item) { return warp.items[item]; });
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
// shard's size and shrinks it to that count).
struct SingleShared {
  int warp_kept[kWarps];
  unsigned long long tile;
  long long base;
  CountPrefix::TempStorage lookback;
};

// The tile's first output position, called by every thread after the barrier that put the
// warps' counts in shared memory (the same value to all).
__device__ __forceinline__ long long single_tile_base(const SelectParams& params, long long tile,
                                                      SingleShared& shared) {
  if (threadIdx.x < 32) {
    unsigned long long mine = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mine += static_cast<unsigned long long>(shared.warp_kept[w]);
    const unsigned long long before = count_before_tile(params.tile_state, tile, mine, shared.lookback);
    if (threadIdx.x == 0) {
      shared.base = static_cast<long long>(before);
      if (tile == params.tiles - 1) params.totals->count[0] = static_cast<long long>(before + mine);
    }
  }
  __syncthreads();
  return shared.base;
}

#if CSJ_ELEMENT_SIZE <= 8
// 4- and 8-byte elements: the tile (select_single_items a thread, 32 KiB) is staged in shared
// memory by one bulk asynchronous copy (cuda::memcpy_async on a block barrier: the tensor
// memory accelerator on sm_90; before sm_90 the block's threads load it), so a thread holds a
// mask of its kept elements, not the elements: at most 40 registers, 6 blocks a multiprocessor
// and 192 KiB of loads in flight through the look-backs that hold each block between its loads
// and its stores, against 64 registers, 4 blocks and 128 KiB with the tile in registers
// (test_select.py holds it to that). For 2^28 float32, half kept, on one H100, 2357-2363 GB/s against
// 2063-2162 in registers (builds alternated in one call).
constexpr int kSingleBlocks = 6;
constexpr int kStagedBytes = kSingleItems * kSelectBlock * CSJ_ELEMENT_SIZE;
// A contiguous array (ShardedArray::allocate_contiguous) maps each place's chunk at multiples
// of the driver's granularity (2 MiB): a bulk copy is split where it would cross such a
// boundary, so no copy spans two mappings (compute-sanitizer reports one that does).
constexpr unsigned long long kMappingAlign = 2ULL << 20;

using Barrier = cuda::barrier<cuda::thread_scope_block>;

// `bytes` (a multiple of 16, both ends 16-byte aligned) from global to shared memory, counted
// on `arrived`. Called by one thread.
__device__ __forceinline__ void stage_bulk(unsigned char* to, const unsigned char* from, unsigned bytes,
                                           Barrier& arrived) {
  const auto address = reinterpret_cast<unsigned long long>(from);
  const unsigned long long boundary = (address / kMappingAlign + 1) * kMappingAlign;
  const unsigned first = boundary < address + bytes ? static_cast<unsigned>(boundary - address) : bytes;
  cuda::memcpy_async(to, from, cuda::aligned_size_t<16>(first), arrived);
  if (first < bytes) cuda::memcpy_async(to + first, from + first, cuda::aligned_size_t<16>(bytes - first), arrived);
}

extern "C" __global__ void __launch_bounds__(kSelectBlock, kSingleBlocks)
    csj_select_single(const __grid_constant__ SelectParams params) {
  constexpr int kTileItems = kSingleItems * kSelectBlock;
  constexpr int kSpan = kSingleItems * 32;  // a warp's run of elements
  // the tile at the shard's alignment within 16 bytes, so that the bulk copy's ends are aligned
  __shared__ alignas(128) unsigned char staged_bytes[kStagedBytes + 16];
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ Barrier arrived;
  __shared__ SingleShared shared;
  if (threadIdx.x == 0) {
    shared.tile = atomicAdd(params.next_tile, 1ULL);
    init(&arrived, kSelectBlock);
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the barrier, seen by the bulk copy
#endif
  }
  __syncthreads();
  const auto tile = static_cast<long long>(shared.tile);
  const long long first = tile * kTileItems;
  const long long left = params.n - first;
  const int valid = left < kTileItems ? static_cast<int>(left) : kTileItems;
  const Element* in = static_cast<const Element*>(params.in) + first;
  const auto shift = static_cast<unsigned>(reinterpret_cast<unsigned long long>(in) % 16);
  Element* staged = reinterpret_cast<Element*>(staged_bytes + shift);
#if __CUDA_ARCH__ >= 900
  constexpr int kSize = CSJ_ELEMENT_SIZE;
  // elements before the tile's 16-byte aligned run, and in it; threads load the rest
  const int head = min(valid, static_cast<int>((16 - shift) % 16) / kSize);
  const int bulk = (valid - head) / (16 / kSize) * (16 / kSize);
  if (threadIdx.x == 0 && bulk > 0) {
    stage_bulk(reinterpret_cast<unsigned char*>(staged + head), reinterpret_cast<const unsigned char*>(in + head),
               static_cast<unsigned>(bulk) * kSize, arrived);
  }
  if (static_cast<int>(threadIdx.x) < head) staged[threadIdx.x] = in[threadIdx.x];
  for (int i = head + bulk + static_cast<int>(threadIdx.x); i < valid; i += kSelectBlock) staged[i] = in[i];
#else
  // no bulk copy before sm_90 (memcpy_async would issue a thread's copies one by one): the
  // block's threads load the tile (modules built for sm_80; not measured)
  for (int i = static_cast<int>(threadIdx.x); i < valid; i += kSelectBlock) staged[i] = in[i];
#endif
  arrived.arrive_and_wait();
  // each warp ranks its run as select_keep does, reading the elements from shared memory
  const int warp_index = static_cast<int>(threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int begin = warp_index * kSpan;
  unsigned kept = 0;
#pragma unroll
  for (int item = 0; item < kSingleItems; ++item) {
    const int offset = begin + item * 32 + lane;
    if (offset < valid) {
      const Element element = staged[offset];
      kept |= static_cast<unsigned>(csj_select_class(&element, params.index_base + first + offset) == 0) << item;
    }
  }
  const int count = kept_count<kSingleItems>(kept);
  if (lane == 0) shared.warp_kept[warp_index] = count;
  __syncthreads();
  long long position = single_tile_base(params, tile, shared);
  if (count == 0) return;
  for (int w = 0; w < warp_index; ++w) position += shared.warp_kept[w];
  write_kept<kSingleItems>(params, position, kept, [&](int item) { return staged[begin + item * 32 + lane]; });
}
#else
// Records: select_items' 64 bytes a thread in registers, 48 registers and 5 blocks.
// (Tiles by blockIdx.x, as CUB's single passes take them, saved nothing: 695-715 against
// 695-696 us for 2^28 float32 on an H200, with the tile in registers.)
constexpr int kSingleBlocks = 5;

extern "C" __global__ void __launch_bounds__(kSelectBlock, kSingleBlocks)
    csj_select_single(const __grid_constant__ SelectParams params) {
  __shared__ SingleShared shared;
  if (threadIdx.x == 0) shared.tile = atomicAdd(params.next_tile, 1ULL);
  __syncthreads();
  const auto tile = static_cast<long long>(shared.tile);
  select_keep<kSingleItems>(params, tile, shared.warp_kept,
                            [&](const int(&)[kWarps]) { return single_tile_base(params, tile, shared); });
}
#endif
