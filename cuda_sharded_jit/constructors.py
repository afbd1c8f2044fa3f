"""Array constructors with NumPy's names: `empty`, `zeros`, `ones`, `full`, `arange`,
`linspace`, `asarray` and the `*_like` forms, each a ShardedArray over a PlaceGroup.

They are thin calls over what the containers already do: `allocate` (an even split, or
explicit `sizes=`, or one address range with `contiguous=True`), the built-in `fill` and
`sequence` kernels, and one cached JIT transform for `linspace`, whose last element is `stop`
exactly, as NumPy's is. Results follow NumPy's dtype rules where these calls choose a dtype.
"""

from __future__ import annotations

import math

import numpy as np

from . import _dlpack
from ._dtypes import as_array_dtype, is_integer
from .algorithms import transform as _transform
from .algorithms.opaque import fill, sequence
from .array import ShardedArray, _check_group, _shard_sizes, check_array
from .places import PlaceGroup


def _count(n, argument: str = "n") -> int:
    if not is_integer(n):
        raise TypeError(f"{argument}: expected an int, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"{argument}: must be >= 0, got {n}")
    return int(n)


def empty(g: PlaceGroup, n, dtype=np.float64, *, sizes=None, contiguous: bool = False) -> ShardedArray:
    """An uninitialised array of `n` elements (even split), or of the given shard `sizes`
    (which must add up to n); `contiguous`: one virtual address range (allocate_contiguous).

    >>> a = sharded.empty(g, 1 << 20, np.float32)                            # doctest: +SKIP
    """
    n = _count(n)
    if sizes is not None:
        sizes = list(sizes)
        if sum(int(size) for size in sizes) != n:
            raise ValueError(f"sizes: {sizes} add up to {sum(int(size) for size in sizes)}, not n = {n}")
    if contiguous is not False and contiguous is not True:
        raise TypeError(f"contiguous: expected a bool, got {type(contiguous).__name__}")
    make = ShardedArray.allocate_contiguous if contiguous else ShardedArray.allocate
    return make(g, n if sizes is None else sizes, dtype)


def full(g: PlaceGroup, n, value, dtype=None, *, sizes=None, contiguous: bool = False) -> ShardedArray:
    """Every element `value`, cast to `dtype` as NumPy casts (default: `value`'s own dtype,
    as `np.full` chooses it: int64 for a Python int, float64 for a float).

    >>> sharded.full(g, 10, 0.5, np.float32).to_numpy()[0]                  # doctest: +SKIP
    """
    value = np.asarray(value)
    if value.ndim != 0:
        raise TypeError(f"value: expected a number, got an array of shape {value.shape}")
    dtype = value.dtype if dtype is None else np.dtype(dtype)
    out = empty(g, n, dtype, sizes=sizes, contiguous=contiguous)
    return fill(out, value.astype(dtype)[()])


def zeros(g: PlaceGroup, n, dtype=np.float64, *, sizes=None, contiguous: bool = False) -> ShardedArray:
    """Every element 0.

    >>> sharded.zeros(g, 1000, np.int32)                                     # doctest: +SKIP
    """
    return full(g, n, 0, dtype, sizes=sizes, contiguous=contiguous)


def ones(g: PlaceGroup, n, dtype=np.float64, *, sizes=None, contiguous: bool = False) -> ShardedArray:
    """Every element 1.

    >>> sharded.ones(g, 1000, np.float32)                                    # doctest: +SKIP
    """
    return full(g, n, 1, dtype, sizes=sizes, contiguous=contiguous)


def arange(g: PlaceGroup, start, stop=None, step=1, dtype=None, *, sizes=None,
           contiguous: bool = False) -> ShardedArray:
    """`start, start + step, ...` below `stop`, as `np.arange` (one argument: 0 to it); the
    dtype NumPy picks from the arguments unless given; element i is computed as
    start + step * i (in float64, int64 or uint64, then cast).

    >>> sharded.arange(g, 10).to_numpy()                                     # doctest: +SKIP
    array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    """
    for name, value in (("start", start), ("stop", stop), ("step", step)):
        if name == "stop" and value is None:
            continue
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
            raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("step: must not be zero")
    n = max(0, math.ceil((stop - start) / step))
    if dtype is None:
        dtype = np.result_type(np.asarray(start), np.asarray(stop), np.asarray(step))
    return sequence(empty(g, n, dtype, sizes=sizes, contiguous=contiguous), start, step)


def _linspace_element(x, start, step, stop, last, index):
    return stop if index == last else index * step + start


def linspace(g: PlaceGroup, start, stop, num, dtype=np.float64, *, sizes=None,
             contiguous: bool = False) -> ShardedArray:
    """`num` evenly spaced values from `start` to `stop` inclusive, as `np.linspace`: element
    i is start + i * step in float64 (the last exactly `stop`; one value is `start`), then cast to `dtype`.

    >>> sharded.linspace(g, 0.0, 1.0, 5).to_numpy()                          # doctest: +SKIP
    array([0.  , 0.25, 0.5 , 0.75, 1.  ])
    """
    num = _count(num, "num")
    start, stop = float(start), float(stop)
    out = empty(g, num, dtype, sizes=sizes, contiguous=contiguous)
    if num == 0:
        return out
    step = (stop - start) / (num - 1) if num > 1 else 0.0
    last = stop if num > 1 else start  # np.linspace(start, stop, 1) is [start]
    return _transform.transform(_linspace_element, out, start, step, last, np.int64(num - 1), with_index=True,
                                out=out)


def _device_of(obj) -> tuple[int, int] | None:
    """(DLPack device type, id) of a DLPack producer on a GPU; None for anything else."""
    if not callable(getattr(obj, "__dlpack__", None)):
        return None
    found = _dlpack.producer_device(obj, "obj")
    if found is None or found[0] not in (_dlpack.DLDeviceType.kDLCUDA, _dlpack.DLDeviceType.kDLCUDAManaged):
        return None
    return found


def _from_device(g: PlaceGroup, obj, device: tuple[int, int], dtype, sizes) -> ShardedArray:
    """A 1-D device array `obj` on `g`: adopted on the first place of its device, then copied
    onto the even split (or `sizes`) and cast, unless it is there already."""
    g = _check_group(g)
    target = None if dtype is None else as_array_dtype(dtype)
    device_type, device_id = device
    if device_type == _dlpack.DLDeviceType.kDLCUDAManaged or device_id in g.devices:
        place = 0 if device_type == _dlpack.DLDeviceType.kDLCUDAManaged else g.devices.index(device_id)
    else:
        raise ValueError(f"obj: lives on cuda:{device_id}, a device no place of g uses (devices {g.devices}): "
                         f"make the group with a place there, or copy it through the host")
    buffers = [None] * len(g)
    buffers[place] = obj
    # DLPack even where obj has __cuda_array_interface__ too: its producer then orders its own
    # pending work before our copies (torch's interface names no stream to wait for).
    adopted = ShardedArray._adopt(g, buffers, None, ["obj"] * len(g), dlpack_only=True, one_dimensional=True)
    try:
        wanted = _shard_sizes(g, len(adopted) if sizes is None else sizes, "sizes")
        if sum(wanted) != len(adopted):
            raise ValueError(f"sizes: {wanted} add up to {sum(wanted)}, not obj's {len(adopted)} elements")
        in_place = tuple(wanted) == adopted.shard_sizes
        if in_place and (target is None or target == adopted.dtype):
            return adopted  # already where it belongs: a zero-copy view of obj
        result = adopted if in_place else adopted.resharded(wanted)
        if target is not None and target != result.dtype:
            result = result.astype(target)
    except BaseException:
        adopted.free()
        raise
    adopted.free()  # waits for the copies out of obj, then lets obj's memory go
    return result


def asarray(g: PlaceGroup, obj, dtype=None, sizes=None) -> ShardedArray:
    """`obj` as a ShardedArray on `g`: a numpy array, a list or a number (copied in, as
    `np.asarray` reads it), or a ShardedArray (itself when its group, sizes and dtype already
    fit; otherwise resharded, cast, or, from another group, copied through the host).

    A 1-D GPU array with `__dlpack__` (torch, CuPy, JAX) on a device of g is read in place
    on the first place of its device (as `ShardedArray.from_dlpack` reads it), then copied
    onto the even split (or `sizes`) and cast to `dtype`; when it already sits there (a group
    of one place, no cast), the result is a zero-copy view of it, as `np.asarray` makes no
    copy it need not. A copy is complete when asarray returns: later writes to `obj` do not
    reach it.

    >>> sharded.asarray(g, [1.0, 2.0, 3.0])                                  # doctest: +SKIP
    >>> sharded.asarray(g, torch.arange(10, device="cuda"))                  # doctest: +SKIP
    """
    if isinstance(obj, ShardedArray):
        check_array(obj, "obj")
        result = obj
        if obj.group is not g:
            return ShardedArray.from_numpy(g, obj.to_numpy() if dtype is None else obj.to_numpy().astype(dtype),
                                           sizes=sizes)
        if sizes is not None and tuple(int(size) for size in sizes) != obj.shard_sizes:
            result = obj.resharded(sizes)
        if dtype is not None and np.dtype(dtype) != result.dtype:
            result = result.astype(dtype)
        return result
    device = _device_of(obj)
    if device is not None:
        return _from_device(g, obj, device, dtype, sizes)
    if hasattr(obj, "__cuda_array_interface__"):
        raise TypeError(f"obj: a device array ({type(obj).__name__}) with __cuda_array_interface__ but no "
                        f"DLPack device to place it by; ShardedArray.adopt(g, buffers) takes one buffer per "
                        f"place without a copy, or copy it to the host first")
    host = np.asarray(obj) if dtype is None else np.asarray(obj, dtype=as_array_dtype(dtype))
    return ShardedArray.from_numpy(g, host.reshape(-1) if host.ndim == 0 else host, sizes=sizes)


def empty_like(a: ShardedArray, dtype=None) -> ShardedArray:
    """An uninitialised array with a's group and shard sizes (and dtype, unless given).

    >>> b = sharded.empty_like(a)                                            # doctest: +SKIP
    """
    check_array(a)
    return ShardedArray.allocate(a.group, list(a.shard_sizes), a.dtype if dtype is None else dtype)


def zeros_like(a: ShardedArray, dtype=None) -> ShardedArray:
    """empty_like, every element 0.

    >>> b = sharded.zeros_like(a)                                            # doctest: +SKIP
    """
    return full_like(a, 0, dtype)


def full_like(a: ShardedArray, value, dtype=None) -> ShardedArray:
    """empty_like, every element `value` cast to the result's dtype (a's unless given).

    >>> b = sharded.full_like(a, 1.5)                                        # doctest: +SKIP
    """
    check_array(a)
    target = a.dtype if dtype is None else np.dtype(dtype)
    return full(a.group, len(a), value, target, sizes=list(a.shard_sizes))


__all__ = ["empty", "zeros", "ones", "full", "arange", "linspace", "asarray", "empty_like", "zeros_like",
           "full_like"]
