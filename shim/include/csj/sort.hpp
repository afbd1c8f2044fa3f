// The multi-place sorts. CUDA-free header.
#pragma once

#include "csj/sharded_array.hpp"

namespace csj {

// Sorts `in` into `out` (which may be `in`) in global order; shard sizes never change.
// Each place radix-sorts its shard, exact splitters come from a multi-sequence selection
// over the sorted shards (so output shard q receives exactly its size), the pieces travel
// over peer copies and each output shard merges its pieces. NaNs sort last (first when
// descending) and are rewritten as the positive quiet NaN; -0.0 and +0.0 compare equal.
// Returns after the splitters are known; the rest is queued on the places' streams.
void sort(const ShardedArray& in, ShardedArray& out, bool descending);

// The same sort of `keys` into `out_keys`, each key carrying its value from `values` into
// `out_values` (same group and shard sizes; either output may be its input; keys and values
// distinct arrays). Stable: equal keys keep their global order, their values with them.
// Values are 4 or 8 bytes of any type (moved, never read); Python sorts wider records as
// several such lanes.
void sort_by_key(const ShardedArray& keys, ShardedArray& out_keys, const ShardedArray& values,
                 ShardedArray& out_values, bool descending);

// How the multi-place sorts of this process bounded their cuts before the splitter search
// ended (for tests and probes): from samples of the keys (`sampled`; `missed` counts those
// where some place's exact cuts fell outside the sampled bounds, so that it received its
// pieces again), or from the search's first round (`first_round`).
struct SortPathCounts {
  unsigned long long sampled = 0, missed = 0, first_round = 0;
};
SortPathCounts sort_path_counts();

}  // namespace csj
