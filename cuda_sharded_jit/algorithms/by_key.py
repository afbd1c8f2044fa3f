"""Algorithms over runs of equal keys: scans and reductions by key, unique_by_key, unique.

The runs are consecutive keys that `equal` (default ==) says belong together; runs may
cross shard boundaries.

The scans by key and reduce_by_key run on the by-key engine (shim/kernels/by_key_params.hpp):
one JIT module per key and value size, linked with the keys' equality and the values'
operator, folding (head, value) pairs under the segmented combine

    combine((h1, v1), (h2, v2)) = (h1 | h2, v2 if h2 else op(v1, v2))

which is associative (not commutative) for an associative op. In one process each shard is
read once: tiles joined by a decoupled look-back whose fold is a fixed left fold over tiles,
then runs crossing shards fixed up from the earlier shards' totals; across ranks each shard
is read twice (its chunks' folds, then a sweep). Every association is fixed, so results are
deterministic; reduce_by_key writes each run's first key and fold where the run ends.

unique_by_key (and unique, after a sort) compacts the run heads with the selection engine,
each element's class coming from the by-key module's equality of the key and its
predecessor (a shard's first key meets the last of the previous non-empty shard): the keys
are read once to count and once to move the heads. Across ranks the heads are int32 flags
from adjacent_difference's kernel (which meets each rank's first key with the previous
rank's last), then the flagged compaction.
"""

from __future__ import annotations

import numpy as np

from .. import _shim
from .._collective import collective
from .._layout import layout_of
from ..array import ShardedArray, check_array, check_numbers, check_out
from ..compiler import BY_KEY_MAP, by_key_module, kernel_libraries
from ..op import Op, as_op
from .reduce import _PYTHON_OPS, _operator
from .select import select_flagged
from .sort import sort
from .transform import transform

_FLAG = np.dtype(np.int32)


def _equal(x, y):
    return x == y


def _equal_or_both_nan(x, y):  # np.unique's equal_nan=True: the NaNs make one run
    return x == y or (x != x and y != y)


def _one(x):
    return 1


def _first(x, y):  # a run's first value (unique_by_key on one place); the heads' module's operator
    return x


def _same(x):
    return x


_EQUAL, _EQUAL_NAN, _ONE, _SAME = Op(_equal), Op(_equal_or_both_nan), Op(_one), Op(_same)


def _head_flag(equal: Op) -> Op:
    def head_flag(x, previous):  # adjacent_difference meets each key with its predecessor
        return 0 if equal(previous, x) else 1
    return Op(head_flag)


# ---- argument checks (all before anything compiles or runs) -------------------------------

def _check_values(values, keys: ShardedArray, argument: str = "values") -> ShardedArray:
    check_array(values, argument)
    if values.group is not keys.group:
        raise ValueError(f"{argument}: belongs to another PlaceGroup than keys")
    if values.shard_sizes != keys.shard_sizes:
        raise ValueError(f"{argument}: shard sizes {values.shard_sizes} differ from keys': "
                         f"{keys.shard_sizes}")
    return values


_checked_equals: dict = {}


def _check_equal(equal, keys: ShardedArray) -> Op:
    """`equal` as an Op of two keys returning a bool (an integer is read as one); TypeError
    naming it otherwise. Typed once per operator identity, key dtype and architecture."""
    if equal is None:
        return _EQUAL
    equal = as_op(equal, "equal")
    equal.check_arity(2, "equal")
    from .. import _jit
    from ..compiler import _arch_cc

    identity = equal.identity()
    for arch in keys.group.archs:
        memo = (identity, keys.dtype, arch)
        if memo in _checked_equals:
            continue
        _, types, _ = _jit._load_numba()
        element = _jit.value_type(keys.dtype)
        returned = types.unliteral(_jit._return_type(equal, [element, element], [keys.dtype, keys.dtype],
                                                     _arch_cc(arch)))
        if not (returned == types.boolean or isinstance(returned, types.Integer)):
            raise TypeError(f"equal: operator {equal.name} returns {returned} for two {keys.dtype} keys; "
                            f"it must return a bool (True when the two keys belong to one run)")
        _checked_equals[memo] = True
    return equal


def _check_op(op, values: ShardedArray, what: str) -> Op:
    layout = layout_of(values.dtype)
    if isinstance(op, str) and layout.is_record:
        raise TypeError(f"op: {op!r} combines numbers, but values hold records {layout.description}; "
                        f"pass an operator that combines two tuples")
    op = _operator(op, 2, what, layout)
    return _PYTHON_OPS[op] if isinstance(op, str) else op  # "sum", "min", "max": their Python forms


def _check_result_out(out, values: ShardedArray) -> ShardedArray | None:
    out = check_out(out, values, "values")
    if out is not None and len(layout_of(out.dtype).fields) != len(layout_of(values.dtype).fields):
        raise TypeError(f"out: holds {layout_of(out.dtype).description}, values "
                        f"{layout_of(values.dtype).description}; the result has values' fields")
    return out


# ---- the runs-of-equal-keys step -------------------------------------------------------------

class _RunFlags:
    """The kernels of the head flags of `keys`' runs, compiled (the selections by key)."""

    def __init__(self, keys: ShardedArray, equal: Op):
        kinds = (("array", keys.dtype), ("array", keys.dtype))
        archs = keys.group.archs
        _, self.difference = kernel_libraries(_head_flag(equal), "transform", kinds, _FLAG, archs)
        _, self.edge = kernel_libraries(_ONE, "transform", kinds[:1], _FLAG, archs)

    def __call__(self, keys: ShardedArray) -> ShardedArray:
        flags = ShardedArray.allocate(keys.group, list(keys.shard_sizes), _FLAG)
        if keys.group._distributed:  # a rank's first key meets the previous rank's last
            from ..distributed import _algorithms

            _algorithms.adjacent_difference(self.difference, self.edge, keys, flags)
        else:
            _shim.adjacent_difference(self.difference, self.edge, keys._impl, flags._impl, False)
        return flags


def _engine(call: str, keys: ShardedArray, value_dtype: np.dtype, op: Op, equal: Op,
            argument: str = "values") -> list:
    """The by-key engine's kernels of `call` ("inclusive", "exclusive", "reduce" or "heads")
    for keys, values of `value_dtype`, `op` and `equal`."""
    by_key_module(call, keys.dtype, value_dtype, argument)
    kinds = (("array", keys.dtype), ("array", value_dtype))
    return kernel_libraries(op, f"by_key_{call}", kinds, value_dtype, keys.group.archs, (BY_KEY_MAP, equal))[1]


_FIRST = Op(_first)


def _heads(keys: ShardedArray, equal: Op) -> list:
    """The by-key module of keys' dtype with `equal`: its run-head selection kernels."""
    return _engine("heads", keys, keys.dtype, _FIRST, equal, "keys")


def _select_heads(libraries: list, keys: ShardedArray, arrays: list) -> list:
    """Each of `arrays` (keys' group and shard sizes, at most two here) compacted to the
    elements that start a run of keys, in global order."""
    impls = _shim.select_heads(libraries, keys._impl, [array._impl for array in arrays])
    return [ShardedArray(impl, array.group, array.dtype) for impl, array in zip(impls, arrays)]


def _shares_storage(out: ShardedArray, keys: ShardedArray) -> bool:
    """Whether `out` is keys' memory (the same array, or another view of it)."""
    if out is keys:
        return True
    mine = any(size and out._impl.shard_pointer(p) == keys._impl.shard_pointer(p)
               for p, size in enumerate(keys._impl.shard_sizes))  # this rank's shards
    if keys.group._distributed:  # every rank takes the same branch
        from ..distributed._agreement import gather

        return any(gather(keys.group, mine, ("scan by key: out shares keys' memory",)))
    return mine


def _init_bytes(layout, init) -> bytes:
    """init packed as one value of `layout` (a tuple for records), with what went wrong."""
    if init is None:
        raise ValueError("init: an exclusive scan by key needs an initial value")
    if layout.is_record:
        if not isinstance(init, tuple):
            raise TypeError(f"init: values hold records {layout.description}, so init is a "
                            f"tuple of {len(layout.fields)} numbers; got {init!r}")
    elif isinstance(init, tuple):
        raise TypeError(f"init: values hold {layout.description} numbers; got a tuple")
    return layout.pack_init(init)


def _scan_by_key(keys, values, op, init, out, equal, exclusive: bool, what: str) -> ShardedArray:
    check_numbers(keys, what, "keys")
    _check_values(values, keys)
    op = _check_op(op, values, what)
    out = _check_result_out(out, values)
    equal = _check_equal(equal, keys)
    # the scan runs in the result's dtype: out's when given, else values'
    out_dtype = values.dtype if out is None else out.dtype
    layout = layout_of(out_dtype)
    if layout.is_record and out_dtype != values.dtype:
        raise TypeError(f"out: holds {layout.description}, values {layout_of(values.dtype).description}; "
                        f"a scan of records writes values' dtype")
    packed = _init_bytes(layout, init) if exclusive else b""
    libraries = _engine("exclusive" if exclusive else "inclusive", keys, out_dtype, op, equal,
                        "values" if out is None else "out")
    source = values if values.dtype == out_dtype else values.astype(out_dtype)
    if out is None:
        out = ShardedArray.allocate(keys.group, list(keys.shard_sizes), out_dtype)
    edges = None
    if keys.group._distributed:  # the engine is told what lies beyond this rank's shards
        from ..distributed import _runs

        edges = _runs.edges(keys, source, what)
    if _shares_storage(out, keys):  # the sweep reads keys across tile edges: a new array first
        result = ShardedArray.allocate(keys.group, list(keys.shard_sizes), out_dtype)
        _shim.scan_by_key(libraries, keys._impl, source._impl, result._impl, exclusive, packed, edges)
        return transform(_SAME, result, out=keys)
    _shim.scan_by_key(libraries, keys._impl, source._impl, out._impl, exclusive, packed, edges)
    return out


@collective("inclusive_scan_by_key")
def inclusive_scan_by_key(keys: ShardedArray, values: ShardedArray, op,
                          out: ShardedArray | None = None, equal=None) -> ShardedArray:
    """out[i] = values[h] op values[h+1] op ... op values[i], h the first index of i's run of
    equal keys: a scan that restarts at every run, across shard boundaries.

    `keys`: numbers; runs are consecutive keys with `equal(x, y)` (default ==). `values`:
    same group and shard sizes; numbers or records (op then takes and returns tuples). `op` need only be associative; the scan runs in, and returns, values'
    dtype (out's when given; `out` may be `values`). Deterministic: the same bits run after
    run. Stream-ordered: returns at once. Speed: about one read of keys and values where runs
    are short; runs over many thousands of elements take up to a few times as long (see the
    performance docs).

    >>> k = sharded.ShardedArray.from_numpy(g, np.array([1, 1, 2, 2, 2], np.int32))  # doctest: +SKIP
    >>> v = sharded.ShardedArray.from_numpy(g, np.array([1, 2, 3, 4, 5], np.int32))  # doctest: +SKIP
    >>> sharded.inclusive_scan_by_key(k, v, lambda x, y: x + y).to_numpy()            # doctest: +SKIP
    array([ 1,  3,  3,  7, 12], dtype=int32)
    """
    return _scan_by_key(keys, values, op, None, out, equal, False, "inclusive_scan_by_key")


@collective("exclusive_scan_by_key")
def exclusive_scan_by_key(keys: ShardedArray, values: ShardedArray, op, init,
                          out: ShardedArray | None = None, equal=None) -> ShardedArray:
    """out[h] = init at the first index h of every run of equal keys, then out[i] = init op
    values[h] op ... op values[i-1] within the run; as inclusive_scan_by_key otherwise (init:
    a number, or a tuple when values hold records).

    >>> sharded.exclusive_scan_by_key(k, v, lambda x, y: x + y, 0).to_numpy()         # doctest: +SKIP
    array([0, 1, 0, 3, 7], dtype=int32)
    """
    return _scan_by_key(keys, values, op, init, out, equal, True, "exclusive_scan_by_key")


@collective("reduce_by_key")
def reduce_by_key(keys: ShardedArray, values: ShardedArray, op, equal=None):
    """(unique_keys, reduced_values): each run of consecutive equal keys (`equal(x, y)`,
    default ==) collapsed to its first key and to its values folded with `op` in order.

    `op` need only be associative (not commutative): each run is folded in element order,
    with an association fixed by the shard layout, so the result is bitwise the same run
    after run; runs may cross shard boundaries. `values`: numbers or records, of keys' group
    and shard sizes. Both results are new arrays, with shard sizes of their own (the same for
    both): shard i holds the runs that end in shard i. Speed: about one read of keys and
    values where runs are short; runs over many thousands of elements take up to about six
    times as long (see the performance docs).

    >>> k = sharded.ShardedArray.from_numpy(g, np.array([1, 1, 2, 2, 2], np.int32))  # doctest: +SKIP
    >>> v = sharded.ShardedArray.from_numpy(g, np.array([1, 2, 3, 4, 5], np.int32))  # doctest: +SKIP
    >>> uk, rv = sharded.reduce_by_key(k, v, lambda x, y: x + y)                       # doctest: +SKIP
    >>> uk.to_numpy(), rv.to_numpy()                                                   # doctest: +SKIP
    (array([1, 2], dtype=int32), array([ 3, 12], dtype=int32))
    """
    check_numbers(keys, "reduce_by_key", "keys")
    _check_values(values, keys)
    op = _check_op(op, values, "reduce_by_key")
    equal = _check_equal(equal, keys)
    libraries = _engine("reduce", keys, values.dtype, op, equal)
    if keys.group._distributed:  # the engine is told what lies beyond this rank's shards
        from ..distributed import _runs

        unique_keys, reduced = _shim.reduce_by_key(libraries, keys._impl, values._impl,
                                                   _runs.edges(keys, values, "reduce_by_key"))
        return _runs.gathered(keys, values, unique_keys, reduced)
    unique_keys, reduced = _shim.reduce_by_key(libraries, keys._impl, values._impl)
    return ShardedArray(unique_keys, keys.group, keys.dtype), ShardedArray(reduced, values.group, values.dtype)


@collective("unique_by_key")
def unique_by_key(keys: ShardedArray, values: ShardedArray | None = None, equal=None):
    """The first element of every run of consecutive equal keys (`equal(x, y)`, default
    ==): `(keys, values)`, the values of those elements (None when no values are given).

    Runs may cross shard boundaries; shard i of each result holds the runs that start in
    shard i. `values`: any dtype (records too), of keys' group and shard sizes.

    >>> k = sharded.ShardedArray.from_numpy(g, np.array([1, 1, 2, 3, 3], np.int32))  # doctest: +SKIP
    >>> sharded.unique_by_key(k)[0].to_numpy()                                         # doctest: +SKIP
    array([1, 2, 3], dtype=int32)
    """
    check_numbers(keys, "unique_by_key", "keys")
    if values is not None:
        _check_values(values, keys)
    equal = _check_equal(equal, keys)
    if values is not None and not keys.group._distributed and len(keys.group) == 1 \
            and not layout_of(values.dtype).is_record:
        # One place, numbers for values: a run's first value is its fold under "first",
        # which reduce_by_key's single pass gives reading the keys and values once (the heads'
        # selection reads the keys twice). It puts each run in the shard where the run ends,
        # which on one place is the shard where it starts; on several, a run crossing shards
        # would land in a later one.
        return reduce_by_key(keys, values, _FIRST, equal)
    arrays = [keys] if values is None else [keys, values]
    if keys.group._distributed:
        kept = select_flagged(arrays, _RunFlags(keys, equal)(keys))
    else:
        kept = _select_heads(_heads(keys, equal), keys, arrays)
    return kept[0], (None if values is None else kept[1])


@collective("unique")
def unique(a: ShardedArray) -> ShardedArray:
    """The sorted distinct elements of `a`, as `np.unique(a)` (the NaNs, sorted last, make
    one): a sorted copy, then unique_by_key. `a` is left as it was.

    >>> sharded.unique(a).to_numpy()                                                   # doctest: +SKIP
    """
    check_numbers(a, "unique")
    equal = _EQUAL_NAN if a.dtype.kind == "f" else _EQUAL
    # the heads' kernels compile before the sort runs
    heads = _RunFlags(a, equal) if a.group._distributed else _heads(a, equal)
    ordered = sort(a, out=ShardedArray.allocate(a.group, list(a.shard_sizes), a.dtype))
    if a.group._distributed:
        return select_flagged([ordered], heads(ordered))[0]
    return _select_heads(heads, ordered, [ordered])[0]


__all__ = ["inclusive_scan_by_key", "exclusive_scan_by_key", "reduce_by_key", "unique_by_key", "unique"]
