// Reductions and scans on every place, combined across places in shard order
// (deterministic; operators need be associative, not commutative). CUDA-free header.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "csj/sharded_array.hpp"
#include "csj/transform.hpp"

namespace csj {

enum class BuiltinReduction { sum, min, max };

// An accumulator's raw bytes; `valid` is false when nothing was reduced and no init given.
struct ReduceResult {
  bool valid = false;
  std::string value;
};

// `libraries`: per place, a linked reduce (or scan) module: entry points csj_reduce and
// csj_fold (scan modules add csj_scan_init and csj_scan). `init`: the accumulator's bytes,
// empty for none. `acc_size`: 4 or 8.
ReduceResult reduce(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                    int acc_size, const std::string& init);
ReduceResult reduce_builtin(BuiltinReduction op, const ShardedArray& in, const std::string& init);

// Number of elements equal to `value` (the dtype's bytes); built in, no JIT.
long long count(const ShardedArray& in, const std::string& value);

// numpy's histogram with num_bins equal bins: `edges` (`edge_bytes` of host memory) holds
// num_bins + 1 edges as numpy computes them (float32 values for float32 input, float64
// otherwise). Writes the count of each bin to `counts` (`count_bytes` of host memory, room
// for num_bins). Checks check_histogram_memory first.
void histogram_even(const ShardedArray& in, int num_bins, const void* edges, std::size_t edge_bytes,
                    long long* counts, std::size_t count_bytes);
// csj::OutOfMemory naming num_bins unless every device of the group has the memory that
// histogram_even's scratch takes there (edges and counts for each of its places with a
// non-empty shard), counting what the group's pool keeps cached as free. Allocates nothing.
void check_histogram_memory(const ShardedArray& in, int num_bins);

// Reduce-then-scan across places: per-shard totals, their prefix in shard order, then each
// shard scanned seeded with its prefix. `out` may be `in`. An exclusive scan needs `init`.
void scan(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
          ShardedArray& out, int acc_size, const std::string& init, bool exclusive);
void scan_builtin(BuiltinReduction op, const ShardedArray& in, ShardedArray& out,
                  const std::string& init, bool exclusive);

}  // namespace csj
