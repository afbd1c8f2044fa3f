"""The sort with a user comparator: a stable merge sort whose kernels are linked with it.

`sort(a, compare=...)` routes here. The comparator (and the key and the direction, baked into
the wrapper numba compiles around them) is linked into the merge sort module of the
element's size; each place sorts its shard with it. On a PlaceGroup.from_mpi group each rank
sorts its part and the split across ranks is searched by comparisons (distributed/_sorting.py).
"""

from __future__ import annotations

from .. import _shim
from .._dtypes import as_flag
from .._layout import describe_dtype
from ..array import ShardedArray, check_array
from ..compiler import kernel_libraries, sort_spec
from ..op import as_op


def compare_sort(a: ShardedArray, compare, key=None, descending: bool = False,
                 out: ShardedArray | None = None) -> ShardedArray:
    """Sort `a` stably in the order of `compare`: `compare(x, y)` returns True when x goes
    strictly before y (a strict weak order, as Python's `<`). Elements that compare equal
    keep their global order. With `key`, elements are ordered by `compare(key(x), key(y))`;
    `descending` gives the reverse order, as `sorted(..., reverse=True)` does (equal elements
    still keep their order). Numbers and records (a comparator of two tuples) of any dtype.
    Returns `a` itself (sorted in place) or `out` (same group, shard sizes and dtype; `a` is
    left as it was). Shard sizes never change; the work is queued on the places' streams.

    >>> x = sharded.ShardedArray.from_numpy(g, np.array([3, -1, 2], np.int64))  # doctest: +SKIP
    >>> compare_sort(x, lambda x, y: abs(x) < abs(y)).to_numpy()              # doctest: +SKIP
    array([-1, 2, 3])
    """
    check_array(a)
    compare = as_op(compare, "compare")
    compare.check_arity(2, "sort (compare)")
    if key is not None:
        key = as_op(key, "key")
        key.check_arity(1, "sort (key)")
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
            raise ValueError(f"out: dtype {describe_dtype(out.dtype)} differs from a's "
                             f"{describe_dtype(a.dtype)}")
    _, libraries = kernel_libraries(compare, "merge_sort", (("array", a.dtype),), None, a.group.archs,
                                    sort_spec(key, descending))
    if a.group._distributed:
        from ..distributed import _sorting

        return _sorting.compare_sort(a, out, libraries, ("key", key is not None), ("descending", descending))
    _shim.sort_compare(libraries, a._impl, out._impl)
    return out
