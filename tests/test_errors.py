"""Bad input: each a clear exception naming the argument, raised before anything compiles or
runs, nothing written.

The checks that live in Python run here without a GPU, on stand-in arrays and groups: every
shim entry point an algorithm could reach is replaced by one that fails the test, so an error
raised too late (or not at all) cannot pass. The checks that live in the shim (freed arrays,
wrong-device buffers) need real arrays and carry the `gpu` marker.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim

from conftest import ALL_DTYPES, cupy_or_skip, needs_devices, sample

ARCH = "sm_90"

# Every shim call an algorithm makes after its checks.
_SHIM_ENTRY_POINTS = ("transform", "transform_builtin", "reduce", "reduce_builtin", "scan",
                      "scan_builtin", "count", "check_histogram_memory", "histogram_even",
                      "adjacent_difference", "KernelLibrary", "sort", "sort_by_key", "copy_lanes",
                      "segmented_reduce")


@pytest.fixture
def shim_untouched(monkeypatch):
    """Fails the test if any algorithm reaches the shim (nothing may run or be written)."""
    reached = []
    for name in _SHIM_ENTRY_POINTS:
        def entry(*args, _name=name, **kwargs):
            reached.append(_name)
            raise AssertionError(f"_shim.{_name} was reached: the error came too late")
        monkeypatch.setattr(_shim, name, entry)
    yield reached
    assert reached == []


class _GroupImpl:
    def __init__(self, places: int):
        self.places = places
        self.devices = [0] * places
        self.locality_domains = [0] * places

    def __len__(self):
        return self.places


class _ArrayImpl:
    """What ShardedArray reads of its shim array before calling into the shim."""

    def __init__(self, sizes, dtype):
        self.shard_sizes = list(sizes)
        self.shard_offsets = list(np.cumsum([0] + list(sizes))[:-1])
        self.dtype = np.dtype(dtype).name
        self.size = int(sum(sizes))
        self.num_shards = len(sizes)
        self.storage = "separate"
        self.is_freed = False

    def describe(self):
        return f"stand-in ShardedArray({self.shard_sizes}, {self.dtype})"


def stand_in_group(places: int = 3) -> sharded.PlaceGroup:
    group = object.__new__(sharded.PlaceGroup)
    group._impl = _GroupImpl(places)
    group._archs = (ARCH,) * places
    return group


def stand_in_array(group, sizes=(4, 3, 3), dtype=np.float32) -> sharded.ShardedArray:
    array = object.__new__(sharded.ShardedArray)
    array._impl = _ArrayImpl(sizes, dtype)
    array._group = group
    array._dtype = np.dtype(dtype)
    array._keepalive = None
    array._shard_sizes = tuple(sizes)
    return array


@pytest.fixture
def group():
    return stand_in_group()


# ---- shapes and groups ------------------------------------------------------------------

def test_transform_rejects_other_groups_and_shard_sizes(shim_untouched, group):
    x = stand_in_array(group)
    with pytest.raises(ValueError, match=r"args: array 1 belongs to another PlaceGroup"):
        sharded.transform(lambda p, q: p + q, x, stand_in_array(stand_in_group()))
    with pytest.raises(ValueError, match=r"args: array 1 has shard sizes \(5, 3, 2\)"):
        sharded.transform(lambda p, q: p + q, x, stand_in_array(group, (5, 3, 2)))
    with pytest.raises(ValueError, match="out: belongs to another PlaceGroup than the inputs"):
        sharded.transform(lambda p: p, x, out=stand_in_array(stand_in_group()))
    with pytest.raises(ValueError, match=r"out: shard sizes \(10, 0, 0\) differ"):
        sharded.transform(sharded.ops.negate, x, out=stand_in_array(group, (10, 0, 0)))
    with pytest.raises(TypeError, match="out: expected a ShardedArray, got ndarray"):
        sharded.transform(lambda p: p, x, out=np.zeros(10, np.float32))


def test_scans_and_differences_check_out_before_compiling(shim_untouched, group):
    a = stand_in_array(group, dtype=np.int64)
    elsewhere = stand_in_array(stand_in_group(), dtype=np.int64)
    resized = stand_in_array(group, (1, 1, 8), np.int64)
    for call in (lambda out: sharded.inclusive_scan(a, lambda x, y: x + y, out=out),
                 lambda out: sharded.exclusive_scan(a, "sum", 0, out=out),
                 lambda out: sharded.adjacent_difference(a, out=out)):
        with pytest.raises(ValueError, match="out: belongs to another PlaceGroup than a"):
            call(elsewhere)
        with pytest.raises(ValueError, match=r"out: shard sizes \(1, 1, 8\) differ from a: \(4, 3, 3\)"):
            call(resized)
    with pytest.raises(ValueError, match="out: must not alias a"):
        sharded.adjacent_difference(a, out=a)
    with pytest.raises(ValueError, match="init: an exclusive scan needs an initial value"):
        sharded.exclusive_scan(a, "sum", None)


# ---- dtypes and scalars -----------------------------------------------------------------

def test_wrong_dtypes_and_scalars(shim_untouched, group):
    x = stand_in_array(group, dtype=np.int32)
    with pytest.raises(TypeError, match=r"args\[1\]: unsupported dtype float16"):
        sharded.transform(lambda p, s: p * s, x, np.float16(2))
    with pytest.raises(TypeError, match=r"args\[1\]: expected a ShardedArray or a scalar, got bool"):
        sharded.transform(lambda p, s: p * s, x, True)
    with pytest.raises(TypeError, match=r"args\[1\]: expected a ShardedArray or a scalar, got complex"):
        sharded.transform(lambda p, s: p * s, x, 1j)
    with pytest.raises(TypeError, match=r"args\[1\]: dtype float64 differs from args\[0\]'s int32"):
        sharded.transform(sharded.ops.add, x, stand_in_array(group, dtype=np.float64))
    with pytest.raises(ValueError, match=r"ops.scale: 2.5 does not fit int32"):
        sharded.transform(sharded.ops.scale(2.5), x)
    with pytest.raises(TypeError, match="ops.add takes 2 array arguments, got 1"):
        sharded.transform(sharded.ops.add, x)
    with pytest.raises(TypeError, match="unsupported dtype complex64"):
        sharded.ShardedArray.allocate(group, 10, np.complex64)
    with pytest.raises(TypeError, match=r"host: unsupported dtype float16"):
        sharded.ShardedArray.from_numpy(group, np.zeros(10, np.float16))
    with pytest.raises(TypeError, match=r"sizes\[1\]: expected an int, got float"):
        sharded.ShardedArray.allocate(group, [1, 2.0, 3], np.float32)
    with pytest.raises(TypeError, match="group: expected a PlaceGroup, got list"):
        sharded.ShardedArray.allocate([0, 0], 10, np.float32)


def test_values_that_are_not_numbers_or_do_not_fit(shim_untouched, group):
    unsigned = stand_in_array(group, dtype=np.uint32)
    with pytest.raises(TypeError, match="value: expected a real number, got str"):
        sharded.fill(unsigned, "3")
    with pytest.raises(TypeError, match="value: expected a real number, got NoneType"):
        sharded.fill(unsigned, None)
    with pytest.raises(ValueError, match="value: -1 does not fit uint32"):
        sharded.fill(unsigned, -1)
    with pytest.raises(ValueError, match=r"value: 2\.5 does not fit uint32"):
        sharded.fill(unsigned, 2.5)
    with pytest.raises(TypeError, match="start: expected a real number, got str"):
        sharded.sequence(unsigned, start="0")
    with pytest.raises(TypeError, match="value: expected a real number, got str"):
        sharded.count(unsigned, "3")  # before: silently counted the 3s
    with pytest.raises(ValueError, match=r"init: 1099511627776 does not fit int32"):
        sharded.reduce(stand_in_array(group, dtype=np.int32), "sum", init=1 << 40)
    with pytest.raises(TypeError, match="init: unsupported dtype"):
        sharded.reduce(unsigned, "sum", init="0")


# ---- operators --------------------------------------------------------------------------

def test_operator_arity_is_checked_before_compiling(shim_untouched, group, monkeypatch):
    from cuda_sharded_jit import compiler

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled an operator whose arity was wrong")

    monkeypatch.setattr(compiler, "_build", no_compile)
    x = stand_in_array(group)
    with pytest.raises(TypeError, match="takes 2 arguments, but transform passes 1"):
        sharded.transform(lambda p, q: p + q, x)
    with pytest.raises(TypeError, match="takes 1 argument, but reduce passes 2"):
        sharded.reduce(x, lambda p: p)
    with pytest.raises(TypeError, match="takes 2 arguments, but transform_reduce's map passes 1"):
        sharded.transform_reduce(x, lambda p, q: p, "sum", 0.0)
    with pytest.raises(TypeError, match="takes 1 argument, but inclusive_scan passes 2"):
        sharded.inclusive_scan(x, lambda p: p)
    with pytest.raises(TypeError, match="takes 3 arguments, but count_if passes 1"):
        sharded.count_if(x, lambda p, q, r: p)
    with pytest.raises(TypeError, match="takes 1 argument, but adjacent_difference passes 2"):
        sharded.adjacent_difference(x, op=lambda p: p)
    with pytest.raises(TypeError, match="must take plain positional parameters"):
        sharded.transform(lambda *p: p[0], x)
    with pytest.raises(ValueError, match="op: expected an operator or one of sum, min, max"):
        sharded.reduce(x, "product")
    with pytest.raises(TypeError, match="op: expected an operator"):
        sharded.reduce(x, 3)


@pytest.mark.parametrize("returns, message", [
    (lambda x: (x, x > 0), r"returns Tuple\(float32, bool\) .* which no array can hold"),
    (lambda x: (x, x, x, x, x), r"tuples of 1 to 4 numbers are supported, got 5"),
    (lambda x: None, "returns no value for argument types"),
    (lambda x: x > 0, "returns bool .* which no array can hold"),
])
def test_operator_returning_what_no_array_holds(shim_untouched, group, returns, message):
    with pytest.raises(TypeError, match=message):
        sharded.transform(returns, stand_in_array(group))


def test_reduction_operator_returning_a_tuple(shim_untouched, group):
    with pytest.raises(TypeError, match=r"operator \S*<lambda> cannot be compiled for argument types \(float32, float32\)"):
        sharded.reduce(stand_in_array(group), lambda a, b: (a, b))


_SEEN = []
_CALLS = {"n": 0}
_COUNT = 0


def _appends(x):
    _SEEN.append(x)
    return x


def _counts_in_dict(x):
    _CALLS["n"] += 1
    return x


def _assigns_global(x):
    global _COUNT
    _COUNT += 1
    return x


class _Box:
    value = 0.0


_BOX = _Box()


def _sets_attribute(x):
    _BOX.value = x
    return x


@pytest.mark.parametrize("operator", [_appends, _counts_in_dict, _assigns_global, _sets_attribute])
def test_operators_with_side_effects_on_python_objects(shim_untouched, group, operator):
    """A device operator cannot touch host objects: TypeError naming it, with numba's reason
    or, for a list, dict or object it reads, why no kernel can bake it in; the Python objects
    are untouched (the operator never ran)."""
    with pytest.raises(TypeError, match=rf"operator {operator.__name__} (cannot be compiled for argument types "
                                        rf"\(float32\)|reads _\w+: a (list|dict|test_errors._Box object))"):
        sharded.transform(operator, stand_in_array(group))
    assert (_SEEN, _CALLS["n"], _COUNT, _BOX.value) == ([], 0, 0, 0.0)


# ---- histogram_even ---------------------------------------------------------------------

@pytest.mark.parametrize("num_bins, lower, upper, error, message", [
    (0, 0.0, 1.0, ValueError, "num_bins: expected a positive number of bins"),
    (-3, 0.0, 1.0, ValueError, "num_bins: expected a positive number of bins"),
    (1 << 31, 0.0, 1.0, ValueError, "num_bins: expected a positive number of bins .at most"),
    (2.5, 0.0, 1.0, TypeError, "num_bins: expected an int, got float"),
    (True, 0.0, 1.0, TypeError, "num_bins: expected an int, got bool"),
    (4, 0.0, float("nan"), ValueError, "lower, upper: the range must be finite"),
    (4, float("nan"), 1.0, ValueError, "lower, upper: the range must be finite"),
    (4, -np.inf, 1.0, ValueError, "lower, upper: the range must be finite"),
    (4, 0.0, np.inf, ValueError, "lower, upper: the range must be finite"),
    (4, 1.0, 1.0, ValueError, "lower, upper: expected lower < upper"),
    (4, 2.0, 1.0, ValueError, "lower, upper: expected lower < upper"),
    (4, "0", 1.0, TypeError, "lower: expected a real number, got str"),
    (4, 0.0, None, TypeError, "upper: expected a real number, got NoneType"),
])
def test_histogram_arguments(shim_untouched, group, num_bins, lower, upper, error, message):
    with pytest.raises(error, match=message):
        sharded.histogram_even(stand_in_array(group), num_bins, lower, upper)


def test_histogram_repeating_the_last_bins_is_checked_as_the_first(monkeypatch, group):
    """A call repeating the last call's bins (the very objects) takes the short path to the
    shim; any other call is checked again, whatever came before it."""
    calls = []

    def shim_histogram(impl, num_bins, edges, edge_bytes, counts):
        calls.append((num_bins, edge_bytes, counts.shape, counts.dtype))
        counts[:] = np.arange(num_bins)

    monkeypatch.setattr(_shim, "histogram_even", shim_histogram)
    a = stand_in_array(group)
    bins, lower, upper = np.int64(64), 0.0, 1.0
    for _ in range(3):
        np.testing.assert_array_equal(sharded.histogram_even(a, bins, lower, upper), np.arange(64))
    assert calls == [(64, 65 * 4, (64,), np.dtype(np.int64))] * 3
    assert all(type(num_bins) is int for num_bins, *_ in calls)
    with pytest.raises(ValueError, match="expected lower < upper"):
        sharded.histogram_even(a, bins, upper, lower)
    sharded.histogram_even(a, bins, lower, upper)
    records = stand_in_array(group, dtype=np.dtype([("x", np.float32), ("y", np.float32)]))
    with pytest.raises(TypeError, match="takes arrays of numbers, not records"):
        sharded.histogram_even(records, bins, lower, upper)
    assert len(calls) == 4


# ---- adopted buffers --------------------------------------------------------------------

class _Buffer:
    """A __cuda_array_interface__ description; adopt must reject it before the shim looks."""

    def __init__(self, shape=(8,), typestr="<f4", strides=None, mask=None, pointer=1 << 20):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "strides": strides,
                                          "data": (pointer, False), "version": 3, "mask": mask}


@pytest.mark.parametrize("buffers, error, message", [
    ([_Buffer()], ValueError, r"buffers: expected one buffer per place \(3\), got 1"),
    ([_Buffer(), object(), _Buffer()], TypeError,
     r"buffers\[1\]: object has no __cuda_array_interface__ and no __dlpack__"),
    # numpy arrays are DLPack producers, in host memory: refused before they export anything
    ([_Buffer(), np.zeros(8), _Buffer()], ValueError, r"buffers\[1\]: ndarray lives in host memory \(kDLCPU\)"),
    ([_Buffer(), _Buffer(strides=(8,)), _Buffer()], ValueError, r"buffers\[1\]: not C-contiguous \(strides \(8,\)\)"),
    ([_Buffer(shape=(4, 4), strides=(4, 16)), _Buffer(), _Buffer()], ValueError, r"buffers\[0\]: not C-contiguous"),
    ([_Buffer(), _Buffer(), _Buffer(mask=object())], ValueError, r"buffers\[2\]: masked arrays are not supported"),
    ([_Buffer(), _Buffer(typestr="<f8"), _Buffer()], TypeError, r"buffers\[1\]: dtype float64 differs from buffers\[0\]'s float32"),
    ([_Buffer(typestr="|i1"), _Buffer(), _Buffer()], TypeError, r"buffers\[0\]: unsupported dtype int8"),
])
def test_adopt_rejects_bad_buffers(group, buffers, error, message):
    with pytest.raises(error, match=message):
        sharded.ShardedArray.adopt(group, buffers)


# ---- the shim's own checks (real arrays) ------------------------------------------------

def _every_call(a, out):
    """Each algorithm once, on `a` (and `out` where it writes one)."""
    add = lambda x, y: x + y  # noqa: E731
    return {
        "transform": lambda: sharded.transform(lambda x: x + 1, a, out=out),
        "descriptor": lambda: sharded.transform(sharded.ops.negate, a, out=out),
        "reduce": lambda: sharded.reduce(a, add),
        "sum": lambda: sharded.sum(a),
        "transform_reduce": lambda: sharded.transform_reduce(a, lambda x: x * x, add, 0),
        "count_if": lambda: sharded.count_if(a, lambda x: x > 0),
        "inclusive_scan": lambda: sharded.inclusive_scan(a, add, out=out),
        "exclusive_scan": lambda: sharded.exclusive_scan(a, "sum", 0, out=out),
        "adjacent_difference": lambda: sharded.adjacent_difference(a, out=out),
        "fill": lambda: sharded.fill(a, 1),
        "sequence": lambda: sharded.sequence(a),
        "count": lambda: sharded.count(a, 3),
        "histogram_even": lambda: sharded.histogram_even(a, 4, 0.0, 10.0),
        "to_numpy": lambda: a.to_numpy(),
        "shard": lambda: a.shard(0),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(_every_call(None, None)))
def test_use_after_free_is_value_error_and_writes_nothing(three_places, name):
    host = np.arange(30, dtype=np.int64)
    a = sharded.ShardedArray.from_numpy(three_places, host)
    out = sharded.ShardedArray.from_numpy(three_places, np.full(30, 7, np.int64))
    a.free()
    with pytest.raises(ValueError, match="freed"):
        _every_call(a, out)[name]()
    np.testing.assert_array_equal(out.to_numpy(), np.full(30, 7, np.int64))  # untouched


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["transform", "descriptor", "inclusive_scan", "exclusive_scan",
                                  "adjacent_difference"])
def test_freed_out_is_value_error_naming_out(three_places, name):
    a = sharded.ShardedArray.from_numpy(three_places, np.arange(30, dtype=np.int64))
    out = sharded.ShardedArray.allocate(three_places, 30, np.int64)
    out.free()
    with pytest.raises(ValueError, match=r"out: the array was freed"):
        _every_call(a, out)[name]()
    np.testing.assert_array_equal(a.to_numpy(), np.arange(30))


@pytest.mark.gpu
def test_host_memory_is_not_adopted(one_place):
    host = np.zeros(16, np.float32)

    class HostBuffer:
        __cuda_array_interface__ = {"shape": (16,), "typestr": "<f4", "strides": None,
                                    "data": (host.ctypes.data, False), "version": 3}

    with pytest.raises(ValueError, match=r"buffers\[0\]: (host memory|not a CUDA device pointer)"):
        sharded.ShardedArray.adopt(one_place, [HostBuffer()])


@pytest.mark.gpu
def test_misaligned_buffer_is_not_adopted(one_place):
    cp = cupy_or_skip()
    base = cp.zeros(17, cp.float32)

    class Shifted:
        __cuda_array_interface__ = dict(base.__cuda_array_interface__, shape=(16,),
                                        data=(base.data.ptr + 2, False))

    with pytest.raises(ValueError, match=r"buffers\[0\]: data pointer is not aligned"):
        sharded.ShardedArray.adopt(one_place, [Shifted()])


@pytest.mark.gpu
@needs_devices(2)
def test_wrong_device_buffer_is_value_error():
    cp = cupy_or_skip()
    group = sharded.PlaceGroup.by_devices([0, 1])
    with cp.cuda.Device(1):
        on_one = cp.zeros(4, cp.float32)
        also_one = cp.zeros(4, cp.float32)
    with pytest.raises(ValueError, match=r"buffers\[0\]: lives on device 1, expected device 0"):
        sharded.ShardedArray.adopt(group, [on_one, also_one])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_shim_rejects_mismatched_arrays_even_past_python(three_places, dtype):
    """The shim checks groups and shard sizes itself (the bindings are usable directly)."""
    a = sharded.ShardedArray.from_numpy(three_places, sample(dtype, 12))
    resized = sharded.ShardedArray.allocate(three_places, [2, 2, 8], dtype)
    with pytest.raises(ValueError, match=r"inputs\[0\]: shard sizes differ from out's"):
        _shim.transform_builtin(_shim.BuiltinOp.negate, [a._impl], resized._impl, b"")
    with pytest.raises(ValueError, match="out: shard sizes differ from a's"):
        _shim.scan_builtin(_shim.BuiltinReduction.sum, a._impl, resized._impl, b"", False)
    other = sharded.PlaceGroup.by_devices([0, 0, 0])
    elsewhere = sharded.ShardedArray.allocate(other, 12, dtype)
    with pytest.raises(ValueError, match=r"inputs\[0\]: belongs to another PlaceGroup"):
        _shim.transform_builtin(_shim.BuiltinOp.negate, [a._impl], elsewhere._impl, b"")


_DEVICE_RESET_CHILD = textwrap.dedent("""
    import numpy as np, cuda_sharded_jit as sharded
    from cuda.bindings import runtime
    group = sharded.PlaceGroup.by_devices([0, 0])
    a = sharded.ShardedArray.from_numpy(group, np.arange(1000, dtype=np.float64))
    assert float(sharded.sum(a)) == 499500.0  # reduce slots and sort buffers of this context
    sharded.sort(a, descending=True)            # exist now: none may be used after the reset
    # another library resets the device under us: every context resource is gone
    assert runtime.cudaDeviceReset()[0] == runtime.cudaError_t.cudaSuccess
    outcomes = []
    for name, call in [("sum", lambda: sharded.sum(a)),
                       ("fill", lambda: (sharded.fill(a, 1.0), group.sync())),
                       ("sort", lambda: sharded.sort(a)),
                       ("to_numpy", lambda: a.to_numpy()),
                       ("sync", lambda: group.sync()),
                       ("allocate", lambda: sharded.ShardedArray.allocate(group, 10, np.float32))]:
        try:
            call()
            outcomes.append(name + ":ok")
        except (RuntimeError, ValueError, MemoryError) as error:
            said = "/reset" if "reset" in str(error) and "cuda:0" in str(error) else ""
            outcomes.append(name + ":" + type(error).__name__ + said)
    del a, group  # nothing of the old context reaches the driver
    fresh = sharded.PlaceGroup.by_devices([0, 0])  # a new group lives in the new context
    b = sharded.ShardedArray.from_numpy(fresh, np.arange(10.0))
    sharded.sort(b, descending=True)
    outcomes.append("fresh:" + repr(float(sharded.sum(b))) + "/" + repr(float(b.to_numpy()[0])))
    print(" ".join(outcomes))
""")


@pytest.mark.gpu
def test_arrays_whose_device_was_reset_raise_and_do_not_crash(tmp_path):
    """The devices of a group 'go' when another library resets them: using the group's arrays
    then raises a clear exception, never a crash (run in a child process: a reset would break
    the other tests' groups)."""
    pytest.importorskip("cuda.bindings.runtime")
    result = subprocess.run([sys.executable, "-c", _DEVICE_RESET_CHILD], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    outcomes = dict(outcome.split(":", 1) for outcome in result.stdout.split())
    assert sorted(outcomes) == ["allocate", "fill", "fresh", "sort", "sum", "sync", "to_numpy"]
    for name in ("sum", "fill", "sort", "to_numpy", "sync", "allocate"):
        assert outcomes[name] == "RuntimeError/reset", outcomes  # names the device and the reset
    assert outcomes["fresh"] == "45.0/9.0", outcomes  # a new group works, and is right
