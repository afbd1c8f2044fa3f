// Host-visible handles of the kernels compiled into the shim at build time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace csj::kernels {

// Calls `f(T{})` with the C++ element type of a csj::DType integer value (the dtype switch
// every table of built-in kernels needs).
template <class F>
auto with_dtype(int dtype, F&& f) -> decltype(f(float{})) {
  switch (dtype) {
    case 0: return f(float{});
    case 1: return f(double{});
    case 2: return f(std::int32_t{});
    case 3: return f(std::int64_t{});
    case 4: return f(std::uint32_t{});
    case 5: return f(std::uint64_t{});
  }
  return {};
}

// Same order as csj::BuiltinOp.
enum class BuiltinKernel { negate, scale, add_scalar, add, mul, axpy, fill, sequence };

// The __global__ function for (op, dtype) where dtype is csj::DType's integer value;
// launch with cudaLaunchKernel and one TransformParams argument.
const void* builtin_transform_kernel(BuiltinKernel op, int dtype);

// Same order as csj::BuiltinReduction.
enum class BuiltinReduction { sum, min, max };

// The reduce / fold / scan __global__ functions of one built-in operator and
// dtype (accumulator = input dtype).
struct BuiltinReduceKernels {
  const void* reduce;
  const void* fold;
  const void* scan;
  const void* scan_one_pass;  // OnePassScan (reduce.cuh)
};
BuiltinReduceKernels builtin_reduce_kernels(BuiltinReduction op, int dtype);

// segmented_reduce's check of device positions where no fold runs; launch with
// cudaLaunchKernel, a part a block, kPositionsCheckBlock threads, and one
// PositionsCheckParams (params.hpp) argument.
const void* builtin_positions_check_kernel();

// count: elements equal to ReduceParams::map_value (the dtype's bytes), as int64, with the
// int64 fold for the cross-place combine.
BuiltinReduceKernels builtin_count_kernels(int dtype);

// histogram_even over one shard: adds each element's bin to `counts` (uint64, zeroed before:
// by a memset, or in a slot by the previous call's kernel). `edges` (num_bins + 1 values, float for float32 input, else double) are numpy's
// bin edges; an element is counted when edges[0] <= x <= edges[num_bins] and lands in the
// bin i with edges[i] <= x < edges[i + 1] (the last bin closed), as numpy does.
constexpr int kHistogramInlineEdgeBytes = 2048;  // edges carried in the parameters up to this
constexpr int kHistogramSlotBins = 2048;         // bins a slot hands over (HistogramParams::done)
constexpr int kHistogramTicketShift = 48;        // a handed-over word: ticket << 48 | count
struct HistogramParams {
  const void* in;
  long long n;
  const void* edges;    // null: the edges are inline_edges
  unsigned long long* counts;
  int num_bins;
  int edges_in_shared;  // copy the edges to the start of dynamic shared memory
  // 32-bit sub-histograms in shared memory: `copies` of them (kHistogramWarps, one per warp,
  // or 1), or 0 (atomics straight on `counts`); each bin of a copy is `columns` counters
  // (32: one per lane, so that no two lanes of a warp ever meet on a counter or a bank).
  int copies;
  int columns;
  int bins_offset;      // where they start in dynamic shared memory (16-byte aligned)
  // Non-null: `counts` and `done` read zero at the start, and the last block to finish zeroes
  // them and then hands each bin's count to the host in its word of `host_counts` (pinned,
  // mapped), stored whole as ticket << kHistogramTicketShift | count: no memset before, no
  // copy after, and a word that shows the call's ticket holds the call's count (n < 2^48). A
  // lone block (a grid of one) stores its counts there itself and leaves both untouched.
  unsigned int* done;
  unsigned long long* host_counts;
  unsigned long long ticket;
  alignas(16) unsigned char inline_edges[kHistogramInlineEdgeBytes];
};
const void* builtin_histogram_kernel(int dtype);
constexpr int kHistogramBlock = 256;
constexpr int kHistogramWarps = kHistogramBlock / 32;
constexpr int kHistogramSharedBytes = 48 * 1024;  // dynamic shared memory without opt-in
// Elements a thread counts at least before the grid grows past a block per this many: each
// block zeroes, merges and adds its sub-histograms once, which small shards must amortise.
constexpr int kHistogramThreadItems = 16;
constexpr int kHistogramBlocksPerSM = 6;  // the grid's most (histogram.cpp, histogram_grid)
// The most bins given a column per lane: 16 KiB of counters a block, six blocks a
// multiprocessor. Measured at 64 bins; more bins take more zeroing and merging per block and,
// near 48 KiB, fewer blocks a multiprocessor than the grid holds, so they keep the copy per warp.
constexpr int kHistogramColumnBins = 128;

// The flagged compaction (select_builtin.cu, SelectParams of select_params.hpp) for flags of
// `flag_size` bytes (4 or 8): count and scatter __global__ functions.
struct SelectFlagKernels {
  const void* count;
  const void* scatter;
};
SelectFlagKernels builtin_select_flag_kernels(int flag_size);

// Every selection's middle step, queued on `stream`: `counts` (tiles + 1 of them, the last
// zero) replaced by their exclusive prefix, so entry t is tile t's first output position in
// each class and entry `tiles` the shard's totals (CUB's decoupled look-back scan; its
// scratch from `pool`, freed in stream order).
struct SelectCounts;  // select_params.hpp
cudaError_t scan_select_counts(SelectCounts* counts, long long tiles, cudaStream_t stream, cudaMemPool_t pool);

// reduce_by_key's step between its single pass and the gather: `ends` (tiles + 1 run-end
// counts, the last zero) replaced by their exclusive prefix the same way.
cudaError_t scan_tile_ends(long long* ends, long long tiles, cudaStream_t stream, cudaMemPool_t pool);
// Queues on `stream` a store of `*count` (device memory) into `host` (pinned host memory, as
// the device addresses it), which the host polls: it learns the count as soon as the work
// before is done, without a copy engine's copy and a stream synchronisation.
cudaError_t publish_count(const long long* count, long long* host, cudaStream_t stream);

// The tile states of a look-back over one count per tile (count_lookback.cuh): their bytes for
// `tiles` tiles (CUB aligns them: give them 256-byte aligned memory), and their initialisation,
// queued on `stream` before the pass that reads them.
std::size_t count_lookback_scratch(long long tiles);
cudaError_t init_count_lookback_states(void* states, long long tiles, cudaStream_t stream);

}  // namespace csj::kernels
