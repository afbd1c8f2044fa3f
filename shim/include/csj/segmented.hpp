// Segmented reduce: one accumulator per segment [offsets[s], offsets[s+1]) of a sharded
// array, folded in element order (deterministic; the operator need be associative, not
// commutative). CUDA-free header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "csj/sharded_array.hpp"
#include "csj/transform.hpp"

namespace csj {

// std::invalid_argument naming `offsets` unless its `count` (S + 1 >= 1) positions are
// non-decreasing and lie in [0, size] (the messages quote the first bad position). One pass.
void check_segment_offsets(const std::int64_t* offsets, std::size_t count, std::int64_t size);

// `libraries`: per place, a linked reduce module (entry points csj_segmented_reduce,
// csj_fold and csj_segmented_fold). `offsets`: `num_offsets` (S + 1) global positions in
// host memory, already checked by check_segment_offsets (here only their ends are). `out`:
// S accumulators of `acc_size` bytes on in's group; out[s] = init op in[offsets[s]] op ...
// op in[offsets[s+1] - 1], init for an empty segment. Queues the work on the places'
// streams and returns (no host wait).
void segmented_reduce(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                      const std::int64_t* offsets, std::size_t num_offsets, ShardedArray& out,
                      int acc_size, const std::string& init);

// The same from positions on the device: `offsets`, an int64 ShardedArray of S + 1
// positions on in's group (a single-process one). They are checked on the device before
// anything else runs, with one host wait for the verdict (std::invalid_argument, the host
// check's messages); the rest is queued without a wait. The host route's association, so the same bits on one
// place; on several, the shape (block or warp a piece) follows len(a) / S here and each
// shard's pieces there, which can differ.
void segmented_reduce(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                      const ShardedArray& offsets, ShardedArray& out, int acc_size, const std::string& init);

}  // namespace csj
