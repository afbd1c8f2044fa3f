#include "csj/transform.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>

#include "../kernels/builtin_kernels.hpp"
#include "../kernels/params.hpp"
#include "cuda_check.hpp"
#include "driver_api.hpp"

namespace csj {
namespace {

using detail::check;
using kernels::TransformParams;

constexpr long long kTileElements =
    static_cast<long long>(kernels::kTransformBlock) * kernels::kTransformItems;

TransformParams params_for(const ArrayList& inputs, const ShardedArray& out, std::size_t place,
                           const std::string& scalars) {
  TransformParams params{};
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    params.inputs[k] = reinterpret_cast<const void*>(inputs[k]->shard_pointer(place));
  }
  params.out = reinterpret_cast<void*>(out.shard_pointer(place));
  params.n = out.shard_size(place);
  std::memcpy(params.scalars.bytes, scalars.data(), scalars.size());
  return params;
}

void check_scalars(const std::string& scalars) {
  if (scalars.size() > sizeof(kernels::ScalarPack) || scalars.size() % kernels::kScalarSlot) {
    throw std::invalid_argument("scalars: at most " + std::to_string(kernels::kMaxScalars) +
                                " runtime scalars are supported, got " +
                                std::to_string(scalars.size() / kernels::kScalarSlot));
  }
}

// Runs `launch(params, grid, place, stream)` on every place with a non-empty shard.
template <class Launch>
void for_each_place(const ArrayList& inputs, ShardedArray& out, const std::string& scalars,
                    Launch&& launch) {
  check_conformable(inputs, out);
  check_scalars(scalars);
  const PlaceGroup& group = *out.group();
  for (std::size_t place = 0; place < group.size(); ++place) {
    const long long n = out.shard_size(place);
    if (n == 0) continue;
    TransformParams params = params_for(inputs, out, place, scalars);
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

KernelLibrary::~KernelLibrary() {
  if (library_) detail::driver().cuLibraryUnload(static_cast<CUlibrary>(library_));
}

void* KernelLibrary::kernel(const std::string& name) const {
  auto found = kernels_.find(name);
  if (found == kernels_.end()) {
    throw std::invalid_argument("library: has no entry point '" + name + "'");
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
  }
  throw std::invalid_argument("unknown built-in operator");
}

int max_transform_inputs() { return kernels::kMaxInputs; }
int max_transform_scalars() { return kernels::kMaxScalars; }

void check_conformable(const ArrayList& inputs, const ShardedArray& out) {
  if (inputs.empty() || inputs.size() > static_cast<std::size_t>(kernels::kMaxInputs)) {
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

void transform(const std::vector<const KernelLibrary*>& libraries, const ArrayList& inputs,
               ShardedArray& out, const std::string& scalars) {
  if (libraries.size() != out.group()->size()) {
    throw std::invalid_argument("libraries: expected one per place (" +
                                std::to_string(out.group()->size()) + "), got " +
                                std::to_string(libraries.size()));
  }
  std::vector<CUfunction> kernels;
  for (const KernelLibrary* library : libraries) {
    if (!library) throw std::invalid_argument("libraries: None");
    kernels.push_back(static_cast<CUfunction>(library->kernel("csj_transform")));
  }
  const auto& api = detail::driver();
  for_each_place(inputs, out, scalars,
                 [&](TransformParams& params, unsigned grid, std::size_t place, std::uintptr_t stream) {
                   CUfunction kernel = kernels[place];
                   void* args[] = {&params};
                   check(api.cuLaunchKernel(kernel, grid, 1, 1, kernels::kTransformBlock, 1, 1,
                                            0, reinterpret_cast<CUstream>(stream), args, nullptr),
                         "cuLaunchKernel (transform)");
                 });
}

void transform_builtin(BuiltinOp op, const ArrayList& inputs, ShardedArray& out,
                       const std::string& scalars) {
  if (static_cast<int>(inputs.size()) != builtin_arity(op)) {
    throw std::invalid_argument("inputs: operator takes " + std::to_string(builtin_arity(op)) +
                                " arrays, got " + std::to_string(inputs.size()));
  }
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k]->dtype() != out.dtype()) {
      throw std::invalid_argument("inputs[" + std::to_string(k) + "]: dtype " +
                                  dtype_name(inputs[k]->dtype()) + " differs from out's " +
                                  dtype_name(out.dtype()));
    }
  }
  const void* kernel = kernels::builtin_transform_kernel(static_cast<kernels::BuiltinKernel>(op),
                                                         static_cast<int>(out.dtype()));
  for_each_place(inputs, out, scalars,
                 [&](TransformParams& params, unsigned grid, std::size_t, std::uintptr_t stream) {
                   void* args[] = {&params};
                   check(cudaLaunchKernel(kernel, dim3(grid), dim3(kernels::kTransformBlock), args,
                                          0, reinterpret_cast<cudaStream_t>(stream)),
                         "cudaLaunchKernel (built-in transform)");
                 });
}

}  // namespace csj
