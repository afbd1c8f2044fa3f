// top_k over a sharded array (csj/search.hpp). Each place selects the min(k, n) best elements
// of its own shard without sorting it (the radix select of top_k_engine.hpp): every counting
// pass is queued at once (a pass launched after the selection is done returns at once, so the
// host never waits between passes), then the gather of the candidates, CUB's sort of them by
// (select key, local index) and the output of the first min(k, n). Only then does the host
// wait, for each place in turn, copy its list and merge the lists by (select key, global
// index): P lists of at most k each, one step of a heap of P heads per element kept.
// Each place's memory is one stream-ordered allocation from its pool, used on its own stream
// only, so it goes back in stream order whether the call ends normally or by a throw.
#include "csj/search.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <new>
#include <queue>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../kernels/top_k_engine.hpp"
#include "csj/errors.hpp"
#include "cuda_check.hpp"
#include "format.hpp"
#include "launch.hpp"

namespace csj {
namespace {

using detail::check;
namespace kn = kernels;

constexpr std::size_t kAlign = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The digits the passes count, from the top: the select key's bits, then the local index's.
struct Digit {
  int source;  // 0: key, 1: index
  int shift;
  int width;
};

std::vector<Digit> digit_schedule(int key_bits, int index_bits) {
  std::vector<Digit> digits;
  for (int source = 0; source < 2; ++source) {
    const int bits = source == 0 ? key_bits : index_bits;
    for (int known = 0; known < bits;) {
      const int width = std::min(kn::kSelectDigitBits, bits - known);
      digits.push_back({source, bits - known - width, width});
      known += width;
    }
  }
  return digits;
}

// Bits of a local index: those of n - 1, at least one.
int index_bits_of(long long n) {
  const auto last = static_cast<unsigned long long>(n - 1);
  int bits = 1;
  while (bits < 64 && (last >> bits) != 0) ++bits;
  return bits;
}

// One place's allocation, carved into the selection's state and bins, the candidates' two
// double buffers (buffer 0 of keys and of indices adjacent, so that one memset marks every
// slot unused), CUB's storage and the output for the host.
struct SelectLayout {
  static constexpr std::size_t state = 0;
  static constexpr std::size_t arrivals = 64;
  static constexpr std::size_t count = 128;
  static constexpr std::size_t bins = 256;
  std::size_t keys[2] = {};
  std::size_t indices[2] = {};
  std::size_t temp = 0;
  std::size_t temp_bytes = 0;
  std::size_t staging = 0;  // take select keys (8 bytes each), take global indices, take values
  std::size_t total = 0;

  SelectLayout(const kn::TopKEngine& engine, long long capacity, long long take, std::size_t item,
               int index_bits, cudaStream_t stream) {
    const std::size_t key_bytes = aligned(static_cast<std::size_t>(capacity) * (engine.key_bits / 8));
    const std::size_t index_bytes = aligned(static_cast<std::size_t>(capacity) * sizeof(unsigned long long));
    keys[0] = bins + aligned(kn::kSelectBins * sizeof(unsigned long long));
    indices[0] = keys[0] + key_bytes;
    keys[1] = indices[0] + index_bytes;
    indices[1] = keys[1] + key_bytes;
    temp = indices[1] + index_bytes;
    void* const no_keys[2] = {nullptr, nullptr};
    unsigned long long* const no_indices[2] = {nullptr, nullptr};
    check(engine.sort(nullptr, temp_bytes, no_keys, no_indices, capacity, index_bits, nullptr, nullptr, stream),
          "cub::DeviceRadixSort (top_k candidates)");
    staging = temp + aligned(temp_bytes);
    total = staging + static_cast<std::size_t>(take) * (2 * sizeof(long long) + item);
  }
};

struct SelectPlace {
  int device = 0;
  cudaStream_t stream = nullptr;
  long long n = 0;
  long long take = 0;  // min(k, n): the place's list
  long long offset = 0;
  detail::StreamScratch scratch;
  std::size_t staging = 0;  // offset in scratch
};

// Queues one place's selection, up to its list in the staging area (current device: the
// place's).
void queue_selection(const kn::TopKEngine& engine, SelectPlace& place, const void* shard, std::size_t item,
                     cudaMemPool_t pool) {
  const long long capacity = std::min(place.n, place.take + kn::kSelectBoundaryLimit);
  const int index_bits = index_bits_of(place.n);
  const SelectLayout layout(engine, capacity, place.take, item, index_bits, place.stream);
  try {
    place.scratch = detail::StreamScratch(layout.total, place.stream, pool);
  } catch (const OutOfMemory&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw OutOfMemory("k: top_k of " + std::to_string(place.take) + " from a shard of " + std::to_string(place.n) +
                      " elements needs " + detail::memory_amount(layout.total) + " of device memory on cuda:" +
                      std::to_string(place.device) + ", which is not free");
  }
  place.staging = layout.staging;
  unsigned char* base = place.scratch.bytes();
  auto* state = reinterpret_cast<kn::SelectState*>(base + layout.state);
  auto* arrivals = reinterpret_cast<unsigned int*>(base + layout.arrivals);
  auto* count = reinterpret_cast<unsigned long long*>(base + layout.count);
  auto* bins = reinterpret_cast<unsigned long long*>(base + layout.bins);
  void* const keys[2] = {base + layout.keys[0], base + layout.keys[1]};
  unsigned long long* const indices[2] = {reinterpret_cast<unsigned long long*>(base + layout.indices[0]),
                                          reinterpret_cast<unsigned long long*>(base + layout.indices[1])};
  check(cudaMemsetAsync(base, 0, layout.keys[0], place.stream), "cudaMemsetAsync (top_k state)");
  check(cudaMemsetAsync(base + layout.keys[0], 0xFF,
                        layout.indices[0] + static_cast<std::size_t>(capacity) * sizeof(unsigned long long) -
                            layout.keys[0],
                        place.stream),
        "cudaMemsetAsync (top_k candidates)");

  const int sms = detail::multiprocessors(place.device);
  auto grid_for = [&](const void* kernel) {
    const long long per_block = static_cast<long long>(kn::kSelectBlock) * 2 * (16 / static_cast<long long>(item));
    const long long wanted = std::max(1LL, (place.n + per_block - 1) / per_block);
    const long long resident =
        static_cast<long long>(sms) *
        detail::blocks_per_multiprocessor(detail::KernelHandle::builtin(kernel), kn::kSelectBlock);
    return static_cast<unsigned>(std::min(wanted, resident));
  };

  // a shard wanted whole needs no pass: with no bit known, every element is in the bucket
  if (place.take < place.n) {
    bool first = true;
    for (const Digit& digit : digit_schedule(engine.key_bits, index_bits)) {
      const auto kind = first ? kn::SelectPassKind::first
                              : digit.source == 0 ? kn::SelectPassKind::key : kn::SelectPassKind::index;
      kn::SelectPassParams params{};
      params.in = shard;
      params.n = place.n;
      params.state = state;
      params.bins = bins;
      params.arrivals = arrivals;
      params.k = place.take;
      params.limit = kn::kSelectBoundaryLimit;
      params.shift = digit.shift;
      params.width = digit.width;
      params.key_bits = engine.key_bits;
      params.index_bits = index_bits;
      const void* kernel = engine.pass_kernels[static_cast<int>(kind)];
      detail::launch(detail::KernelHandle::builtin(kernel), grid_for(kernel), kn::kSelectBlock, place.stream, params,
                     "launching top_k pass");
      first = false;
    }
  }
  kn::SelectGatherParams gather{};
  gather.in = shard;
  gather.n = place.n;
  gather.state = state;
  gather.keys = keys[0];
  gather.indices = indices[0];
  gather.count = count;
  gather.capacity = capacity;
  gather.key_bits = engine.key_bits;
  gather.index_bits = index_bits;
  detail::launch(detail::KernelHandle::builtin(engine.gather_kernel), grid_for(engine.gather_kernel),
                 kn::kSelectBlock, place.stream, gather, "launching top_k gather");

  std::size_t temp_bytes = layout.temp_bytes;
  int key_current = 0, index_current = 0;
  check(engine.sort(base + layout.temp, temp_bytes, keys, indices, capacity, index_bits, &key_current,
                    &index_current, place.stream),
        "cub::DeviceRadixSort (top_k candidates)");

  kn::SelectEmitParams emit{};
  emit.in = shard;
  emit.keys = keys[key_current];
  emit.indices = indices[index_current];
  emit.count = place.take;
  emit.offset = place.offset;
  emit.out_keys = reinterpret_cast<unsigned long long*>(base + layout.staging);
  emit.out_indices = reinterpret_cast<long long*>(base + layout.staging + place.take * sizeof(long long));
  emit.out_values = base + layout.staging + place.take * 2 * sizeof(long long);
  const auto emit_grid = static_cast<unsigned>(std::min<long long>((place.take + 255) / 256, sms * 8LL));
  detail::launch(detail::KernelHandle::builtin(engine.emit_kernel), emit_grid, 256, place.stream, emit,
                 "launching top_k output");
}

}  // namespace

void top_k(const ShardedArray& in, long long k, bool largest, void* values, std::size_t value_bytes,
           long long* indices, std::size_t index_bytes) {
  const ArrayLeases leases({{&in, "a"}});
  in.check_scalar("a", "top_k");
  if (k < 0 || k > in.size()) {
    throw std::invalid_argument("k: expected 0 <= k <= len(a) = " + std::to_string(in.size()) + ", got " +
                                std::to_string(k));
  }
  const std::size_t item = in.itemsize();
  if (value_bytes != static_cast<std::size_t>(k) * item) {
    throw std::invalid_argument("values: expected room for k elements of a's dtype");
  }
  if (index_bytes != static_cast<std::size_t>(k) * sizeof(long long)) {
    throw std::invalid_argument("indices: expected room for k int64 indices");
  }
  if (k == 0) return;
  const kn::TopKEngine* engine = kn::top_k_engine(static_cast<int>(in.dtype()), largest);
  if (!engine) throw std::invalid_argument(std::string("a: cannot select from dtype ") + dtype_name(in.dtype()));

  const PlaceGroup& group = *in.group();
  std::vector<SelectPlace> places(group.size());
  std::vector<std::size_t> used;  // places with elements, in order
  // every place's work first, so that the places select concurrently; the host then waits
  for (std::size_t p = 0; p < group.size(); ++p) {
    SelectPlace& place = places[p];
    place.n = in.shard_size(p);
    if (place.n == 0) continue;
    place.device = group.device(p);
    place.stream = reinterpret_cast<cudaStream_t>(group.stream(p));
    place.take = std::min(k, place.n);
    place.offset = in.shard_offset(p);
    detail::DeviceGuard guard(place.device);
    queue_selection(*engine, place, reinterpret_cast<const void*>(in.shard_pointer(p)), item,
                    reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)));
    used.push_back(p);
  }

  auto copy_out = [&](const SelectPlace& place, std::size_t from, void* to, std::size_t bytes) {
    check(cudaMemcpyAsync(to, place.scratch.bytes() + place.staging + from, bytes, cudaMemcpyDeviceToHost,
                          place.stream),
          "cudaMemcpyAsync (top_k results)");
  };
  const auto take_bytes = [](long long take, std::size_t size) { return static_cast<std::size_t>(take) * size; };

  if (used.size() == 1) {  // one list: it is the answer
    const SelectPlace& place = places[used.front()];
    detail::DeviceGuard guard(place.device);
    copy_out(place, take_bytes(place.take, sizeof(long long)), indices, index_bytes);
    copy_out(place, take_bytes(place.take, 2 * sizeof(long long)), values, value_bytes);
    check(cudaStreamSynchronize(place.stream), "cudaStreamSynchronize");
    return;
  }

  // each place's list, in place order: select keys, global indices, values
  std::vector<std::vector<unsigned char>> lists(group.size());
  for (std::size_t p : used) {
    const SelectPlace& place = places[p];
    detail::DeviceGuard guard(place.device);
    lists[p].resize(take_bytes(place.take, 2 * sizeof(long long) + item));
    copy_out(place, 0, lists[p].data(), lists[p].size());
    check(cudaStreamSynchronize(place.stream), "cudaStreamSynchronize");
  }
  // Merge by (select key, global index): global indices never tie, so the order is total.
  using Head = std::tuple<unsigned long long, long long, std::size_t, long long>;  // key, index, place, position
  std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
  auto key_at = [&](std::size_t p, long long j) {
    unsigned long long key;
    std::memcpy(&key, lists[p].data() + j * sizeof(unsigned long long), sizeof(key));
    return key;
  };
  auto index_at = [&](std::size_t p, long long j) {
    long long index;
    std::memcpy(&index, lists[p].data() + take_bytes(places[p].take, sizeof(long long)) + j * sizeof(long long),
                sizeof(index));
    return index;
  };
  for (std::size_t p : used) heads.emplace(key_at(p, 0), index_at(p, 0), p, 0);
  auto* out_values = static_cast<unsigned char*>(values);
  for (long long written = 0; written < k; ++written) {
    const Head head = heads.top();
    heads.pop();
    const std::size_t p = std::get<2>(head);
    const long long j = std::get<3>(head);
    indices[written] = std::get<1>(head);
    std::memcpy(out_values + written * item,
                lists[p].data() + take_bytes(places[p].take, 2 * sizeof(long long)) + j * item, item);
    if (j + 1 < places[p].take) heads.emplace(key_at(p, j + 1), index_at(p, j + 1), p, j + 1);
  }
}

}  // namespace csj
