#include "csj/reduce.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>

#include "../kernels/builtin_kernels.hpp"
#include "../kernels/params.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"

namespace csj {
namespace {

using detail::check;
using detail::KernelHandle;
namespace k = kernels;

struct KernelSet {
  KernelHandle reduce, fold, scan_init, scan;
};

std::vector<KernelSet> linked_sets(const std::vector<const KernelLibrary*>& libraries,
                                   const PlaceGroup& group, bool with_scan) {
  if (libraries.size() != group.size()) {
    throw std::invalid_argument("libraries: expected one per place (" + std::to_string(group.size()) +
                                "), got " + std::to_string(libraries.size()));
  }
  std::vector<KernelSet> sets;
  for (const KernelLibrary* library : libraries) {
    if (!library) throw std::invalid_argument("libraries: None");
    KernelSet set;
    set.reduce = KernelHandle::linked(library->kernel("csj_reduce"));
    set.fold = KernelHandle::linked(library->kernel("csj_fold"));
    if (with_scan) {
      set.scan_init = KernelHandle::linked(library->kernel("csj_scan_init"));
      set.scan = KernelHandle::linked(library->kernel("csj_scan"));
    }
    sets.push_back(set);
  }
  return sets;
}

std::vector<KernelSet> builtin_sets(BuiltinReduction op, DType dtype, std::size_t places) {
  const k::BuiltinReduceKernels kernels =
      k::builtin_reduce_kernels(static_cast<k::BuiltinReduction>(op), static_cast<int>(dtype));
  KernelSet set{KernelHandle::builtin(kernels.reduce), KernelHandle::builtin(kernels.fold),
                KernelHandle::builtin(kernels.scan_init), KernelHandle::builtin(kernels.scan)};
  return std::vector<KernelSet>(places, set);
}

void check_acc(int acc_size, const std::string& init) {
  if (acc_size != 4 && acc_size != 8) {
    throw std::invalid_argument("acc_size: expected 4 or 8, got " + std::to_string(acc_size));
  }
  if (!init.empty() && init.size() != static_cast<std::size_t>(acc_size)) {
    throw std::invalid_argument("init: expected " + std::to_string(acc_size) + " bytes");
  }
}

cudaStream_t stream_of(const PlaceGroup& group, std::size_t place) {
  return reinterpret_cast<cudaStream_t>(group.stream(place));
}

void* allocate(std::size_t bytes, cudaStream_t stream) {
  void* pointer = nullptr;
  check(cudaMallocAsync(&pointer, bytes, stream), "cudaMallocAsync (scratch)");
  return pointer;
}

// Makes `waiter` wait for the work queued so far on `producer` (no-op when they are equal).
void order_after(cudaStream_t waiter, int waiter_device, cudaStream_t producer, int producer_device) {
  if (waiter == producer) return;
  cudaEvent_t event;
  {
    detail::DeviceGuard guard(producer_device);
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check(cudaEventRecord(event, producer), "cudaEventRecord");
  }
  detail::DeviceGuard guard(waiter_device);
  cudaError_t status = cudaStreamWaitEvent(waiter, event, 0);
  cudaEventDestroy(event);
  check(status, "cudaStreamWaitEvent");
}

int multiprocessors(int device) {
  int count = 0;
  check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute");
  return count;
}

// Queues the reduction of one shard; its accumulator lands at `result` (device memory of
// the place) once the place's stream gets there.
void reduce_shard(const KernelSet& kernels, const ShardedArray& in, std::size_t place,
                  int acc_size, void* result) {
  const PlaceGroup& group = *in.group();
  const int device = group.device(place);
  const cudaStream_t stream = stream_of(group, place);
  const long long n = in.shard_size(place);
  const long long tile = static_cast<long long>(k::kReduceBlock) *
                         k::reduce_items(static_cast<int>(itemsize(in.dtype())));
  const long long tiles = (n + tile - 1) / tile;
  const long long target = static_cast<long long>(multiprocessors(device)) * k::kReduceBlocksPerSm;
  const long long tiles_per_block = (tiles + target - 1) / target;
  const auto grid = static_cast<unsigned>((tiles + tiles_per_block - 1) / tiles_per_block);

  detail::DeviceGuard guard(device);
  const std::size_t partial_bytes = (static_cast<std::size_t>(grid) * acc_size + 15) / 16 * 16;
  auto* scratch = static_cast<unsigned char*>(allocate(partial_bytes + 16, stream));
  check(cudaMemsetAsync(scratch + partial_bytes, 0, sizeof(unsigned int), stream), "cudaMemsetAsync");
  k::ReduceParams params{};
  params.in = reinterpret_cast<const void*>(in.shard_pointer(place));
  params.n = n;
  params.index_base = in.shard_offset(place);
  params.partials = scratch;
  params.counter = reinterpret_cast<unsigned int*>(scratch + partial_bytes);
  params.result = result;
  params.tiles_per_block = tiles_per_block;
  detail::launch(kernels.reduce, grid, k::kReduceBlock, stream, params, "launching reduce");
  check(cudaFreeAsync(scratch, stream), "cudaFreeAsync");
}

// Per-shard totals of `places` (in order) folded on place 0's stream into `staging` on place
// 0's device: staging[0..K) totals, [K..2K) exclusive prefixes, [2K] the total.
void* totals_and_prefixes(const std::vector<KernelSet>& sets, const ShardedArray& in,
                          const std::vector<std::size_t>& places, int acc_size,
                          const std::string& init) {
  const PlaceGroup& group = *in.group();
  const int home = group.device(0);
  const cudaStream_t home_stream = stream_of(group, 0);
  const std::size_t count = places.size();
  unsigned char* staging;
  {
    detail::DeviceGuard guard(home);
    staging = static_cast<unsigned char*>(allocate((2 * count + 1) * acc_size, home_stream));
  }
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t place = places[k];
    const int device = group.device(place);
    const cudaStream_t stream = stream_of(group, place);
    order_after(stream, device, home_stream, home);  // staging exists
    detail::DeviceGuard guard(device);
    void* result = allocate(acc_size, stream);
    reduce_shard(sets[place], in, place, acc_size, result);
    check(cudaMemcpyPeerAsync(staging + k * acc_size, home, result, device, acc_size, stream),
          "cudaMemcpyPeerAsync (partial total)");
    check(cudaFreeAsync(result, stream), "cudaFreeAsync");
    order_after(home_stream, home, stream, device);
  }
  k::FoldParams fold{};
  fold.values = staging;
  fold.prefixes = staging + count * acc_size;
  fold.total = staging + 2 * count * acc_size;
  fold.count = static_cast<int>(count);
  fold.has_init = init.empty() ? 0 : 1;
  if (!init.empty()) std::memcpy(fold.init, init.data(), init.size());
  detail::DeviceGuard guard(home);
  detail::launch(sets[0].fold, 1, 32, home_stream, fold, "launching fold");
  return staging;
}

std::vector<std::size_t> non_empty_places(const ShardedArray& array) {
  std::vector<std::size_t> places;
  for (std::size_t place = 0; place < array.num_shards(); ++place) {
    if (array.shard_size(place) > 0) places.push_back(place);
  }
  return places;
}

ReduceResult reduce_impl(const std::vector<KernelSet>& sets, const ShardedArray& in, int acc_size,
                         const std::string& init) {
  check_acc(acc_size, init);
  in.check_alive("a");
  const std::vector<std::size_t> places = non_empty_places(in);
  ReduceResult result;
  if (places.empty()) {
    result.valid = !init.empty();
    result.value = init;
    return result;
  }
  const PlaceGroup& group = *in.group();
  void* staging = totals_and_prefixes(sets, in, places, acc_size, init);
  const cudaStream_t home_stream = stream_of(group, 0);
  detail::DeviceGuard guard(group.device(0));
  result.value.assign(acc_size, '\0');
  check(cudaMemcpyAsync(result.value.data(),
                        static_cast<unsigned char*>(staging) + 2 * places.size() * acc_size,
                        acc_size, cudaMemcpyDeviceToHost, home_stream),
        "cudaMemcpyAsync (result)");
  check(cudaFreeAsync(staging, home_stream), "cudaFreeAsync");
  check(cudaStreamSynchronize(home_stream), "cudaStreamSynchronize");
  result.valid = true;
  return result;
}

void scan_impl(const std::vector<KernelSet>& sets, const ShardedArray& in, ShardedArray& out,
               int acc_size, const std::string& init, bool exclusive) {
  check_acc(acc_size, init);
  in.check_alive("a");
  out.check_alive("out");
  if (exclusive && init.empty()) throw std::invalid_argument("init: an exclusive scan needs one");
  if (in.group() != out.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  if (in.shard_sizes() != out.shard_sizes()) throw std::invalid_argument("out: shard sizes differ from a's");
  if (static_cast<int>(itemsize(out.dtype())) != acc_size) {
    throw std::invalid_argument("out: element size differs from the accumulator's");
  }
  const std::vector<std::size_t> places = non_empty_places(in);
  if (places.empty()) return;
  const PlaceGroup& group = *in.group();
  const int home = group.device(0);
  const cudaStream_t home_stream = stream_of(group, 0);

  // Prefixes: the totals of every non-empty shard but the last are needed.
  unsigned char* staging = nullptr;
  const std::size_t count = places.size() - 1;
  if (count > 0) {
    std::vector<std::size_t> leading(places.begin(), places.end() - 1);
    staging = static_cast<unsigned char*>(totals_and_prefixes(sets, in, leading, acc_size, init));
  }
  for (std::size_t k = 0; k < places.size(); ++k) {
    const std::size_t place = places[k];
    const int device = group.device(place);
    const cudaStream_t stream = stream_of(group, place);
    const long long n = in.shard_size(place);
    const long long tile = static_cast<long long>(k::kScanBlock) * k::scan_items(acc_size);
    const long long tiles = (n + tile - 1) / tile;
    const bool seeded = k > 0 || !init.empty();
    if (k > 0) order_after(stream, device, home_stream, home);  // fold done
    detail::DeviceGuard guard(device);
    const std::size_t state_bytes =
        static_cast<std::size_t>(tiles + k::kScanTilePadding) * k::scan_tile_state_bytes(acc_size);
    auto* scratch = static_cast<unsigned char*>(allocate(state_bytes + 16, stream));
    unsigned char* seed = scratch + state_bytes;
    if (k == 0 && seeded) {
      check(cudaMemcpyAsync(seed, init.data(), acc_size, cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync (init)");
    } else if (k > 0) {
      // prefix before shard k: prefixes[k] of the fold, or its total for the last shard
      const unsigned char* prefix = k < count ? staging + (count + k) * acc_size
                                              : staging + 2 * count * acc_size;
      check(cudaMemcpyPeerAsync(seed, device, prefix, home, acc_size, stream),
            "cudaMemcpyPeerAsync (prefix)");
    }
    k::ScanInitParams init_params{scratch, static_cast<int>(tiles)};
    detail::launch(sets[place].scan_init,
                   static_cast<unsigned>((tiles + k::kScanTilePadding + 255) / 256), 256, stream,
                   init_params, "launching scan init");
    k::ScanParams params{};
    params.in = reinterpret_cast<const void*>(in.shard_pointer(place));
    params.out = reinterpret_cast<void*>(out.shard_pointer(place));
    params.n = n;
    params.index_base = in.shard_offset(place);
    params.tile_state = scratch;
    params.seed = seed;
    params.has_seed = seeded ? 1 : 0;
    params.exclusive = exclusive ? 1 : 0;
    detail::launch(sets[place].scan, static_cast<unsigned>(tiles), k::kScanBlock, stream, params,
                   "launching scan");
    check(cudaFreeAsync(scratch, stream), "cudaFreeAsync");
    if (k > 0) order_after(home_stream, home, stream, device);  // staging read before freed
  }
  if (staging) {
    detail::DeviceGuard guard(home);
    check(cudaFreeAsync(staging, home_stream), "cudaFreeAsync");
  }
}

}  // namespace

ReduceResult reduce(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                    int acc_size, const std::string& init) {
  return reduce_impl(linked_sets(libraries, *in.group(), false), in, acc_size, init);
}

ReduceResult reduce_builtin(BuiltinReduction op, const ShardedArray& in, const std::string& init) {
  return reduce_impl(builtin_sets(op, in.dtype(), in.group()->size()), in,
                     static_cast<int>(itemsize(in.dtype())), init);
}

void scan(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
          ShardedArray& out, int acc_size, const std::string& init, bool exclusive) {
  scan_impl(linked_sets(libraries, *in.group(), true), in, out, acc_size, init, exclusive);
}

void scan_builtin(BuiltinReduction op, const ShardedArray& in, ShardedArray& out,
                  const std::string& init, bool exclusive) {
  if (out.dtype() != in.dtype()) throw std::invalid_argument("out: dtype differs from a's");
  scan_impl(builtin_sets(op, in.dtype(), in.group()->size()), in, out,
            static_cast<int>(itemsize(in.dtype())), init, exclusive);
}

}  // namespace csj
