"""Reduction-like cases: reduce, transform_reduce, inclusive and exclusive scans, count,
histogram_even, adjacent_difference and argmin, ours vs CuPy, torch and cuda.compute. Bytes
counted: the input read, plus the output written for scans and differences (a scan's 2n, as
the peers' figures count it)."""

from __future__ import annotations

import functools

import numpy as np

import cuda_sharded_jit as sharded

from sweep import (INT_RANGE, Case, Impl, NotApplicable, accumulator, assert_close, assert_equal,
                   assert_scalar, cccl_impl, cuda_compute)
from bench_transform import USER_ADD, add

SQUARE = sharded.op(lambda a: a * a)
HISTOGRAM_BINS = 64


def square(a):  # cuda.compute's map operator
    return a * a


def to_numpy(value) -> np.ndarray:
    """A host copy of a result from any library: numpy, CuPy, torch (first of a tuple)."""
    if isinstance(value, tuple):
        value = value[0]
    if hasattr(value, "get"):          # CuPy
        return value.get()
    if hasattr(value, "cpu"):          # torch
        return value.cpu().numpy()
    return np.asarray(value)


def _sum(data, squared: bool = False):
    """Sum (of squares) over every shard, computed by CuPy in float64 / 64-bit integers."""
    cp, total = data.cp, 0
    for place, x in enumerate(data.x):
        with cp.cuda.Device(data.devices[place]):
            wide = x.astype(accumulator(cp, data.dtype))
            total += (wide * wide if squared else wide).sum().item()
    return total


# ---- reduce ------------------------------------------------------------------------------------

def _cccl_reduce(data, source) -> Impl:
    """cuda.compute reduce_into over `source` (the input array, or an iterator over it)."""
    result, init = data.cp.empty(1, data.dtype), np.zeros(1, data.dtype)
    build = cuda_compute().make_reduce_into(d_in=source, d_out=result, op=add, h_init=init)
    return cccl_impl(data, build, lambda: result[0].item(), d_in=source, d_out=result, op=add,
                     num_items=int(data.x[0].size), h_init=init)


def _torch():
    import torch

    return torch


REDUCE = Case(
    "reduce", 1,
    ours={"ours": lambda d: Impl(functools.partial(sharded.reduce, d.arrays["x"], USER_ADD)),
          "ours built-in": lambda d: Impl(functools.partial(sharded.reduce, d.arrays["x"], "sum"))},
    # "cupy .item()": CuPy's sum brought to the host as ours is (the events of a call that
    # returns a host value also hold its wait and read-back; CuPy's alone do not)
    peers={"cupy": lambda d: Impl(d.x[0].sum),
           "cupy .item()": lambda d: Impl(lambda: d.x[0].sum().item()),
           "torch": lambda d: Impl(functools.partial(_torch().sum, d.tensors["x"])),
           "cuda.compute": lambda d: _cccl_reduce(d, d.x[0])},
    check=lambda d, value: assert_scalar(value, _sum(d), d.dtype, "sum"),
    note="user add; built-in: \"sum\"; returns a host value")


# ---- transform_reduce: sum of squares ---------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _cupy_sum_of_squares(cp):
    # CuPy's fused map-reduce: the fair peer of a one-pass transform_reduce
    return cp.ReductionKernel("T x", "T y", "x * x", "a + b", "y = a", "0", "sum_of_squares")


def _ours_transform_reduce(data) -> Impl:
    x, init = data.arrays["x"], data.dtype.type(0)
    return Impl(lambda: sharded.transform_reduce(x, SQUARE, USER_ADD, init))


def _cupy_transform_reduce(data) -> Impl:
    return Impl(functools.partial(_cupy_sum_of_squares(data.cp), data.x[0]))


def _torch_transform_reduce(data) -> Impl:
    torch, x = _torch(), data.tensors["x"]
    return Impl(lambda: torch.sum(x * x))


def _cccl_transform_reduce(data) -> Impl:
    return _cccl_reduce(data, cuda_compute().TransformIterator(data.x[0], square))


TRANSFORM_REDUCE = Case(
    "transform_reduce", 1,
    ours={"ours": _ours_transform_reduce},
    peers={"cupy": _cupy_transform_reduce, "torch": _torch_transform_reduce,
           "cuda.compute": _cccl_transform_reduce},
    check=lambda d, value: assert_scalar(value, _sum(d, squared=True), d.dtype, "sum of squares"),
    note="sum of x * x; cupy: ReductionKernel (fused); torch: (x * x).sum() (not fused); "
         "cuda.compute: reduce_into over a TransformIterator")


# ---- scans -------------------------------------------------------------------------------------

def _check_scan(data, exclusive: bool) -> None:
    """Each shard against CuPy's cumsum in float64 / 64-bit integers, seeded with the totals of
    the shards before it."""
    cp, prefix = data.cp, 0
    kind = "exclusive" if exclusive else "inclusive"
    for place, (x, out) in enumerate(zip(data.x, data.out)):
        with cp.cuda.Device(data.devices[place]):
            running = cp.cumsum(x, dtype=accumulator(cp, data.dtype))
            expected = (running - x if exclusive else running) + prefix
            if data.dtype.kind == "f":
                assert_close(cp, out, expected, f"{kind} scan, shard {place}")
            else:  # fixed-width arithmetic wraps: compare in the data's dtype
                assert_equal(cp, out, expected.astype(data.dtype), f"{kind} scan, shard {place}")
            if x.size:
                prefix = prefix + running[-1].item()


def _cccl_scan(data, exclusive: bool) -> Impl:
    x, out, cc = data.x[0], data.out[0], cuda_compute()
    init = np.zeros(1, data.dtype) if exclusive else None
    make = cc.make_exclusive_scan if exclusive else cc.make_inclusive_scan
    build = make(d_in=x, d_out=out, op=add, init_value=init)
    return cccl_impl(data, build, d_in=x, d_out=out, op=add, num_items=int(x.size), init_value=init)


def _ours_scan(data, op, exclusive: bool) -> Impl:
    x, out = data.arrays["x"], data.arrays["out"]
    if exclusive:
        init = data.dtype.type(0)
        return Impl(lambda: sharded.exclusive_scan(x, op, init, out=out))
    return Impl(lambda: sharded.inclusive_scan(x, op, out=out))


def _cupy_cumsum(data) -> Impl:
    cp, x, out = data.cp, data.x[0], data.out[0]
    return Impl(lambda: cp.cumsum(x, dtype=x.dtype, out=out))


def _torch_cumsum(data) -> Impl:
    torch, x, out = _torch(), data.tensors["x"], data.tensors["out"]
    return Impl(lambda: torch.cumsum(x, 0, dtype=x.dtype, out=out))


INCLUSIVE_SCAN = Case(
    "inclusive_scan", 2,
    ours={"ours": lambda d: _ours_scan(d, USER_ADD, False),
          "ours built-in": lambda d: _ours_scan(d, "sum", False)},
    peers={"cupy": _cupy_cumsum, "torch": _torch_cumsum,
           "cuda.compute": lambda d: _cccl_scan(d, False)},
    check=lambda d, value: _check_scan(d, False),
    note="user add; built-in: \"sum\"; 2n counted")

EXCLUSIVE_SCAN = Case(
    "exclusive_scan", 2,
    ours={"ours": lambda d: _ours_scan(d, USER_ADD, True)},
    peers={"cuda.compute": lambda d: _cccl_scan(d, True)},
    check=lambda d, value: _check_scan(d, True),
    note="user add, init 0; CuPy and torch have none; 2n counted")


# ---- count -------------------------------------------------------------------------------------

def _count_value(dtype: np.dtype):
    return 0.5 if dtype.kind == "f" else 7


def _check_count(data, value) -> None:
    cp, target, expected = data.cp, _count_value(data.dtype), 0
    for place, x in enumerate(data.x):
        with cp.cuda.Device(data.devices[place]):
            expected += int(cp.count_nonzero(x == target))
    if int(value) != expected:
        raise AssertionError(f"count({target}): {int(value)}, expected {expected}")


def _count_peer(library, x, target) -> Impl:
    """CuPy's or torch's count: count_nonzero(x == target), two kernels."""
    return Impl(lambda: library.count_nonzero(x == target))


COUNT = Case(
    "count", 1,
    ours={"ours": lambda d: Impl(functools.partial(sharded.count, d.arrays["x"], _count_value(d.dtype)))},
    peers={"cupy": lambda d: _count_peer(d.cp, d.x[0], _count_value(d.dtype)),
           "torch": lambda d: _count_peer(_torch(), d.tensors["x"], _count_value(d.dtype))},
    check=_check_count,
    note="elements equal to 0.5 (floats) or 7 (integers); cupy: count_nonzero(x == v)")


# ---- histogram_even ----------------------------------------------------------------------------

def _histogram_range(dtype: np.dtype) -> tuple:
    return (0.0, 1.0) if dtype.kind == "f" else (0, INT_RANGE)


def _check_histogram(data, value) -> None:
    """Exactly CuPy's (numpy's) histogram, summed over the shards."""
    cp, (lower, upper) = data.cp, _histogram_range(data.dtype)
    expected = np.zeros(HISTOGRAM_BINS, np.int64)
    for place, x in enumerate(data.x):
        with cp.cuda.Device(data.devices[place]):
            expected += cp.histogram(x, bins=HISTOGRAM_BINS, range=(lower, upper))[0].get().astype(np.int64)
    counts = to_numpy(value).astype(np.int64)
    if counts.shape != expected.shape or not np.array_equal(counts, expected):
        diff = counts - expected if counts.shape == expected.shape else counts
        raise AssertionError(f"histogram: differs from cupy.histogram by {diff.tolist()}")


def _cupy_histogram(data) -> Impl:
    cp, x, bounds = data.cp, data.x[0], _histogram_range(data.dtype)
    return Impl(lambda: cp.histogram(x, bins=HISTOGRAM_BINS, range=bounds))


def _torch_histogram(data) -> Impl:
    if data.dtype.kind != "f":
        raise NotApplicable("torch.histc takes floating data only")
    torch, x, (lower, upper) = _torch(), data.tensors["x"], _histogram_range(data.dtype)
    return Impl(lambda: torch.histc(x, bins=HISTOGRAM_BINS, min=lower, max=upper))


def _cccl_histogram(data) -> Impl:
    # float32 only: CUB's integer levels bin by integer arithmetic, not numpy's edges
    if data.dtype != np.float32:
        raise NotApplicable("cuda.compute histogram_even measured on float32 only")
    x, counts = data.x[0], data.cp.zeros(HISTOGRAM_BINS, data.cp.int32)
    lower, upper = (np.array([bound], np.float32) for bound in _histogram_range(data.dtype))
    arguments = dict(d_samples=x, d_histogram=counts, h_num_output_levels=np.array([HISTOGRAM_BINS + 1], np.int32),
                     h_lower_level=lower, h_upper_level=upper, num_samples=int(x.size))
    build = cuda_compute().make_histogram_even(**arguments)
    return cccl_impl(data, build, lambda: counts, **arguments)


def _ours_histogram(data) -> Impl:
    x, (lower, upper) = data.arrays["x"], _histogram_range(data.dtype)
    return Impl(lambda: sharded.histogram_even(x, HISTOGRAM_BINS, lower, upper))


HISTOGRAM_EVEN = Case(
    "histogram_even", 1,
    ours={"ours": _ours_histogram},
    peers={"cupy": _cupy_histogram, "torch": _torch_histogram, "cuda.compute": _cccl_histogram},
    check=_check_histogram,
    note=f"{HISTOGRAM_BINS} bins over [0, 1) (floats, uniform) or [0, {INT_RANGE}) (integers)")


# ---- adjacent_difference -----------------------------------------------------------------------

def _check_adjacent_difference(data, value) -> None:
    cp = data.cp
    if not data.is_ours:  # cupy.diff / torch.diff: the n - 1 differences
        x = data.x[0]
        assert_equal(cp, cp.asarray(value), x[1:] - x[:-1], "diff")
        return
    previous = None  # the last element of the shards before, on the host
    for place, (x, out) in enumerate(zip(data.x, data.out)):
        with cp.cuda.Device(data.devices[place]):
            assert_equal(cp, out[1:], x[1:] - x[:-1], f"adjacent_difference, shard {place}")
            if x.size:
                first = x[:1] if previous is None else x[:1] - cp.asarray(previous)
                assert_equal(cp, out[:1], first, f"adjacent_difference, first element of shard {place}")
                previous = x[-1:].get()


ADJACENT_DIFFERENCE = Case(
    "adjacent_difference", 2,
    ours={"ours": lambda d: Impl(lambda: sharded.adjacent_difference(d.arrays["x"], out=d.arrays["out"]))},
    peers={"cupy": lambda d: Impl(functools.partial(d.cp.diff, d.x[0])),
           "torch": lambda d: Impl(functools.partial(_torch().diff, d.tensors["x"]))},
    check=_check_adjacent_difference,
    note="x[i] - x[i-1]; cupy.diff / torch.diff allocate their n - 1 outputs")


# ---- argmin --------------------------------------------------------------------------------------

def _check_argmin(data, value) -> None:
    cp, best, offset = data.cp, None, 0
    for place, x in enumerate(data.x):
        with cp.cuda.Device(data.devices[place]):
            if x.size:
                index = int(x.argmin())
                smallest = x[index].item()
                if best is None or smallest < best[0]:
                    best = (smallest, offset + index)
        offset += int(x.size)
    if int(value) != best[1]:
        raise AssertionError(f"argmin: {int(value)}, expected {best[1]}")


ARGMIN = Case(
    "argmin", 1,
    ours={"ours": lambda d: Impl(functools.partial(sharded.argmin, d.arrays["x"]))},
    peers={"cupy": lambda d: Impl(d.x[0].argmin),
           "cupy .item()": lambda d: Impl(lambda: d.x[0].argmin().item()),
           "torch": lambda d: Impl(functools.partial(_torch().argmin, d.tensors["x"]))},
    check=_check_argmin, note="index of the first smallest element")

CASES = [REDUCE, TRANSFORM_REDUCE, INCLUSIVE_SCAN, EXCLUSIVE_SCAN, HISTOGRAM_EVEN, COUNT, ADJACENT_DIFFERENCE,
         ARGMIN]
