// Reductions and scans on every place, combined across places in shard order
// (deterministic; operators need be associative, not commutative). CUDA-free header.
#pragma once

#include <cstddef>
#include <functional>
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

// The same fold (the same association: bit for bit reduce's answer), written to every place's
// element of `out` (a DeviceScalar's storage: one element of acc_size bytes on each place of
// in's group) instead of returned: queued on the places' streams, nothing waited for on the
// host. An empty `in` writes init (which must then be given).
void reduce_into(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in, int acc_size,
                 const std::string& init, ShardedArray& out);
void reduce_builtin_into(BuiltinReduction op, const ShardedArray& in, const std::string& init, ShardedArray& out);

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

// ---- The steps of a reduce or scan whose places span several processes ----
// (cuda_sharded_jit/distributed): each process computes its own places' parts, exactly as
// reduce and scan compute them per place; the caller gathers them and folds them in global
// place order (fold, below), so the result has the same bits as one process's over the same
// places and shard sizes.

// Each place's fold of its own shard, without init, in the association reduce folds it
// before it combines places: one entry per place, invalid for an empty shard.
std::vector<ReduceResult> reduce_partials(const std::vector<const KernelLibrary*>& libraries,
                                          const ShardedArray& in, int acc_size);
std::vector<ReduceResult> reduce_builtin_partials(BuiltinReduction op, const ShardedArray& in);

// `values` (accumulators' bytes) folded in order, init first when given, by the fold kernel
// of libraries[0] on place 0 of `group`: the association of reduce's and scan's cross-place
// fold. prefixes[k] is the fold of init and values[0, k) (empty for k == 0 without init);
// total the fold of them all (init when there are no values). Any number of values: launches
// of up to 64 chain, each starting from the previous one's total, which keeps the association.
struct FoldResult {
  std::vector<std::string> prefixes;
  std::string total;
};
FoldResult fold(const std::vector<const KernelLibrary*>& libraries, const PlaceGroup& group, int acc_size,
                const std::vector<std::string>& values, const std::string& init);
FoldResult fold_builtin(BuiltinReduction op, DType dtype, const PlaceGroup& group,
                        const std::vector<std::string>& values, const std::string& init);

// A scan whose cross-place step is the caller's: the first pass on every place (as scan),
// then carry(totals) with each place's total (invalid for an empty shard), which returns each
// place's seed (what comes before its first element; empty for none, which only the first
// elements of an inclusive scan without init may have), then the second pass seeded with it.
// Called with no lock held; a throw from carry unwinds the call (queued work drains first).
using ScanCarry = std::function<std::vector<std::string>(const std::vector<ReduceResult>&)>;
void scan_carried(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                  ShardedArray& out, int acc_size, bool exclusive, const ScanCarry& carry);
void scan_builtin_carried(BuiltinReduction op, const ShardedArray& in, ShardedArray& out, bool exclusive,
                          const ScanCarry& carry);

}  // namespace csj
