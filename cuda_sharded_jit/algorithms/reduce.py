"""Reductions, scans, counts and differences whose operators are Python functions.

Operators need only be associative: shards are folded in shard order and every block of
work in element order, so a non-commutative operator gives the sequential answer, and the
same input on the same group gives bitwise-identical results run after run.
"""

from __future__ import annotations

import weakref

import numpy as np

from .. import _collective, _shim, compiler
from .._collective import collective
from .._dtypes import as_dtype, as_flag, is_weak_scalar
from .._layout import Layout, layout_of
from ..array import ShardedArray, check_array, check_numbers, check_out
from ..compiler import kernel_libraries, one_pass_scans
from ..op import Op, as_op, identity_or_none

_BUILTIN = {"sum": _shim.BuiltinReduction.sum, "min": _shim.BuiltinReduction.min,
            "max": _shim.BuiltinReduction.max}


def _add(a, b):
    return a + b


def _min(a, b):  # NaN propagates, as in numpy
    return a if (a < b or a != a) else b


def _max(a, b):
    return a if (a > b or a != a) else b


_PYTHON_OPS = {"sum": Op(_add), "min": Op(_min), "max": Op(_max)}
_ADD = _PYTHON_OPS["sum"]



_WEAK_TYPES = (float, int, bool)  # exactly these: numpy's float64 subclasses float


def _accumulator(dtype: np.dtype, layout: Layout, init) -> np.dtype:
    """The input dtype, or init's when it is an explicitly typed (numpy) value and wider.

    Python scalars are weak, as in numpy: `reduce(float32_array, op, init=0.0)` stays
    float32; `init=np.float64(0)` accumulates in float64. Records accumulate as themselves
    (init: a tuple).
    """
    if type(init) in _WEAK_TYPES:  # the common call, reduce(a, op, 0.0): a weak Python scalar
        return dtype
    if type(init) is dtype.type and not layout.is_record:  # np.float32(0) for float32: nothing to promote
        return dtype
    init_dtype = None if layout.is_record else _init_request(init)
    if init_dtype is None:
        return dtype
    return init_dtype if np.promote_types(dtype, init_dtype) == init_dtype else dtype


def _init_request(init) -> np.dtype | None:
    """The accumulator dtype a mapped algorithm is asked for by `init`: its dtype when it is a
    numpy value, else None (a Python scalar is weak, a tuple builds a tuple accumulator)."""
    if init is None or isinstance(init, tuple) or is_weak_scalar(init):
        return None
    return as_dtype(np.asarray(init).dtype, "init")


def _map_operator(map_op, with_index, what: str) -> Op:
    """map_op as an Op taking (x) or, with `with_index`, (x, global_index); TypeError before
    any compile otherwise."""
    with_index = as_flag(with_index, "with_index")
    map_op = as_op(map_op, "map_op")
    map_op.check_arity(2 if with_index else 1, f"{what}'s map" + (" (value, index)" if with_index else ""))
    return map_op


def _operator(op, arity: int, what: str, values: Layout | None = None):
    """A built-in name or an Op; TypeError before any compile for a wrong arity, or for a
    built-in name when the `values` are records (it combines numbers)."""
    if isinstance(op, str):
        if op not in _BUILTIN:
            raise ValueError(f"op: expected an operator or one of {', '.join(_BUILTIN)}, got {op!r}")
        if values is not None and values.is_record:
            raise TypeError(f"op: {op!r} combines numbers, but a holds records "
                            f"{values.description}; pass an operator that combines two tuples")
        return op
    op = as_op(op)
    op.check_arity(arity, what)
    return op


def _reduce_call(a: ShardedArray, acc_size: int, init: bytes, libraries=None, builtin=None):
    """(valid, accumulator bytes) of the shim's reduce (`builtin`: a BuiltinReduction), or of
    its cross-rank form on a PlaceGroup.from_mpi group."""
    if _collective.capturing:
        _collective.refuse_host_wait("a reduction to a host value")
    if a._group._distributed:
        from ..distributed import _algorithms

        return _algorithms.reduce(a, acc_size, init, libraries, builtin)
    if builtin is not None:
        return _shim.reduce_builtin(builtin, a._impl, init)
    return _shim.reduce(libraries, a._impl, acc_size, init)


def _scan_algorithm(a: ShardedArray, in_dtype: np.dtype, acc: np.dtype | None) -> str:
    """The kernels a scan of `a` links: where at most one shard holds elements, the single
    pass alone ("scan_one_pass", which the shim then runs), else the two passes ("scan").
    The single pass takes 4- and 8-byte inputs and accumulators (`acc`: None where the
    operator's typing decides it); other sizes get the two passes under one cache key."""
    sizes = a.shard_sizes
    lone = len(sizes) - sizes.count(0) <= 1
    sized = one_pass_scans(in_dtype.itemsize, None if acc is None else acc.itemsize)
    return "scan_one_pass" if lone and sized else "scan"


def _scan_call(a: ShardedArray, out: ShardedArray, acc_size: int, init: bytes, exclusive: bool,
               libraries=None, builtin=None) -> None:
    """The shim's scan of a into out, or its cross-rank form on a PlaceGroup.from_mpi group."""
    if a.group._distributed:
        from ..distributed import _algorithms

        return _algorithms.scan(a, out, acc_size, init, exclusive, libraries, builtin)
    if builtin is not None:
        return _shim.scan_builtin(builtin, a._impl, out._impl, init, exclusive)
    return _shim.scan(libraries, a._impl, out._impl, acc_size, init, exclusive)


def _result(valid: bool, raw: bytes, layout: Layout, op, what: str):
    """The folded value (a numpy scalar, or a tuple of them), or an empty array's answer."""
    if not valid:
        if op == "sum":
            return layout.dtype.type(0)
        raise ValueError(f"{what}: the array is empty and no init was given, and the operator "
                         f"has no known identity; pass init=")
    return layout.unpack(raw)


@collective("reduce")
def reduce(a: ShardedArray, op="sum", init=None, out=None):
    """Fold every element with an associative operator, in global order; a numpy scalar.

    `op`: an operator (or plain callable) of two accumulators, or "sum", "min", "max"
    (built in, no JIT). The accumulator has a's dtype, or init's when init is a wider numpy
    value. An empty array gives `init`; with no init, "sum" gives 0 and others ValueError.
    A record array folds its records: `op` takes and returns tuples (named ones when the
    fields have names), init is a tuple or None, the result a tuple of numpy scalars.
    `out`: a sharded.DeviceScalar of a's group, which receives the result on every place
    and is returned; nothing is waited for on the host. The fold accumulates in out's dtype
    (narrower than a's too), bit for bit what reduce returns for that accumulator.

    >>> sharded.reduce(a, op=lambda x, y: max(abs(x), abs(y)), init=0.0)   # doctest: +SKIP
    >>> sharded.reduce(points, lambda p, q: (p.x + q.x, p.y + q.y))          # doctest: +SKIP
    (np.float32(12.5), np.float32(-3.0))
    """
    plannable = (out is None and type(a) is ShardedArray and not isinstance(op, str)
                 and (init is None or type(init) is float or type(init) is int))
    if plannable:
        op = as_op(op)  # what _operator does first
        plan = op._reduce_plan
        if (plan is not None and plan[0]() is a._group and plan[1] is a._dtype
                and plan[2] == compiler._generation and plan[3] == identity_or_none(op)):
            acc = plan[5]  # the last call's group, dtype and identity: its kernels
            valid, raw = _reduce_call(a, acc.itemsize, b"" if init is None else acc.pack_init(init), plan[4])
            return acc.unpack(raw) if valid else _result(valid, raw, acc, None, "reduce")
    check_array(a)
    dtype = a._dtype  # a.dtype, read once
    values = layout_of(dtype)
    op = _operator(op, 2, "reduce", values)
    if isinstance(init, tuple) and not values.is_record:
        raise TypeError("init: a tuple accumulator is built from each element by a map: use "
                        "sharded.transform_reduce(a, map_op, reduce_op, init)")
    if out is not None:
        return _reduce_into(a, op, init, out, values)
    acc_dtype = _accumulator(dtype, values, init)
    acc = values if acc_dtype is dtype else layout_of(acc_dtype)
    packed = acc.pack_init(init)
    if isinstance(op, str):
        if acc_dtype == dtype:
            valid, raw = _reduce_call(a, acc.itemsize, packed, builtin=_BUILTIN[op])
            return _result(valid, raw, acc, op, "reduce")
        name, op = op, _PYTHON_OPS[op]
    else:
        name = None
    _, libraries = kernel_libraries(op, "reduce", (("array", dtype),), acc_dtype, a._group.archs)
    valid, raw = _reduce_call(a, acc.itemsize, packed, libraries)
    made_for = compiler.libraries_made_for(op, libraries) if plannable and acc is values else None
    if made_for is not None and not a._group._distributed:
        # what a call on an array of this group and dtype, with no init or a Python number as
        # init (its accumulator is a's dtype), needs again; the group held weakly
        op._reduce_plan = (weakref.ref(a._group), dtype) + made_for + (libraries, acc)
    return _result(valid, raw, acc, name, "reduce")


def _reduce_into(a: ShardedArray, op, init, out, values: Layout):
    """reduce(..., out=DeviceScalar): the fold in out's dtype, written to its every copy."""
    from ..scalar import DeviceScalar

    if not isinstance(out, DeviceScalar):
        raise TypeError(f"out: expected a sharded.DeviceScalar, got {type(out).__name__}")
    if out.group is not a.group:
        raise ValueError("out: belongs to another PlaceGroup than a")
    if values.is_record:
        raise TypeError(f"out: a DeviceScalar holds one number, but a holds records {values.description}")
    acc_dtype = out.dtype
    acc = layout_of(acc_dtype)
    packed = acc.pack_init(init)
    if a.size == 0:
        _collective.refuse_host_wait("a reduce of an empty array (its init is written from host memory)")
    if a.size == 0 and not packed:
        if op != "sum":
            raise ValueError("reduce: the array is empty and no init was given, and the operator has no "
                             "known identity; pass init=")
        packed = acc.pack_init(acc_dtype.type(0))
    if isinstance(op, str):
        if acc_dtype == a.dtype:
            _shim.reduce_builtin_into(_BUILTIN[op], a._impl, packed, out._impl)
            return out
        op = _PYTHON_OPS[op]
    _, libraries = kernel_libraries(op, "reduce", (("array", a.dtype),), acc_dtype, a.group.archs)
    _shim.reduce_into(libraries, a._impl, acc.itemsize, packed, out._impl)
    return out


def sum(a: ShardedArray):  # noqa: A001 - numpy's name
    """Sum of all elements in a's dtype (built in, no JIT).

    >>> sharded.sum(a)                                                      # doctest: +SKIP
    """
    return reduce(a, "sum")


def min(a: ShardedArray):  # noqa: A001
    """Smallest element (NaN if any is NaN); ValueError when empty.

    >>> sharded.min(a)                                                      # doctest: +SKIP
    """
    return reduce(a, "min")


def max(a: ShardedArray):  # noqa: A001
    """Largest element (NaN if any is NaN); ValueError when empty.

    >>> sharded.max(a)                                                      # doctest: +SKIP
    """
    return reduce(a, "max")


@collective("transform_reduce")
def transform_reduce(a: ShardedArray, map_op, reduce_op, init, with_index: bool = False):
    """reduce(map_op(x) for x in a) in one pass (nothing is written in between).

    With `with_index`, the map also receives each element's global index: map_op(x, i).
    The accumulator is map_op's result type, or init's dtype when init is a numpy value. A map
    that returns a tuple of numbers makes a tuple accumulator: reduce_op then takes and
    returns tuples, init is a tuple (or None) and the result is a tuple of numpy scalars.
    The elements of a record array reach the map as tuples (named when the fields are).

    >>> sharded.transform_reduce(a, lambda x: x * x, lambda x, y: x + y, 0.0)  # L2 norm²  # doctest: +SKIP
    >>> def first_min(p, q):               # (value, index): the first smallest  # doctest: +SKIP
    ...     return q if q[0] < p[0] else p
    >>> sharded.transform_reduce(a, lambda x, i: (x, i), first_min, None, with_index=True)  # doctest: +SKIP
    (np.float32(-3.2), np.int64(41))
    """
    check_array(a)
    map_op = _map_operator(map_op, with_index, "transform_reduce")
    reduce_op = _operator(reduce_op, 2, "transform_reduce")
    builtin = reduce_op if isinstance(reduce_op, str) else None
    if builtin:
        reduce_op = _PYTHON_OPS[builtin]
    request = _init_request(init)
    try:
        acc_dtype, libraries = kernel_libraries(reduce_op, "reduce", (("array", a.dtype),), request,
                                                a.group.archs, ("call_index" if with_index else "call", map_op))
    except TypeError as error:
        if builtin and "tuple" in str(error):
            raise TypeError(_tuples_error(builtin, "reduce_op")) from error
        raise
    acc = layout_of(acc_dtype)
    _refuse_tuples(builtin, acc, "reduce_op")
    valid, raw = _reduce_call(a, acc.itemsize, acc.pack_init(init), libraries)
    return _result(valid, raw, acc, None, "transform_reduce")


def _tuples_error(builtin: str, argument: str) -> str:
    return (f"{argument}: {builtin!r} combines single numbers, but the map returns tuples; "
            f"pass an operator that combines two tuples")


def _refuse_tuples(builtin: str | None, acc: Layout, argument: str) -> None:
    """TypeError when a built-in operator name would combine tuple accumulators ("min" and
    "max" would compare them lexicographically)."""
    if builtin and acc.is_record:
        raise TypeError(_tuples_error(builtin, argument))


def _pair_with_index(value, index):
    return value, index


# Pairs (value, global index); `p` always comes before `q`, so keeping `p` on ties gives the
# first index, as numpy does; the first NaN wins, as in numpy. `q` wins only when `p` is a
# number and `q` is smaller (larger) or NaN: `not q >= p` is true for a NaN `q`. Two
# comparisons per fold, not three.
def _first_min(p, q):
    if p[0] == p[0] and not q[0] >= p[0]:
        return q
    return p


def _first_max(p, q):
    if p[0] == p[0] and not q[0] <= p[0]:
        return q
    return p


_FIRST_MIN, _FIRST_MAX, _PAIR = Op(_first_min), Op(_first_max), Op(_pair_with_index)


def _first_index(a: ShardedArray, better: Op, what: str) -> int:
    """The index half of the (value, index) pair `better` keeps over the whole array."""
    check_array(a)
    values = layout_of(a.dtype)
    if values.is_record:
        raise TypeError(f"a: {what} compares numbers, but a holds records {values.description}; "
                        f"use transform_reduce with an operator that orders them")
    if a.size == 0:
        raise ValueError(f"{what}: the array is empty")
    # transform_reduce(a, _PAIR, better, None, with_index=True)[1], less the argument checks
    # and the tuple of numpy scalars (a third of the host time of a small call)
    acc, libraries = kernel_libraries(better, "reduce", (("array", a.dtype),), None, a.group.archs,
                                      ("call_index", _PAIR))
    _, raw = _reduce_call(a, acc.itemsize, b"", libraries)
    offset = layout_of(acc).fields[1][0]
    return int.from_bytes(raw[offset:offset + 8], "little", signed=True)


@collective("argmin")
def argmin(a: ShardedArray) -> int:
    """Global index of the smallest element (the first one on ties, the first NaN if any),
    as `np.argmin`; ValueError when empty. One pass: transform_reduce over (value, index).

    >>> sharded.argmin(a)                                                   # doctest: +SKIP
    """
    return _first_index(a, _FIRST_MIN, "argmin")


@collective("argmax")
def argmax(a: ShardedArray) -> int:
    """Global index of the largest element (the first one on ties, the first NaN if any),
    as `np.argmax`; ValueError when empty.

    >>> sharded.argmax(a)                                                   # doctest: +SKIP
    """
    return _first_index(a, _FIRST_MAX, "argmax")


@collective("count_if")
def count_if(a: ShardedArray, pred) -> int:
    """Number of elements where `pred(x)` is true.

    >>> sharded.count_if(a, lambda x: x != x)   # NaNs           # doctest: +SKIP
    """
    check_array(a)
    pred = as_op(pred, "pred")
    pred.check_arity(1, "count_if")
    int64 = np.dtype(np.int64)
    _, libraries = kernel_libraries(_ADD, "reduce", (("array", a.dtype),), int64, a.group.archs,
                                    ("predicate", pred))
    valid, raw = _reduce_call(a, 8, b"", libraries)
    return int(np.frombuffer(raw, dtype=int64)[0]) if valid else 0


def _scan(a, op, init, out, exclusive: bool, what: str) -> ShardedArray:
    check_array(a)
    values = layout_of(a.dtype)
    op = _operator(op, 2, what, values)
    if out is not None:
        check_out(out, a, "a")
        acc = out.dtype
    else:
        acc = _accumulator(a.dtype, values, init)
    acc_layout = layout_of(acc)
    if isinstance(init, tuple) and not acc_layout.is_record:
        raise TypeError(f"init: a tuple, but the accumulator is a single {acc}")
    packed = acc_layout.pack_init(init)
    if isinstance(op, str):
        if acc == a.dtype:
            out = out if out is not None else ShardedArray.allocate(a.group, list(a.shard_sizes), acc)
            _scan_call(a, out, acc.itemsize, packed, exclusive, builtin=_BUILTIN[op])
            return out
        op = _PYTHON_OPS[op]
    _, libraries = kernel_libraries(op, _scan_algorithm(a, a.dtype, acc), (("array", a.dtype),), acc, a.group.archs)
    if out is None:
        out = ShardedArray.allocate(a.group, list(a.shard_sizes), acc)
    _scan_call(a, out, acc.itemsize, packed, exclusive, libraries)
    return out


@collective("inclusive_scan")
def inclusive_scan(a: ShardedArray, op="sum", out: ShardedArray | None = None, init=None) -> ShardedArray:
    """out[i] = init op a[0] op ... op a[i] (without init when None). `out` may be `a`.

    The accumulator (and result) dtype is out's when given, else a's (or init's when it is a
    wider numpy value). A record array scans its records into its own layout: `op` takes and
    returns tuples (named when the fields are), init is a tuple. Stream-ordered: returns at
    once.

    >>> running_max = sharded.inclusive_scan(a, lambda x, y: x if x > y else y)  # doctest: +SKIP
    >>> path = sharded.inclusive_scan(steps, lambda p, q: (p.x + q.x, p.y + q.y))  # doctest: +SKIP
    """
    return _scan(a, op, init, out, False, "inclusive_scan")


@collective("exclusive_scan")
def exclusive_scan(a: ShardedArray, op, init, out: ShardedArray | None = None) -> ShardedArray:
    """out[0] = init, out[i] = init op a[0] op ... op a[i-1]. `out` may be `a`.

    >>> offsets = sharded.exclusive_scan(counts, "sum", 0)                     # doctest: +SKIP
    """
    if init is None:
        raise ValueError("init: an exclusive scan needs an initial value")
    return _scan(a, op, init, out, True, "exclusive_scan")


def _transform_scan(a, map_op, scan_op, init, out, with_index, exclusive: bool, what: str) -> ShardedArray:
    check_array(a)
    map_op = _map_operator(map_op, with_index, what)
    scan_op = _operator(scan_op, 2, what)
    builtin = scan_op if isinstance(scan_op, str) else None
    if builtin:
        scan_op = _PYTHON_OPS[builtin]
    if out is not None:
        check_out(out, a, "a")
    request = out.dtype if out is not None else _init_request(init)
    if layout_of(a.dtype).is_record:
        # Records: the map runs as an indexed transform into `out`, which is then scanned in
        # place (a scan of records takes no map); both kernels are compiled before either runs.
        from .transform import prepare, run

        prepared = prepare(map_op, (a,), out, with_index, request)
        acc = prepared[2]
        acc_layout = layout_of(acc)
        _refuse_tuples(builtin, acc_layout, "scan_op")
        _, libraries = kernel_libraries(scan_op, _scan_algorithm(a, acc, acc), (("array", acc),), acc, a.group.archs)
        packed = acc_layout.pack_init(init)
        out = run(prepared, out)
        _scan_call(out, out, acc.itemsize, packed, exclusive, libraries)
        return out
    try:
        acc, libraries = kernel_libraries(scan_op, _scan_algorithm(a, a.dtype, request), (("array", a.dtype),), request,
                                          a.group.archs,
                                          ("call_index" if with_index else "call", map_op))
    except TypeError as error:
        if builtin and "tuple" in str(error):
            raise TypeError(_tuples_error(builtin, "scan_op")) from error
        raise
    acc_layout = layout_of(acc)
    _refuse_tuples(builtin, acc_layout, "scan_op")
    packed = acc_layout.pack_init(init)
    if out is None:
        out = ShardedArray.allocate(a.group, list(a.shard_sizes), acc)
    _scan_call(a, out, acc.itemsize, packed, exclusive, libraries)
    return out


@collective("transform_inclusive_scan")
def transform_inclusive_scan(a: ShardedArray, map_op, scan_op, out: ShardedArray | None = None,
                             init=None, with_index: bool = False) -> ShardedArray:
    """out[i] = init op map(a[0]) op ... op map(a[i]): the map and the scan in one pass
    (a record array: an indexed transform into `out`, then the scan in place).

    As transform_reduce: with `with_index` the map is map_op(x, global_index); a map
    returning a tuple makes a tuple accumulator and `out` a record array (fields f0, f1, ...,
    or out's own); scan_op then takes and returns tuples and init is a tuple. The result
    dtype is out's when given, else the map's result type (or init's when it is a numpy
    value). `out` may be `a`. Stream-ordered: returns at once.

    >>> def first_min(p, q):                # running (minimum, its first index)  # doctest: +SKIP
    ...     return q if q[0] < p[0] else p
    >>> m = sharded.transform_inclusive_scan(a, lambda x, i: (x, i), first_min, with_index=True)  # doctest: +SKIP
    >>> m.to_numpy()["f1"]                  # where each prefix's minimum is   # doctest: +SKIP
    """
    return _transform_scan(a, map_op, scan_op, init, out, with_index, False, "transform_inclusive_scan")


@collective("transform_exclusive_scan")
def transform_exclusive_scan(a: ShardedArray, map_op, scan_op, init, out: ShardedArray | None = None,
                             with_index: bool = False) -> ShardedArray:
    """out[0] = init, out[i] = init op map(a[0]) op ... op map(a[i-1]); as
    transform_inclusive_scan otherwise.

    >>> def moments(x):                     # (count, sum) before each element  # doctest: +SKIP
    ...     return 1, x
    >>> before = sharded.transform_exclusive_scan(
    ...     a, moments, lambda p, q: (p[0] + q[0], p[1] + q[1]), (0, 0.0))    # doctest: +SKIP
    """
    if init is None:
        raise ValueError("init: an exclusive scan needs an initial value")
    return _transform_scan(a, map_op, scan_op, init, out, with_index, True, "transform_exclusive_scan")


def _subtract(x, previous):
    return x - previous


_SUBTRACT = Op(_subtract)
_IDENTITY = Op(lambda x: x)


@collective("adjacent_difference")
def adjacent_difference(a: ShardedArray, out: ShardedArray | None = None, op=None) -> ShardedArray:
    """out[0] = a[0]; out[i] = op(a[i], a[i-1]) (default a[i] - a[i-1]), across shards.

    The result dtype is out's when given, else a's for the default operator and the
    operator's return type otherwise. `out` must not be `a` (each element reads its
    predecessor): ValueError.

    >>> d = sharded.adjacent_difference(a)                                   # doctest: +SKIP
    """
    check_numbers(a, "adjacent_difference")
    if out is not None:
        check_out(out, a, "a")
        written = layout_of(out.dtype)
        if written.is_record:
            raise TypeError(f"out: adjacent_difference writes numbers, not records {written.description}")
        if out is a:
            raise ValueError("out: must not alias a (each element reads its predecessor)")
    if op is None:
        op, request = _SUBTRACT, (out.dtype if out is not None else a.dtype)
    else:
        op = as_op(op)
        op.check_arity(2, "adjacent_difference")
        request = None if out is None else out.dtype
    kinds = (("array", a.dtype), ("array", a.dtype))
    out_dtype, difference = kernel_libraries(op, "transform", kinds, request, a.group.archs)
    _, first = kernel_libraries(_IDENTITY, "transform", kinds[:1], out_dtype, a.group.archs)
    if out is None:
        out = ShardedArray.allocate(a.group, list(a.shard_sizes), out_dtype)
    if a.group._distributed:  # the first element of a rank's part meets the previous rank's last
        from ..distributed import _algorithms

        _algorithms.adjacent_difference(difference, first, a, out)
    else:  # out[0] = a[0] is a copy where out has a's dtype: the pass writes it
        _shim.adjacent_difference(difference, first, a._impl, out._impl, False, b"", out_dtype == a.dtype)
    return out
