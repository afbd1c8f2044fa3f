"""The multi-GPU sort: global order across shards, shard sizes unchanged."""

from __future__ import annotations

from .. import _shim
from .._dtypes import as_flag
from ..array import ShardedArray, check_array, check_numbers


def sort(a: ShardedArray, descending: bool = False, out: ShardedArray | None = None) -> ShardedArray:
    """Sort every element of `a` in global order (shard 0 gets the smallest); returns the
    sorted array: `a` itself (in place) or `out` (same group, shard sizes and dtype; `a`
    is left as it was).

    Each place radix-sorts its shard, exact splitters are found over the sorted shards (each
    shard keeps its size), the pieces travel between GPUs over peer copies and each shard
    merges what it received. Floats sort like numpy: NaNs last (first when descending, the
    exact reverse), -0.0 and 0.0 equal; every NaN is written back as the positive quiet NaN.
    The call returns once the split is known; the rest runs on the places' streams.

    >>> x = sharded.ShardedArray.from_numpy(g, np.array([3, 1, 2], np.int32))  # doctest: +SKIP
    >>> sharded.sort(x).to_numpy()                                             # doctest: +SKIP
    array([1, 2, 3], dtype=int32)
    """
    check_numbers(a, "sort")
    descending = as_flag(descending, "descending")
    if out is None:
        out = a
    else:
        check_array(out, "out")
        if out.group is not a.group:
            raise ValueError("out: belongs to another PlaceGroup than a")
        if out.shard_sizes != a.shard_sizes:
            raise ValueError(f"out: shard sizes {out.shard_sizes} differ from a's {a.shard_sizes}")
        if out.dtype != a.dtype:
            raise ValueError(f"out: dtype {out.dtype} differs from a's {a.dtype}")
    _shim.sort(a._impl, out._impl, descending)
    return out


__all__ = ["sort"]
