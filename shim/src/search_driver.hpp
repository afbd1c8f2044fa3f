// Internal: the searchsorted driver, apart from the kernel that does the search, so that one
// driver serves the built-in order of numbers (csj::searchsorted, search.cpp) and any order a
// comparator defines (a kernel linked at run time from search.cuh with the user's operator,
// taking the same SearchParams).
#pragma once

#include <cstddef>
#include <functional>

#include "csj/sharded_array.hpp"
#include "launch.hpp"

namespace csj::detail {

// The search kernel a place of `values` launches (asked with the place's device current).
using SearchKernelFor = std::function<KernelHandle(std::size_t place)>;

// csj::searchsorted with `kernel_for`'s kernels: checks values' dtype and out (int64, values'
// group and shard sizes), then, per place of `values` with queries, lays out the shards of
// `sorted` as that place reads them (in place or copied), fills the table of lasts and
// samples, and queues the search, ordered after the work already queued on the sorted
// shards' streams and before any queued there later.
void search_with(const SearchKernelFor& kernel_for, const ShardedArray& sorted, const ShardedArray& values,
                 ShardedArray& out, bool right);

}  // namespace csj::detail
