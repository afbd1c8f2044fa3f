"""ShardedArray's arithmetic (`a + b`, `2.0 * a`, `-a`, `abs(a)`, `a ** 2`, the in-place
forms) and its NumPy-style methods (`copy`, `astype`, `sum`, `mean`, `var`, `std`, ...), as
thin calls over the transforms and reductions: descriptor operators where one exists (same
dtype on both sides), a cached JIT transform otherwise.

Result types follow NumPy's promotion (NEP 50: a Python scalar takes the array's kind and
width, a NumPy scalar keeps its dtype), found once per pair of operand types by running the
ufunc on empty operands; the operands are computed in numba's types and the result cast to
that dtype, which gives NumPy's values for these operators.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import _shim, ops
from .._dtypes import is_scalar
from .._layout import layout_of
from ..array import ShardedArray, check_numbers
from . import reduce as _reduce
from . import transform as _transform


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


def _neg(x):
    return -x


def _same(x):
    return x


# name -> (operator, the NumPy ufunc whose promotion it follows, descriptor for two arrays of one dtype)
_BINARY = {
    "add": (_add, np.add, ops.add), "sub": (_sub, np.subtract, None), "mul": (_mul, np.multiply, ops.mul),
    "truediv": (_truediv, np.true_divide, None), "pow": (_pow, np.power, None),
}
_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "pow": "**"}


def _operand(value, position: str):
    """(dtype or the scalar's Python type, value) of one operand; TypeError otherwise."""
    if isinstance(value, ShardedArray):
        check_numbers(value, "arithmetic", position)
        return value.dtype, value
    if isinstance(value, np.generic) and is_scalar(value):
        return value.dtype, value
    if type(value) in (int, float, bool):
        return type(value), value
    raise TypeError(f"{position}: expected a ShardedArray or a number, got {type(value).__name__}")


@functools.lru_cache(maxsize=256)
def result_dtype(name: str, left, right) -> np.dtype:
    """The dtype NumPy gives `name` of operands of these dtypes (or Python scalar types)."""
    ufunc = _BINARY[name][1]

    def sample(kind):
        return np.empty(0, kind) if isinstance(kind, np.dtype) else kind(1)

    return np.dtype(ufunc(sample(left), sample(right)).dtype)


def binary(name: str, left, right, out: ShardedArray | None = None) -> ShardedArray:
    """`left <op> right` elementwise, at least one operand a ShardedArray; into `out` when
    given (an in-place form), which must take the result under NumPy's same-kind casting."""
    left_kind, left = _operand(left, "left operand")
    right_kind, right = _operand(right, "right operand")
    arrays = [value for value in (left, right) if isinstance(value, ShardedArray)]
    first = arrays[0]
    if len(arrays) == 2:
        if right.group is not left.group:
            raise ValueError("right operand: belongs to another PlaceGroup than the left one")
        if right.shard_sizes != left.shard_sizes:
            raise ValueError(f"right operand: shard sizes {right.shard_sizes} differ from the left one's "
                             f"{left.shard_sizes}")
    dtype = result_dtype(name, left_kind, right_kind)
    if out is not None and not np.can_cast(dtype, out.dtype, "same_kind"):
        raise TypeError(f"{_SYMBOLS[name]}=: the result ({dtype}) cannot be cast to the array's {out.dtype} "
                        f"under NumPy's same-kind rule")
    function, _, descriptor = _BINARY[name]
    if descriptor is not None and len(arrays) == 2 and left.dtype == right.dtype == dtype and (
            out is None or out.dtype == dtype):
        return _transform.transform(descriptor, left, right, out=out)
    # a Python scalar takes the result's dtype, as NumPy computes it
    operands = [np.array(value, dtype)[()] if type(value) in (int, float, bool) else value for value in (left, right)]
    if out is None:
        out = ShardedArray.allocate(first.group, list(first.shard_sizes), dtype)
    return _transform.transform(function, *operands, out=out)


def unary(name: str, a: ShardedArray) -> ShardedArray:
    """`-a` or `abs(a)`, in a's dtype."""
    check_numbers(a, "arithmetic", "operand")
    if name == "neg":
        return _transform.transform(ops.negate, a)
    return _transform.transform(_abs, a, out=ShardedArray.allocate(a.group, list(a.shard_sizes), a.dtype))


def copy(a: ShardedArray) -> ShardedArray:
    """A new array with a's group, shard sizes, dtype and elements (records too)."""
    out = ShardedArray.allocate(a.group, list(a.shard_sizes), a.dtype)
    _shim.copy_lanes(a._impl, 0, out._impl, 0, a.dtype.itemsize)
    return out


def astype(a: ShardedArray, dtype) -> ShardedArray:
    """A copy in another number dtype, each element cast as numba casts it (C casts: floats
    to integers truncate toward zero)."""
    target = np.dtype(dtype)
    if target == a.dtype:
        return copy(a)
    check_numbers(a, "astype")
    if layout_of(target).is_record:
        raise TypeError(f"dtype: astype casts numbers to numbers, not to records {target}; use transform")
    return _transform.transform(_same, a, out=ShardedArray.allocate(a.group, list(a.shard_sizes), target))


def _one(x):
    return 1.0, np.float64(x), 0.0  # count, mean, M2 of a single value


def _combine(p, q):
    count = p[0] + q[0]
    if count == 0.0:
        return p
    delta = q[1] - p[1]
    mean = p[1] + delta * (q[0] / count)
    return count, mean, p[2] + q[2] + delta * delta * (p[0] * q[0] / count)


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


__all__ = ["binary", "unary", "copy", "astype", "mean", "var", "std", "moments", "result_dtype"]
