"""The multi-GPU sorts: global order across shards, shard sizes unchanged.

One engine (the shim's multi-place radix sort) behind every name: `sort_by_key` moves values
with the keys; `argsort` is a sort_by_key of the elements and their global indices;
`sort(key=)` a sort_by_key of the computed keys and the elements (a tuple key: one stable pass
per component, last first); `sort(compare=)` the merge sort of `merge_sort.py`, whose order is
a comparator linked into its kernels.
"""

from __future__ import annotations

import numpy as np

from .. import _shim
from .._collective import collective
from .._dtypes import as_flag
from .._layout import layout_of
from ..array import ShardedArray, check_array, check_numbers
from ..op import as_op
from . import transform as _transform
from .opaque import sequence


def _check_like(out, like: ShardedArray, argument: str, like_name: str) -> ShardedArray:
    """`out` checked against `like` (named `like_name`): same group, shard sizes and dtype
    (ValueError)."""
    check_array(out, argument)
    if out.group is not like.group:
        raise ValueError(f"{argument}: belongs to another PlaceGroup than {like_name}")
    if out.shard_sizes != like.shard_sizes:
        raise ValueError(f"{argument}: shard sizes {out.shard_sizes} differ from {like_name}: {like.shard_sizes}")
    if out.dtype != like.dtype:
        raise ValueError(f"{argument}: dtype {out.dtype} differs from {like_name}: {like.dtype}")
    return out


def _like(a: ShardedArray, dtype) -> ShardedArray:
    """An uninitialised array of `dtype` with `a`'s group and shard sizes."""
    return ShardedArray.allocate(a.group, list(a.shard_sizes), dtype)


def _sort_values(keys: ShardedArray, out_keys: ShardedArray, values: ShardedArray, out_values: ShardedArray,
                 descending: bool) -> None:
    """The shim's sort_by_key, for values of any size: 4- and 8-byte values ride along with
    the keys; wider records travel one 4- or 8-byte lane at a time, each lane sorted with a
    fresh copy of the keys (the sort is stable and deterministic, so every lane takes the
    same permutation), the last lane with the keys themselves."""
    size = values.dtype.itemsize
    if size in (4, 8):
        _shim.sort_by_key(keys._impl, out_keys._impl, values._impl, out_values._impl, descending)
        return
    width = 8 if size % 8 == 0 else 4
    lane = _like(values, np.uint64 if width == 8 else np.uint32)
    scratch = _like(keys, keys.dtype)
    try:
        for offset in range(0, size, width):
            _shim.copy_lanes(values._impl, offset, lane._impl, 0, width)
            if offset + width < size:
                _shim.copy_lanes(keys._impl, 0, scratch._impl, 0, keys.dtype.itemsize)
                _shim.sort_by_key(scratch._impl, scratch._impl, lane._impl, lane._impl, descending)
            else:
                _shim.sort_by_key(keys._impl, out_keys._impl, lane._impl, lane._impl, descending)
            _shim.copy_lanes(lane._impl, 0, out_values._impl, offset, width)
    finally:
        lane.free()
        scratch.free()


@collective("sort_by_key")
def sort_by_key(keys: ShardedArray, values: ShardedArray, descending: bool = False,
                out_keys: ShardedArray | None = None, out_values: ShardedArray | None = None):
    """Sort `keys` in global order, moving each element of `values` with its key; returns
    `(sorted keys, sorted values)`: `keys` and `values` themselves (in place), or `out_keys` /
    `out_values` where given (the inputs are then left as they were).

    Stable: equal keys keep their global order, and so do their values. Keys order as `sort`
    orders them (NaNs last, first when descending; -0.0 equals 0.0). `values` has the keys'
    group and shard sizes and any supported dtype or record; shard sizes never change.

    >>> k = sharded.ShardedArray.from_numpy(g, np.array([3, 1, 2], np.int32))      # doctest: +SKIP
    >>> v = sharded.ShardedArray.from_numpy(g, np.array([30., 10., 20.]))          # doctest: +SKIP
    >>> [x.to_numpy() for x in sharded.sort_by_key(k, v)]                          # doctest: +SKIP
    [array([1, 2, 3], dtype=int32), array([10., 20., 30.])]
    """
    check_numbers(keys, "sort_by_key", "keys")
    check_array(values, "values")
    descending = as_flag(descending, "descending")
    if values.group is not keys.group:
        raise ValueError("values: belongs to another PlaceGroup than keys")
    if values.shard_sizes != keys.shard_sizes:
        raise ValueError(f"values: shard sizes {values.shard_sizes} differ from keys' {keys.shard_sizes}")
    if values is keys:
        raise ValueError("values: must be another array than keys")
    out_keys = keys if out_keys is None else _check_like(out_keys, keys, "out_keys", "keys")
    out_values = values if out_values is None else _check_like(out_values, values, "out_values", "values")
    if out_keys is values or out_keys is out_values or out_values is keys:
        raise ValueError("out_keys, out_values: the keys and the values need arrays of their own")
    if keys.group._distributed:
        from ..distributed import _sorting

        return _sorting.sort_by_key(keys, values, out_keys, out_values, descending)
    _sort_values(keys, out_keys, values, out_values, descending)
    return out_keys, out_values


@collective("argsort")
def argsort(a: ShardedArray, descending: bool = False) -> ShardedArray:
    """The global indices that sort `a` (as `np.argsort(a, kind="stable")`; with
    `descending`, equal elements still in ascending index order): an int64 ShardedArray with
    `a`'s group and shard sizes. `a` is left as it was.

    >>> x = sharded.ShardedArray.from_numpy(g, np.array([3., 1., 2., 1.]))         # doctest: +SKIP
    >>> sharded.argsort(x).to_numpy()                                              # doctest: +SKIP
    array([1, 3, 2, 0])
    """
    check_numbers(a, "argsort")
    descending = as_flag(descending, "descending")
    if a.group._distributed:
        from ..distributed import _sorting

        return _sorting.argsort(a, descending)
    # Indices that fit 32 bits sort as uint32 (every radix pass moves 8 bytes an element,
    # not 12: about a quarter of the sort's traffic) and widen to int64 in one pass after.
    narrow = len(a) <= _NARROW_INDICES
    indices = sequence(_like(a, np.uint32 if narrow else np.int64))
    keys = _like(a, a.dtype)
    try:
        _shim.sort_by_key(a._impl, keys._impl, indices._impl, indices._impl, descending)
    finally:
        keys.free()
    if not narrow:
        return indices
    try:
        return _transform.transform(_widen, indices, out=_like(a, np.int64))
    finally:
        indices.free()


_NARROW_INDICES = 1 << 32


def _widen(index):
    return index


def _key_components(key, a: ShardedArray):
    """The compiled key transform's result: (prepared transform, None) for a number, or
    (None, [one prepared transform per tuple component]) for a tuple; TypeError naming the
    operator for anything else. Everything compiles before anything runs."""
    op = as_op(key, "key")
    prepared = _transform.prepare(op, (a,), None)
    layout = layout_of(prepared[2])
    if not layout.is_record:
        _check_key_number(op, prepared[2])
        return prepared, None
    components = []
    for index, (_, field) in enumerate(layout.fields):
        _check_key_number(op, field)
        component = _component(op, index)
        components.append(_transform.prepare(component, (a,), None))
    return None, components


def _check_key_number(op, dtype: np.dtype) -> None:
    if layout_of(dtype).is_record or dtype.kind not in "iuf":
        raise TypeError(f"key: operator {op.name} returns {dtype}; a sort key is a number or a tuple of numbers")


def _component(op, index: int):
    """The operator giving component `index` of `op`'s tuple (`op` an Op: the compiler
    builds it as a device function of the component's)."""

    def component(x):
        return op(x)[index]

    component.__name__ = f"{op.name}[{index}]"
    return component


@collective("sort")
def sort(a: ShardedArray, key=None, compare=None, descending: bool = False,
         out: ShardedArray | None = None) -> ShardedArray:
    """Sort every element of `a` in global order (shard 0 gets the first); returns the
    sorted array: `a` itself (in place) or `out` (same group, shard sizes and dtype; `a`
    is left as it was).

    - No operator: the elements' own order. Floats sort like numpy: NaNs last (first when
      descending, the exact reverse), -0.0 and 0.0 equal; every NaN is written back as the
      positive quiet NaN.
    - `key=op`: by `op(x)`, a number or a tuple compared lexicographically; stable. Records
      sort this way (`key=lambda p: p.score`). A number key costs about a `sort_by_key`.
    - `compare=op`: `op(x, y)` is True when x goes strictly before y (a strict weak order);
      stable; any element type. With `key` too, elements order by `compare(key(x), key(y))`.
    - `descending`: the reverse order, ties still in index order, as Python's
      `sorted(reverse=True)`.

    Each place sorts its shard, exact splitters are found over the sorted shards (each
    shard keeps its size), the pieces travel between GPUs over peer copies and each shard
    merges what it received. The call returns once the split is known; the rest runs on the
    places' streams. On a PlaceGroup.from_mpi group (a collective) each rank sorts its part,
    the pieces travel between ranks in one all-to-all, and each rank sorts what it received:
    the same result as one process's.

    >>> x = sharded.ShardedArray.from_numpy(g, np.array([3, 1, 2], np.int32))  # doctest: +SKIP
    >>> sharded.sort(x).to_numpy()                                             # doctest: +SKIP
    array([1, 2, 3], dtype=int32)
    >>> sharded.sort(x, key=lambda v: -v).to_numpy()                           # doctest: +SKIP
    array([3, 2, 1], dtype=int32)
    """
    check_array(a, "a")
    descending = as_flag(descending, "descending")
    if out is not None:
        _check_like(out, a, "out", "a")
    if compare is not None:
        from .merge_sort import compare_sort

        return compare_sort(a, compare, key=key, descending=descending, out=out)
    if key is not None:
        return _sort_by_computed_key(a, key, descending, a if out is None else out)
    check_numbers(a, "sort")
    if a.group._distributed:
        from ..distributed import _sorting

        return _sorting.sort(a, a if out is None else out, descending)
    _shim.sort(a._impl, (a if out is None else out)._impl, descending)
    return a if out is None else out


def _sort_by_computed_key(a: ShardedArray, key, descending: bool, out: ShardedArray) -> ShardedArray:
    number, components = _key_components(key, a)
    if number is not None:
        keys = _transform.run(number, None)
        try:
            _sort_elements(keys, a, out, descending)
        finally:
            keys.free()
        return out
    # least significant component first: each stable pass keeps the order of the later ones
    # among equal earlier components; each pass computes its component from the elements
    # as the previous passes left them
    source = a
    for prepared in reversed(components):
        _, *compiled = prepared
        keys = _transform.run(([source], *compiled), None)
        try:
            _sort_elements(keys, source, out, descending)
        finally:
            keys.free()
        source = out
    return out


def _sort_elements(keys: ShardedArray, elements: ShardedArray, out: ShardedArray, descending: bool) -> None:
    """`elements` into `out` in the stable order of their computed `keys` (sorted in place);
    across ranks on a from_mpi group."""
    if keys.group._distributed:
        from ..distributed import _sorting

        _sorting.sort_by_key(keys, elements, keys, out, descending)
    else:
        _sort_values(keys, keys, elements, out, descending)


__all__ = ["argsort", "sort", "sort_by_key"]
