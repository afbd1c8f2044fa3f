"""The NumPy-named constructors against numpy: values, dtypes, shard sizes; the argument errors
come before anything is allocated (no GPU needed for those)."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import ALL_DTYPES
from test_errors import shim_untouched, stand_in_array, stand_in_group  # noqa: F401 (fixture)


class _DeviceBuffer:
    __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (0, False), "version": 3}


def test_constructor_errors_come_first(shim_untouched):
    group = stand_in_group(2)
    with pytest.raises(ValueError, match="n: must be >= 0"):
        sharded.empty(group, -1)
    with pytest.raises(TypeError, match="n: expected an int"):
        sharded.zeros(group, 2.5)
    with pytest.raises(ValueError, match="sizes: \\[3, 3\\] add up to 6, not n = 5"):
        sharded.empty(group, 5, sizes=[3, 3])
    with pytest.raises(ValueError, match="step: must not be zero"):
        sharded.arange(group, 0, 10, 0)
    with pytest.raises(TypeError, match="start: expected a number"):
        sharded.arange(group, "10")
    with pytest.raises(TypeError, match="value: expected a number"):
        sharded.full(group, 3, [1.0, 2.0])
    with pytest.raises(ValueError, match="num: must be >= 0"):
        sharded.linspace(group, 0.0, 1.0, -2)
    with pytest.raises(TypeError, match="ShardedArray.adopt"):
        sharded.asarray(group, _DeviceBuffer())
    with pytest.raises(TypeError, match="contiguous: expected a bool"):
        sharded.empty(group, 4, contiguous="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_filled_constructors(places, dtype):
    for made, expected in [(sharded.zeros(places, 1001, dtype), np.zeros(1001, dtype)),
                           (sharded.ones(places, 1001, dtype), np.ones(1001, dtype)),
                           (sharded.full(places, 1001, 7, dtype), np.full(1001, 7, dtype))]:
        assert made.dtype == expected.dtype and len(made) == 1001
        np.testing.assert_array_equal(made.to_numpy(), expected)
    like = sharded.full_like(sharded.zeros(places, 500, dtype, sizes=None), 3)
    np.testing.assert_array_equal(like.to_numpy(), np.full(500, 3, dtype))


@pytest.mark.gpu
def test_full_takes_numpys_dtype_and_cast(places):
    assert sharded.full(places, 4, 2).dtype == np.int64
    assert sharded.full(places, 4, 2.5).dtype == np.float64
    np.testing.assert_array_equal(sharded.full(places, 4, 0.1, np.float32).to_numpy(), np.full(4, 0.1, np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("arguments", [(10,), (3, 20), (3, 20, 4), (0.5, 7.25, 0.75), (10, 0, -3), (5, 5)])
def test_arange_matches_numpy(places, arguments):
    made, expected = sharded.arange(places, *arguments), np.arange(*arguments)
    assert made.dtype == expected.dtype and len(made) == len(expected)
    np.testing.assert_allclose(made.to_numpy(), expected, rtol=1e-15)


@pytest.mark.gpu
@pytest.mark.parametrize("num", [0, 1, 2, 7, 1000])
def test_linspace_matches_numpy(places, num):
    made = sharded.linspace(places, -1.5, 2.0, num)
    expected = np.linspace(-1.5, 2.0, num)
    np.testing.assert_allclose(made.to_numpy(), expected, rtol=1e-15, atol=1e-15)
    if num > 1:
        assert made.to_numpy()[-1] == 2.0
    np.testing.assert_allclose(sharded.linspace(places, 0, 1, num, np.float32).to_numpy(),
                               np.linspace(0, 1, num, dtype=np.float32), rtol=1e-6)


@pytest.mark.gpu
def test_explicit_sizes_contiguous_and_asarray(places):
    sizes = [0] * (len(places) - 1) + [9]
    a = sharded.arange(places, 9, sizes=sizes)
    assert a.shard_sizes == tuple(sizes)
    np.testing.assert_array_equal(a.to_numpy(), np.arange(9))
    b = sharded.zeros(places, 64, np.float32, contiguous=True)
    assert b.is_contiguous
    assert sharded.asarray(places, a) is a
    np.testing.assert_array_equal(sharded.asarray(places, [1, 2, 3], dtype=np.float32).to_numpy(),
                                  np.array([1, 2, 3], np.float32))
    even = sharded.asarray(places, a, sizes=sharded.zeros(places, 9).shard_sizes)
    np.testing.assert_array_equal(even.to_numpy(), np.arange(9))
    assert sharded.asarray(places, a, dtype=np.float64).dtype == np.float64
    assert sharded.empty_like(a, np.float32).shard_sizes == a.shard_sizes
