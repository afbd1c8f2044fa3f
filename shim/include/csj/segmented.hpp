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

// `libraries`: per place, a linked reduce module (entry points csj_segmented_reduce and
// csj_fold). `offsets`: `num_offsets` (S + 1) non-decreasing global positions in
// [0, in.size()], host memory. `out`: S accumulators of `acc_size` bytes on in's group;
// out[s] = init op in[offsets[s]] op ... op in[offsets[s+1] - 1], init for an empty segment.
// Returns once every place's work is done.
void segmented_reduce(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                      const std::int64_t* offsets, std::size_t num_offsets, ShardedArray& out,
                      int acc_size, const std::string& init);

}  // namespace csj
