"""ShardedArray's operators and NumPy-style methods against numpy: result dtypes (NumPy's
promotion), values on the GPU, in-place forms, comparisons, and the errors that come before
anything runs.

Which operator runs, on which argument dtypes, and how a scalar is converted are decided in
Python: those run here on host-backed stand-ins (`host_run`: the transform's launch evaluates
the chosen operator in Python, element by element, after checking that a plain operator gets
operands of one dtype, so numba's mixed-type rules could never decide), against numpy for
every pair of dtypes and scalars of every kind on both sides. The gpu tests run the same
through the compiled kernels."""

from __future__ import annotations

import ctypes
import operator
import warnings

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit.algorithms import arithmetic
from cuda_sharded_jit.algorithms import transform as transform_module
from cuda_sharded_jit.algorithms.arithmetic import result_dtype

from conftest import ALL_DTYPES, sample
from test_errors import shim_untouched, stand_in_array, stand_in_group  # noqa: F401 (fixture)

POINT = np.dtype([("x", np.float32), ("y", np.float32)], align=True)
COMPARISONS = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
               "eq": operator.eq, "ne": operator.ne}


@pytest.mark.parametrize("name, left, right, expected", [
    ("add", np.dtype(np.float32), float, np.float32),          # a Python float takes the array's width
    ("add", np.dtype(np.int32), int, np.int32),
    ("add", np.dtype(np.int32), float, np.float64),            # ... and a float kind where the array has none
    ("truediv", np.dtype(np.int32), np.dtype(np.int32), np.float64),
    ("add", np.dtype(np.uint64), np.dtype(np.int64), np.float64),
    ("mul", np.dtype(np.float32), np.dtype(np.float64), np.float64),
    ("add", np.dtype(np.float32), np.dtype(np.float64), np.float64),  # a NumPy scalar keeps its dtype
    ("pow", np.dtype(np.int64), int, np.int64),
    ("sub", np.dtype(np.uint32), int, np.uint32),
])
def test_result_dtypes_follow_numpy(name, left, right, expected):
    assert result_dtype(name, left, right) == np.dtype(expected)


def test_operator_errors_come_first(shim_untouched):
    group = stand_in_group(2)
    a = stand_in_array(group, [3, 3], np.float32)
    with pytest.raises(ValueError, match="shard sizes"):
        a + stand_in_array(group, [4, 2], np.float32)
    with pytest.raises(ValueError, match="another PlaceGroup"):
        a * stand_in_array(stand_in_group(2), [3, 3], np.float32)
    with pytest.raises(TypeError, match="right operand: expected a ShardedArray or a number, got str"):
        a + "1"
    with pytest.raises(TypeError, match="left operand"):
        [1.0] - a
    ints = stand_in_array(group, [3, 3], np.int32)
    with pytest.raises(TypeError, match="cannot be cast to the array's int32"):
        ints += 0.5
    with pytest.raises(TypeError, match="records"):
        stand_in_array(group, [3, 3], POINT) + 1.0
    with pytest.raises(TypeError, match="not iterated on the host"):
        list(a)
    with pytest.raises(TypeError, match="not to records"):
        a.astype(POINT)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_binary_operators_match_numpy(places, dtype):
    x, y = sample(dtype, 3001, seed=1), sample(dtype, 3001, seed=2)
    if np.dtype(dtype).kind != "f":
        y = np.where(y == 0, 1, y).astype(dtype)  # no division by zero
    a, b = sharded.ShardedArray.from_numpy(places, x), sharded.ShardedArray.from_numpy(places, y)
    for result, expected in [(a + b, x + y), (a - b, x - y), (a * b, x * y), (a / b, x / y),
                             (a + 2, x + 2), (3 - a, 3 - x), (a * 2.5, x * 2.5), (2.0 / b, 2.0 / y),
                             (a * np.float64(0.5), x * np.float64(0.5)), (a ** 2, x ** 2)]:
        assert result.dtype == expected.dtype
        np.testing.assert_allclose(result.to_numpy(), expected, rtol=1e-6 if expected.dtype == np.float32 else 1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_unary_and_in_place_forms(places, dtype):
    x = sample(dtype, 2000, seed=3)
    a = sharded.ShardedArray.from_numpy(places, x)
    np.testing.assert_array_equal((-a).to_numpy(), -x)
    np.testing.assert_array_equal(abs(a).to_numpy(), np.abs(x))
    same = a
    a += 1
    a *= 2
    assert a is same
    np.testing.assert_array_equal(a.to_numpy(), ((x + 1) * 2).astype(dtype))


@pytest.mark.gpu
def test_copy_astype_and_reductions(places):
    x = sample(np.float32, 5003, seed=4)
    a = sharded.ShardedArray.from_numpy(places, x)
    b = a.copy()
    assert b is not a and b.shard_sizes == a.shard_sizes
    np.testing.assert_array_equal(b.to_numpy(), x)
    np.testing.assert_array_equal(a.astype(np.float64).to_numpy(), x.astype(np.float64))
    np.testing.assert_array_equal(a.astype(np.int32).to_numpy(), x.astype(np.int32))
    assert a.min() == x.min() and a.max() == x.max()
    assert a.argmin() == int(np.argmin(x)) and a.argmax() == int(np.argmax(x))
    np.testing.assert_allclose(a.sum(), x.sum(dtype=np.float64), rtol=1e-4)
    np.testing.assert_allclose(a.mean(), x.astype(np.float64).mean(), rtol=1e-12)
    np.testing.assert_allclose(a.var(), x.astype(np.float64).var(), rtol=1e-10)
    np.testing.assert_allclose(a.std(ddof=1), x.astype(np.float64).std(ddof=1), rtol=1e-10)


# ---- comparisons and mixed dtypes: the Python side, on host-backed stand-ins --------------------

def _edge_values(dtype) -> np.ndarray:
    """Values where a comparison in the wrong dtype goes wrong: the ends of the range, 2^53 + 1
    (not a float64), 2^24 + 1 (not a float32), -0.0, infinities and NaN."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        values = [-np.inf, -1e30, -2.5, -1.0, -0.0, 0.0, 0.1, 0.5, 1.0, 2.5, 16777216.0, 16777217.0,
                  2.0 ** 53, 2.0 ** 63, 1e30, np.inf, np.nan]
        return np.array(values, np.float64).astype(dtype)
    info = np.iinfo(dtype)
    values = [info.min, info.min + 1, -1000, -3, -1, 0, 1, 2, 3, 7, 200, 2 ** 24 + 1, 2 ** 31, 2 ** 53,
              2 ** 53 + 1, 2 ** 62 + 1, 2 ** 63, 2 ** 63 + 1, info.max - 1, info.max]
    return np.array(sorted({value for value in values if info.min <= value <= info.max}), dtype)


def _host_array(group, data: np.ndarray) -> sharded.ShardedArray:
    """A stand-in array over `data` (three uneven shards, or one), readable by a[i] and bool()."""
    places = len(group._impl)
    sizes = [len(data)] if places == 1 else [len(data) // 3, 0, len(data) - len(data) // 3][:places]
    array = stand_in_array(group, sizes, data.dtype)
    array._impl.data = data

    def to_host(start, stop, host, nbytes):
        ctypes.memmove(host, data[start:stop].ctypes.data, nbytes)

    array._impl.copy_range_to_host = to_host
    return array


def _check_operator_types(op, dtypes) -> None:
    """A plain operator must get operands of one dtype: numba's rules for mixed operands are
    not NumPy's (int64 with float32, int32 with uint64), so every cast is made explicitly."""
    name = op.func.__name__
    if name == "compare_mixed":
        assert dtypes == [np.dtype(np.int64), np.dtype(np.uint64)], dtypes
    elif name != "cast_both":
        assert len(set(dtypes)) == 1, f"{op.name} would get {dtypes}: numba would choose the promotion"


@pytest.fixture
def host_run(monkeypatch):
    """Operators run on the host: allocation makes host-backed stand-ins, the transform's launch
    evaluates the operator chosen element by element, the built-ins and fill run in numpy."""
    launched = []

    def new_like(cls, like, dtype):
        return _host_array(like.group, np.zeros(like.size, dtype))

    def launch(op, arrays, kinds, packed, out):
        columns, dtypes, pending, slot = [], [], list(arrays), 0
        for kind, dtype in kinds:
            if kind == "array":
                array = pending.pop(0)
                assert array.dtype == dtype and array.shard_sizes == out.shard_sizes
                columns.append(array._impl.data)
            else:
                value = np.frombuffer(packed[8 * slot:8 * slot + dtype.itemsize], dtype)[0]
                slot += 1
                columns.append(np.full(out.size, value, dtype))
            dtypes.append(np.dtype(dtype))
        assert not pending and len(packed) == 8 * slot
        _check_operator_types(op, dtypes)
        launched.append((op, op.identity(), tuple(kinds)))
        with np.errstate(all="ignore"):
            results = [op.func(*values) for values in zip(*columns)]
            out._impl.data[:] = np.array(results).astype(out.dtype) if results else []
        return out

    def launch_builtin(name, arrays, out, scalars=b""):
        with np.errstate(all="ignore"):
            data = [array._impl.data for array in arrays]
            out._impl.data[:] = {"add": np.add, "mul": np.multiply, "negate": np.negative}[name](*data)
        return out

    def fill(out, value):
        out._impl.data[:] = value
        return out

    monkeypatch.setattr(sharded.ShardedArray, "_new_like", classmethod(new_like))
    monkeypatch.setattr(transform_module, "launch", launch)
    monkeypatch.setattr(transform_module, "launch_builtin", launch_builtin)
    monkeypatch.setattr(arithmetic, "fill", fill)
    return launched


def _expect_flags(result, expected) -> None:
    assert result.dtype == np.uint32
    np.testing.assert_array_equal(result._impl.data, np.asarray(expected).astype(np.uint32))


@pytest.mark.parametrize("left", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("right", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_comparisons_of_two_arrays_match_numpy(host_run, left, right):
    x_values, y_values = _edge_values(left), _edge_values(right)
    x, y = np.repeat(x_values, len(y_values)), np.tile(y_values, len(x_values))  # every pair
    group = stand_in_group(3)
    a, b = _host_array(group, x), _host_array(group, y)
    for name, compare in COMPARISONS.items():
        _expect_flags(compare(a, b), compare(x, y))


_PYTHON_SCALARS = [0, 5, -3, 7, 2 ** 24 + 1, 2 ** 40, -2 ** 40, 2 ** 53 + 1, 2 ** 63, -2 ** 63 - 1, 2 ** 64,
                   -2 ** 70, True, False, 2.5, -0.0, 0.1, float("nan"), float("inf"), -float("inf"), 1e300,
                   16777217.0, 2.0 ** 63]
_NUMPY_SCALARS = [np.float32(0.1), np.float64(0.1), np.float64(np.nan), np.int32(-5), np.int64(2 ** 53 + 1),
                  np.int64(-1), np.uint64(2 ** 63 + 1), np.uint64(3), np.uint32(7), np.int8(-1), np.uint8(200),
                  np.int16(-300), np.float16(0.5), np.bool_(True)]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("scalar", _PYTHON_SCALARS + _NUMPY_SCALARS, ids=repr)
def test_comparisons_with_scalars_on_either_side_match_numpy(host_run, dtype, scalar):
    x = _edge_values(dtype)
    a = _host_array(stand_in_group(3), x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 1e300 as float32 overflows, in numpy as here
        for name, compare in COMPARISONS.items():
            _expect_flags(compare(a, scalar), compare(x, scalar))
            _expect_flags(compare(scalar, a), compare(scalar, x))  # 1 < a is a > 1


def test_comparisons_refuse_what_numpy_refuses(host_run):
    a = _host_array(stand_in_group(1), np.ones(3, np.float32))
    with pytest.raises(OverflowError):
        np.ones(3, np.float32) < 10 ** 400
    with pytest.raises(OverflowError):
        a < 10 ** 400
    assert host_run == []


def test_comparisons_are_one_lookup_and_one_kernel_per_types(host_run):
    group = stand_in_group(3)
    a, b = _host_array(group, np.arange(6, dtype=np.int32)), _host_array(group, np.arange(6, dtype=np.float32))
    for value in (1.5, 2.5, 3.5):
        a < value
        a <= b
    plans, casts = len(arithmetic._plans), len(arithmetic._cast_ops)
    for value in (4.5, 5.5, -1.0):
        a < value
        a <= b
    assert (len(arithmetic._plans), len(arithmetic._cast_ops)) == (plans, casts)
    scalar_calls, array_calls = host_run[0::2], host_run[1::2]
    for calls in (scalar_calls, array_calls):  # the same operator, identity and kinds every time
        assert all(call[0] is calls[0][0] and call[1] == calls[0][1] and call[2] == calls[0][2] for call in calls)
    assert scalar_calls[0][0] is not array_calls[0][0]


def test_comparison_errors_come_first(shim_untouched):
    group = stand_in_group(2)
    a = stand_in_array(group, [3, 3], np.float32)
    with pytest.raises(ValueError, match="shard sizes"):
        a < stand_in_array(group, [4, 2], np.float32)
    with pytest.raises(ValueError, match="another PlaceGroup"):
        a == stand_in_array(stand_in_group(2), [3, 3], np.float32)
    with pytest.raises(TypeError, match="<: the other operand must be a ShardedArray or a number, got str"):
        a < "1"
    with pytest.raises(TypeError, match=">=: the other operand must be a ShardedArray or a number, got list"):
        [1.0] <= a  # reflected: a >= [1.0]
    with pytest.raises(TypeError, match="==: the other operand must be a ShardedArray or a number, got NoneType"):
        a == None  # noqa: E711 - what is refused
    with pytest.raises(TypeError, match="comparisons take arrays of numbers, not records"):
        stand_in_array(group, [3, 3], POINT) > 0.5
    with pytest.raises(TypeError, match="not records"):
        a != stand_in_array(group, [3, 3], POINT)
    with pytest.raises(TypeError, match="compares float32 with complex64 in complex64"):
        a < np.complex64(1)
    with pytest.raises(TypeError, match="compares float32 with float128 in float128"):
        a < np.longdouble(1)
    with pytest.raises(TypeError, match=r"does not index on the host; .*astype\(bool\)"):
        a[stand_in_array(group, [3, 3], np.uint32)]


def test_truth_value_is_numpy_s(host_run):
    group = stand_in_group(1)
    with pytest.raises(ValueError, match="truth value of a ShardedArray of 3 elements is ambiguous"):
        bool(_host_array(group, np.ones(3, np.float32)))
    with pytest.raises(ValueError, match="empty ShardedArray is ambiguous"):
        if _host_array(group, np.ones(0, np.float32)):
            pass
    assert bool(_host_array(group, np.array([2.5], np.float32))) is True
    assert not _host_array(group, np.array([0], np.uint32))
    assert len(_host_array(group, np.ones(3, np.float32))) == 3


def test_arrays_keep_their_identity_and_are_unhashable():
    group = stand_in_group(2)
    a, b = stand_in_array(group, [3, 3]), stand_in_array(group, [3, 3])
    assert a is not b and a in [a, b] and [a, b].index(a) == 0  # found by identity, nothing compared
    with pytest.raises(TypeError, match="unhashable"):
        {a: 1}


@pytest.mark.parametrize("left", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("right", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_arithmetic_of_mixed_dtypes_is_computed_in_numpy_s_dtype(host_run, left, right):
    x, y = sample(left, 40, seed=5), sample(right, 40, seed=6)
    y = np.where(y == 0, 1, y).astype(right)
    group = stand_in_group(3)
    a, b = _host_array(group, x), _host_array(group, y)
    with np.errstate(all="ignore"):
        for result, expected in [(a + b, x + y), (a - b, x - y), (a * b, x * y), (a / b, x / y),
                                 (a + 3, x + 3), (2.5 * a, 2.5 * x), (a - np.float32(1.5), x - np.float32(1.5)),
                                 (np.int8(2) * b, np.int8(2) * y), (b ** 2, y ** 2)]:
            assert result.dtype == expected.dtype
            np.testing.assert_array_equal(result._impl.data, expected)


def test_in_place_forms_compute_in_numpy_s_dtype_then_cast(host_run):
    group = stand_in_group(3)
    x, y = sample(np.float32, 30, seed=7), sample(np.float64, 30, seed=8)
    a, b = _host_array(group, x.copy()), _host_array(group, y)
    same = a
    a += b
    a *= 2
    assert a is same and a.dtype == np.float32
    expected = x.copy()
    expected += y
    expected *= 2
    np.testing.assert_array_equal(a._impl.data, expected)


# ---- comparisons and mixed dtypes on the GPU -------------------------------------------------

def _pairs(left, right):
    x_values, y_values = _edge_values(left), _edge_values(right)
    return np.repeat(x_values, len(y_values)), np.tile(y_values, len(x_values))


@pytest.mark.gpu
@pytest.mark.parametrize("left", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("right", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_comparisons_of_two_arrays_match_numpy_on_the_gpu(places, left, right):
    x, y = _pairs(left, right)
    a, b = sharded.ShardedArray.from_numpy(places, x), sharded.ShardedArray.from_numpy(places, y)
    for name, compare in COMPARISONS.items():
        result = compare(a, b)
        assert result.dtype == np.uint32 and result.shard_sizes == a.shard_sizes
        np.testing.assert_array_equal(result.to_numpy(), compare(x, y).astype(np.uint32), err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_comparisons_with_scalars_match_numpy_on_the_gpu(places, dtype):
    x = _edge_values(dtype)
    a = sharded.ShardedArray.from_numpy(places, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 1e300 as float32 overflows, in numpy as here
        for scalar in _PYTHON_SCALARS + _NUMPY_SCALARS:
            for name, compare in COMPARISONS.items():
                np.testing.assert_array_equal(compare(a, scalar).to_numpy(), compare(x, scalar).astype(np.uint32),
                                              err_msg=f"a {name} {scalar!r}")
                np.testing.assert_array_equal(compare(scalar, a).to_numpy(), compare(scalar, x).astype(np.uint32),
                                              err_msg=f"{scalar!r} {name} a")


@pytest.mark.gpu
def test_comparison_results_are_flags_the_library_takes(places):
    x = sample(np.float32, 3001, seed=9)
    a = sharded.ShardedArray.from_numpy(places, x)
    above = a > 0.5
    assert int(above.sum()) == int((x > 0.5).sum())
    assert (above.max() == 1) == bool((x > 0.5).any())
    np.testing.assert_array_equal(a[above.to_numpy().astype(bool)], x[x > 0.5])
    assert bool(sharded.ShardedArray.from_numpy(places, np.array([3.0])) > 2)
    a == a
    entries = sharded.cache_info()["memory_entries"]
    for value in (0.25, 0.75, -1.0, np.float32(2)):  # new values, the same two kernels
        a > value
        a == a
    assert sharded.cache_info()["memory_entries"] == entries


@pytest.mark.gpu
@pytest.mark.parametrize("left", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("right", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_arithmetic_of_mixed_dtypes_matches_numpy_on_the_gpu(places, left, right):
    x, y = sample(left, 2001, seed=10), sample(right, 2001, seed=11)
    y = np.where(y == 0, 1, y).astype(right)  # no division by zero
    a, b = sharded.ShardedArray.from_numpy(places, x), sharded.ShardedArray.from_numpy(places, y)
    for result, expected in [(a + b, x + y), (a - b, x - y), (a * b, x * y), (a / b, x / y),
                             (a - np.float32(1.5), x - np.float32(1.5)), (np.int8(2) * b, np.int8(2) * y)]:
        assert result.dtype == expected.dtype
        np.testing.assert_allclose(result.to_numpy(), expected, rtol=1e-6 if expected.dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("name, left, right, scalar", [
    ("lt", np.float32, np.float32, False),   # one dtype: the plain compare
    ("le", np.int32, np.float32, False),     # both cast to float64
    ("eq", np.int32, np.uint32, False),      # both cast to int64
    ("gt", np.int64, np.uint64, False),      # exact, NumPy's mixed loop
    ("ne", np.uint64, np.int64, False),      # the same, operands swapped
    ("ge", np.int32, float, True),           # a Python float: float64
])
def test_comparison_operators_compile_inlined_for_sm_90(host_run, name, left, right, scalar):
    """What the GPU runs, built here with no GPU: every kind of operator the comparisons choose
    links for sm_90, inlined (no CALL), writing uint32 flags."""
    group = stand_in_group(1)
    a = _host_array(group, np.ones(3, left))
    other = 1.5 if scalar else _host_array(group, np.ones(3, right))
    COMPARISONS[name](a, other)
    op, _, kinds = host_run[-1]
    kernel = sharded.compile(op, "transform", tuple(dtype for _, dtype in kinds), arch="sm_90",
                             scalars=tuple(i for i, (kind, _) in enumerate(kinds) if kind == "scalar"),
                             out_dtype=np.uint32)
    assert kernel.out_dtype == np.uint32 and "CALL" not in kernel.sass()
