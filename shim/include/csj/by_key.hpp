// Scans by key and reduce_by_key across places: runs of consecutive keys that a linked
// `equal` says belong together, folded with a linked operator in element order
// (deterministic; the operator need be associative, not commutative). CUDA-free header.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "csj/select.hpp"
#include "csj/sharded_array.hpp"
#include "csj/transform.hpp"

namespace csj {

// Across the ranks of a from_mpi group: what lies beyond this rank's shards. `prev_key` and
// `next_key`: the last key of the nearest earlier rank holding any, the first key of the
// nearest later one (a key's bytes; empty: none). `totals`: called once, after the single
// pass (or the two passes' first), with the totals of this rank's non-empty shards (64-byte
// records, in place order); it answers the earlier ranks' totals, in place order, which
// every carry folds in front of this rank's own: the folds one process makes over every
// place, in the same order.
struct ByKeyEdges {
  std::string prev_key;
  std::string next_key;
  std::function<std::string(const std::string&)> totals;
};

// `libraries`: per place, a linked by-key module (by_key_jit.cu) for keys' and values'
// element sizes. out[i] = values[h] op ... op values[i] (inclusive) or init op values[h] op
// ... op values[i - 1], init at h (exclusive; `init` holds values' bytes), h the first index
// of i's run; `out` has values' group, shard sizes and element size (it may be values, not
// keys: the sweep reads keys beyond its own tile).
// Stream-ordered.
void scan_by_key(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                 const ShardedArray& values, ShardedArray& out, bool exclusive, const std::string& init,
                 const ByKeyEdges* edges = nullptr);

// (first keys, folds): one element per run, in the shard where the run ends. Returns once
// the output sizes are known (each place's count is read) and the rest is queued.
ArrayList reduce_by_key(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                        const ShardedArray& values, const ByKeyEdges* edges = nullptr);

}  // namespace csj
