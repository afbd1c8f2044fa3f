// Kernel parameter blocks shared by the device code and the host launch driver.
// Plain C++ (no CUDA types) so both sides agree on the layout.
#pragma once

namespace csj::kernels {

constexpr int kTransformBlock = 256;
constexpr int kTransformItems = 4;
constexpr int kMaxInputs = 4;
constexpr int kMaxScalars = 8;
constexpr int kScalarSlot = 8;  // bytes per runtime scalar

struct ScalarPack {
  alignas(8) unsigned char bytes[kMaxScalars * kScalarSlot];
};

struct TransformParams {
  const void* inputs[kMaxInputs];
  void* out;
  long long n;
  ScalarPack scalars;
};

// ---- reduce / scan ----
constexpr int kReduceBlock = 256;
constexpr int kReduceVectors = 8;  // 16-byte loads per thread per tile
constexpr int reduce_items(int in_size) { return kReduceVectors * 16 / in_size; }
constexpr int kReduceBlocksPerSm = 8;

constexpr int kScanBlock = 256;
constexpr int scan_items(int acc_size) { return acc_size == 4 ? 16 : 8; }
constexpr int kScanTilePadding = 32;  // CUB's TILE_STATUS_PADDING (one warp)
// Bytes per tile of CUB's single-word tile state: status + value in one transaction word.
constexpr int scan_tile_state_bytes(int acc_size) { return acc_size == 4 ? 8 : 16; }

struct ReduceParams {
  const void* in;
  long long n;
  long long index_base;      // global index of in[0] (index-aware map operators)
  void* partials;            // one accumulator per block
  unsigned int* counter;     // zero before launch; the last block resets it
  void* result;              // one accumulator
  long long tiles_per_block;
};

// Folds `count` accumulators in order: total = init? op v0 op v1 ...; prefixes[k] holds the
// exclusive prefix before v_k (undefined for k == 0 without init).
struct FoldParams {
  const void* values;
  void* prefixes;
  void* total;
  int count;
  int has_init;
  alignas(8) unsigned char init[8];
};

struct ScanInitParams {
  void* tile_state;
  int num_tiles;
};

struct ScanParams {
  const void* in;
  void* out;
  long long n;
  long long index_base;
  void* tile_state;
  const void* seed;  // the accumulated value of everything before in[0] (device memory)
  int has_seed;
  int exclusive;
};

}  // namespace csj::kernels
