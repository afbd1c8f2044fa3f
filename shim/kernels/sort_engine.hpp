// The sort engine: CUB radix sort and merge per element type and direction, and the small
// kernels of the multi-place sort (splitter counting, key samples, NaN canonicalisation).
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

struct KeysParams {
  void* keys;
  long long n;
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
  // last whatever their sign bit; null for integer types.
  const void* canonicalize_kernel;
  // __global__ (SampleParams): the samples behind the sampled bounds of the cuts.
  const void* sample_kernel;
};

constexpr int kSplitterBlock = 256;

// dtype: csj::DType's integer value; null for an unknown one.
const SortEngine* sort_engine(int dtype, bool descending);

}  // namespace csj::kernels
