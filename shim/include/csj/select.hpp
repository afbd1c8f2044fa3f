// Selections (select, partition, three_way_partition), the flagged compaction, the run
// heads' compaction, and the resharding of an array onto other shard sizes. CUDA-free header.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "csj/sharded_array.hpp"
#include "csj/transform.hpp"

namespace csj {

// Splits `in` by the class (0, 1 or 2) the linked predicates give each element (`libraries`:
// the select module linked with them, select_e<itemsize>, one per place) into `outputs`
// (1 to 3) new arrays on in's group, output k holding class k's elements in global order;
// shard i of each holds what shard i of `in` had of that class (no data crosses places).
// The class counts are read on the host (each place's stream is synchronised once). A select
// (one output) takes one pass over `in` where every device has room for the output at the
// shards' sizes (it then shrinks to the counts: ShardedArray::shrink_shards); otherwise, for
// partitions, or with `single_pass` false (tests, A/B runs), two: a counting pass, the host
// read, then the writes, queued on the places' streams.
ArrayList select(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in, int outputs,
                 bool single_pass = true);

// Compacts each of `arrays` (up to 4 per launch, same group and shard sizes as `flags`)
// by `flags` (int32 / uint32 / int64 / uint64: nonzero keeps the element): new arrays of the
// kept elements in global order, shard i holding what shard i kept. Built-in kernels.
ArrayList select_flagged(const ShardedArray& flags, const ArrayList& arrays);

// Compacts each of `arrays` (up to 4 per launch, same group and shard sizes as `keys`) to
// the elements that start a run of equal keys (the by-key module linked with the keys'
// equality, by_key_k<key size>_v*, one per place): new arrays in global order, shard i
// holding the heads of shard i. A run continues across shards: a shard's first element is
// compared with the last key of the nearest non-empty shard before it.
ArrayList select_heads(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                       const ArrayList& arrays);

// A copy of `in` with shard sizes `sizes` (one per place, adding up to in's size): output
// shard q receives, in global order, the pieces of every input shard its range overlaps,
// by device or peer copies on place q's stream, which first waits for each source place's
// stream; each source place's stream then waits for the copies that read it.
std::shared_ptr<ShardedArray> redistribute(const ShardedArray& in, const std::vector<std::int64_t>& sizes);

}  // namespace csj
