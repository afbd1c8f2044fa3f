// Selection and search over sharded numbers: the k best elements of an array (top_k) and the
// insertion points of queries in a globally sorted array (searchsorted). CUDA-free header.
#pragma once

#include <cstddef>
#include <vector>

#include "csj/sharded_array.hpp"
#include "csj/transform.hpp"

namespace csj {

// The k largest (smallest when !largest) elements of `in` in order, best first, ties to the
// lower global index; NaNs count as larger than every number, -0.0 equals 0.0. Writes k
// elements to `values` (`value_bytes` of host memory: k * itemsize) and their int64 global
// indices to `indices` (`index_bytes`: k * 8). Each place selects its own min(k, n) best
// without sorting its shard; the host merges the places' lists. 0 <= k <= in.size(), else
// std::invalid_argument naming k. Returns once the results are on the host.
void top_k(const ShardedArray& in, long long k, bool largest, void* values, std::size_t value_bytes,
           long long* indices, std::size_t index_bytes);

// For every element v of `values` (any group; sorted's dtype), the number of elements of
// `sorted` that go before it: those ordered below v (side "left", `right` false) or not above
// it (`right`), as np.searchsorted over the concatenated shards, which must be sorted in
// global order as sort() leaves them (ascending, NaNs last, -0.0 == 0.0; not checked).
// Writes int64 positions to `out` (int64, values' group and shard sizes). Each place of
// `values` searches its own queries, reading `sorted`'s shards where they lie (the same
// device, or a peer's with peer access) or from a copy. Stream-ordered: returns once queued.
void searchsorted(const ShardedArray& sorted, const ShardedArray& values, ShardedArray& out, bool right);

// searchsorted in the order of a linked comparator less(x, y) (x goes strictly before y):
// for every element v of `values` (any group; sorted's dtype and itemsize, records allowed),
// the number of elements x of `sorted` with less(x, v) (`right` false) or with !less(v, x)
// (`right`), `sorted`'s shards being sorted in that order over the concatenation (not
// checked). `libraries` holds the comparator's merge sort module (merge_sort_e<itemsize>)
// for each place of values' group. Writes int64 positions to `out` (int64, values' group and
// shard sizes). Each place of `values` counts its queries in every sorted shard with
// elements, one search per shard accumulated into its positions, reading the shard where it
// lies (its own device, or a peer's with peer access) or from a copy. Stream-ordered.
void search_compare(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& sorted,
                    const ShardedArray& values, ShardedArray& out, bool right);

}  // namespace csj
