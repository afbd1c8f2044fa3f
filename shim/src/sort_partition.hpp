// Internal: the partition-first multi-place sort (sort_partition.cpp), which csj::sort
// tries before its sort-then-merge path.
#pragma once

#include "csj/sharded_array.hpp"

namespace csj::kernels {
struct SortEngine;
}

namespace csj::detail {

// Sorts `in` into `out` (checked alike by the caller) when the keys suit it: several
// places, at least kPartitionMinKeys keys, no shard far below an even share, and sampled
// buckets that fit their buffers. Returns false, with nothing written, otherwise.
bool partition_sort(const ShardedArray& in, ShardedArray& out, const kernels::SortEngine& engine);

constexpr long long kPartitionMinKeys = 1LL << 22;

}  // namespace csj::detail
