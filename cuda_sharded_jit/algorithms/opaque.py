"""Opaque algorithms: fill, sequence, count and histogram_even, built into the shim (no JIT)."""

from __future__ import annotations

import math
import numbers
import os

import numpy as np

from .. import _shim
from .._collective import begin, collective
from .._dtypes import exact_cast
from ..array import ShardedArray, check_numbers



def _wide(dtype: np.dtype) -> np.dtype:
    """The widest type of the dtype's kind: sequence arithmetic happens there."""
    return np.dtype({"f": np.float64, "i": np.int64, "u": np.uint64}[dtype.kind])


@collective("fill")
def fill(a: ShardedArray, value) -> ShardedArray:
    """Set every element to `value` (which must fit a's dtype). Returns `a`.

    >>> sharded.fill(a, 3.0)                                                # doctest: +SKIP
    """
    check_numbers(a, "fill")
    packed = exact_cast(value, a.dtype, "value").tobytes().ljust(8, b"\0")
    if a.group._distributed:
        begin(a.group, "fill", ("shard sizes", a.shard_sizes), ("dtype", a.dtype.str))
    _shim.transform_builtin(_shim.BuiltinOp.fill, [], a._impl, packed)
    return a


@collective("sequence")
def sequence(a: ShardedArray, start=0, step=1) -> ShardedArray:
    """a[i] = start + step * i over the global index i, across shards. Returns `a`.

    The arithmetic is done in float64 (floating dtypes), int64 or uint64, then cast.

    >>> sharded.sequence(a, start=10, step=2)                               # doctest: +SKIP
    """
    check_numbers(a, "sequence")
    wide = _wide(a.dtype)
    packed = (exact_cast(start, wide, "start").tobytes() + exact_cast(step, wide, "step").tobytes())
    if a.group._distributed:
        begin(a.group, "sequence", ("shard sizes", a.shard_sizes), ("dtype", a.dtype.str))
    _shim.transform_builtin(_shim.BuiltinOp.sequence, [], a._impl, packed)
    return a


@collective("count")
def count(a: ShardedArray, value) -> int:
    """Number of elements equal to `value` (compared in a's dtype, as numpy does).

    >>> sharded.count(a, 3.0)                                                # doctest: +SKIP
    """
    check_numbers(a, "count")
    try:
        target = exact_cast(value, a.dtype, "value")
    except ValueError:  # an integer array holds no 2.5 and no out-of-range value
        return 0
    if a.group._distributed:
        from ..distributed import _algorithms

        return _algorithms.count(a, target.tobytes())
    return _shim.count(a._impl, target.tobytes())


_MAX_BINS = (1 << 31) - 2  # num_bins + 1 edges fit the kernel's int

# Below this much host memory the question costs more than the answer tells (reading
# /proc/meminfo takes tens of microseconds): numpy's own MemoryError does as well.
_CHECKED_HOST_BYTES = 64 << 20


def _available_host_bytes() -> int | None:
    """Host memory that can be allocated without swapping: MemAvailable (Linux, which counts
    reclaimable page cache), else sysconf's free pages; None where neither is known."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _memory_amount(count: int) -> str:
    """'16.0 GiB', '512.0 MiB': as the shim writes amounts in its messages."""
    return f"{count / (1 << 30):.1f} GiB" if count >= 1 << 30 else f"{count / (1 << 20):.1f} MiB"


# The edges of the last histogram_even call of up to _KEPT_EDGE_BINS bins, read-only, with
# their address: numpy's linspace takes ~5 us, and notebook and solver loops call with the
# same bins again and again (more bins are made anew: their time is the kernel's).
_last_edges: tuple = (None, None)
_KEPT_EDGE_BINS = 2048

# The last checked call of up to _KEPT_EDGE_BINS bins: its num_bins, lower and upper as the
# very objects passed, the array's dtype, then num_bins as an int and the edges with their
# address. A loop calling again with the same objects (the same values, signs included) on an
# array of that dtype skips the argument checks and the edges' key, which cost more than the
# rest of the call's Python side.
_last_call: tuple = (None, None, None, None, 0, None)


def _edges(lower: float, upper: float, num_bins: int, bin_dtype: np.dtype) -> tuple:
    """(numpy's edges for these bins, their address); the signs keep -0.0 apart from 0.0."""
    global _last_edges
    key = (lower, upper, math.copysign(1.0, lower), math.copysign(1.0, upper), num_bins, bin_dtype)
    known, entry = _last_edges
    if known == key:
        return entry
    edges = np.linspace(lower, upper, num_bins + 1, endpoint=True, dtype=bin_dtype)
    edges.flags.writeable = False
    entry = (edges, edges.ctypes.data)
    if num_bins <= _KEPT_EDGE_BINS:
        _last_edges = (key, entry)  # one assignment: a thread sees the old pair or the new one
    return entry


def _check_host_memory(a: ShardedArray, num_bins: int, bin_dtype: np.dtype) -> None:
    """MemoryError naming num_bins when the host memory the call takes at its peak is not
    available: the edges, with np.linspace's float64 working copy while it makes float32 ones,
    then the edges with the counts and the shim's one buffer for adding each further place's."""
    edges = (num_bins + 1) * bin_dtype.itemsize
    working = (num_bins + 1) * 8 if bin_dtype.itemsize != 8 else 0
    counts = num_bins * 8
    staging = counts if sum(1 for size in a.shard_sizes if size) > 1 else 0
    need = edges + max(working, counts + staging)
    if need < _CHECKED_HOST_BYTES:
        return
    available = _available_host_bytes()
    if available is not None and need > available:
        raise MemoryError(f"num_bins: {num_bins} bins need {_memory_amount(need)} of host memory; "
                          f"{_memory_amount(available)} is available")


@collective("histogram_even")
def histogram_even(a: ShardedArray, num_bins: int, lower: float, upper: float) -> np.ndarray:
    """Counts in `num_bins` equal bins over [lower, upper], as
    `np.histogram(x, bins=num_bins, range=(lower, upper))`: values outside ignored, NaN
    ignored, the last bin closed. Returns an int64 numpy array.

    Memory grows with `num_bins` (edges and counts, on the host and on every place): a
    num_bins that does not fit is a MemoryError that says so, before anything is allocated.

    >>> sharded.histogram_even(a, num_bins=64, lower=0.0, upper=1.0)        # doctest: +SKIP
    """
    global _last_call
    last_bins, last_lower, last_upper, last_dtype, bins, last_edges = _last_call
    if (num_bins is last_bins and lower is last_lower and upper is last_upper and type(a) is ShardedArray
            and a.dtype is last_dtype and not a.group._distributed):
        edges, address = last_edges
        counts = np.empty(bins, dtype=np.int64)
        _shim.histogram_even(a._impl, bins, address, edges.nbytes, counts)
        return counts
    check_numbers(a, "histogram_even")
    if isinstance(num_bins, bool) or not isinstance(num_bins, numbers.Integral):
        raise TypeError(f"num_bins: expected an int, got {type(num_bins).__name__}")
    if not 0 < num_bins <= _MAX_BINS:
        raise ValueError(f"num_bins: expected a positive number of bins (at most {_MAX_BINS}), "
                         f"got {num_bins}")
    for name, bound in (("lower", lower), ("upper", upper)):
        if isinstance(bound, (bool, np.bool_)) or not isinstance(bound, numbers.Real):
            raise TypeError(f"{name}: expected a real number, got {type(bound).__name__}")
    bounds = (lower, upper)
    lower, upper = float(lower), float(upper)
    if not (math.isfinite(lower) and math.isfinite(upper)):
        raise ValueError(f"lower, upper: the range must be finite, got ({lower}, {upper})")
    if lower >= upper:
        raise ValueError(f"lower, upper: expected lower < upper, got ({lower}, {upper})")
    bins_passed, num_bins = num_bins, int(num_bins)
    # numpy's edges: linspace in the bin dtype (float32 data keeps float32, others float64)
    bin_dtype = np.dtype(np.float32 if a.dtype == np.float32 else np.float64)
    # Memory first, host then devices, before any is taken: a huge num_bins is a clear
    # MemoryError, not gigabytes allocated and then a failure (or the OOM killer).
    _check_host_memory(a, num_bins, bin_dtype)
    # The shim asks devices only when a device's scratch (under 16 bytes a bin and place, plus
    # the padding of 16) reaches the same 64 MiB, and histogram_even asks again before it runs.
    if 16 * (num_bins + 2) * len(a.shard_sizes) >= _CHECKED_HOST_BYTES:
        _shim.check_histogram_memory(a._impl, num_bins)
    edges, address = _edges(lower, upper, num_bins, bin_dtype)
    counts = np.empty(num_bins, dtype=np.int64)
    if a.group._distributed:
        from ..distributed import _algorithms

        return _algorithms.histogram_even(a, num_bins, edges, counts)
    _shim.histogram_even(a._impl, num_bins, address, edges.nbytes, counts)
    if num_bins <= _KEPT_EDGE_BINS and 16 * (num_bins + 2) * len(a.shard_sizes) < _CHECKED_HOST_BYTES:
        _last_call = (bins_passed, *bounds, a.dtype, num_bins, (edges, address))  # one assignment, as _last_edges
    return counts


__all__ = ["fill", "sequence", "count", "histogram_even"]
