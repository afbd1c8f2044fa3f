// The sort engine: CUB radix sort and merge per element type and direction, and the small
// kernels of the multi-place sort (splitter counting, NaN canonicalisation). Compiled in
// its own translation unit (sort.cu): CUB's sort is the costliest code of the build.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace csj::kernels {

// Keys compare through an unsigned "ordered key" of the element's width: unsigned values
// as they are, signed ones with the sign bit flipped, floats with the usual sign twiddle,
// -0.0 mapped onto +0.0 (CUB's radix sort treats them as equal) and every NaN onto the
// largest key (NaNs last, as numpy). Descending order complements the key.
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

// The partition-first sort (sort_partition.cpp). Ordered keys (above) are stored at the
// element's width: "ordered" arrays below hold 4- or 8-byte unsigned values.
constexpr int kMaxBuckets = 32;
constexpr int kPartitionBlock = 256;
constexpr int kPartitionItems = 8;  // keys per thread: a tile is kPartitionBlock * this

constexpr int kMaxSortPlaces = 16;

// `count` samples of the keys of up to kMaxSortPlaces shards (read where they lie, peers'
// included): samples firsts[p] up to firsts[p + 1] come from shard p, the j-th of its
// samples as the ordered key at a hashed position within the j-th of as many equal strata.
struct SampleParams {
  const void* shards[kMaxSortPlaces];
  long long sizes[kMaxSortPlaces];
  long long firsts[kMaxSortPlaces + 1];
  int places;
  long long count;
  void* ordered;
};

// out[m] = sorted[ranks[m]] for the m < count splitters (ordered keys).
struct PickParams {
  const void* sorted;
  void* splitters;
  int count;
  long long ranks[kMaxBuckets];
};

// counts[b] += how many of `count` ordered keys fall in bucket b: the number of splitters at
// or below the key (splitters ascending, nsplit < kMaxBuckets).
struct BucketCountParams {
  const void* ordered;
  long long count;
  const void* splitters;
  int nsplit;
  unsigned long long* counts;
};

// Every key of a shard goes to its bucket's run: dests[b] from element cursors[b] on (a
// cursor taken per tile). A key past caps[b] is dropped and sets *overflow. NaNs are written
// as the positive quiet NaN.
struct PartitionParams {
  const void* keys;
  long long n;
  const void* splitters;
  int nsplit;
  unsigned long long* cursors;
  int* overflow;
  void* dests[kMaxBuckets];
  long long caps[kMaxBuckets];
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
  // The partition-first sort's kernels, (SampleParams), (BucketCountParams) and
  // (PartitionParams); launch the last with kPartitionBlock threads per tile.
  const void* sample_kernel;
  const void* bucket_count_kernel;
  const void* partition_kernel;
};

// __global__ (PickParams) for ordered keys of `key_bytes` (4 or 8): launch one block of
// kMaxBuckets threads.
const void* pick_kernel(int key_bytes);

constexpr int kSplitterBlock = 256;

// dtype: csj::DType's integer value; null for an unknown one.
const SortEngine* sort_engine(int dtype, bool descending);

}  // namespace csj::kernels
