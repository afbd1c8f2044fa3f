// The top-k engine: the kernels that select one shard's k best elements without sorting the
// shard (a radix select over the elements' ordered keys, then their local indices), and the
// CUB sort that orders the few candidates exactly. Plain C++ (no CUDA types beyond the
// runtime's) so that the host driver (shim/src/top_k.cpp) and the kernels (top_k.cu) agree on
// the layout.
//
// The selection works on the *select key* of an element: its ordered key (ordered_key.cuh),
// complemented for the largest elements, so that the k wanted elements are always the k
// smallest select keys, ties going to the lower index. Each pass counts the elements of the
// current bucket by the next digit of (select key, local index) read from the top, one digit
// of kSelectDigitBits bits of the key or of the index at a time; the last block of a pass
// keeps the bucket where the k-th element lies (SelectState). Since (key, index) pairs are
// distinct, a bucket shrinks to at most kSelectBoundaryLimit elements once enough digits are
// known; the passes stop there (or earlier, when the whole bucket is wanted) and the gather
// takes every element of a better bucket and every element of the boundary bucket.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace csj::kernels {

constexpr int kSelectDigitBits = 11;
constexpr int kSelectBins = 1 << kSelectDigitBits;
constexpr int kSelectBlock = 512;
// Boundary buckets of at most this many elements are gathered whole: the candidates, at most
// k - 1 + kSelectBoundaryLimit of them, are then sorted exactly.
constexpr long long kSelectBoundaryLimit = 1 << 14;

// Where the selection stands (device memory, zeroed before the first pass): the bucket that
// holds the k-th element, as the known top bits of the select key (`key_known` of them) and
// then of the local index (`index_known`).
struct SelectState {
  unsigned long long key_prefix;
  unsigned long long index_prefix;
  long long need;      // elements still wanted from the bucket (the better buckets give the rest)
  long long boundary;  // elements in the bucket
  int key_known;
  int index_known;
  int done;            // no further pass: the gather may run
  int unused;
};

// The kinds of counting pass, in the order they run: the first counts every element by the
// key's top digit; a key pass the elements of the bucket by its key's next digit; an index
// pass (every key bit known: the bucket's elements are equal) by their local index's next
// digit.
enum class SelectPassKind { first, key, index };

// One counting pass over a shard: the digit of bits [shift, shift + width) of the select key
// or of the local index, of the elements in the current bucket. A pass launched after the
// selection is done returns at once.
struct SelectPassParams {
  const void* in;
  long long n;
  SelectState* state;
  unsigned long long* bins;  // kSelectBins counts: zero before the pass, left zero after it
  unsigned int* arrivals;    // zero before; the last block to arrive chooses, then resets it
  long long k;               // elements to select (read by the first pass)
  long long limit;           // kSelectBoundaryLimit
  int shift;
  int width;
  int key_bits;
  int index_bits;  // of a local index: bits of n - 1, at least 1
};

// Every element of a better bucket or of the boundary bucket: its select key and local index
// appended at `count` (zero before). Slots beyond `capacity` are dropped (they only exist
// when other work writes the shard meanwhile).
struct SelectGatherParams {
  const void* in;
  long long n;
  const SelectState* state;
  void* keys;                   // select keys, of the element's width
  unsigned long long* indices;  // local indices
  unsigned long long* count;
  long long capacity;
  int key_bits;
  int index_bits;
};

// The first `count` sorted candidates, for the host: their select keys (as 64-bit values),
// global indices and the elements themselves.
struct SelectEmitParams {
  const void* in;
  const void* keys;
  const unsigned long long* indices;
  long long count;
  long long offset;  // global index of in[0]
  unsigned long long* out_keys;
  long long* out_indices;
  void* out_values;
};

struct TopKEngine {
  int key_bits;
  // __global__ (SelectPassParams) of each SelectPassKind, kSelectBlock threads
  const void* pass_kernels[3];
  // __global__ (SelectGatherParams), kSelectBlock threads
  const void* gather_kernel;
  // __global__ (SelectEmitParams), any block size
  const void* emit_kernel;
  // Orders n (select key, local index) candidates by key, then index: CUB's radix sort of
  // the pairs by index, then stably by key, in the double buffers keys[0|1] and
  // indices[0|1] (both start in buffer 0; on return *key_current and *index_current say
  // where the sorted ones are). Unused slots hold all-ones keys and indices, which sort last.
  // A null `temp` queries `temp_bytes`.
  cudaError_t (*sort)(void* temp, std::size_t& temp_bytes, void* const keys[2], unsigned long long* const indices[2],
                      long long n, int index_bits, int* key_current, int* index_current, cudaStream_t stream);
};

// dtype: csj::DType's integer value; null for an unknown one.
const TopKEngine* top_k_engine(int dtype, bool largest);

}  // namespace csj::kernels
