// Elementwise transforms on every place: with a run-time linked operator (a KernelLibrary
// built by nvJitLink) or with a built-in descriptor operator compiled into the shim.
// CUDA-free header.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "csj/sharded_array.hpp"

namespace csj {

// A cubin loaded once per process with context-independent loading (cuLibraryLoadData):
// usable on every device whose architecture it was linked for.
class KernelLibrary {
 public:
  // Loads `cubin` and resolves each `extern "C" __global__` entry point it names.
  KernelLibrary(const std::string& cubin, const std::vector<std::string>& entries);
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;
  // Waits for the devices the library launched on (see launched_on_), then unloads it.
  ~KernelLibrary();
  // The CUkernel of a resolved entry point, as an opaque handle, for a launch on `device`
  // (noted for the destructor). Thread-safe.
  void* kernel(const std::string& name, int device) const;
  // Whether `name` is one of the entry points it resolved.
  bool has(const std::string& name) const { return kernels_.count(name) != 0; }

 private:
  void* library_ = nullptr;
  std::unordered_map<std::string, void*> kernels_;
  // Bit d: a kernel of the library was handed out for a launch on device d (bit 63: on
  // device 63 or any above it). Only ever gains bits.
  mutable std::atomic<std::uint64_t> launched_on_{0};
};

// fill (out = value) and sequence (out = start + step * global index) take no input array.
enum class BuiltinOp { negate, scale, add_scalar, add, mul, axpy, fill, sequence };
int builtin_arity(BuiltinOp op);

// Limits of the transform kernels (mirrored from shim/kernels/params.hpp).
int max_transform_inputs();
int max_transform_scalars();

using ArrayList = std::vector<std::shared_ptr<ShardedArray>>;

// out[i] = op(inputs[0][i], ..., scalars...) on every place, stream-ordered, returns at once.
// `scalars` holds one 8-byte slot per runtime scalar, already in the operator's types.
// `libraries` holds the linked transform for each place (one per place, repeats allowed:
// places of one architecture share a library). `indexed`: the libraries are indexed
// transforms (csj_transform_indexed: records, index-aware operators), which receive each
// array's global base and every element's global index; otherwise vectorised ones
// (csj_transform, 4- and 8-byte scalars).
// `device_slots` / `device_values`: scalars read on the device, slot device_slots[k] reading
// each place's copy of device_values[k] (a DeviceScalar's storage: one element per place).
void transform(const std::vector<const KernelLibrary*>& libraries, const ArrayList& inputs,
               ShardedArray& out, const std::string& scalars, bool indexed = false,
               const std::vector<int>& device_slots = {}, const ArrayList& device_values = {});
void transform_builtin(BuiltinOp op, const ArrayList& inputs, ShardedArray& out,
                       const std::string& scalars);

// A transform's kernel resolved for each place of a group once, so that a call repeating the
// operator and types (the Python package's transform plans) launches without looking it up.
// The kernels belong to the libraries they were resolved from, which must outlive them.
struct TransformKernels {
  std::vector<void*> kernels;  // the CUkernel of each place
  bool indexed = false;        // csj_transform_indexed, else csj_transform
};
TransformKernels transform_kernels(const std::vector<const KernelLibrary*>& libraries,
                                   const PlaceGroup& group, bool indexed);
// transform() with its kernels resolved for out's group.
void transform(const TransformKernels& resolved, const ArrayList& inputs, ShardedArray& out,
               const std::string& scalars, const std::vector<int>& device_slots = {},
               const ArrayList& device_values = {});

// out[0] = first(in[0]); out[i] = difference(in[i], in[i-1]) across shard boundaries (shard i
// reads the last element of the previous non-empty shard). `first` and `difference` are
// linked unary and binary transforms, one library per place. `out` must not alias `in`.
// With `successor`, each element meets its successor instead: out[i] = difference(in[i],
// in[i+1]) and the last element out[n-1] = first(in[n-1]) (shard i reads the first element of
// the next non-empty shard); the by-key algorithms find the ends of runs this way.
// `halo` (an element's bytes, or empty): the neighbour of the edge element of the first
// non-empty shard, which then gets difference(in[i], halo) instead of first(in[i]): an array
// that is one process's part of a larger one (cuda_sharded_jit/distributed) has its
// neighbour in another process. `first_copies`: `first` copies its argument (an identity
// into a's own dtype), so the pass copies that element itself and `first` is not launched.
void adjacent_difference(const std::vector<const KernelLibrary*>& difference,
                         const std::vector<const KernelLibrary*>& first, const ShardedArray& in,
                         ShardedArray& out, bool successor = false, const std::string& halo = {},
                         bool first_copies = false);

// Throws std::invalid_argument unless every array shares `out`'s group and shard sizes.
void check_conformable(const ArrayList& inputs, const ShardedArray& out,
                       bool allow_no_inputs = false);

}  // namespace csj
