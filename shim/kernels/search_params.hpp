// The searchsorted kernels' parameter blocks, shared by the device code (search.cuh,
// search.cu) and the host driver (shim/src/search.cpp). Plain C++ (no CUDA types) so both
// sides agree on the layout. A search kernel takes SearchParams whatever decides the order:
// the built-in one compares numbers by their ordered keys (search.cu); one that takes a
// user's comparator is the same kernel body (search.cuh) instantiated with it.
#pragma once

namespace csj::kernels {

// A shard of the sorted array, as the searching place reads it: where it lies (its own
// memory on the same device or a peer's, or a copy), and which of the samples it holds.
struct SearchShard {
  const void* data;
  long long n;             // > 0: only shards with elements are listed
  long long offset;        // global index of data[0]
  long long first_sample;  // samples [first_sample, end_sample) lie in this shard
  long long end_sample;
};

// The table a search keeps in shared memory: every shard's last element, then the elements
// at the global positions 0, stride, 2 * stride, ... (the top levels of every search).
constexpr int kSearchSampleBytes = 16 * 1024;
// Shared memory a search block may use without opting in: the samples and the lasts.
constexpr int kSearchSharedBytes = 48 * 1024;

// Fills the table (elements of item_size bytes, a multiple of 4) from the shards: one
// thread per entry.
struct SearchIndexParams {
  const SearchShard* shards;
  int shard_count;
  int item_size;
  long long stride;
  long long sample_count;
  void* table;  // shard_count lasts, then sample_count samples
};

// positions[i] = the number of elements of the sorted array ordered before queries[i]
// (`right`: not after it).
struct SearchParams {
  const void* queries;
  long long count;
  long long* positions;
  const SearchShard* shards;
  int shard_count;
  int right;
  long long total;
  const void* table;  // shard_count lasts, then sample_count samples
  long long sample_count;
  long long stride;   // sample j is the element at global position j * stride
};

constexpr int kSearchBlock = 256;

// The built-in search for a csj::DType integer value (null for an unknown one), and the
// table's fill (any element size); launch with kSearchBlock threads, the search with
// (shard_count + sample_count) * item_size bytes of dynamic shared memory.
const void* builtin_search_kernel(int dtype);
const void* search_index_kernel();

}  // namespace csj::kernels
