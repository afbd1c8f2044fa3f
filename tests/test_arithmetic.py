"""ShardedArray's operators and NumPy-style methods against numpy: result dtypes (NumPy's
promotion), values on the GPU, in-place forms, and the errors that come before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit.algorithms.arithmetic import result_dtype

from conftest import ALL_DTYPES, sample
from test_errors import shim_untouched, stand_in_array, stand_in_group  # noqa: F401 (fixture)

POINT = np.dtype([("x", np.float32), ("y", np.float32)], align=True)


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
