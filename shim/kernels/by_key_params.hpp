// The by-key engine's sizes, record and parameter block, shared by its JIT module
// (by_key_jit.cu, one per key and value size) and the host driver (by_key.cpp). Plain C++
// (no CUDA types) so both sides agree on the layout.
//
// The scans by key and reduce_by_key run on (head, value) pairs under the segmented
// combine, (h1, v1) . (h2, v2) = (h1 | h2, h2 ? v2 : op(v1, v2)), which is associative (not
// commutative) whatever op is, as long as op is associative.
//
// Every shard takes a single pass, one kernel per mode:
//   csj_by_key_one_pass_inclusive, _exclusive, _reduce
//                       a tile is a warp's (32 x by_key_lane_items elements), each block's
//                       warps taking consecutive tiles from a counter (every predecessor of a
//                       running tile has started, so the look-back cannot deadlock); each
//                       tile's keys and values read once, its pairs folded in each lane and
//                       scanned across the warp by shuffles (no block barrier), joined to the
//                       tiles before it by a decoupled look-back whose fold is fixed (left
//                       folds within groups of 32 tiles and over the groups; by_key_jit.cu
//                       says why that keeps the bits fixed); a tile with a run head publishes
//                       its pair at once
//                       (reduce_by_key: only the blocks resident at once, which loop over the
//                       groups of tiles, each warp copying its next tile in while it works on
//                       the current one). Writes the scan or, at every run's end, its first
//                       key and fold from the tile's first element's position, and the tile's
//                       count of run ends; the last tile writes the shard's total.
//   (reduce_by_key)     the tiles' counts replaced by their exclusive prefix (CUB's device
//                       scan, compiled into the shim), the last one the shard's run count;
//   csj_by_key_one_pass_gather
//                       each tile's outputs moved to their place in the result;
//   csj_by_key_carry    as below, over the single passes' totals;
//   csj_by_key_one_pass_fix_inclusive, _exclusive, _reduce
//                       on shards after the first: the carry applied to the shard's first run
//                       (each of its elements; reduce_by_key: its first output), which the
//                       pass, started with no carry, left without it (reduce_by_key: after
//                       the gather).
// Where a device lacks the room for reduce_by_key's outputs at the shard's size (or under
// CSJ_X_BY_KEY=two_pass) a shard takes two passes over chunks of kByKeyChunkTiles tiles, one block a chunk:
//   csj_by_key_reduce   each chunk's record: the fold of its pairs (only the values of its
//                       last run are read) and its count of run ends (tails);
//   csj_by_key_chunks   one block a group of kByKeyGroup chunks: the chunks' records replaced
//                       by their exclusive prefix within the group, and the group's fold;
//   csj_by_key_groups   one block: the groups' folds replaced by their exclusive prefix in
//                       group order, and the shard's total (a chunk's prefix is its group's
//                       then its own);
//   csj_by_key_carry    one thread, on shards after the first non-empty one: the fold of the
//                       earlier shards' totals in place order (what runs into this shard);
//   csj_by_key_sweep_inclusive, _exclusive, _reduce
//                       each chunk scanned again from its prefix, writing the scan or, at every
//                       run's end, its first key and fold (one kernel per mode).
// Every fold has a fixed association for a given shard layout and engine, so the results are
// the same bits run after run, floats included (the two engines associate differently).
#pragma once

namespace csj::kernels {

constexpr int kByKeyBlock = 256;
constexpr int kByKeyChunkTiles = 4;
constexpr int kByKeyMaxValue = 32;  // bytes of a value (a record of up to four 8-byte fields)

// Items per thread: 8 for keys and values of up to 8 bytes, 4 up to 16, else 2.
constexpr int by_key_items(int key_size, int value_size) {
  const int widest = key_size > value_size ? key_size : value_size;
  return widest <= 8 ? 8 : widest <= 16 ? 4 : 2;
}
// Blocks of the sweeps and single passes a multiprocessor must hold (their launch bounds): 4
// (64 registers) for
// 4-byte keys and values, which the sweeps are latency-bound on. They spill (sm_90: 16 bytes
// a thread for the exclusive scan, 24 for the inclusive, 112 for reduce_by_key's), which costs
// less than the occupancy gained: on an H200 reduce_by_key took 2.75 against 3.6 ms uncapped
// (112 registers), the scan 2.67 against 2.91 (80). Wider types, which would spill
// hundreds of bytes, are left to the compiler.
constexpr int by_key_sweep_blocks(int key_size, int value_size) {
  return key_size <= 4 && value_size <= 4 ? 4 : 1;
}
// The single pass: a tile a warp, kByKeyPassWarps warps a block. 16 items a lane for keys and
// values of up to 4 bytes, 8 up to 8, 4 up to 16, else 2 (a lane's 64 bytes of either).
constexpr int kByKeyPassWarps = 8;
static_assert(kByKeyBlock == 32 * kByKeyPassWarps, "the single pass's blocks are kByKeyBlock threads");
// reduce_by_key's gather after the single pass: consecutive tiles a warp (a power of two, at most 32).
constexpr int kByKeyGatherTiles = 32;
constexpr int by_key_lane_items(int key_size, int value_size) {
  const int widest = key_size > value_size ? key_size : value_size;
  return widest <= 4 ? 16 : widest <= 8 ? 8 : widest <= 16 ? 4 : 2;
}
constexpr long long by_key_pass_tile(int key_size, int value_size) {
  return 32LL * by_key_lane_items(key_size, value_size);
}

// The chunk records' scan, in two levels: csj_by_key_chunks' blocks of kByKeyGroupThreads
// threads each fold kByKeyGroupRun consecutive records a thread and scan the runs, one group
// of kByKeyGroup chunks a block; csj_by_key_groups does the same over the groups in one
// block. (One block of 1024 threads over every chunk spilled its records to local memory
// and took 0.95 ms for 2^28 elements on an H200, a third of a scan by key.)
constexpr int kByKeyGroupThreads = 256;
constexpr int kByKeyGroupRun = 4;
constexpr long long kByKeyGroup = static_cast<long long>(kByKeyGroupThreads) * kByKeyGroupRun;
constexpr long long by_key_chunk(int key_size, int value_size, int chunk_tiles = kByKeyChunkTiles) {
  return static_cast<long long>(kByKeyBlock) * by_key_items(key_size, value_size) * chunk_tiles;
}

// A range's fold, as the chunk records, the shards' totals and the carries hold it.
struct alignas(16) ByKeyRecord {
  long long tails;               // runs that end in the range
  int valid;                     // the range holds an element (else the record is the identity)
  int head;                      // a run starts in it
  unsigned long long key;        // the first key of its last run (a 4-byte key in the low bytes)
  unsigned long long unused;
  unsigned char value[kByKeyMaxValue];  // the fold of its last run's values
};
static_assert(sizeof(ByKeyRecord) == 64, "ByKeyRecord is 64 bytes on both sides");

enum ByKeyMode { kByKeyInclusive = 0, kByKeyExclusive = 1, kByKeyReduce = 2 };

struct ByKeyParams {
  const void* keys;
  const void* values;
  long long n;                 // the shard's elements
  int mode;                    // ByKeyMode
  int count;                   // csj_by_key_carry: records to fold
  int chunk_tiles;             // tiles a chunk (kByKeyChunkTiles)
  const void* prev_key;        // the last key of the nearest non-empty shard before, or null
  const void* next_key;        // the first key of the nearest non-empty shard after, or null
  ByKeyRecord* chunks;         // one per chunk (device scratch)
  long long num_chunks;
  ByKeyRecord* groups;         // one per kByKeyGroup chunks (device scratch)
  long long num_groups;
  ByKeyRecord* total;          // the shard's fold (device scratch)
  ByKeyRecord* carry;          // what runs into the shard (device scratch), or null: nothing
  const ByKeyRecord* sources;  // csj_by_key_carry: the earlier shards' totals, in place order
  void* out_values;            // modes 0, 1: the scan (n values); mode 2: one per run end
  void* out_keys;              // mode 2: each run's first key
  alignas(16) unsigned char init[kByKeyMaxValue];  // mode 1: the value every run starts from
  // The single pass (csj_by_key_one_pass_*): tiles of the shard in the order a counter hands
  // them out, each publishing its fold in `tile_records` under `tile_flags`.
  long long num_tiles;
  unsigned long long* tile_counter;  // zeroed before the launch
  int* tile_flags;                   // num_tiles, zeroed before the launch (kByKeyTile*)
  void* tile_records;                // 2 * num_tiles pairs of at most kByKeyTileRecord bytes each
  long long* run_count;              // mode 2: the shard's run ends (tile_ends + num_tiles)
  long long* tile_ends;              // mode 2: each tile's run ends (num_tiles + 1, the last zero),
                                     // then their exclusive prefix (each tile's first output)
  void* tile_keys;                   // mode 2: each tile's outputs from its first element's
  void* tile_values;                 // position (scratch at the shard's size)
};

// A tile's state in the single pass: nothing yet, its own fold published (the aggregate),
// its fold with its group's tiles before it (the local inclusive), or, on a group's last
// tile, the fold of its group and every group before it (the group's prefix).
enum ByKeyTileState { kByKeyTileNone = 0, kByKeyTileAggregate = 1, kByKeyTileInclusive = 2, kByKeyTileGroup = 3 };
// Tiles a group of the look-back's two levels (by_key_jit.cu says why).
constexpr long long kByKeyLookBackGroup = 32;
constexpr int kByKeyTileRecord = 64;  // bytes a tile record may take (a pair with its key)

}  // namespace csj::kernels
