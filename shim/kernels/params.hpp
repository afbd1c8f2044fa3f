// Kernel parameter blocks shared by the device code and the host launch driver.
// Plain C++ (no CUDA types) so both sides agree on the layout; the one device helper is
// compiled for the device side only.
#pragma once

namespace csj::kernels {

constexpr int kTransformBlock = 256;
constexpr int kTransformItems = 4;
constexpr int kMaxInputs = 4;
constexpr int kMaxScalars = 8;
constexpr int kScalarSlot = 8;  // bytes per runtime scalar

constexpr int kMaxAccSize = 32;  // bytes: tuple accumulators of up to four 8-byte fields

// The alignment the kernels need of an element of `size` bytes, which they move as words:
// a number as itself (4 or 8 bytes), a record as 8-byte words when its size allows, else as
// 4-byte words (Blob in transform.cuh). adopt() checks foreign buffers against it.
constexpr int element_alignment(int size) { return size % 8 == 0 ? 8 : 4; }

// A transform's runtime scalars, one slot each. Bit k of `on_device` set: slot k holds the
// device address of the value (a DeviceScalar's copy on the launching place), which the
// kernel reads there, so a value a reduction wrote on the device needs no host round trip.
struct ScalarPack {
  alignas(8) unsigned char bytes[kMaxScalars * kScalarSlot];
  unsigned int on_device;
};

#if defined(__CUDACC__)
// Where an operator reads scalar `k`: its slot, or the device value the slot points to.
__device__ __forceinline__ const void* scalar_address(const ScalarPack& scalars, int k) {
  const unsigned char* slot = scalars.bytes + k * kScalarSlot;
  if ((scalars.on_device >> k) & 1u) return *reinterpret_cast<const void* const*>(slot);
  return slot;
}
#endif

struct TransformParams {
  const void* inputs[kMaxInputs];
  void* out;
  long long n;
  long long index_base;  // global index of out[0], for operators that use it
  ScalarPack scalars;
  int neighbour;         // adjacent_difference's pass: -1 reads x[i - 1] beside x[i], +1 x[i + 1]
  int copy_edge;         // ... and copies the element without a neighbour (x[0], or x[n - 1])
};

// ---- reduce / scan ----
// A block folds one contiguous chunk of its place's shard in block tiles, its 8 warps one
// contiguous part of each tile, each lane 64 bytes of the part per step (see Reduction).
// Every fold runs in element order and with a fixed association, so results are
// deterministic and operators need not be commutative.
constexpr int kReduceBlock = 256;
constexpr int kReduceWarps = kReduceBlock / 32;
constexpr int reduce_lane_items(int in_size) { return 64 / in_size; }


struct ReduceParams {
  const void* in;
  long long n;
  long long index_base;      // global index of in[0] (index-aware map operators)
  long long chunk;           // elements per block: a multiple of 8 * 16 / in_size
  void* partials;            // one accumulator per block
  void* prefixes;            // null, or one exclusive prefix per block (for scans)
  unsigned int* counter;     // zero before launch; the last block resets it
  void* result;              // one accumulator: init op (the fold of the whole shard)
  int has_init;
  alignas(8) unsigned char init[kMaxAccSize];
  // A runtime value for built-in maps (count's target); for record inputs, the shard's
  // global base (ShardedArray::global_base), which maps of record modules address from.
  alignas(8) unsigned char map_value[8];
  // Several places (place_count > 1), no fold launch: the last block of each place stores
  // its shard's total in place_totals[place_index] (memory of place 0's device) and counts
  // itself in place_counter (system scope); the place that arrives last folds the totals
  // in place order, init first, into final_result (pinned host memory) and zeroes the
  // counter. `result` is then unused.
  void* place_totals;
  unsigned int* place_counter;
  void* final_result;
  int place_index;
  int place_count;
  // One place, a host result: the last block hands the result over in `handover` (mapped
  // pinned host memory, handover_words(acc size) words), which the host polls instead of
  // synchronising the stream. Each 8-byte word carries 4 bytes of the result below `ticket`
  // and is stored whole, so a word showing this call's ticket holds this call's bytes: no
  // system fence between the value and a flag, and `result` is unused. Null: `result` gets
  // the value instead.
  unsigned long long* handover;
  unsigned int ticket;
};
constexpr int handover_words(int acc_size) { return (acc_size + 3) / 4; }

// Folds `count` accumulators in order: total = init? op v0 op v1 ...; prefixes[k] holds the
// exclusive prefix before v_k (undefined for k == 0 without init). Each v_k is read where
// its place left it (peer access) or from a staging copy.
constexpr int kMaxFoldValues = 64;
struct FoldParams {
  const void* sources[kMaxFoldValues];
  void* prefixes;
  void* total;
  int count;
  int has_init;
  alignas(8) unsigned char init[kMaxAccSize];
};

// Segmented reduce on one place: piece k of the shard is [offsets[k], offsets[k+1]) (global
// positions) clamped to the shard, folded in element order by one block (or, per_warp, one
// warp) into pieces[k]: init op fold, init for an empty piece, and the bare fold for piece 0
// when `head` (the tail of a segment that began on an earlier shard; init went in there).
// With `bare` (positions read on the device by several places, every segment a piece of
// each place): a non-empty piece stores its bare fold and an empty one stores nothing; the
// places' pieces are then combined by SegmentedFoldParams's kernel.
// With `verdicts` (device positions: the kernel of one place, its pieces every segment), blocks
// [0, check_parts) first check the count + 1 positions against [0, size] (check_positions_part,
// reduce.cuh), so the call needs no check kernel ahead of the folds.
struct SegmentedParams {
  const void* in;
  long long n;
  long long index_base;     // global index of in[0]
  const long long* offsets;  // count + 1 global positions, non-decreasing
  long long count;           // pieces
  void* pieces;              // count accumulators
  unsigned long long* verdicts;  // check_parts words of mapped pinned host memory, or null
  long long size;                // len(a), for the check
  int check_parts;
  int per_warp;
  int head;
  int bare;
  alignas(8) unsigned char init[kMaxAccSize];
  alignas(8) unsigned char map_value[8];  // as ReduceParams::map_value
};

// The cross-place step of a segmented reduce from device positions, on one result place:
// out[i] = init op piece_0 op piece_1 ..., in place order, over the places whose shard
// [shard_begin[q], shard_end[q]) meets segment first + i (the others left no piece: their
// slot was never written). pieces[q] points at place q's piece of segment `first` (its own
// memory through peer access, or a staging copy), null for a place that holds no elements.
struct SegmentedFoldParams {
  const long long* offsets;  // the S + 1 global positions, on this place's device
  long long first;           // the segment of out[0]
  long long count;           // result slots on this place
  void* out;
  const void* pieces[kMaxFoldValues];
  long long shard_begin[kMaxFoldValues];
  long long shard_end[kMaxFoldValues];
  int places;
  alignas(8) unsigned char init[kMaxAccSize];
};
constexpr int kSegmentedFoldBlock = 256;

// Checks S + 1 positions for a segmented reduce from device memory, in `parts` parts, one a
// block: part c writes to verdicts[c] the least code of a violation among its positions, or
// kPositionsGood: k for offsets[k] < offsets[k - 1] (1 <= k <= S), S + 1 for offsets[0] < 0,
// S + 2 for offsets[S] > size, so the least code over the parts reports a fall before the
// ends, and the first fall before the later ones (the order of the host check's messages).
// Non-decreasing positions lie in range when both ends do. The host sets every word to
// kPositionsPending before the launch and reads the verdict once none is left pending.
// Used by the segmented reduce's first blocks (SegmentedParams) and, where no fold runs, by a
// kernel of its own.
constexpr unsigned long long kPositionsGood = ~0ULL;
constexpr unsigned long long kPositionsPending = ~0ULL - 1;
struct PositionsCheckParams {
  const long long* offsets;
  long long count;  // S + 1
  long long size;   // len(a)
  unsigned long long* verdicts;  // gridDim.x words
};
constexpr int kPositionsCheckBlock = 256;

constexpr int kScanBlock = 256;
// Items per thread: records over 16 bytes take 4 so that a tile's exchange and store fit the
// 48 KiB of static shared memory (256 x 8 x 32 bytes would not).
constexpr int scan_items(int acc_size) { return acc_size == 4 ? 16 : acc_size <= 16 ? 8 : 4; }
constexpr int scan_tile(int acc_size) { return kScanBlock * scan_items(acc_size); }

// Second pass of a scan: block b scans its chunk (same chunks as the ReduceParams pass that
// produced `prefixes`) seeded with seed op prefixes[b].
struct ScanParams {
  const void* in;
  void* out;
  long long n;
  long long index_base;
  long long chunk;
  const void* prefixes;
  const void* seed;  // device memory: everything before in[0] (or null: seed_value)
  int has_seed;
  int exclusive;
  alignas(8) unsigned char seed_value[kMaxAccSize];
};

// A scan of one place in one pass (OnePassScan in reduce.cuh), for accumulators of 4 or 8
// bytes: one tile of one_pass_tile(in_size, acc_size) elements a block, taken in order from `draw`, and
// joined to the tiles before it by a look-back over `states` (a 16-byte word a tile, tagged with
// the launch's epoch). `draw` (PlaceGroup::pass_counter's second word) holds the epoch above
// kOnePassTileBits and the tiles drawn below; the block that draws the last tile sets it to the
// next epoch with none drawn, so no call clears it. States from an earlier epoch read as not
// yet published, so no call clears them either; they are zero when allocated (epochs tag from 1).
constexpr bool one_pass_scans(int in_size, int acc_size) {  // the modules that hold csj_scan_one_pass
  return (in_size == 4 || in_size == 8) && (acc_size == 4 || acc_size == 8);
}
constexpr int kOnePassTileBits = 24;
constexpr int kOnePassBlock = 512;
constexpr int kOnePassReads = 2;  // tile states a lane of the look-back reads at a time
// Where inputs and accumulators have one size, a tile of 32 KiB is staged in shared memory
// (OnePassScan's staged path): 256 threads a block, each folding and then scanning a run of
// 128 bytes read from there, so the elements are never all in registers and six blocks (six
// tiles in flight) fit a multiprocessor. Otherwise the tile goes through registers: 512 threads,
// and a tile's exchange (inputs) and store (accumulators) each fit the 48 KiB of static shared
// memory, so 8 items a thread where either is 8 bytes wide.
constexpr bool one_pass_staged(int in_size, int acc_size) { return in_size == acc_size; }
constexpr int kOnePassStagedBlock = 256;
constexpr int kOnePassStagedBytes = 32 << 10;  // a staged tile
constexpr int one_pass_block(int in_size, int acc_size) {
  return one_pass_staged(in_size, acc_size) ? kOnePassStagedBlock : kOnePassBlock;
}
constexpr int one_pass_items(int in_size, int acc_size) {
  return one_pass_staged(in_size, acc_size) ? kOnePassStagedBytes / kOnePassStagedBlock / in_size : 8;
}
constexpr int one_pass_tile(int in_size, int acc_size) {
  return one_pass_block(in_size, acc_size) * one_pass_items(in_size, acc_size);
}
// Blocks a multiprocessor (the launch bounds): six staged (at most 40 registers, 34 KiB of
// shared memory each: six tiles of 32 KiB in flight), two otherwise (the compiler's 60-62
// registers). Staged against the tile in registers (three blocks of 512 for 4-byte elements,
// two for 8-byte), 2^28 elements on one H100, builds alternated in one call: float32 2665-2690
// GB/s against 2221-2260, int32 2628-2711 against 2131-2151, float64 2529 against 2094.
constexpr int one_pass_blocks(int in_size, int acc_size) { return one_pass_staged(in_size, acc_size) ? 6 : 2; }
struct OnePassScanParams {
  const void* in;
  void* out;
  long long n;
  long long index_base;
  long long num_tiles;  // < 2^kOnePassTileBits
  void* states;         // num_tiles 16-byte words
  unsigned long long* draw;
  int has_seed;
  int exclusive;
  alignas(8) unsigned char seed_value[kMaxAccSize];
};

}  // namespace csj::kernels
