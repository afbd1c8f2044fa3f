"""The Python side of host time per call, on a machine with no GPU: the calls of the host
suite (benchmarks/run.py --only host) and each step of their hot path, with the shim
stubbed (allocation, launches and KernelLibrary do nothing; a reduction returns a fixed
value; the kernel cache is filled without compiling). What it leaves out is the shim's own
part (nanobind's argument conversion, the C++ checks, the launches, a reduction's wait and
read-back), which only a GPU run (benchmarks/host_time_ab.py) sees. The transforms here take the
full path every time: a plan (algorithms/transform.py) is made only for the shim's own group and
kernels, and a planned call is C++ from its argument checks on, so host_time_ab times it.

    PYTHONPATH=<tree> python benchmarks/host_python.py [--places 1 4] [--calls 20000]

Prints the best and the median of 7 batches per statement, in µs per call. Run it for two
trees one after the other (pinned to one core with taskset where other work shares the
machine) to compare them.
"""

from __future__ import annotations

import argparse
import sys
import timeit

import numpy as np

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim, compiler
from cuda_sharded_jit.algorithms import reduce as reduce_module
from cuda_sharded_jit.algorithms import segmented as segmented_module
from cuda_sharded_jit.algorithms import transform as transform_module
from cuda_sharded_jit.array import check_out
from cuda_sharded_jit.op import as_op

FLOAT32 = np.dtype(np.float32)
INT64 = np.dtype(np.int64)
SEGMENT = 64  # elements per segment of the segmented_reduce calls
RESULT = np.float32(1024.0).tobytes()  # what every stubbed reduction returns


class _GroupImpl:
    """The shim group's part the Python side reads: size, devices, architectures."""

    def __init__(self, places: int):
        self.places = places
        self.devices = [0] * places
        self.locality_domains = [0] * places

    def __len__(self):
        return self.places

    def compute_capability(self, place):
        return 9, 0

    def sync(self):
        pass


class _ArrayImpl:
    """The shim array's part the Python side reads; `allocate` makes one."""

    even_sizes = staticmethod(_shim.ShardedArray.even_sizes)

    def __init__(self, sizes, dtype_name):
        self.shard_sizes = list(sizes)
        self.dtype = dtype_name
        self.size = sum(sizes)
        self.num_shards = len(sizes)

    @staticmethod
    def allocate(group, sizes, dtype_name, contiguous=False, itemsize=0):
        return _ArrayImpl(sizes, dtype_name)

    def free(self):
        pass


def _stored_kernel(op, key, map_spec=compiler.VALUE_MAP):
    """compiler._lookup's answer for a hit: a kernel of the requested (or input) dtype."""
    algorithm, _, _, arg_kinds, out_request, arch = key
    out_dtype = out_request if out_request is not None else arg_kinds[0][1]
    return compiler.CompiledKernel(algorithm, op.name, arg_kinds, np.dtype(out_dtype), arch,
                                   f"{algorithm}_stub", b"", b"", "", True, 0.0)


def stub_shim() -> None:
    """Replaces the shim's entry points the measured calls reach (this process only)."""
    _shim.ShardedArray = _ArrayImpl
    _shim.KernelLibrary = lambda cubin, entry_points: object()
    _shim.transform = lambda libraries, inputs, out, scalars, indexed=False: None
    _shim.transform_builtin = lambda op, inputs, out, scalars: None
    _shim.reduce = lambda libraries, a, acc_size, init: (True, RESULT)
    _shim.reduce_builtin = lambda op, a, init: (True, RESULT)
    _shim.segmented_reduce_device = lambda libraries, a, offsets, out, acc_size, init: None
    _shim.segmented_reduce = lambda libraries, a, positions, count, out, acc_size, init: None
    _shim.check_segment_offsets = lambda positions, count, size: None
    _shim.histogram_even = lambda a, num_bins, edges, edge_bytes, counts: None
    compiler._lookup = _stored_kernel


def stand_in_group(places: int) -> sharded.PlaceGroup:
    group = object.__new__(sharded.PlaceGroup)
    group._impl = _GroupImpl(places)
    group._archs = None
    return group


def stand_in_array(group: sharded.PlaceGroup, per_place: int, dtype: np.dtype = FLOAT32,
                   n: int | None = None) -> sharded.ShardedArray:
    n = per_place * len(group) if n is None else n
    sizes = _shim.ShardedArray.even_sizes(n, len(group))
    return sharded.ShardedArray(_ArrayImpl(sizes, dtype.name), group, dtype)


CALLS = {  # the host suite's calls, and the brief forms of their operators
    "transform(lambda x, y: x + y, a, b, out=c)": "sharded.transform(lambda x, y: x + y, a, b, out=c)",
    "transform(op, a, b, out=c)": "sharded.transform(add, a, b, out=c)",
    "transform(ops.add, a, b, out=c)": "sharded.transform(sharded.ops.add, a, b, out=c)",
    "transform(ops.add, a, b) (a new array)": "sharded.transform(sharded.ops.add, a, b)",
    "a + b (a new array)": "a + b",
    "reduce(a, lambda x, y: x + y, 0.0) -> host": "sharded.reduce(a, lambda x, y: x + y, 0.0)",
    "reduce(a, op) -> host": "sharded.reduce(a, add)",
    "sum(a) -> host": "sharded.sum(a)",
    # as benchmarks/bench_selection.py calls it: a plain function, made once, and float32 init
    "segmented_reduce(a, offsets, f, float32(0))": "sharded.segmented_reduce(a, offsets, f, F32_ZERO)",
    "segmented_reduce(a, offsets, op, float32(0))": "sharded.segmented_reduce(a, offsets, add, F32_ZERO)",
    "segmented_reduce(a, numpy offsets, f, ...)": "sharded.segmented_reduce(a, host_offsets, f, F32_ZERO)",
    "histogram_even(a, 64, 0.0, 1.0) -> host": "sharded.histogram_even(a, 64, 0.0, 1.0)",
}
STEPS = {  # the parts of those calls, each alone
    "a no-op call (what the decorator wraps below)": "noop(a, add, 0.0)",
    "collective decorator (around that no-op)": "collective_noop(a, add, 0.0)",
    "as_op(a new lambda)": "as_op(lambda x, y: x + y)",
    "op.identity()": "add.identity()",
    "kernel_libraries hit (transform)": "compiler.kernel_libraries(add, 'transform', kinds, FLOAT32, archs)",
    "transform prepare (checks, cache hit)": "transform_module.prepare(add, (a, b), c)",
    "transform run (launch stubbed)": "transform_module.run(prepared, c)",
    "check_out(c, a)": "check_out(c, a)",
    "pack init 0.0 (float32)": "layout.pack_init(0.0)",
    "read a float32 result": "reduce_module._result(True, RESULT, layout, None, 'reduce')",
    "as_op(a plain function made once)": "as_op(f)",
    "kernel_libraries hit (reduce)": "compiler.kernel_libraries(add, 'reduce', reduce_kinds, FLOAT32, archs)",
    "segmented _positions(device offsets)": "segmented_module._positions(offsets, a)",
    "segmented _positions(numpy offsets)": "segmented_module._positions(host_offsets, a)",
    "pack init float32(0) (float32)": "layout.pack_init(F32_ZERO)",
    "_new_even(group, S, float32) (the result)": "sharded.ShardedArray._new_even(a.group, segments, FLOAT32)",
}


def _noop(*args):
    return None


def _add(x, y):
    return x + y


def measure(statement: str, namespace: dict, calls: int) -> tuple[float, float]:
    timer = timeit.Timer(statement, globals=namespace)
    timer.timeit(calls // 10)
    batches = sorted(seconds / calls * 1e6 for seconds in timer.repeat(7, calls))
    return batches[0], batches[3]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--places", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--calls", type=int, default=20000, help="calls per batch")
    parser.add_argument("--elements", type=int, default=1024, help="elements per place")
    arguments = parser.parse_args(argv)
    stub_shim()
    from cuda_sharded_jit._collective import collective
    from cuda_sharded_jit._layout import layout_of

    print(f"µs per call, best (median) of 7 batches of {arguments.calls}; shim stubbed")
    for places in arguments.places:
        group = stand_in_group(places)
        a, b, c = (stand_in_array(group, arguments.elements) for _ in range(3))
        host_offsets = np.arange(0, a.size + 1, SEGMENT, dtype=np.int64)
        namespace = {
            "sharded": sharded, "compiler": compiler, "transform_module": transform_module,
            "reduce_module": reduce_module, "check_out": check_out, "as_op": as_op,
            "a": a, "b": b, "c": c, "add": sharded.op(lambda x, y: x + y), "FLOAT32": FLOAT32,
            "kinds": (("array", FLOAT32), ("array", FLOAT32)), "archs": group.archs,
            "layout": layout_of(FLOAT32), "RESULT": RESULT,
            "noop": _noop, "collective_noop": collective("noop")(_noop),
            "segmented_module": segmented_module, "f": _add, "F32_ZERO": np.float32(0),
            "offsets": stand_in_array(group, 0, INT64, len(host_offsets)), "host_offsets": host_offsets,
            "segments": len(host_offsets) - 1, "reduce_kinds": (("array", FLOAT32),),
        }
        namespace["prepared"] = transform_module.prepare(namespace["add"], (a, b), c)
        for title, table in (("calls", CALLS), ("steps", STEPS)):
            print(f"\n{places} place{'s' if places > 1 else ''}, {title}")
            for label, statement in table.items():
                best, median = measure(statement, namespace, arguments.calls)
                print(f"  {label:46s} {best:6.2f} ({median:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
