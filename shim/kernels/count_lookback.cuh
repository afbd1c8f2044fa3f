// Decoupled look-back over one integer count per tile (CUB's tile states and prefix callback),
// for single passes whose tiles need the sum of their predecessors' counts: reduce_by_key's
// single pass takes the run ends before each tile (its output position) from it. The sums are
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

// Every tile's state "not yet published" (CUB's padding before tile 0 included).
__device__ __forceinline__ void init_count_lookback(void* storage, int tiles) {
  LookbackState state;
  state.Init(tiles, storage, 0);  // one array of words: nothing to size
  state.InitializeStatus(tiles);
}

}  // namespace csj::kernels
