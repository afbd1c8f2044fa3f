"""GPU tests of reduce, transform_reduce, count_if against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import ALL_DTYPES, cupy_or_skip, sample

pytestmark = pytest.mark.gpu

SIZES = [[0, 0, 0], [1, 0, 0], [0, 5000, 1], [1 << 16, 3, (1 << 17) + 5], [700001, 0, 299999]]


def _host(dtype, n, seed=0):
    return sample(dtype, n, seed)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_builtin_sum_min_max(group, dtype):
    host = _host(dtype, 1_000_003)
    array = sharded.ShardedArray.from_numpy(group, host)
    total = sharded.sum(array)
    assert total.dtype == np.dtype(dtype)
    if np.dtype(dtype).kind == "f":
        np.testing.assert_allclose(total, host.astype(np.float64).sum(), rtol=1e-4)
    else:
        assert total == host.sum(dtype=dtype)
    assert sharded.min(array) == host.min()
    assert sharded.max(array) == host.max()


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_user_operators(three_places, dtype):
    host = _host(dtype, 300_007, seed=3)
    array = sharded.ShardedArray.from_numpy(three_places, host)
    add = sharded.reduce(array, lambda x, y: x + y)
    if np.dtype(dtype).kind == "f":
        np.testing.assert_allclose(add, host.astype(np.float64).sum(), rtol=1e-4)
    else:
        assert add == host.sum(dtype=dtype)
    assert sharded.reduce(array, lambda x, y: x if x < y else y) == host.min()
    assert sharded.reduce(array, lambda x, y: x if x > y else y) == host.max()
    if np.dtype(dtype).kind != "u":
        expected = np.abs(host).max()
        assert sharded.reduce(array, lambda x, y: max(abs(x), abs(y))) == expected


@pytest.mark.parametrize("sizes", SIZES)
def test_uneven_and_empty_shards(three_places, sizes):
    host = _host(np.int64, sum(sizes), seed=5)
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=sizes)
    assert sharded.reduce(array, lambda x, y: x + y, init=7) == host.sum() + 7
    assert sharded.sum(array) == host.sum()
    if host.size == 0:
        with pytest.raises(ValueError, match="empty"):
            sharded.reduce(array, lambda x, y: x + y)
        with pytest.raises(ValueError, match="empty"):
            sharded.min(array)
        assert sharded.reduce(array, "max", init=-3) == -3
    else:
        assert sharded.reduce(array, lambda x, y: x + y) == host.sum()


def test_init_values_and_accumulator_type(three_places):
    host = np.full(1000, 0.1, dtype=np.float32)
    array = sharded.ShardedArray.from_numpy(three_places, host)
    weak = sharded.reduce(array, lambda x, y: x + y, init=1.0)  # Python float: stays float32
    assert weak.dtype == np.float32
    wide = sharded.reduce(array, lambda x, y: x + y, init=np.float64(1.0))
    assert wide.dtype == np.float64
    np.testing.assert_allclose(wide, 1.0 + host.astype(np.float64).sum(), rtol=1e-9)
    assert sharded.reduce(array, "sum", init=np.float64(0)).dtype == np.float64


# 2x2 integer matrices packed in one int64 (four 16-bit fields, entries stay small mod 2^16):
# associative, not commutative.
def _matmul_packed(a, b):
    a00, a01, a10, a11 = a & 0xFFFF, (a >> 16) & 0xFFFF, (a >> 32) & 0xFFFF, (a >> 48) & 0xFFFF
    b00, b01, b10, b11 = b & 0xFFFF, (b >> 16) & 0xFFFF, (b >> 32) & 0xFFFF, (b >> 48) & 0xFFFF
    c00 = (a00 * b00 + a01 * b10) & 0xFFFF
    c01 = (a00 * b01 + a01 * b11) & 0xFFFF
    c10 = (a10 * b00 + a11 * b10) & 0xFFFF
    c11 = (a10 * b01 + a11 * b11) & 0xFFFF
    return c00 | (c01 << 16) | (c10 << 32) | (c11 << 48)


def _matrices(n, seed):
    rng = np.random.default_rng(seed)
    entries = rng.integers(0, 4, size=(n, 4)).astype(np.int64)
    return entries[:, 0] | (entries[:, 1] << 16) | (entries[:, 2] << 32) | (entries[:, 3] << 48)


def test_non_commutative_operator_follows_global_order(three_places):
    host = _matrices(50_001, seed=11)
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=[20_000, 1, 30_000])
    expected = host[0]
    for value in host[1:]:
        expected = _matmul_packed(int(expected), int(value))
    assert int(sharded.reduce(array, _matmul_packed)) == expected
    # "take the right one": the last element
    assert sharded.reduce(array, lambda x, y: y) == host[-1]
    assert sharded.reduce(array, lambda x, y: x) == host[0]


def _affine_packed(a, b):
    """x -> a1 x + b1, then x -> a2 x + b2 (16-bit coefficients): associative, not commutative."""
    a1, b1, a2, b2 = a & 0xFFFF, (a >> 16) & 0xFFFF, b & 0xFFFF, (b >> 16) & 0xFFFF
    return ((a2 * a1) & 0xFFFF) | (((a2 * b1 + b2) & 0xFFFF) << 16)


# around the 16-byte vectors, the 32 of a warp step and the warp and block tiles of 4- and 8-byte items
SMALL_SIZES = [1, 2, 3, 4, 5, 7, 31, 33, 127, 128, 129, 131, 255, 257, 300, 511, 513, 1023, 1024, 1029,
               2047, 2049, 4095, 4097, 4103, 8199]


def test_small_ranges_keep_element_order(one_place, three_places):
    """Ranges under a warp tile are loaded as vectors: a non-commutative fold of every length,
    and indices (argmin) at every position class, must still follow the global order."""
    rng = np.random.default_rng(12)
    for n in SMALL_SIZES:
        affine = (rng.integers(0, 1 << 16, n) | (rng.integers(0, 1 << 16, n) << 16)).astype(np.int32)
        matrices = _matrices(n, seed=n)
        expected32, expected64 = int(affine[0]) & 0xFFFFFFFF, int(matrices[0])
        for value in affine[1:]:
            expected32 = _affine_packed(expected32, int(value) & 0xFFFFFFFF)
        for value in matrices[1:]:
            expected64 = _matmul_packed(expected64, int(value))
        floats = rng.integers(0, 20, n).astype(np.float32)  # ties of the minimum
        for group in (one_place, three_places):
            reduced = sharded.reduce(sharded.ShardedArray.from_numpy(group, affine), _affine_packed)
            assert int(reduced) & 0xFFFFFFFF == expected32, n
            reduced = sharded.reduce(sharded.ShardedArray.from_numpy(group, matrices), _matmul_packed)
            assert int(reduced) & 0xFFFFFFFFFFFFFFFF == expected64, n
            array = sharded.ShardedArray.from_numpy(group, floats)
            assert sharded.argmin(array) == int(np.argmin(floats)), n
            assert sharded.argmax(array) == int(np.argmax(floats)), n


def test_deterministic(group):
    host = sample(np.float32, 4_000_037, seed=9)
    array = sharded.ShardedArray.from_numpy(group, host)
    first = sharded.reduce(array, lambda x, y: x + y)
    for _ in range(3):
        assert sharded.reduce(array, lambda x, y: x + y).tobytes() == first.tobytes()
    assert sharded.sum(array).tobytes() == sharded.sum(array).tobytes()


def test_host_results_of_every_width_in_a_row(one_place):
    """Results of 4 to 32 bytes, one after another on one place, from one block and from
    many: each call's words must not be taken for an earlier, wider result's."""
    small = sample(np.float64, 1000, seed=21)
    large = sample(np.float64, 300_001, seed=22)

    def four(x):
        return (x, x * x, -x, 1.0)

    def three(x):
        return (x, x * x, -x)

    def add4(p, q):
        return (p[0] + q[0], p[1] + q[1], p[2] + q[2], p[3] + q[3])

    def add3(p, q):
        return (p[0] + q[0], p[1] + q[1], p[2] + q[2])

    for _ in range(3):
        for host in (small, large):
            a64 = sharded.ShardedArray.from_numpy(one_place, host)
            a32 = sharded.ShardedArray.from_numpy(one_place, host.astype(np.float32))
            wide = sharded.transform_reduce(a64, four, add4, None)
            np.testing.assert_allclose(wide, [host.sum(), (host * host).sum(), -host.sum(), host.size],
                                       rtol=1e-9)
            assert sharded.reduce(a32, lambda x, y: x if x > y else y) == host.astype(np.float32).max()
            twelve = sharded.transform_reduce(a32, three, add3, None)
            assert all(value.dtype == np.float32 for value in twelve)
            narrow = host.astype(np.float32).astype(np.float64)
            np.testing.assert_allclose(twelve, [narrow.sum(), (narrow * narrow).sum(), -narrow.sum()],
                                       rtol=1e-3, atol=1e-2)
            assert sharded.reduce(a64, lambda x, y: x if x < y else y) == host.min()


def test_transform_reduce(three_places):
    host = sample(np.float64, 123_457, seed=2)
    host[::1000] = np.nan
    array = sharded.ShardedArray.from_numpy(three_places, host)
    clean = np.nan_to_num(host)
    finite = sharded.ShardedArray.from_numpy(three_places, clean)
    squares = sharded.transform_reduce(finite, lambda x: x * x, lambda x, y: x + y, 0.0)
    np.testing.assert_allclose(np.sqrt(squares), np.linalg.norm(clean), rtol=1e-12)
    nans = sharded.transform_reduce(array, lambda x: 1 if x != x else 0, lambda x, y: x + y, 0)
    assert nans == np.isnan(host).sum()
    as_int = sharded.transform_reduce(finite, lambda x: x, "max", np.float32(-1e30))
    assert as_int.dtype == np.float32


def test_count_if(three_places):
    host = sample(np.int32, 77_777, seed=4)
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=[0, 77_000, 777])
    assert sharded.count_if(array, lambda x: x > 100) == int((host > 100).sum())
    empty = sharded.ShardedArray.allocate(three_places, 0, np.int32)
    assert sharded.count_if(empty, lambda x: x > 100) == 0


def test_contiguous_and_adopted(three_places):
    host = sample(np.int64, 10_001, seed=6)
    contiguous = sharded.ShardedArray.from_numpy(three_places, host, contiguous=True)
    assert sharded.reduce(contiguous, lambda x, y: x + y) == host.sum()
    cp = cupy_or_skip()
    adopted = sharded.ShardedArray.adopt(three_places, [cp.asarray(part) for part in np.array_split(host, 3)])
    assert sharded.reduce(adopted, lambda x, y: x + y) == host.sum()


def test_errors(three_places):
    array = sharded.ShardedArray.allocate(three_places, 10, np.float32)
    with pytest.raises(TypeError, match="takes 1 argument, but reduce passes 2"):
        sharded.reduce(array, lambda x: x)
    with pytest.raises(ValueError, match="op: expected an operator or one of"):
        sharded.reduce(array, "product")
    with pytest.raises(TypeError, match="a: expected a ShardedArray"):
        sharded.reduce(np.zeros(3), "sum")
