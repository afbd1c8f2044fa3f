"""Selection and search over sharded numbers: top_k (the k best elements) and searchsorted
(insertion points in a globally sorted array). Both are built into the shim (no JIT), except
searchsorted with a comparator, whose search kernel is the comparator merge sort's, linked
with the user's operator."""

from __future__ import annotations

import numpy as np

from .. import _shim
from .._collective import collective
from .._dtypes import as_flag, is_integer
from .._layout import describe_dtype
from ..array import ShardedArray, check_array, check_numbers
from ..compiler import kernel_libraries, sort_spec
from ..op import as_op


@collective("top_k")
def top_k(a: ShardedArray, k: int, largest: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The `k` largest elements of `a` (smallest when `largest=False`), best first, and their
    global indices: `(values, indices)`, numpy arrays of a's dtype and of int64.

    Ties go to the lower index (what a stable descending sort gives); NaNs count as larger
    than every number (as torch.topk), and -0.0 equals 0.0. `0 <= k <= len(a)`. Each place
    selects its own best without sorting its shard; the places' lists are merged on the host,
    so the call waits for the places it uses. On a PlaceGroup.from_mpi group (a collective)
    every rank's best are merged on every rank, which returns the same result.

    >>> x = sharded.ShardedArray.from_numpy(g, np.array([3, 1, 4, 1, 5], np.int32))  # doctest: +SKIP
    >>> sharded.top_k(x, 2)                                                        # doctest: +SKIP
    (array([5, 4], dtype=int32), array([4, 2]))
    """
    check_numbers(a, "top_k")
    if not is_integer(k):
        raise TypeError(f"k: expected an int, got {type(k).__name__}")
    k = int(k)
    if not 0 <= k <= a.size:
        raise ValueError(f"k: expected 0 <= k <= len(a) = {a.size}, got {k}")
    largest = as_flag(largest, "largest")
    if a.group._distributed:
        from ..distributed import _sorting

        return _sorting.top_k(a, k, largest)
    values = np.empty(k, dtype=a.dtype)
    indices = np.empty(k, dtype=np.int64)
    _shim.top_k(a._impl, k, largest, values.ctypes.data, values.nbytes, indices.ctypes.data, indices.nbytes)
    return values, indices


def _queries(values, dtype: np.dtype) -> np.ndarray:
    """`values` as a numpy array of `dtype`: cast with numpy where the cast keeps the kind
    (`np.can_cast(..., "same_kind")`), integers only when each one fits."""
    try:
        host = np.asarray(values)
    except (TypeError, ValueError) as error:
        raise TypeError(f"values: expected a ShardedArray or numbers (an array, a list or a scalar), "
                        f"got {type(values).__name__} ({error})") from None
    if not np.can_cast(host.dtype, dtype, "same_kind"):
        raise TypeError(f"values: cannot search {host.dtype} values in a {dtype} array (numpy's "
                        f"'same_kind' casting refuses it); convert them with .astype first")
    if dtype.kind in "iu" and host.dtype.kind in "iu" and host.size:
        info = np.iinfo(dtype)
        low, high = int(host.min()), int(host.max())
        if low < info.min or high > info.max:
            outside = low if low < info.min else high
            raise ValueError(f"values: {outside} does not fit {dtype}, the dtype of sorted_a")
    return host.astype(dtype, copy=False)


@collective("searchsorted")
def searchsorted(sorted_a: ShardedArray, values, side: str = "left", compare=None):
    """Where each of `values` would be inserted into `sorted_a` to keep it sorted, as
    `np.searchsorted(np.concatenate(shards), values, side)`: the number of elements that go
    before it (side "left": smaller ones; "right": those not greater).

    `sorted_a` must be sorted in global order as `sharded.sort` leaves it (ascending, NaNs
    last, -0.0 == 0.0); like numpy, this is not checked. NaN queries go as numpy's: NaN is
    the largest, all NaNs equal. `values` is a ShardedArray of sorted_a's dtype (any group):
    the positions come back as an int64 ShardedArray on its group, with its shard sizes, and
    the call returns once they are queued. Or numpy values (an array, a list or a scalar),
    cast to sorted_a's dtype where numpy's "same_kind" casting allows (integers only when they
    fit): positions come back as numpy int64 of the same shape (an int64 scalar for a scalar).

    With `compare`, `sorted_a` is sorted in that order instead (as `sharded.sort(a,
    compare=compare)` leaves it): `compare(x, y)` returns True when x goes strictly before y
    (a strict weak order, as Python's `<`), and the positions are np.searchsorted's under it:
    side "left" counts the elements x with `compare(x, v)`, "right" those with `not
    compare(v, x)`. Numbers and records (a comparator of two tuples) of 4 to 32 bytes (a
    multiple of 4); a ShardedArray of queries has sorted_a's dtype, numpy queries of numbers
    cast as above, of records have sorted_a's dtype. Each place of the queries counts them
    in every shard of sorted_a by the comparator's binary search (no table of splitters).

    On a PlaceGroup.from_mpi group (a collective) the queries are numpy values, the same on
    every rank, and the positions come back on every rank.

    >>> s = sharded.sort(sharded.ShardedArray.from_numpy(g, np.array([5, 1, 3], np.int32)))  # doctest: +SKIP
    >>> sharded.searchsorted(s, [0, 3, 6]), sharded.searchsorted(s, 3, side="right")        # doctest: +SKIP
    (array([0, 1, 3]), np.int64(2))
    """
    check_array(sorted_a, "sorted_a")
    if not (isinstance(side, str) and side in ("left", "right")):
        raise ValueError(f"side: expected 'left' or 'right', got {side!r}")
    distributed = any(isinstance(array, ShardedArray) and array.group._distributed for array in (sorted_a, values))
    if distributed and isinstance(values, ShardedArray):
        raise ValueError("values: searchsorted on a PlaceGroup.from_mpi group takes numpy queries (the "
                         "positions come back on every rank), not a ShardedArray, in this version")
    right = side == "right"
    if distributed:
        from ..distributed import _sorting

        if compare is None:
            check_numbers(sorted_a, "searchsorted", "sorted_a")
            return _sorting.searchsorted(sorted_a, _queries(values, sorted_a.dtype), right)
        # compiled on every rank (one holding no elements too) before the ranks agree
        _compare_libraries(compare, sorted_a.dtype, _sorting.local(sorted_a).group)
        return _sorting.searchsorted(sorted_a, _compare_queries(values, sorted_a.dtype), right, compare)
    if compare is not None:
        return _search_compare(sorted_a, values, right, compare)
    check_numbers(sorted_a, "searchsorted", "sorted_a")
    if isinstance(values, ShardedArray):
        check_numbers(values, "searchsorted", "values")
        if values.dtype != sorted_a.dtype:
            raise TypeError(f"values: dtype {values.dtype} differs from sorted_a's {sorted_a.dtype}")
        positions = ShardedArray.allocate(values.group, list(values.shard_sizes), np.int64)
        _shim.searchsorted(sorted_a._impl, values._impl, positions._impl, right)
        return positions
    host = _queries(values, sorted_a.dtype)
    result = np.zeros(host.shape, dtype=np.int64)
    if host.size:
        queries = ShardedArray.from_numpy(sorted_a.group, np.ascontiguousarray(host).reshape(-1))
        positions = ShardedArray.allocate(sorted_a.group, list(queries.shard_sizes), np.int64)
        _shim.searchsorted(sorted_a._impl, queries._impl, positions._impl, right)
        result = positions.to_numpy().reshape(host.shape)
    return result[()] if result.ndim == 0 else result


def _search_compare(sorted_a: ShardedArray, values, right: bool, compare):
    """searchsorted in the order of `compare`: the arguments checked and the comparator
    compiled (an operator numba cannot type, or one not returning a bool, is a TypeError
    naming it) before anything runs, then _shim.search_compare per place of the queries."""
    dtype = sorted_a.dtype
    if isinstance(values, ShardedArray):
        check_array(values, "values")
        if values.dtype != dtype:
            raise TypeError(f"values: dtype {describe_dtype(values.dtype)} differs from sorted_a's "
                            f"{describe_dtype(dtype)}")
        libraries = _compare_libraries(compare, dtype, values.group)
        positions = ShardedArray.allocate(values.group, list(values.shard_sizes), np.int64)
        _shim.search_compare(libraries, sorted_a._impl, values._impl, positions._impl, right)
        return positions
    host = _compare_queries(values, dtype)
    libraries = _compare_libraries(compare, dtype, sorted_a.group)
    result = np.zeros(host.shape, dtype=np.int64)
    if host.size:
        queries = ShardedArray.from_numpy(sorted_a.group, np.ascontiguousarray(host).reshape(-1))
        positions = ShardedArray.allocate(sorted_a.group, list(queries.shard_sizes), np.int64)
        _shim.search_compare(libraries, sorted_a._impl, queries._impl, positions._impl, right)
        result = positions.to_numpy().reshape(host.shape)
    return result[()] if result.ndim == 0 else result


def _compare_libraries(compare, dtype: np.dtype, group):
    """The comparator compiled into the merge sort's modules for `group`'s places (TypeError
    naming an operator numba cannot type or one not returning a bool)."""
    compare = as_op(compare, "compare")
    compare.check_arity(2, "searchsorted (compare)")
    return kernel_libraries(compare, "merge_sort", (("array", dtype),), None, group.archs, sort_spec(None, False))[1]


def _compare_queries(values, dtype: np.dtype) -> np.ndarray:
    """Host queries for a comparator search: numbers cast as `_queries` casts them, records a
    numpy array of sorted_a's dtype (TypeError otherwise)."""
    if dtype.fields is None:
        return _queries(values, dtype)
    host = np.asarray(values) if isinstance(values, (np.ndarray, np.void)) else None
    if host is None or host.dtype != dtype:
        got = describe_dtype(host.dtype) if host is not None else type(values).__name__
        raise TypeError(f"values: expected a ShardedArray or a numpy array of sorted_a's dtype "
                        f"{describe_dtype(dtype)}, got {got}")
    return host


__all__ = ["top_k", "searchsorted"]
