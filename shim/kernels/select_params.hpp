// The selection engine's tile sizes and parameter block, shared by its kernels (select.cuh:
// the JIT module select_jit.cu, one per element size, and the built-in flags kernels of
// select_builtin.cu) and the host driver (select.cpp). Plain C++ (no CUDA types) so both
// sides agree on the layout.
//
// Every element falls in one of three classes (0, 1, 2): select keeps class 0, partition
// writes classes 0 and 1, three_way_partition all three. One place's shard takes three
// steps: csj_select_count (per tile, how many elements of each class), the device scan of
// the tiles' counts (scan_select_counts in builtin_kernels.hpp: their output offsets, and
// the place's totals, which the host reads to size the outputs), csj_select_scatter (each
// element written to its class's output at its tile's offset plus its rank in the tile:
// global order kept; a select's csj_select_keep). A select takes one pass where its device
// has room for an output at the shard's size (select.cpp decides): csj_select_single gets
// each tile's output position by decoupled look-back and writes the shard's count, which the
// host reads to shrink the output.
#pragma once

namespace csj::kernels {

constexpr int kSelectBlock = 256;
constexpr int kSelectClasses = 3;
constexpr int kMaxSelectPayloads = 4;  // arrays one payload-moving selection moves
constexpr int kSelectPayloadItems = 8;  // items per thread of the payload-moving selections

// Items per thread: 16 of 4 bytes, 8 of 8, 64 bytes' worth of records (at least 2). A tile
// holds at most 4096 elements, so that a thread's three class counts pack into one 64-bit
// word, 21 bits each (select.cuh).
constexpr int select_items(int element_size) {
  return element_size <= 4 ? 16 : element_size <= 8 ? 8 : (64 / element_size < 2 ? 2 : 64 / element_size);
}
constexpr long long select_tile(int element_size) {
  return static_cast<long long>(kSelectBlock) * select_items(element_size);
}

// A select's single pass (csj_select_single) ranks by ballot, not by the packed counts, so its
// tiles may be larger: 32 items a thread of 4 bytes (a bit each in a lane's mask), 16 of 8,
// select_items' otherwise. Twice select_items' tile keeps twice the bytes in flight through
// each look-back, which holds its block between the loads and the stores: for 2^28 float32,
// half kept, on one H100, 1918-2107 GB/s against 1722-1948 with tiles of 4096 (builds
// alternated four times over two calls). 32 KiB tiles of 4 and 8 bytes are staged in shared
// memory (select_jit.cu), so their size no longer costs registers.
constexpr int select_single_items(int element_size) {
  return element_size <= 4 ? 32 : element_size <= 8 ? 16 : select_items(element_size);
}
constexpr long long select_single_tile(int element_size) {
  return static_cast<long long>(kSelectBlock) * select_single_items(element_size);
}

// One tile's elements per class; after the scan, the tile's first output position in each
// class's output.
struct SelectCounts {
  long long count[kSelectClasses];
};

struct SelectParams {
  const void* in;           // the shard the classes come from (the elements, or the flags)
  long long n;
  long long index_base;     // the shard's first global index (operators with the index)
  long long tiles;
  SelectCounts* tile_counts;  // one per tile and one more, the totals (device scratch)
  void* out[kSelectClasses];  // each class's output shard; null: not written
  // payload-moving selections: the flagged compaction (select_builtin.cu: the class is 0
  // where the flag is nonzero, 1 elsewhere) and the run heads (by_key_jit.cu: 0 where an
  // element starts a run of equal keys); class 0's elements of each payload array are
  // written, not `in`'s
  int payloads;
  const void* payload_in[kMaxSelectPayloads];
  void* payload_out[kMaxSelectPayloads];
  int payload_size[kMaxSelectPayloads];  // bytes, a multiple of 4
  const void* before;  // run heads: the key before the shard's first (null: a run starts there)
  // select's single pass (csj_select_single): the look-back's tile states (count_lookback.cuh,
  // initialised by init_count_lookback_states), the counter tiles are taken from (zeroed), and
  // where the last tile writes the shard's count (totals->count[0]); device scratch
  void* tile_state;
  unsigned long long* next_tile;
  SelectCounts* totals;
};

}  // namespace csj::kernels
