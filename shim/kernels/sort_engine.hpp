// The sort engine: CUB radix sort and merge per element type and direction (keys alone, or
// carrying values), and the small kernels of the multi-place sort (splitter counting, key samples, NaN canonicalisation).
// Compiled in its own translation unit (sort.cu): CUB's sort is the costliest code of the
// build.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace csj::kernels {

// Keys compare through an unsigned "ordered key" of the element's width (ordered_key.cuh):
// unsigned values as they are, signed ones with the sign bit flipped, floats with the usual
// sign twiddle, -0.0 mapped onto +0.0 (CUB's radix sort treats them as equal) and every NaN
// onto the largest key (NaNs last, as numpy). Descending order complements the key.
struct SplitterParams {
  const void* keys;                  // one place's sorted run
  long long n;
  const unsigned long long* bases;   // per boundary: the lowest candidate
  unsigned long long* counts;        // per (boundary, candidate): keys below the candidate
  int boundaries;
  int candidates;                    // a power of two
  int shift;                         // candidate j of boundary b is bases[b] + (j << shift)
};

// The NaN canonicalisation's keys: written to `keys`, read from `in` (null: `keys` itself).
struct KeysParams {
  void* keys;
  long long n;
  const void* in;
};

// `count` samples of a shard's keys (`count` at most n), as ordered keys of the element's
// width (4- or 8-byte unsigned values): the j-th at a hashed position within the j-th of
// `count` equal strata.
struct SampleParams {
  const void* keys;
  long long n;
  long long count;
  void* ordered;
};

struct SortEngine {
  int key_bits;
  // cub::DeviceRadixSort over (current, alternate); on return `*current_is_alternate` says
  // where the sorted keys are. A null `temp` queries `temp_bytes`.
  cudaError_t (*sort)(void* temp, std::size_t& temp_bytes, void* current, void* alternate,
                      long long n, bool* current_is_alternate, cudaStream_t stream);
  // cub::DeviceRadixSort from `in`, left as it was, into `out` (temp then holds a third
  // buffer of n keys). A null `temp` queries `temp_bytes`.
  cudaError_t (*sort_into)(void* temp, std::size_t& temp_bytes, const void* in, void* out, long long n,
                           cudaStream_t stream);
  // cub::DeviceMerge of two sorted runs into `out` (stable: ties from `first` come first).
  cudaError_t (*merge)(void* temp, std::size_t& temp_bytes, const void* first, long long first_n,
                       const void* second, long long second_n, void* out, cudaStream_t stream);
  // __global__ (SplitterParams): launch with kSplitterBlock threads.
  const void* splitter_kernel;
  // __global__ (KeysParams) rewriting every NaN as the positive quiet NaN, so that NaNs sort
  // last whatever their sign bit (copying the other keys when `in` is another buffer); null
  // for integer types.
  const void* canonicalize_kernel;
  // __global__ (SampleParams): the samples behind the sampled bounds of the cuts.
  const void* sample_kernel;
};

constexpr int kSplitterBlock = 256;

// dtype: csj::DType's integer value; null for an unknown one.
const SortEngine* sort_engine(int dtype, bool descending);

// The radix sort and merge of keys that carry values (sort_by_key): as SortEngine's, the
// values moved with their keys (stable: equal keys keep their order, values included). Values
// are 4 or 8 bytes of any type (they are moved, never read); wider ones travel as several
// such lanes (see csj/sort.hpp).
struct PairsEngine {
  // cub::DeviceRadixSort::SortPairs over (current, alternate) buffers of keys and of values;
  // on return `*current_is_alternate` says where both sorted lanes are.
  cudaError_t (*sort)(void* temp, std::size_t& temp_bytes, void* keys, void* keys_alternate, void* values,
                      void* values_alternate, long long n, bool* current_is_alternate, cudaStream_t stream);
  // From `keys_in` / `values_in`, left as they were, into `keys_out` / `values_out`.
  cudaError_t (*sort_into)(void* temp, std::size_t& temp_bytes, const void* keys_in, void* keys_out,
                           const void* values_in, void* values_out, long long n, cudaStream_t stream);
  // cub::DeviceMerge::MergePairs of two sorted runs (stable: ties from `first` come first).
  cudaError_t (*merge)(void* temp, std::size_t& temp_bytes, const void* first_keys, const void* first_values,
                       long long first_n, const void* second_keys, const void* second_values, long long second_n,
                       void* out_keys, void* out_values, cudaStream_t stream);
};

// value_bytes 4 or 8; null for an unknown dtype or width. (Each width is its own translation
// unit, sort_pairs4.cu and sort_pairs8.cu: the instantiations compile in parallel.)
const PairsEngine* pairs_engine(int dtype, bool descending, int value_bytes);
const PairsEngine* pairs_engine_4(int dtype, bool descending);
const PairsEngine* pairs_engine_8(int dtype, bool descending);

}  // namespace csj::kernels
