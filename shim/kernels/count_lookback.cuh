// Decoupled look-back over one integer count per tile (CUB's tile states and prefix callback),
// for single passes whose tiles are blocks and need the sum of their predecessors' counts:
// select's single pass takes the kept elements before each tile (its output position) from it.
// (reduce_by_key's tiles are warps, which CUB's callback, run by a block's first warp, does not
// serve: by_key_jit.cu has its own.) The sums are
// integers, so whatever grouping the look-back's timing gives them, the result is the same:
// deterministic. The host sizes and initialises the states with count_lookback_scratch and
// init_count_lookback (builtin_kernels.hpp), on the stream of the pass that reads them.
#pragma once

#include <cub/agent/single_pass_scan_operators.cuh>

namespace csj::kernels {

using LookbackState = cub::ScanTileState<unsigned long long>;

struct AddLookback {
  __device__ __forceinline__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
    return a + b;
  }
};

// CUB's default delays: a look-back sleeps before its first poll and between polls. Without them
// (no_delay_constructor_t) select's single pass took 829 against 698 us and reduce_by_key's
// 2.03 against 1.89 ms for 2^28 elements on an H200: the spinning loads crowd L2.
using CountPrefix = cub::TilePrefixCallbackOp<unsigned long long, AddLookback, LookbackState>;

// The counts of the tiles before `tile` (lane 0's; tiles are numbered in the order they must
// add up, each of them running or done), `mine` published for the tiles after it. Called by
// every lane of warp 0 of the tile's block (CUB's callback publishes from thread 0).
__device__ __forceinline__ unsigned long long count_before_tile(void* states, long long tile, unsigned long long mine,
                                                                CountPrefix::TempStorage& storage) {
  LookbackState state;
  state.Init(0, states, 0);  // one array of words: nothing to size
  if (tile == 0) {
    if ((threadIdx.x & 31) == 0) state.SetInclusive(0, mine);
    return 0;
  }
  CountPrefix prefix(state, storage, AddLookback(), static_cast<int>(tile));
  return prefix(mine);
}

// Every tile's state "not yet published" (CUB's padding before tile 0 included).
__device__ __forceinline__ void init_count_lookback(void* storage, int tiles) {
  LookbackState state;
  state.Init(tiles, storage, 0);  // one array of words: nothing to size
  state.InitializeStatus(tiles);
}

}  // namespace csj::kernels
