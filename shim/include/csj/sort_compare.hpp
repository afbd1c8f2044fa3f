// The sort with a user comparator: a stable merge sort whose kernels are linked with the
// comparator (KernelLibrary, one per place). CUDA-free header.
#pragma once

#include <vector>

#include "csj/sharded_array.hpp"
#include "csj/transform.hpp"

namespace csj {

// Sorts `in` into `out` (which may be `in`) in the order of the linked comparator, stably
// (equal elements keep their global order); shard sizes never change. `libraries` holds the
// merge sort module linked with the comparator for each place (merge_sort_e<itemsize>).
// Everything is queued on the places' streams.
void sort_compare(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in, ShardedArray& out);

}  // namespace csj
