"""ShardedArray's operators, arithmetic (`a + b`, `2.0 * a`, `-a`, `abs(a)`, `a ** 2`, the
in-place forms) and comparisons (`a < b`, `a == 0.5`, `1 < a`, ...), and its NumPy-style
methods (`copy`, `astype`, `sum`, `mean`, `var`, `std`, ...), as thin calls over the
transforms and reductions: descriptor operators where one exists (same dtype on both sides),
a cached JIT transform otherwise.

Results follow NumPy's promotion (NEP 50: a Python scalar takes the array's kind and width, a
NumPy scalar keeps its dtype), and so do the values: both operands are cast to the dtype
NumPy computes or compares them in before the operator runs (`int32 + float32` in float64,
`int32 < 2.5` in float64, `float32 < 0.1` in float32), so numba's own rules for mixed
operands, which are not NumPy's for every pair, never decide. Arithmetic: that dtype is the
one the ufunc gives on empty operands, and the result's. Comparisons: int64 against uint64
is exact, as NumPy's mixed loops are, and a Python int beyond an integer array's range gives
every element the same answer, as in NumPy 2; the result is a uint32 array of 1 (true) and
0 (false), since arrays hold no bool nor any 1-byte dtype (`(a > 0).sum()` counts, as
NumPy's bool sum does; `a[(a > 0).to_numpy().astype(bool)]` selects on the host).

Each call is one dict lookup keyed by (operator, left operand's type, right operand's type):
the checks that depend on types only, the result dtype, the operator that runs and how a
scalar is converted are worked out at the first call with those types (a _Plan) and reused;
per call only the group, the shard sizes and a scalar's value are looked at. The operators
are LibraryOps (identity computed once), one per operator and dtype combination, so the
kernel cache holds one entry per combination, however many calls are made.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _shim, ops
from .._collective import collective
from .._dtypes import SUPPORTED_DTYPES, as_dtype
from .._layout import layout_of
from ..array import ShardedArray, check_numbers, check_out
from ..op import LibraryOp
from . import reduce as _reduce
from . import transform as _transform
from .opaque import fill

FLAGS = np.dtype(np.uint32)  # the dtype comparisons return
_INT64, _UINT64, _FLOAT64 = np.dtype(np.int64), np.dtype(np.uint64), np.dtype(np.float64)
_INT64_MAX = np.iinfo(np.int64).max
_PYTHON_SCALARS = (int, float, bool)


def _add(x, y):
    return x + y


def _sub(x, y):
    return x - y


def _mul(x, y):
    return x * y


def _truediv(x, y):
    return x / y


def _pow(x, y):
    return x ** y


def _abs(x):
    return abs(x)


def _same(x):
    return x


def _less(x, y):
    return x < y


def _less_equal(x, y):
    return x <= y


def _greater(x, y):
    return x > y


def _greater_equal(x, y):
    return x >= y


def _equal(x, y):
    return x == y


def _not_equal(x, y):
    return x != y


_ABS, _SAME = LibraryOp(_abs), LibraryOp(_same)

# name -> (the NumPy ufunc whose promotion it follows, descriptor for two arrays of one dtype)
_ARITHMETIC = {"add": (np.add, ops.add), "sub": (np.subtract, None), "mul": (np.multiply, ops.mul),
               "truediv": (np.true_divide, None), "pow": (np.power, None)}
_FUNCTIONS = {"add": _add, "sub": _sub, "mul": _mul, "truediv": _truediv, "pow": _pow,
              "lt": _less, "le": _less_equal, "gt": _greater, "ge": _greater_equal, "eq": _equal,
              "ne": _not_equal}
_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "pow": "**",
            "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
_MIRROR = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}  # x < y is y > x
# `x <op> y` for every x when y lies above (below) every value x's dtype holds
_WHEN_ABOVE = {"lt": 1, "le": 1, "gt": 0, "ge": 0, "eq": 0, "ne": 1}
_WHEN_BELOW = {"lt": 0, "le": 0, "gt": 1, "ge": 1, "eq": 0, "ne": 1}


def _casting(function, cast):
    """function(cast(x), cast(y)): operands of different dtypes, computed or compared in the
    one NumPy promotes both to (cast: np.float64, np.int64, ...). Without it numba's own
    rules would choose, and they are not NumPy's for every pair."""
    def cast_both(x, y):
        return function(cast(x), cast(y))

    return cast_both


def _int64_with_uint64(compare, when_negative):
    """compare(x, y) of an int64 x and a uint64 y, exactly, as NumPy's mixed loops do (in
    float64 they would round above 2^53): a negative x is below every y."""
    def compare_mixed(x, y):
        return when_negative if x < 0 else compare(np.uint64(x), y)

    return compare_mixed


_PLAIN_OPS = {name: LibraryOp(function) for name, function in _FUNCTIONS.items()}
_MIXED_OPS = {name: LibraryOp(_int64_with_uint64(_FUNCTIONS[name], bool(_WHEN_ABOVE[name])))
              for name in _COMPARISONS}
_cast_ops: dict[tuple[str, np.dtype], LibraryOp] = {}


def _operator(name: str, dtype: np.dtype, kinds: tuple) -> LibraryOp:
    """The operator for `name` computing in `dtype` on arguments of `kinds`: the plain one
    when they all are of that dtype, else one that casts both first (one per name and dtype)."""
    if all(kind_dtype == dtype for _, kind_dtype in kinds):
        return _PLAIN_OPS[name]
    found = _cast_ops.get((name, dtype))
    if found is None:
        found = _cast_ops.setdefault((name, dtype), LibraryOp(_casting(_FUNCTIONS[name], dtype.type)))
    return found


class _Plan:
    """What an operator does with operands of two given types, worked out at the first call
    with them: `dtype` (the result's), `op` (the JIT operator) or `builtin` (a descriptor's
    name), `kinds` (the transform's argument kinds, in the order `swap` says), `scalar` (the
    position of the scalar operand, None for two arrays), `convert` (a scalar to the dtype
    the operator takes; OverflowError where it cannot hold it), `saturates` (comparisons:
    such an OverflowError means "beyond every element", answered by a fill), `into_left`
    (whether the result may be written into the left operand, NumPy's same-kind rule)."""

    __slots__ = ("dtype", "op", "builtin", "kinds", "scalar", "convert", "pack", "saturates", "swap",
                 "into_left")

    def __init__(self, dtype, op=None, builtin=None, kinds=(), scalar=None, convert=None, saturates=False,
                 swap=False, into_left=False):
        self.dtype, self.op, self.builtin, self.kinds, self.scalar = dtype, op, builtin, kinds, scalar
        self.convert, self.saturates, self.swap, self.into_left = convert, saturates, swap, into_left
        self.pack = None if convert is None else _transform.scalar_packer(kinds[scalar][1])


_plans: dict[tuple, _Plan] = {}


def _token(value):
    """What a plan depends on: an array's dtype, or a scalar's type (a dtype never equals a type)."""
    return value._dtype if isinstance(value, ShardedArray) else type(value)


def _keep(key: tuple, plan: _Plan) -> _Plan:
    return _plans.setdefault(key, plan)  # a racing thread's equal plan may win


def _check_pair(left: ShardedArray, right: ShardedArray) -> None:
    if right._group is not left._group:
        raise ValueError("right operand: belongs to another PlaceGroup than the left one")
    if right._shard_sizes != left._shard_sizes:
        raise ValueError(f"right operand: shard sizes {right.shard_sizes} differ from the left one's "
                         f"{left.shard_sizes}")


def _operand(value, position: str):
    """The dtype of one arithmetic operand (the Python type of a Python scalar); TypeError
    for anything else."""
    if isinstance(value, ShardedArray):
        check_numbers(value, "arithmetic", position)
        return value.dtype
    if type(value) in _PYTHON_SCALARS:
        return type(value)
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return value.dtype
    raise TypeError(f"{position}: expected a ShardedArray or a number, got {type(value).__name__}")


def result_dtype(name: str, left, right) -> np.dtype:
    """The dtype NumPy gives `name` of operands of these dtypes (or Python scalar types)."""
    ufunc = _ARITHMETIC[name][0]

    def sample(kind):
        return np.empty(0, kind) if isinstance(kind, np.dtype) else kind(1)

    return np.dtype(ufunc(sample(left), sample(right)).dtype)


def _arithmetic_plan(name: str, left, right) -> _Plan:
    left_kind, right_kind = _operand(left, "left operand"), _operand(right, "right operand")
    dtype = result_dtype(name, left_kind, right_kind)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{_SYMBOLS[name]}: NumPy's result would be {dtype}, which ShardedArrays do not hold")
    descriptor = _ARITHMETIC[name][1]
    into_left = isinstance(left, ShardedArray) and np.can_cast(dtype, left.dtype, "same_kind")
    if isinstance(left, ShardedArray) and isinstance(right, ShardedArray):
        kinds = (("array", left.dtype), ("array", right.dtype))
        builtin = descriptor.name if descriptor is not None and left.dtype == right.dtype == dtype else None
        plan = _Plan(dtype, _operator(name, dtype, kinds), builtin, kinds, into_left=into_left)
    else:
        # a scalar of either kind is taken in the result's dtype, as NumPy computes it (a
        # Python int that it cannot hold is NumPy's OverflowError)
        scalar = 0 if isinstance(right, ShardedArray) else 1
        array = right if scalar == 0 else left
        kinds = [("array", array.dtype)]
        kinds.insert(scalar, ("scalar", dtype))
        kinds = tuple(kinds)
        plan = _Plan(dtype, _operator(name, dtype, kinds), None, kinds, scalar, dtype.type, into_left=into_left)
    return _keep((name, _token(left), _token(right)), plan)


@collective("arithmetic")
def binary(name: str, left, right, out: ShardedArray | None = None) -> ShardedArray:
    """`left <op> right` elementwise, at least one operand a ShardedArray; into `out` when
    given (an in-place form), which must take the result under NumPy's same-kind casting."""
    plan = _plans.get((name, _token(left), _token(right)))
    if plan is None:
        plan = _arithmetic_plan(name, left, right)
    scalar = plan.scalar
    if scalar is None:
        _check_pair(left, right)
        arrays, packed = [left, right], b""
    elif scalar:
        arrays, packed = [left], plan.pack(plan.convert(right))
    else:
        arrays, packed = [right], plan.pack(plan.convert(left))
    dtype, builtin = plan.dtype, plan.builtin
    if out is None:
        out = ShardedArray._new_like(arrays[0], dtype)
    else:
        fits = plan.into_left if out is left else np.can_cast(dtype, check_out(out, arrays[0]).dtype, "same_kind")
        if not fits:
            raise TypeError(f"{_SYMBOLS[name]}=: the result ({dtype}) cannot be cast to the array's {out.dtype} "
                            f"under NumPy's same-kind rule")
        if out._dtype != dtype:
            builtin = None
    if builtin is not None:
        return _transform.launch_builtin(builtin, arrays, out)
    return _transform.launch(plan.op, arrays, plan.kinds, packed, out)


def _compared(array: ShardedArray, symbol: str) -> np.dtype:
    layout = layout_of(array.dtype)
    if layout.is_record:
        raise TypeError(f"{symbol}: comparisons take arrays of numbers, not records {layout.description}; "
                        f"compare a field inside an operator instead, e.g. "
                        f"sharded.select(a, lambda r: r[0] < 0.5)")
    return array.dtype


def _uint64_as_int64(value) -> np.int64:
    """A uint64 scalar compared with an int64 array: exact, in int64 where it fits."""
    if value > _INT64_MAX:
        raise OverflowError(f"{value} is above every int64")
    return np.int64(value)


def _int64_as_uint64(value) -> np.uint64:
    """An int64 scalar compared with a uint64 array: exact, in uint64 where it fits."""
    if value < 0:
        raise OverflowError(f"{value} is below every uint64")
    return np.uint64(value)


def _comparison_plan(name: str, a: ShardedArray, other) -> _Plan:
    symbol = _SYMBOLS[name]
    dtype = _compared(a, symbol)
    key = (name, a._dtype, _token(other))
    if isinstance(other, ShardedArray):
        other_dtype = _compared(other, symbol)
        if {dtype, other_dtype} == {_INT64, _UINT64}:  # exact, the int64 operand first
            swap = dtype == _UINT64
            op = _MIXED_OPS[_MIRROR[name] if swap else name]
            kinds = (("array", other_dtype), ("array", dtype)) if swap else (("array", dtype), ("array", other_dtype))
            return _keep(key, _Plan(FLAGS, op, kinds=kinds, swap=swap))
        kinds = (("array", dtype), ("array", other_dtype))
        return _keep(key, _Plan(FLAGS, _operator(name, np.result_type(dtype, other_dtype), kinds), kinds=kinds))
    integers = dtype.kind in "iu"
    if type(other) in _PYTHON_SCALARS:
        # weak: a Python float takes a float array's dtype (float64 for integers), an int
        # the array's own; an int the dtype cannot hold is beyond every element
        common = _FLOAT64 if type(other) is float and integers else dtype
        convert, saturates = common.type, integers and type(other) is int
    elif isinstance(other, np.generic) and other.dtype.kind in "biufc":
        scalar_dtype = other.dtype
        if {dtype, scalar_dtype} == {_INT64, _UINT64}:
            common, saturates = dtype, True
            convert = _uint64_as_int64 if dtype == _INT64 else _int64_as_uint64
        else:
            common, saturates = np.result_type(dtype, scalar_dtype), False
            convert = common.type
            if common not in SUPPORTED_DTYPES:
                raise TypeError(f"{symbol}: NumPy compares {dtype} with {scalar_dtype} in {common}, which "
                                f"ShardedArrays do not support; convert the scalar first (float(value), "
                                f"np.float64(value))")
    else:
        raise TypeError(f"{symbol}: the other operand must be a ShardedArray or a number, got "
                        f"{type(other).__name__}")
    kinds = (("array", dtype), ("scalar", common))
    return _keep(key, _Plan(FLAGS, _operator(name, common, kinds), kinds=kinds, scalar=1, convert=convert,
                            saturates=saturates))


@collective("comparison")
def compare(name: str, a: ShardedArray, other) -> ShardedArray:
    """`a <op> other` elementwise ("lt", "le", "gt", "ge", "eq", "ne"), as NumPy compares them,
    into a new uint32 array of 1 (true) and 0 (false). `other`: a ShardedArray of a's group
    and shard sizes, or a Python or NumPy number (a scalar on the left is Python's
    reflection: `1 < a` calls `a > 1`)."""
    plan = _plans.get((name, a._dtype, _token(other)))
    if plan is None:
        plan = _comparison_plan(name, a, other)
    if plan.scalar is None:
        _check_pair(a, other)
        arrays, packed = ([other, a] if plan.swap else [a, other]), b""
    else:
        try:
            value = plan.convert(other)
        except OverflowError:
            if not plan.saturates:
                raise
            return fill(ShardedArray._new_like(a, FLAGS), (_WHEN_ABOVE if other > 0 else _WHEN_BELOW)[name])
        arrays, packed = [a], plan.pack(value)
    return _transform.launch(plan.op, arrays, plan.kinds, packed, ShardedArray._new_like(a, FLAGS))


@collective("arithmetic")
def unary(name: str, a: ShardedArray) -> ShardedArray:
    """`-a` or `abs(a)`, in a's dtype."""
    check_numbers(a, "arithmetic", "operand")
    out = ShardedArray._new_like(a, a.dtype)
    if name == "neg":
        return _transform.launch_builtin(ops.negate.name, [a], out)
    return _transform.launch(_ABS, [a], (("array", a.dtype),), b"", out)


@collective("copy")
def copy(a: ShardedArray) -> ShardedArray:
    """A new array with a's group, shard sizes, dtype and elements (records too)."""
    out = ShardedArray._new_like(a, a.dtype)
    _shim.copy_lanes(a._impl, 0, out._impl, 0, a.dtype.itemsize)
    return out


@collective("astype")
def astype(a: ShardedArray, dtype) -> ShardedArray:
    """A copy in another number dtype, each element cast as numba casts it (C casts: floats
    to integers truncate toward zero)."""
    target = np.dtype(dtype)
    if target == a.dtype:
        return copy(a)
    check_numbers(a, "astype")
    if layout_of(target).is_record:
        raise TypeError(f"dtype: astype casts numbers to numbers, not to records {target}; use transform")
    return _transform.transform(_SAME, a, out=ShardedArray._new_like(a, as_dtype(target, "dtype")))


def _one(x):
    return 1.0, np.float64(x), 0.0  # count, mean, M2 of a single value


def _combine(p, q):
    count = p[0] + q[0]
    if count == 0.0:
        return p
    delta = q[1] - p[1]
    mean = p[1] + delta * (q[0] / count)
    return count, mean, p[2] + q[2] + delta * delta * (p[0] * q[0] / count)


@collective("mean")
def moments(a: ShardedArray) -> tuple[float, float, float]:
    """(count, mean, M2) in one pass over `a` (Welford's accumulator, combined pairwise)."""
    check_numbers(a, "mean")
    count, mean, m2 = _reduce.transform_reduce(a, _one, _combine, (0.0, 0.0, 0.0))
    return float(count), float(mean), float(m2)


def mean(a: ShardedArray) -> np.float64:
    """The mean in float64 (NaN for an empty array)."""
    count, value, _ = moments(a)
    return np.float64(value if count else math.nan)


def var(a: ShardedArray, ddof: int = 0) -> np.float64:
    """The variance, M2 / (n - ddof), in float64 (NaN when n <= ddof)."""
    count, _, m2 = moments(a)
    return np.float64(m2 / (count - ddof) if count > ddof else math.nan)


def std(a: ShardedArray, ddof: int = 0) -> np.float64:
    """The standard deviation, the square root of var."""
    return np.float64(math.sqrt(var(a, ddof)))


__all__ = ["binary", "compare", "unary", "copy", "astype", "mean", "var", "std", "moments", "result_dtype",
           "FLAGS"]
