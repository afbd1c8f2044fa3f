// Scans by key and reduce_by_key across places: runs of consecutive keys that a linked
// `equal` says belong together, folded with a linked operator in element order
// (deterministic; the operator need be associative, not commutative). CUDA-free header.
#pragma once

#include <string>
#include <vector>

#include "csj/select.hpp"
#include "csj/sharded_array.hpp"
#include "csj/transform.hpp"

namespace csj {

// `libraries`: per place, a linked by-key module (by_key_jit.cu) for keys' and values'
// element sizes. out[i] = values[h] op ... op values[i] (inclusive) or init op values[h] op
// ... op values[i - 1], init at h (exclusive; `init` holds values' bytes), h the first index
// of i's run; `out` has values' group, shard sizes and element size (it may be values, not
// keys: the sweep reads keys beyond its own tile).
// Stream-ordered.
void scan_by_key(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                 const ShardedArray& values, ShardedArray& out, bool exclusive, const std::string& init);

// (first keys, folds): one element per run, in the shard where the run ends. Returns once
// the output sizes are known (each place's count is read) and the rest is queued.
ArrayList reduce_by_key(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& keys,
                        const ShardedArray& values);

}  // namespace csj
