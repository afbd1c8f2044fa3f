"""Selections and resharding: select, partition, three_way_partition (one engine), the
flagged compaction the by-key algorithms build on, and redistribute / ShardedArray.resharded.

The engine gives every element a class (0, 1 or 2) through one wrapper numba compiles around
the predicates, linked into the select module of the element's size; the shim counts the
classes per place, reads the totals (the output shard sizes), allocates the outputs and
writes each element to its class's output, keeping global order. A select takes one pass
where its devices have room: the output allocated at the shards' sizes, the kept elements
written with their positions found by look-back, the output shrunk to the counts read
back. No element crosses places: shard i of every output holds what shard i of the input had
of that class.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import _shim
from .._collective import collective
from .._dtypes import as_flag, is_integer
from .._layout import describe_dtype
from ..array import ShardedArray, check_array
from ..compiler import kernel_libraries, select_spec
from ..op import as_op

_FLAG_DTYPES = tuple(np.dtype(name) for name in ("int32", "uint32", "int64", "uint64"))
_FLAGGED_PER_CALL = 4  # arrays the shim's flagged compaction moves in one pass

# Internal: False sends a select through the two passes (count, then write) that partitions
# take and that the shim falls back to where a device lacks room for the single pass's
# output (tests of that path, A/B runs).
_SINGLE_PASS = True


def _predicate(pred, argument: str, arity: int, what: str):
    pred = as_op(pred, argument)
    pred.check_arity(arity, what)
    return pred


def _classify(a: ShardedArray, first, second, with_index: bool, outputs: int) -> list[ShardedArray]:
    if a.group._distributed:  # each rank selects from its shards; the outputs' sizes allgathered
        from ..distributed import _sorting

        return _sorting.selected(a, _classify(_sorting.local(a), first, second, with_index, outputs), "select")
    _, libraries = kernel_libraries(first, "select", (("array", a.dtype),), None, a.group.archs,
                                    select_spec(second, with_index))
    return [ShardedArray(impl, a.group, a.dtype)
            for impl in _shim.select(libraries, a._impl, outputs, _SINGLE_PASS)]


@collective("select")
def select(a: ShardedArray, pred, with_index: bool = False) -> ShardedArray:
    """The elements of `a` where `pred(x)` is true (`pred(x, global_index)` with
    `with_index`), in global order: a new array on a's group whose shard i holds what shard i
    kept (its shard sizes are the per-shard counts, zeros allowed; nothing crosses places).
    `pred` returns a bool (or an integer, nonzero keeps). Numbers and records.

    >>> a = sharded.ShardedArray.from_numpy(g, np.arange(10, dtype=np.int64))  # doctest: +SKIP
    >>> sharded.select(a, lambda x: x % 3 == 0).to_numpy()                     # doctest: +SKIP
    array([0, 3, 6, 9])
    """
    check_array(a)
    with_index = as_flag(with_index, "with_index")
    pred = _predicate(pred, "pred", 2 if with_index else 1,
                      "select (with the index)" if with_index else "select")
    return _classify(a, pred, None, with_index, 1)[0]


@collective("partition")
def partition(a: ShardedArray, pred) -> tuple[ShardedArray, ShardedArray]:
    """`(selected, rejected)`: the elements of `a` where `pred(x)` is true and those where it
    is false, each in global order, with shard i of both holding shard i's elements.

    >>> yes, no = sharded.partition(a, lambda x: x < 4)                        # doctest: +SKIP
    >>> yes.to_numpy(), no.to_numpy()                                          # doctest: +SKIP
    (array([0, 1, 2, 3]), array([4, 5, 6, 7, 8, 9]))
    """
    check_array(a)
    pred = _predicate(pred, "pred", 1, "partition")
    selected, rejected = _classify(a, pred, None, False, 2)
    return selected, rejected


@collective("three_way_partition")
def three_way_partition(a: ShardedArray, first, second) -> tuple[ShardedArray, ShardedArray, ShardedArray]:
    """`(first_part, second_part, rest)`: the elements where `first(x)`, those where not
    `first(x)` but `second(x)`, and the others, each in global order (shard i of each holding
    shard i's elements).

    >>> low, middle, high = sharded.three_way_partition(a, lambda x: x < 3, lambda x: x < 7)  # doctest: +SKIP
    >>> middle.to_numpy()                                                      # doctest: +SKIP
    array([3, 4, 5, 6])
    """
    check_array(a)
    first = _predicate(first, "first", 1, "three_way_partition (first)")
    second = _predicate(second, "second", 1, "three_way_partition (second)")
    first_part, second_part, rest = _classify(a, first, second, False, 3)
    return first_part, second_part, rest


@collective("select_flagged")
def select_flagged(arrays: Sequence[ShardedArray], flags: ShardedArray) -> list[ShardedArray]:
    """Internal (for the by-key algorithms, which compact their run heads): each array of
    `arrays` compacted to its elements where `flags` is nonzero, in global order; shard i of
    every result holds what shard i kept. `flags`: an int32 / uint32 / int64 / uint64
    ShardedArray of 0/1 flags (ShardedArray has no 1-byte dtype) on the arrays' group, with
    their shard sizes; the arrays may hold numbers or records of any dtype, each its own.
    Built-in kernels (nothing compiles); the shim moves up to four arrays per pass over the
    flags. Returns a list of new arrays, one per array, in order.

    >>> heads = sharded.ShardedArray.from_numpy(g, np.array([1, 0, 1], np.int32))   # doctest: +SKIP
    >>> keys, values = select_flagged([keys, values], heads)                       # doctest: +SKIP
    """
    check_array(flags, "flags")
    if np.dtype(flags.dtype) not in _FLAG_DTYPES:
        raise TypeError(f"flags: expected 0/1 flags of int32, uint32, int64 or uint64, got "
                        f"{describe_dtype(flags.dtype)}")
    if isinstance(arrays, ShardedArray) or not isinstance(arrays, (list, tuple)):
        raise TypeError(f"arrays: expected a list of ShardedArrays, got {type(arrays).__name__}")
    if not arrays:
        raise ValueError("arrays: expected at least one array to compact")
    for index, array in enumerate(arrays):
        check_array(array, f"arrays[{index}]")
        if array.group is not flags.group:
            raise ValueError(f"arrays[{index}]: belongs to another PlaceGroup than flags")
        if array.shard_sizes != flags.shard_sizes:
            raise ValueError(f"arrays[{index}]: shard sizes {array.shard_sizes} differ from the flags' "
                             f"{flags.shard_sizes}")
    if flags.group._distributed:  # each rank compacts its shards; the outputs' sizes allgathered
        from ..distributed import _sorting

        parts = select_flagged([_sorting.local(array) for array in arrays], _sorting.local(flags))
        return _sorting.selected(flags, parts, "select_flagged")
    result = []
    for start in range(0, len(arrays), _FLAGGED_PER_CALL):
        chunk = arrays[start:start + _FLAGGED_PER_CALL]
        impls = _shim.select_flagged(flags._impl, [array._impl for array in chunk])
        result.extend(ShardedArray(impl, array.group, array.dtype) for impl, array in zip(impls, chunk))
    return result


def _target_sizes(a: ShardedArray, sizes) -> list[int]:
    places = a.num_shards
    if sizes is None:
        return list(_shim.ShardedArray.even_sizes(a.size, places))
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, (Sequence, np.ndarray)):
        raise TypeError(f"sizes: expected a sequence of {places} shard sizes, got {type(sizes).__name__}")
    sizes = list(sizes)
    if len(sizes) != places:
        raise ValueError(f"sizes: expected {places} shard sizes (one per place), got {len(sizes)}")
    for index, size in enumerate(sizes):
        if not is_integer(size):
            raise TypeError(f"sizes[{index}]: expected an int, got {type(size).__name__}")
        if size < 0:
            raise ValueError(f"sizes[{index}]: shard sizes are non-negative, got {size}")
    sizes = [int(size) for size in sizes]
    if sum(sizes) != a.size:
        raise ValueError(f"sizes: {sizes} add up to {sum(sizes)}, not a's size {a.size}")
    return sizes


@collective("redistribute")
def redistribute(a: ShardedArray, sizes=None) -> ShardedArray:
    """A copy of `a` with shard sizes `sizes` (one per place, adding up to len(a); None: the
    even split), on a's group: elements move between places with device and peer copies in
    global order, stream-ordered on the places' streams. Any dtype, records included.

    >>> b = sharded.redistribute(a, [7, 3])                                    # doctest: +SKIP
    >>> b.shard_sizes, (b.to_numpy() == a.to_numpy()).all()                    # doctest: +SKIP
    ((7, 3), True)
    """
    check_array(a)
    target = _target_sizes(a, sizes)
    if a.group._distributed:
        from ..distributed import _arrays

        return _arrays.redistribute(a, target)
    return ShardedArray(_shim.redistribute(a._impl, target), a.group, a.dtype)
