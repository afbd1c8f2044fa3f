#include "csj/transform.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "../kernels/builtin_kernels.hpp"
#include "../kernels/params.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"
#include "launch.hpp"

namespace csj {
namespace {

using detail::check;
using kernels::TransformParams;

constexpr long long kTileElements =
    static_cast<long long>(kernels::kTransformBlock) * kernels::kTransformItems;

// Scalars read on the device: slot `slots[k]` takes the address of place p's copy of
// `values[k]` (a DeviceScalar's storage: one element on every place).
struct DeviceScalars {
  const std::vector<int>& slots;
  const ArrayList& values;
};

TransformParams params_for(const ArrayList& inputs, const ShardedArray& out, std::size_t place,
                           const std::string& scalars, const DeviceScalars& device) {
  TransformParams params{};
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    params.inputs[k] = reinterpret_cast<const void*>(inputs[k]->shard_pointer(place));
  }
  params.out = reinterpret_cast<void*>(out.shard_pointer(place));
  params.n = out.shard_size(place);
  params.index_base = out.index_base(place);
  std::memcpy(params.scalars.bytes, scalars.data(), scalars.size());
  for (std::size_t k = 0; k < device.slots.size(); ++k) {
    const auto address = static_cast<std::uintptr_t>(device.values[k]->shard_pointer(place));
    std::memcpy(params.scalars.bytes + device.slots[k] * kernels::kScalarSlot, &address, sizeof(address));
    params.scalars.on_device |= 1u << device.slots[k];
  }
  return params;
}

void check_scalars(const std::string& scalars, const DeviceScalars& device, const ShardedArray& out) {
  constexpr std::size_t kSlots = sizeof(kernels::ScalarPack{}.bytes);
  if (scalars.size() > kSlots || scalars.size() % kernels::kScalarSlot) {
    throw std::invalid_argument("scalars: at most " + std::to_string(kernels::kMaxScalars) +
                                " runtime scalars are supported, got " +
                                std::to_string(scalars.size() / kernels::kScalarSlot));
  }
  if (device.slots.size() != device.values.size()) {
    throw std::invalid_argument("device_values: expected one per device slot");
  }
  for (std::size_t k = 0; k < device.slots.size(); ++k) {
    const std::string what = "device_values[" + std::to_string(k) + "]";
    const int slot = device.slots[k];
    if (slot < 0 || static_cast<std::size_t>(slot) * kernels::kScalarSlot >= scalars.size()) {
      throw std::invalid_argument("device_slots: " + std::to_string(slot) + " is not one of the scalars' slots");
    }
    if (!device.values[k]) throw std::invalid_argument(what + ": None");
    const ShardedArray& value = *device.values[k];
    if (value.group() != out.group()) throw std::invalid_argument(what + ": belongs to another PlaceGroup than out");
    for (std::size_t place = 0; place < value.num_shards(); ++place) {
      if (value.shard_size(place) != 1) {
        throw std::invalid_argument(what + ": expected one element on every place (a DeviceScalar's storage)");
      }
    }
    if (value.itemsize() > static_cast<std::size_t>(kernels::kScalarSlot)) {
      throw std::invalid_argument(what + ": elements wider than a scalar slot");
    }
  }
}

// Leases on `out`, every input and every device scalar, named as in errors.
ArrayLeases lease_all(const ArrayList& inputs, const ShardedArray& out, const ArrayList& device_values) {
  std::vector<ArrayLeases::Use> uses{{&out, "out"}};
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k]) uses.push_back({inputs[k].get(), "inputs[" + std::to_string(k) + "]"});
  }
  for (std::size_t k = 0; k < device_values.size(); ++k) {
    if (device_values[k]) uses.push_back({device_values[k].get(), "device_values[" + std::to_string(k) + "]"});
  }
  return ArrayLeases(std::move(uses));
}

const std::vector<int> kNoSlots;
const ArrayList kNoValues;

// Runs `launch(params, grid, place, stream)` on every place with a non-empty shard.
template <class Launch>
void for_each_place(const ArrayList& inputs, ShardedArray& out, const std::string& scalars,
                    Launch&& launch, bool allow_no_inputs = false,
                    const DeviceScalars& device = DeviceScalars{kNoSlots, kNoValues}) {
  const ArrayLeases leases = lease_all(inputs, out, device.values);
  check_conformable(inputs, out, allow_no_inputs);
  check_scalars(scalars, device, out);
  const PlaceGroup& group = *out.group();
  for (std::size_t place = 0; place < group.size(); ++place) {
    const long long n = out.shard_size(place);
    if (n == 0) continue;
    TransformParams params = params_for(inputs, out, place, scalars, device);
    const auto grid = static_cast<unsigned>((n + kTileElements - 1) / kTileElements);
    detail::DeviceGuard guard(group.device(place));
    launch(params, grid, place, group.stream(place));
  }
}

}  // namespace

KernelLibrary::KernelLibrary(const std::string& cubin, const std::vector<std::string>& entries) {
  const auto& api = detail::driver();
  CUlibrary library = nullptr;
  check(api.cuLibraryLoadData(&library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
        "cuLibraryLoadData");
  library_ = library;
  try {
    for (const std::string& name : entries) {
      CUkernel handle = nullptr;
      check(api.cuLibraryGetKernel(&handle, library, name.c_str()), "cuLibraryGetKernel");
      kernels_.emplace(name, handle);
    }
  } catch (...) {
    api.cuLibraryUnload(library);
    throw;
  }
}

namespace {

// Blocks until the work queued on each device of `devices` (KernelLibrary::launched_on_'s
// bits) has run. A device whose primary context is not active was reset since, and the
// work went with its context; asking the runtime about that device would make a new
// context, so it is left alone. Never throws: destructors call it.
void synchronize_devices(std::uint64_t devices) noexcept {
  if (devices == 0) return;
  try {
    const detail::DriverApi& api = detail::driver();
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    int current = previous;
    for (int device = 0; device < count; ++device) {
      if (!(devices & (std::uint64_t{1} << std::min(device, 63)))) continue;
      CUdevice handle = 0;
      unsigned int flags = 0;
      int active = 0;
      if (api.cuDeviceGet(&handle, device) != CUDA_SUCCESS ||
          api.cuDevicePrimaryCtxGetState(handle, &flags, &active) != CUDA_SUCCESS || !active) {
        continue;
      }
      if (cudaSetDevice(device) != cudaSuccess) continue;
      current = device;
      cudaDeviceSynchronize();  // a failed context answers at once; nothing is left to wait for
    }
    if (current != previous && previous >= 0) cudaSetDevice(previous);
  } catch (...) {  // no driver: nothing was launched
  }
  cudaGetLastError();
}

}  // namespace

KernelLibrary::~KernelLibrary() {
  if (!library_) return;
  // The compile caches evict libraries while the process runs (least recently used first),
  // and a launch returns once its kernel is queued: kernels of this library may still be
  // waiting or running on a place's stream. Unloading must not race them, and the driver's
  // documentation promises no wait (driver 580 was seen to wait, for queued kernels too; an
  // older or newer one need not), so the devices the library launched on are drained first.
  // Their whole device, not the streams (the library does not know them): an eviction is
  // rare, a launch is not, and this way the launch pays one bit for it.
  synchronize_devices(launched_on_.load(std::memory_order_acquire));
  detail::driver().cuLibraryUnload(static_cast<CUlibrary>(library_));
}

void* KernelLibrary::kernel(const std::string& name, int device) const {
  auto found = kernels_.find(name);
  if (found == kernels_.end()) {
    throw std::invalid_argument("library: has no entry point '" + name + "'");
  }
  // A load first, so the launch path writes the shared word only on a device's first launch.
  // Relaxed suffices: whoever destroys the library has synchronised with every user of it.
  const std::uint64_t bit = std::uint64_t{1} << std::min(std::max(device, 0), 63);
  if (!(launched_on_.load(std::memory_order_relaxed) & bit)) {
    launched_on_.fetch_or(bit, std::memory_order_relaxed);
  }
  return found->second;
}

int builtin_arity(BuiltinOp op) {
  switch (op) {
    case BuiltinOp::negate:
    case BuiltinOp::scale:
    case BuiltinOp::add_scalar:
      return 1;
    case BuiltinOp::add:
    case BuiltinOp::mul:
    case BuiltinOp::axpy:
      return 2;
    case BuiltinOp::fill:
    case BuiltinOp::sequence:
      return 0;
  }
  throw std::invalid_argument("unknown built-in operator");
}

int max_transform_inputs() { return kernels::kMaxInputs; }
int max_transform_scalars() { return kernels::kMaxScalars; }

void check_conformable(const ArrayList& inputs, const ShardedArray& out, bool allow_no_inputs) {
  if ((inputs.empty() && !allow_no_inputs) ||
      inputs.size() > static_cast<std::size_t>(kernels::kMaxInputs)) {
    throw std::invalid_argument("inputs: expected 1 to " + std::to_string(kernels::kMaxInputs) +
                                " arrays, got " + std::to_string(inputs.size()));
  }
  out.check_alive("out");
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const ShardedArray& input = *inputs[k];
    input.check_alive("inputs");
    if (input.group() != out.group()) {
      throw std::invalid_argument("inputs[" + std::to_string(k) +
                                  "]: belongs to another PlaceGroup than out");
    }
    if (input.shard_sizes() != out.shard_sizes()) {
      throw std::invalid_argument("inputs[" + std::to_string(k) +
                                  "]: shard sizes differ from out's");
    }
  }
}

TransformKernels transform_kernels(const std::vector<const KernelLibrary*>& libraries,
                                   const PlaceGroup& group, bool indexed) {
  detail::check_libraries(libraries, group.size());
  TransformKernels resolved{{}, indexed};
  resolved.kernels.reserve(libraries.size());
  for (std::size_t place = 0; place < libraries.size(); ++place) {
    resolved.kernels.push_back(
        libraries[place]->kernel(indexed ? "csj_transform_indexed" : "csj_transform", group.device(place)));
  }
  return resolved;
}

void transform(const std::vector<const KernelLibrary*>& libraries, const ArrayList& inputs,
               ShardedArray& out, const std::string& scalars, bool indexed, const std::vector<int>& device_slots,
               const ArrayList& device_values) {
  transform(transform_kernels(libraries, *out.group(), indexed), inputs, out, scalars, device_slots,
            device_values);
}

void transform(const TransformKernels& resolved, const ArrayList& inputs, ShardedArray& out,
               const std::string& scalars, const std::vector<int>& device_slots, const ArrayList& device_values) {
  if (resolved.kernels.size() != out.group()->size()) {
    throw std::invalid_argument("kernels: resolved for " + std::to_string(resolved.kernels.size()) +
                                " places, out's group has " + std::to_string(out.group()->size()));
  }
  const bool indexed = resolved.indexed;
  if (!indexed) {  // the vectorised modules move 4- and 8-byte words
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      if (inputs[k] && inputs[k]->is_record()) {
        throw std::invalid_argument("inputs[" + std::to_string(k) + "]: records need an indexed transform");
      }
    }
    if (out.is_record()) throw std::invalid_argument("out: records need an indexed transform");
  }
  for_each_place(inputs, out, scalars,
                 [&](TransformParams& params, unsigned grid, std::size_t place, std::uintptr_t stream) {
                   if (indexed) {  // the operator addresses its elements from the global bases
                     for (std::size_t k = 0; k < inputs.size(); ++k) {
                       params.inputs[k] = reinterpret_cast<const void*>(inputs[k]->global_base(place));
                     }
                     params.out = reinterpret_cast<void*>(out.global_base(place));
                   }
                   detail::launch(detail::KernelHandle::linked(resolved.kernels[place]), grid,
                                  kernels::kTransformBlock, reinterpret_cast<cudaStream_t>(stream), params,
                                  "launching transform");
                 },
                 false, DeviceScalars{device_slots, device_values});
}

void adjacent_difference(const std::vector<const KernelLibrary*>& difference,
                         const std::vector<const KernelLibrary*>& first, const ShardedArray& in,
                         ShardedArray& out, bool successor, const std::string& halo,
                         bool first_copies) {
  const PlaceGroup& group = *in.group();
  if (difference.size() != group.size() || first.size() != group.size()) {
    throw std::invalid_argument("libraries: expected one per place");
  }
  const ArrayLeases leases({{&in, "a"}, {&out, "out"}});
  check_conformable({}, out, /*allow_no_inputs=*/true);
  if (in.group() != out.group()) throw std::invalid_argument("out: belongs to another PlaceGroup than a");
  if (in.shard_sizes() != out.shard_sizes()) throw std::invalid_argument("out: shard sizes differ from a's");
  for (std::size_t place = 0; place < group.size(); ++place) {
    if (in.shard_size(place) > 0 && in.shard_pointer(place) == out.shard_pointer(place)) {
      throw std::invalid_argument("out: must not alias a (each element reads its predecessor)");
    }
  }
  // on a throw, a peer read already queued must not outlive the call (a could be freed next)
  const detail::SyncOnUnwind settle(group);
  in.check_scalar("a", "adjacent_difference");
  out.check_scalar("out", "adjacent_difference");
  const std::size_t element = in.itemsize();
  if (first_copies && out.itemsize() != element) {
    throw std::invalid_argument("first_copies: out's elements must have a's size to be copies");
  }
  if (!halo.empty() && halo.size() != element) {
    throw std::invalid_argument("halo: expected " + std::to_string(element) + " bytes, got " +
                                std::to_string(halo.size()));
  }
  const std::size_t places = group.size();
  long long previous = -1;  // the last non-empty place visited so far (the neighbour's place)
  for (std::size_t step = 0; step < places; ++step) {
    // with `successor` the neighbour is the next shard's first element: visit places backwards
    const std::size_t place = successor ? places - 1 - step : step;
    const long long n = in.shard_size(place);
    if (n == 0) continue;
    const int device = group.device(place);
    const auto stream = reinterpret_cast<cudaStream_t>(group.stream(place));
    const auto* data = reinterpret_cast<const unsigned char*>(in.shard_pointer(place));
    auto* result = reinterpret_cast<unsigned char*>(out.shard_pointer(place));
    const auto diff_kernel = detail::KernelHandle::linked(difference[place]->kernel("csj_transform", device));
    const auto pass_kernel = detail::KernelHandle::linked(difference[place]->kernel("csj_adjacent", device));
    const auto first_kernel = detail::KernelHandle::linked(first[place]->kernel("csj_transform", device));
    auto launch_over = [&](const detail::KernelHandle& kernel, TransformParams& params) {
      const auto grid = static_cast<unsigned>((params.n + kTileElements - 1) / kTileElements);
      detail::launch(kernel, grid, kernels::kTransformBlock, stream, params, "launching adjacent_difference");
    };
    auto run = [&](const detail::KernelHandle& kernel, const void* a, const void* b, void* to,
                   long long count) {
      TransformParams params{};
      params.inputs[0] = a;
      params.inputs[1] = b;
      params.out = to;
      params.n = count;
      launch_over(kernel, params);
    };
    const auto out_element = out.itemsize();
    // the element whose neighbour lives in another shard: this shard's first (or, with
    // `successor`, last) one
    const auto edge = successor ? static_cast<std::size_t>(n - 1) : std::size_t{0};
    detail::DeviceGuard guard(device);
    // the edge element of the first shard with no halo is `first` of itself: the pass copies it
    // when `first` is a copy, so that one kernel does the whole shard
    const bool copy_edge = previous < 0 && halo.empty() && first_copies;
    if (n > 1 || copy_edge) {  // every element but the edge one, whose neighbour is in the shard
      TransformParams params{};
      params.inputs[0] = data;
      params.out = result;
      params.n = n;
      params.neighbour = successor ? 1 : -1;
      params.copy_edge = copy_edge ? 1 : 0;
      launch_over(pass_kernel, params);
    }
    if (copy_edge) {
      // written by the pass
    } else if (previous < 0 && halo.empty()) {
      run(first_kernel, data + edge * element, nullptr, result + edge * out_element, 1);
    } else if (previous < 0) {
      // the neighbour lives in another process: it came in host memory
      detail::StreamScratch slot(16, stream, reinterpret_cast<cudaMemPool_t>(group.memory_pool(place)));
      check(cudaMemcpyAsync(slot.get(), halo.data(), element, cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync (halo)");
      run(diff_kernel, data + edge * element, slot.get(), result + edge * out_element, 1);
    } else {
      // the neighbour of the edge element lives at the end (start) of another shard
      const auto prior = static_cast<std::size_t>(previous);
      const int prior_device = group.device(prior);
      const auto prior_stream = reinterpret_cast<cudaStream_t>(group.stream(prior));
      detail::wait_for(stream, prior_stream, prior_device);  // the element is written
      {
        // freed on this stream after the kernel that reads it, even when a step throws
        detail::StreamScratch slot(16, stream, reinterpret_cast<cudaMemPool_t>(group.memory_pool(place)));
        const auto* neighbour = reinterpret_cast<const unsigned char*>(in.shard_pointer(prior)) +
                                (successor ? 0 : (in.shard_size(prior) - 1) * element);
        detail::copy_between(slot.get(), device, neighbour, prior_device, element, stream,
                             "copying a shard's neighbour");
        run(diff_kernel, data + edge * element, slot.get(), result + edge * out_element, 1);
      }
      // the prior shard's stream may reuse or overwrite its memory only after our read
      detail::wait_for(prior_stream, stream, device);
    }
    previous = static_cast<long long>(place);
  }
}

void transform_builtin(BuiltinOp op, const ArrayList& inputs, ShardedArray& out,
                       const std::string& scalars) {
  if (static_cast<int>(inputs.size()) != builtin_arity(op)) {
    throw std::invalid_argument("inputs: operator takes " + std::to_string(builtin_arity(op)) +
                                " arrays, got " + std::to_string(inputs.size()));
  }
  out.check_scalar("out", "a built-in operator");
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k]->dtype() != out.dtype()) {
      throw std::invalid_argument("inputs[" + std::to_string(k) + "]: dtype " +
                                  dtype_name(inputs[k]->dtype()) + " differs from out's " +
                                  dtype_name(out.dtype()));
    }
  }
  const auto kernel = detail::KernelHandle::builtin(kernels::builtin_transform_kernel(
      static_cast<kernels::BuiltinKernel>(op), static_cast<int>(out.dtype())));
  for_each_place(inputs, out, scalars,
                 [&](TransformParams& params, unsigned grid, std::size_t, std::uintptr_t stream) {
                   detail::launch(kernel, grid, kernels::kTransformBlock,
                                  reinterpret_cast<cudaStream_t>(stream), params,
                                  "launching built-in transform");
                 },
                 builtin_arity(op) == 0);
}

}  // namespace csj
