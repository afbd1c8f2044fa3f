// Python bindings of the shim (nanobind). CUDA-free: compiled by the host compiler against the
// shim's CUDA-free headers. Every call that can block on the GPU releases the GIL.
#include <cstdint>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "csj/dtype.hpp"
#include "csj/errors.hpp"
#include "csj/place_group.hpp"
#include "csj/reduce.hpp"
#include "csj/search.hpp"
#include "csj/select.hpp"
#include "csj/by_key.hpp"
#include "csj/capture.hpp"
#include "csj/segmented.hpp"
#include "csj/sharded_array.hpp"
#include "csj/sort.hpp"
#include "csj/sort_compare.hpp"
#include "csj/transform.hpp"
#include "dlpack.hpp"
#include "transform_plan.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

const char* storage_name(csj::Storage storage) {
  switch (storage) {
    case csj::Storage::separate: return "separate";
    case csj::Storage::contiguous: return "contiguous";
    case csj::Storage::adopted: return "adopted";
  }
  return "?";
}

std::string to_string(const nb::bytes& data) { return std::string(data.c_str(), data.size()); }

}  // namespace

NB_MODULE(_shim, m) {
  m.doc() = "C++ shim of cuda_sharded_jit: places, sharded containers, kernel launches.";

  // A MemoryError that says what did not fit (nanobind raises a std::bad_alloc bare).
  nb::register_exception_translator([](const std::exception_ptr& thrown, void*) {
    try {
      std::rethrow_exception(thrown);
    } catch (const csj::OutOfMemory& error) {
      PyErr_SetString(PyExc_MemoryError, error.what());
    }
  });

  m.def("visible_device_count", &csj::visible_device_count,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("pinned_host_alloc", &csj::pinned_host_alloc, "bytes"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("pinned_host_free", &csj::pinned_host_free, "address"_a, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<csj::PlaceGroup>(m, "PlaceGroup")
      .def_static("by_devices", &csj::PlaceGroup::by_devices, "devices"_a = nb::none(),
                  nb::call_guard<nb::gil_scoped_release>())
      .def_static("by_locality_domains", &csj::PlaceGroup::by_locality_domains,
                  nb::call_guard<nb::gil_scoped_release>())
      .def("__len__", &csj::PlaceGroup::size)
      .def_prop_ro("devices", &csj::PlaceGroup::devices)
      .def_prop_ro("locality_domains", &csj::PlaceGroup::locality_domains)
      .def("device", &csj::PlaceGroup::device, "place"_a)
      .def("stream", &csj::PlaceGroup::stream, "place"_a)
      .def("locality_domain", &csj::PlaceGroup::locality_domain, "place"_a)
      .def("can_access_peer", &csj::PlaceGroup::can_access_peer, "from_device"_a, "to_device"_a)
      .def("compute_capability", &csj::PlaceGroup::compute_capability, "place"_a)
      .def("wait_for_stream", &csj::PlaceGroup::wait_for_stream, "place"_a, "stream"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("make_foreign_stream_wait", &csj::PlaceGroup::make_foreign_stream_wait, "place"_a, "stream"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("sync", &csj::PlaceGroup::sync, nb::call_guard<nb::gil_scoped_release>())
      .def("release_cached_memory", &csj::PlaceGroup::release_cached_memory,
           nb::call_guard<nb::gil_scoped_release>());

  nb::class_<csj::ShardedArray>(m, "ShardedArray")
      .def_static("even_sizes", &csj::ShardedArray::even_sizes, "n"_a, "places"_a)
      .def_static(
          "allocate",
          [](std::shared_ptr<csj::PlaceGroup> group, std::vector<std::int64_t> sizes,
             const std::string& dtype, bool contiguous, std::size_t itemsize) {
            const csj::DType type = csj::dtype_from_name(dtype);
            nb::gil_scoped_release release;
            return contiguous ? csj::ShardedArray::allocate_contiguous(std::move(group), std::move(sizes),
                                                                      type, itemsize)
                              : csj::ShardedArray::allocate(std::move(group), std::move(sizes), type, itemsize);
          },
          "group"_a, "sizes"_a, "dtype"_a, "contiguous"_a = false, "itemsize"_a = 0)
      .def_static(
          "adopt",
          [](std::shared_ptr<csj::PlaceGroup> group, const std::vector<std::uintptr_t>& pointers,
             std::vector<std::int64_t> sizes, const std::string& dtype, std::size_t itemsize,
             const std::vector<std::uintptr_t>& streams) {
            const csj::DType type = csj::dtype_from_name(dtype);
            nb::gil_scoped_release release;
            return csj::ShardedArray::adopt(std::move(group), pointers, std::move(sizes), type, itemsize,
                                            streams);
          },
          "group"_a, "pointers"_a, "sizes"_a, "dtype"_a, "itemsize"_a = 0,
          "streams"_a = std::vector<std::uintptr_t>{})
      .def_prop_ro("group", &csj::ShardedArray::group)
      .def_prop_ro("dtype", [](const csj::ShardedArray& a) { return csj::dtype_name(a.dtype()); })
      .def_prop_ro("itemsize", &csj::ShardedArray::itemsize)
      .def_prop_ro("storage", [](const csj::ShardedArray& a) { return storage_name(a.storage()); })
      .def_prop_ro("size", &csj::ShardedArray::size)
      .def_prop_ro("num_shards", &csj::ShardedArray::num_shards)
      .def_prop_ro("shard_sizes", &csj::ShardedArray::shard_sizes)
      .def_prop_ro("shard_offsets", &csj::ShardedArray::shard_offsets)
      .def_prop_ro("physical_chunk_bytes", &csj::ShardedArray::physical_chunk_bytes)
      .def_prop_ro("base_pointer", &csj::ShardedArray::base_pointer)
      .def_prop_ro("is_freed", &csj::ShardedArray::is_freed)
      .def("shard_pointer", &csj::ShardedArray::shard_pointer, "shard"_a)
      .def_prop_ro("index_origin", &csj::ShardedArray::index_origin)
      .def("set_index_origin", &csj::ShardedArray::set_index_origin, "origin"_a)
      .def("copy_from_host", &csj::ShardedArray::copy_from_host, "host"_a, "nbytes"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("copy_to_host", &csj::ShardedArray::copy_to_host, "host"_a, "nbytes"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("copy_range_from_host", &csj::ShardedArray::copy_range_from_host, "start"_a, "stop"_a, "host"_a,
           "nbytes"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("copy_range_to_host", &csj::ShardedArray::copy_range_to_host, "start"_a, "stop"_a, "host"_a, "nbytes"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("free", &csj::ShardedArray::free, nb::call_guard<nb::gil_scoped_release>())
      .def("check_alive", &csj::ShardedArray::check_alive, "what"_a)
      .def("describe", &csj::ShardedArray::describe, "dtype_label"_a = "");

  nb::class_<csj::KernelLibrary>(m, "KernelLibrary")
      .def(
          "__init__",
          [](csj::KernelLibrary* self, const nb::bytes& cubin, const std::vector<std::string>& entries) {
            std::string image = to_string(cubin);
            nb::gil_scoped_release release;
            new (self) csj::KernelLibrary(image, entries);
          },
          "cubin"_a, "entries"_a);

  nb::enum_<csj::BuiltinOp>(m, "BuiltinOp")
      .value("negate", csj::BuiltinOp::negate)
      .value("scale", csj::BuiltinOp::scale)
      .value("add_scalar", csj::BuiltinOp::add_scalar)
      .value("add", csj::BuiltinOp::add)
      .value("mul", csj::BuiltinOp::mul)
      .value("axpy", csj::BuiltinOp::axpy)
      .value("fill", csj::BuiltinOp::fill)
      .value("sequence", csj::BuiltinOp::sequence);
  m.def("builtin_arity", &csj::builtin_arity, "op"_a);
  m.attr("MAX_TRANSFORM_INPUTS") = csj::max_transform_inputs();
  m.attr("MAX_TRANSFORM_SCALARS") = csj::max_transform_scalars();

  m.def(
      "transform",
      [](const std::vector<const csj::KernelLibrary*>& libraries, const csj::ArrayList& inputs,
         csj::ShardedArray& out, const nb::bytes& scalars, bool indexed, const std::vector<int>& device_slots,
         const csj::ArrayList& device_values) {
        std::string packed = to_string(scalars);
        nb::gil_scoped_release release;
        csj::transform(libraries, inputs, out, packed, indexed, device_slots, device_values);
      },
      "libraries"_a, "inputs"_a, "out"_a, "scalars"_a, "indexed"_a = false, "device_slots"_a = std::vector<int>{},
      "device_values"_a = csj::ArrayList{});
  m.def(
      "count",
      [](const csj::ShardedArray& in, const nb::bytes& value) {
        std::string bytes = to_string(value);
        nb::gil_scoped_release release;
        return csj::count(in, bytes);
      },
      "a"_a, "value"_a);
  // The edges travel as (address, bytes), as in copy_from_host (those of a histogram of 2^31
  // bins are gigabytes, and a copy of them as many again); the counts are the numpy array the
  // call returns, written in place (its buffer taken without ctypes, which costs a microsecond;
  // never a converted copy, which the call would fill and drop).
  m.def(
      "histogram_even",
      [](const csj::ShardedArray& in, int num_bins, std::uintptr_t edges, std::size_t edge_bytes,
         nb::ndarray<long long, nb::ndim<1>, nb::c_contig, nb::device::cpu> counts) {
        csj::histogram_even(in, num_bins, reinterpret_cast<const void*>(edges), edge_bytes, counts.data(),
                            counts.size() * sizeof(long long));
      },
      "a"_a, "num_bins"_a, "edges"_a, "edge_bytes"_a, "counts"_a.noconvert(),
      nb::call_guard<nb::gil_scoped_release>());
  m.def("check_histogram_memory", &csj::check_histogram_memory, "a"_a, "num_bins"_a,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("sort", &csj::sort, "a"_a, "out"_a, "descending"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("copy_lanes", &csj::copy_lanes, "src"_a, "src_offset"_a, "dst"_a, "dst_offset"_a, "width"_a,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("sort_by_key", &csj::sort_by_key, "keys"_a, "out_keys"_a, "values"_a, "out_values"_a, "descending"_a,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("sort_compare", &csj::sort_compare, "libraries"_a, "a"_a, "out"_a,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("_sort_path_counts", [] {
    const csj::SortPathCounts counts = csj::sort_path_counts();
    return nb::make_tuple(counts.sampled, counts.missed, counts.first_round);
  });
  // top_k writes into numpy buffers, passed as (address, bytes) as histogram_even's counts
  m.def(
      "top_k",
      [](const csj::ShardedArray& in, long long k, bool largest, std::uintptr_t values, std::size_t value_bytes,
         std::uintptr_t indices, std::size_t index_bytes) {
        csj::top_k(in, k, largest, reinterpret_cast<void*>(values), value_bytes,
                   reinterpret_cast<long long*>(indices), index_bytes);
      },
      "a"_a, "k"_a, "largest"_a, "values"_a, "value_bytes"_a, "indices"_a, "index_bytes"_a,
      nb::call_guard<nb::gil_scoped_release>());
  m.def("searchsorted", &csj::searchsorted, "sorted_a"_a, "values"_a, "out"_a, "right"_a,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("search_compare", &csj::search_compare, "libraries"_a, "sorted_a"_a, "values"_a, "out"_a, "right"_a,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("select", &csj::select, "libraries"_a, "a"_a, "outputs"_a, "single_pass"_a = true,
        nb::call_guard<nb::gil_scoped_release>());
  m.def("select_flagged", &csj::select_flagged, "flags"_a, "arrays"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("select_heads", &csj::select_heads, "libraries"_a, "keys"_a, "arrays"_a,
        nb::call_guard<nb::gil_scoped_release>());
  // `edges` across ranks: None, or (previous key bytes, next key bytes, totals callable:
  // bytes -> bytes, called with the GIL held)
  auto by_key_edges = [](const nb::object& edges) {
    std::optional<csj::ByKeyEdges> made;
    if (edges.is_none()) return made;
    const nb::tuple parts = nb::cast<nb::tuple>(edges);
    if (parts.size() != 3) throw std::invalid_argument("edges: expected (previous key, next key, totals)");
    nb::object totals = parts[2];
    made = csj::ByKeyEdges{to_string(nb::cast<nb::bytes>(parts[0])), to_string(nb::cast<nb::bytes>(parts[1])),
                           [totals](const std::string& mine) {
                             nb::gil_scoped_acquire acquire;
                             const nb::object earlier = totals(nb::bytes(mine.data(), mine.size()));
                             return to_string(nb::cast<nb::bytes>(earlier));
                           }};
    return made;
  };
  m.def(
      "scan_by_key",
      [by_key_edges](const std::vector<const csj::KernelLibrary*>& libraries, const csj::ShardedArray& keys,
                     const csj::ShardedArray& values, csj::ShardedArray& out, bool exclusive, const nb::bytes& init,
                     const nb::object& edges) {
        const std::string init_bytes = to_string(init);
        const std::optional<csj::ByKeyEdges> across = by_key_edges(edges);
        nb::gil_scoped_release release;
        csj::scan_by_key(libraries, keys, values, out, exclusive, init_bytes, across ? &*across : nullptr);
      },
      "libraries"_a, "keys"_a, "values"_a, "out"_a, "exclusive"_a, "init"_a, "edges"_a = nb::none());
  m.def(
      "reduce_by_key",
      [by_key_edges](const std::vector<const csj::KernelLibrary*>& libraries, const csj::ShardedArray& keys,
                     const csj::ShardedArray& values, const nb::object& edges) {
        const std::optional<csj::ByKeyEdges> across = by_key_edges(edges);
        nb::gil_scoped_release release;
        return csj::reduce_by_key(libraries, keys, values, across ? &*across : nullptr);
      },
      "libraries"_a, "keys"_a, "values"_a, "edges"_a = nb::none());
  m.def("redistribute", &csj::redistribute, "a"_a, "sizes"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "adjacent_difference",
      [](const std::vector<const csj::KernelLibrary*>& difference, const std::vector<const csj::KernelLibrary*>& first,
         const csj::ShardedArray& in, csj::ShardedArray& out, bool successor, const nb::bytes& halo,
         bool first_copies) {
        const std::string halo_bytes = to_string(halo);
        nb::gil_scoped_release release;
        csj::adjacent_difference(difference, first, in, out, successor, halo_bytes, first_copies);
      },
      "difference"_a, "first"_a, "a"_a, "out"_a, "successor"_a = false, "halo"_a = nb::bytes(""),
      "first_copies"_a = false);

  nb::enum_<csj::BuiltinReduction>(m, "BuiltinReduction")
      .value("sum", csj::BuiltinReduction::sum)
      .value("min", csj::BuiltinReduction::min)
      .value("max", csj::BuiltinReduction::max);

  // Reductions return (valid, accumulator bytes).
  auto result_tuple = [](const csj::ReduceResult& result) {
    return nb::make_tuple(result.valid, nb::bytes(result.value.data(), result.value.size()));
  };
  m.def(
      "reduce",
      [result_tuple](const std::vector<const csj::KernelLibrary*>& libraries,
                     const csj::ShardedArray& in, int acc_size, const nb::bytes& init) {
        std::string init_bytes = to_string(init);
        csj::ReduceResult result;
        {
          nb::gil_scoped_release release;
          result = csj::reduce(libraries, in, acc_size, init_bytes);
        }
        return result_tuple(result);
      },
      "libraries"_a, "a"_a, "acc_size"_a, "init"_a);
  m.def(
      "reduce_builtin",
      [result_tuple](csj::BuiltinReduction op, const csj::ShardedArray& in, const nb::bytes& init) {
        std::string init_bytes = to_string(init);
        csj::ReduceResult result;
        {
          nb::gil_scoped_release release;
          result = csj::reduce_builtin(op, in, init_bytes);
        }
        return result_tuple(result);
      },
      "op"_a, "a"_a, "init"_a);
  nb::class_<csj::CapturedGraph>(m, "CapturedGraph")
      .def("replay", &csj::CapturedGraph::replay, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("nodes", &csj::CapturedGraph::nodes);
  m.def("capture_begin", &csj::capture_begin, "group"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("capture_end", &csj::capture_end, "group"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def("capture_abandon", &csj::capture_abandon, "group"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "reduce_into",
      [](const std::vector<const csj::KernelLibrary*>& libraries, const csj::ShardedArray& in, int acc_size,
         const nb::bytes& init, csj::ShardedArray& out) {
        std::string init_bytes = to_string(init);
        nb::gil_scoped_release release;
        csj::reduce_into(libraries, in, acc_size, init_bytes, out);
      },
      "libraries"_a, "a"_a, "acc_size"_a, "init"_a, "out"_a);
  m.def(
      "reduce_builtin_into",
      [](csj::BuiltinReduction op, const csj::ShardedArray& in, const nb::bytes& init, csj::ShardedArray& out) {
        std::string init_bytes = to_string(init);
        nb::gil_scoped_release release;
        csj::reduce_builtin_into(op, in, init_bytes, out);
      },
      "op"_a, "a"_a, "init"_a, "out"_a);
  // offsets: int64 positions in host memory, (address, count) as histogram_even's buffers
  m.def(
      "segmented_reduce",
      [](const std::vector<const csj::KernelLibrary*>& libraries, const csj::ShardedArray& in,
         std::uintptr_t offsets, std::size_t num_offsets, csj::ShardedArray& out, int acc_size,
         const nb::bytes& init) {
        std::string init_bytes = to_string(init);
        nb::gil_scoped_release release;
        csj::segmented_reduce(libraries, in, reinterpret_cast<const std::int64_t*>(offsets), num_offsets, out,
                              acc_size, init_bytes);
      },
      "libraries"_a, "a"_a, "offsets"_a, "num_offsets"_a, "out"_a, "acc_size"_a, "init"_a);
  m.def(
      "segmented_reduce_device",
      [](const std::vector<const csj::KernelLibrary*>& libraries, const csj::ShardedArray& in,
         const csj::ShardedArray& offsets, csj::ShardedArray& out, int acc_size, const nb::bytes& init) {
        std::string init_bytes = to_string(init);
        nb::gil_scoped_release release;
        csj::segmented_reduce(libraries, in, offsets, out, acc_size, init_bytes);
      },
      "libraries"_a, "a"_a, "offsets"_a, "out"_a, "acc_size"_a, "init"_a);
  m.def(
      "check_segment_offsets",
      [](std::uintptr_t offsets, std::size_t count, std::int64_t size) {
        csj::check_segment_offsets(reinterpret_cast<const std::int64_t*>(offsets), count, size);
      },
      "offsets"_a, "count"_a, "size"_a);
  m.def(
      "scan",
      [](const std::vector<const csj::KernelLibrary*>& libraries, const csj::ShardedArray& in,
         csj::ShardedArray& out, int acc_size, const nb::bytes& init, bool exclusive) {
        std::string init_bytes = to_string(init);
        nb::gil_scoped_release release;
        csj::scan(libraries, in, out, acc_size, init_bytes, exclusive);
      },
      "libraries"_a, "a"_a, "out"_a, "acc_size"_a, "init"_a, "exclusive"_a);
  m.def(
      "scan_builtin",
      [](csj::BuiltinReduction op, const csj::ShardedArray& in, csj::ShardedArray& out,
         const nb::bytes& init, bool exclusive) {
        std::string init_bytes = to_string(init);
        nb::gil_scoped_release release;
        csj::scan_builtin(op, in, out, init_bytes, exclusive);
      },
      "op"_a, "a"_a, "out"_a, "init"_a, "exclusive"_a);

  // The steps of reductions and scans over the places of several processes
  // (cuda_sharded_jit/distributed): per-place results as lists of (valid, bytes), folds as
  // (prefixes, total) with None for a prefix that holds nothing, and scans that call `carry`
  // (with the GIL) between their passes.
  auto result_list = [](const std::vector<csj::ReduceResult>& results) {
    nb::list list;
    for (const csj::ReduceResult& result : results) {
      list.append(nb::make_tuple(result.valid, nb::bytes(result.value.data(), result.value.size())));
    }
    return list;
  };
  auto fold_tuple = [](const csj::FoldResult& result) {
    nb::list prefixes;
    for (const std::string& prefix : result.prefixes) {
      prefixes.append(prefix.empty() ? nb::none() : nb::object(nb::bytes(prefix.data(), prefix.size())));
    }
    return nb::make_tuple(prefixes, nb::bytes(result.total.data(), result.total.size()));
  };
  auto strings = [](const std::vector<nb::bytes>& values) {
    std::vector<std::string> copies;
    copies.reserve(values.size());
    for (const nb::bytes& value : values) copies.push_back(to_string(value));
    return copies;
  };
  m.def(
      "reduce_partials",
      [result_list](const std::vector<const csj::KernelLibrary*>& libraries, const csj::ShardedArray& in,
                    int acc_size) {
        std::vector<csj::ReduceResult> results;
        {
          nb::gil_scoped_release release;
          results = csj::reduce_partials(libraries, in, acc_size);
        }
        return result_list(results);
      },
      "libraries"_a, "a"_a, "acc_size"_a);
  m.def(
      "reduce_builtin_partials",
      [result_list](csj::BuiltinReduction op, const csj::ShardedArray& in) {
        std::vector<csj::ReduceResult> results;
        {
          nb::gil_scoped_release release;
          results = csj::reduce_builtin_partials(op, in);
        }
        return result_list(results);
      },
      "op"_a, "a"_a);
  m.def(
      "fold",
      [fold_tuple, strings](const std::vector<const csj::KernelLibrary*>& libraries, const csj::PlaceGroup& group,
                            int acc_size, const std::vector<nb::bytes>& values, const nb::bytes& init) {
        const std::vector<std::string> copies = strings(values);
        const std::string init_bytes = to_string(init);
        csj::FoldResult result;
        {
          nb::gil_scoped_release release;
          result = csj::fold(libraries, group, acc_size, copies, init_bytes);
        }
        return fold_tuple(result);
      },
      "libraries"_a, "group"_a, "acc_size"_a, "values"_a, "init"_a);
  m.def(
      "fold_builtin",
      [fold_tuple, strings](csj::BuiltinReduction op, const std::string& dtype, const csj::PlaceGroup& group,
                            const std::vector<nb::bytes>& values, const nb::bytes& init) {
        const csj::DType type = csj::dtype_from_name(dtype);
        const std::vector<std::string> copies = strings(values);
        const std::string init_bytes = to_string(init);
        csj::FoldResult result;
        {
          nb::gil_scoped_release release;
          result = csj::fold_builtin(op, type, group, copies, init_bytes);
        }
        return fold_tuple(result);
      },
      "op"_a, "dtype"_a, "group"_a, "values"_a, "init"_a);
  // carry(totals) -> one seed per place (bytes, or None for none); called with the GIL, the
  // scan's passes run without it.
  auto carried = [result_list](const nb::callable& carry) {
    return [&carry, result_list](const std::vector<csj::ReduceResult>& totals) {
      nb::gil_scoped_acquire acquire;
      const nb::object seeds = carry(result_list(totals));
      std::vector<std::string> copies;
      for (nb::handle seed : seeds) copies.push_back(seed.is_none() ? std::string() : to_string(nb::cast<nb::bytes>(seed)));
      return copies;
    };
  };
  m.def(
      "scan_carried",
      [carried](const std::vector<const csj::KernelLibrary*>& libraries, const csj::ShardedArray& in,
                csj::ShardedArray& out, int acc_size, bool exclusive, const nb::callable& carry) {
        const csj::ScanCarry step = carried(carry);
        nb::gil_scoped_release release;
        csj::scan_carried(libraries, in, out, acc_size, exclusive, step);
      },
      "libraries"_a, "a"_a, "out"_a, "acc_size"_a, "exclusive"_a, "carry"_a);
  m.def(
      "scan_builtin_carried",
      [carried](csj::BuiltinReduction op, const csj::ShardedArray& in, csj::ShardedArray& out, bool exclusive,
                const nb::callable& carry) {
        const csj::ScanCarry step = carried(carry);
        nb::gil_scoped_release release;
        csj::scan_builtin_carried(op, in, out, exclusive, step);
      },
      "op"_a, "a"_a, "out"_a, "exclusive"_a, "carry"_a);

  m.def(
      "transform_builtin",
      [](csj::BuiltinOp op, const csj::ArrayList& inputs, csj::ShardedArray& out,
         const nb::bytes& scalars) {
        std::string packed = to_string(scalars);
        nb::gil_scoped_release release;
        csj::transform_builtin(op, inputs, out, packed);
      },
      "op"_a, "inputs"_a, "out"_a, "scalars"_a);

  csj::bindings::bind_dlpack(m);
  csj::bindings::bind_transform_plan(m);
}
