// The sort with a user comparator (csj/sort_compare.hpp): a stable merge sort whose kernels
// nvJitLink linked with the comparator (merge_sort.hpp). One place sorts its shard where it
// lies: in place, or from the input shard into the output shard (the input left as it was),
// through a scratch buffer from the group's stream-ordered pool, all of it queued on the
// place's stream.
#include "csj/sort_compare.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda_check.hpp"
#include "merge_sort.hpp"

namespace csj {
namespace {

using detail::DeviceGuard;

void check_arguments(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in,
                     const ShardedArray& out) {
  if (in.group() != out.group()) throw std::invalid_argument("out: belongs to another PlaceGroup");
  if (in.shard_sizes() != out.shard_sizes()) throw std::invalid_argument("out: shard sizes differ from a's");
  if (in.dtype() != out.dtype() || in.itemsize() != out.itemsize()) {
    throw std::invalid_argument("out: dtype differs from a's");
  }
  const std::size_t count = in.group()->size();
  if (libraries.size() != count) {
    throw std::invalid_argument("libraries: expected one per place (" + std::to_string(count) + "), got " +
                                std::to_string(libraries.size()));
  }
  for (const KernelLibrary* library : libraries) {
    if (!library) throw std::invalid_argument("libraries: None");
  }
}

}  // namespace

void sort_compare(const std::vector<const KernelLibrary*>& libraries, const ShardedArray& in, ShardedArray& out) {
  const ArrayLeases leases({{&in, "a"}, {&out, "out"}});
  check_arguments(libraries, in, out);
  const PlaceGroup& group = *in.group();
  const std::size_t count = group.size();
  const std::size_t item = in.itemsize();
  std::size_t non_empty = 0;
  for (std::size_t p = 0; p < count; ++p) non_empty += in.shard_size(p) > 0 ? 1 : 0;
  if (non_empty == 0) return;
  if (non_empty > 1) {
    throw std::invalid_argument("a: a sort with a comparator over several non-empty shards is not available yet");
  }
  for (std::size_t p = 0; p < count; ++p) {
    const long long n = in.shard_size(p);
    if (n == 0) continue;
    const int device = group.device(p);
    DeviceGuard guard(device);
    const auto stream = reinterpret_cast<cudaStream_t>(group.stream(p));
    const detail::MergeSortKernels kernels = detail::merge_sort_kernels(*libraries[p], device, item);
    // freed on the stream after the sort's last kernel, also when a launch throws
    detail::StreamScratch scratch(detail::merge_sort_scratch_bytes(n, item), stream,
                                  reinterpret_cast<cudaMemPool_t>(group.memory_pool(p)));
    detail::queue_merge_sort(kernels, reinterpret_cast<const void*>(in.shard_pointer(p)),
                             reinterpret_cast<void*>(out.shard_pointer(p)), n, scratch.get(), stream);
  }
}

}  // namespace csj
