"""sharded.top_k against a numpy reference: every dtype, ties, NaNs and -0.0, any number of
places and shard sizes, and each argument error (those on the CPU, with stand-in arrays)."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim

from conftest import ALL_DTYPES, DEVICE_COUNT, uneven
from test_errors import stand_in_array, stand_in_group
from test_sort import keys


def reference(host: np.ndarray, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """The k best of `host` with their indices, by a stable order of dense ranks: np.unique
    ranks NaN above every number (all NaNs one rank) and -0.0 with 0.0, and ranks negate
    safely where unsigned values would not."""
    rank = np.unique(host, return_inverse=True)[1].reshape(-1).astype(np.int64)
    order = np.lexsort((np.arange(host.size), -rank if largest else rank))[:k]
    return host[order], order.astype(np.int64)


def check(array, host: np.ndarray, k: int, largest: bool) -> None:
    values, indices = sharded.top_k(array, k, largest=largest)
    expected_values, expected_indices = reference(host, k, largest)
    assert values.dtype == host.dtype and indices.dtype == np.int64
    assert values.shape == indices.shape == (k,)
    np.testing.assert_array_equal(indices, expected_indices)
    np.testing.assert_array_equal(values, expected_values)
    # the elements themselves, bit for bit: -0.0 stays -0.0, NaN payloads stay
    assert values.tobytes() == host[expected_indices].tobytes()


# ---- GPU: values against numpy ------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("distribution", ["uniform", "sorted", "reverse", "equal", "few"])
@pytest.mark.parametrize("largest", [True, False])
def test_top_k_matches_numpy(places, dtype, distribution, largest):
    n = 20011
    host = keys(dtype, distribution, n, seed=len(places))
    array = sharded.ShardedArray.from_numpy(places, host)
    for k in (1, 37, 4096, n):
        check(array, host, k, largest)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("largest", [True, False])
def test_top_k_nans_infinities_and_signed_zeros(places, dtype, largest):
    host = keys(dtype, "special", 30000, seed=7)
    array = sharded.ShardedArray.from_numpy(places, host)
    for k in (1, 5, 3000, 12000, host.size):
        check(array, host, k, largest)


@pytest.mark.gpu
@pytest.mark.parametrize("largest", [True, False])
def test_top_k_ties_go_to_the_lower_index(places, largest):
    # zeros of both signs, and one value repeated: the tie order is the index order
    host = np.zeros(10000, np.float32)
    host[::3] = -0.0
    host[5000:] = 1.5
    array = sharded.ShardedArray.from_numpy(places, host)
    for k in (1, 2, 4999, 5000, 5001, 10000):
        check(array, host, k, largest)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint32])
def test_top_k_refines_large_buckets(places, dtype):
    # values crowded in a narrow range keep the boundary bucket large for several passes
    rng = np.random.default_rng(3)
    n = 1 << 20
    if np.dtype(dtype).kind == "f":
        host = rng.random(n, dtype=np.float32)  # [0, 1): an eighth of them share the top digit
    else:
        base = np.iinfo(dtype).max // 2
        host = (base + rng.integers(0, 1 << 20, n)).astype(dtype)
    array = sharded.ShardedArray.from_numpy(places, host)
    for k in (1, 1024, 100000):
        for largest in (True, False):
            check(array, host, k, largest)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_top_k_of_many_equal_elements_selects_by_index(places, dtype):
    # more equal elements than one bucket gathers whole: the selection goes on by index
    host = np.full(200003, 7, dtype)
    host[123456] = 9
    host[99] = 5
    array = sharded.ShardedArray.from_numpy(places, host)
    for k in (2, 50000, 200002):
        for largest in (True, False):
            check(array, host, k, largest)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [[0, 0, 0, 7], [1, 0, 0, 1], [0, 5000, 0, 3], [4096, 1, 9000, 0],
                                   [3, 3, 3, 20000], [20000, 0, 0, 0], [1, 1, 1, 1]])
@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.uint64])
def test_top_k_explicit_and_empty_shards(sizes, dtype):
    group = sharded.PlaceGroup.by_devices([place % max(DEVICE_COUNT, 1) for place in range(4)])
    n = sum(sizes)
    host = keys(dtype, "few" if n > 100 else "uniform", n, seed=n)
    array = sharded.ShardedArray.from_numpy(group, host, sizes=sizes)
    for k in sorted({0, 1, min(2, n), n // 2, n}):
        for largest in (True, False):
            check(array, host, k, largest)


@pytest.mark.gpu
def test_top_k_uneven_shards(places):
    n = 50021
    host = keys(np.int64, "uniform", n, seed=11)
    array = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, n))
    for k in (1, 500, n):
        check(array, host, k, True)
        check(array, host, k, False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.uint64])
def test_top_k_contiguous(places, dtype):
    host = keys(dtype, "uniform", 100003, seed=9)
    array = sharded.ShardedArray.from_numpy(places, host, contiguous=True)
    assert array.is_contiguous
    for k in (3, 2048):
        check(array, host, k, True)
        check(array, host, k, False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_top_k_of_zero_and_of_all(places, dtype):
    host = keys(dtype, "uniform", 1000, seed=2)
    array = sharded.ShardedArray.from_numpy(places, host)
    values, indices = sharded.top_k(array, 0)
    assert values.shape == indices.shape == (0,)
    assert values.dtype == host.dtype and indices.dtype == np.int64
    check(array, host, 1000, True)
    check(array, host, 1000, False)
    np.testing.assert_array_equal(array.to_numpy(), host)  # the input is left as it was


@pytest.mark.gpu
def test_top_k_of_an_empty_array(places):
    array = sharded.ShardedArray.allocate(places, 0, np.float32)
    values, indices = sharded.top_k(array, 0)
    assert values.size == indices.size == 0
    with pytest.raises(ValueError, match=r"k: expected 0 <= k <= len\(a\) = 0, got 1"):
        sharded.top_k(array, 1)


@pytest.mark.gpu
def test_top_k_repeated_calls_agree(places):
    host = keys(np.float32, "few", 70000, seed=4)
    array = sharded.ShardedArray.from_numpy(places, host)
    first = sharded.top_k(array, 6000)
    for _ in range(3):
        again = sharded.top_k(array, 6000)
        np.testing.assert_array_equal(again[1], first[1])
    check(array, host, 6000, True)


@pytest.mark.gpu
def test_top_k_after_sort_without_waiting(places):
    # the sort returns before its merges end: top_k runs on the same streams, after them
    host = keys(np.int32, "uniform", 200000, seed=6)
    array = sharded.ShardedArray.from_numpy(places, host)
    sharded.sort(array)
    check(array, np.sort(host), 777, True)


@pytest.mark.gpu
def test_top_k_of_a_freed_array(one_place):
    array = sharded.ShardedArray.from_numpy(one_place, np.arange(5, dtype=np.float32))
    array.free()
    with pytest.raises(ValueError, match="a: the array was freed"):
        sharded.top_k(array, 2)


# ---- CPU: argument errors, before anything runs -----------------------------------------

class _Reached(Exception):
    pass


@pytest.fixture
def shim_top_k(monkeypatch):
    """Replaces _shim.top_k: it records its arguments and raises _Reached."""
    calls = []

    def stand_in(*args):
        calls.append(args)
        raise _Reached

    monkeypatch.setattr(_shim, "top_k", stand_in)
    return calls


@pytest.mark.parametrize("k, error, message", [
    (True, TypeError, "k: expected an int, got bool"),
    (2.0, TypeError, "k: expected an int, got float"),
    ("2", TypeError, "k: expected an int, got str"),
    (None, TypeError, "k: expected an int, got NoneType"),
    (-1, ValueError, r"k: expected 0 <= k <= len\(a\) = 10, got -1"),
    (11, ValueError, r"k: expected 0 <= k <= len\(a\) = 10, got 11"),
])
def test_top_k_refuses_bad_k(shim_top_k, k, error, message):
    with pytest.raises(error, match=message):
        sharded.top_k(stand_in_array(stand_in_group()), k)
    assert shim_top_k == []


def test_top_k_refuses_bad_arrays_and_flags(shim_top_k):
    group = stand_in_group()
    with pytest.raises(TypeError, match="a: expected a ShardedArray, got ndarray"):
        sharded.top_k(np.arange(10), 3)
    record = np.dtype([("x", np.float32), ("y", np.float32)], align=True)
    with pytest.raises(TypeError, match="a: top_k takes arrays of numbers, not records"):
        sharded.top_k(stand_in_array(group, dtype=record), 3)
    with pytest.raises(TypeError, match="largest: expected True or False, got int"):
        sharded.top_k(stand_in_array(group), 3, largest=1)
    assert shim_top_k == []


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_top_k_passes_numpy_buffers_of_k(shim_top_k, dtype):
    array = stand_in_array(stand_in_group(), dtype=dtype)
    with pytest.raises(_Reached):
        sharded.top_k(array, np.int64(4), largest=np.False_)
    (_, k, largest, _, value_bytes, _, index_bytes), = shim_top_k
    assert (k, largest) == (4, False) and type(k) is int and type(largest) is bool
    assert value_bytes == 4 * np.dtype(dtype).itemsize and index_bytes == 4 * 8
