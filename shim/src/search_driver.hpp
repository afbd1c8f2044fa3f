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

// Whether kernels on `device` can read shard `p` of `sorted` where it lies.
bool readable(const ShardedArray& sorted, std::size_t p, int device);

// std::invalid_argument unless values has sorted's dtype and out is an int64 array of its
// own with values' group and shard sizes (the checks of every searchsorted driver).
void check_search_arrays(const ShardedArray& sorted, const ShardedArray& values, const ShardedArray& out);

// csj::searchsorted with `kernel_for`'s kernels: checks values' dtype and out (int64, values'
// group and shard sizes), then, per place of `values` with queries, lays out the shards of
// `sorted` as that place reads them (in place or copied), fills the table of lasts and
// samples, and queues the search, ordered after the work already queued on the sorted
// shards' streams and before any queued there later.
void search_with(const SearchKernelFor& kernel_for, const ShardedArray& sorted, const ShardedArray& values,
                 ShardedArray& out, bool right);

}  // namespace csj::detail
