"""sharded.searchsorted against np.searchsorted: every dtype, both sides, NaNs and -0.0, numpy
and ShardedArray queries (on the sorted array's group or another), any number of places and
shard sizes, and each argument error (those on the CPU, with stand-in arrays). With a
comparator (compare=): descending and abs orders and records by a field, against
np.searchsorted of the same order's keys."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim

from conftest import ALL_DTYPES, DEVICE_COUNT, cupy_or_skip, uneven
from test_errors import stand_in_array, stand_in_group

SIDES = ["left", "right"]


def values_of(dtype, distribution: str, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        uniform = (rng.standard_normal(n) * 100).astype(dtype)
    else:
        info = np.iinfo(dtype)
        uniform = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    if distribution == "uniform":
        return uniform
    if distribution == "few":  # long runs of equal elements, across shard boundaries
        return rng.choice(uniform[:5] if n >= 5 else np.zeros(1, dtype), n).astype(dtype)
    if distribution == "equal":
        return np.full(n, uniform[0] if n else 0, dtype)
    if distribution == "special":
        assert dtype.kind == "f"
        specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, np.finfo(dtype).max,
                             np.finfo(dtype).min], dtype)
        mixed = uniform.copy()
        where = rng.random(n) < 0.3
        mixed[where] = rng.choice(specials, int(where.sum()))
        return mixed
    raise ValueError(distribution)


def queries_for(ordered: np.ndarray, dtype, count: int, seed: int) -> np.ndarray:
    """Random values, every kind of element of the array itself, and the dtype's extremes."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    random = values_of(dtype, "special" if dtype.kind == "f" else "uniform", count, seed)
    present = rng.choice(ordered, count) if ordered.size else np.zeros(0, dtype)
    extremes = (np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype) if dtype.kind == "f"
                else np.array([np.iinfo(dtype).min, np.iinfo(dtype).max, 0], dtype))
    return np.concatenate([random, present.astype(dtype), extremes, ordered[:3], ordered[-3:]])


def check_numpy_queries(array, ordered: np.ndarray, queries: np.ndarray) -> None:
    for side in SIDES:
        got = sharded.searchsorted(array, queries, side=side)
        assert isinstance(got, np.ndarray) and got.dtype == np.int64 and got.shape == queries.shape
        np.testing.assert_array_equal(got, np.searchsorted(ordered, queries, side=side))


# ---- GPU: numpy queries -------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("distribution", ["uniform", "few", "equal"])
def test_searchsorted_matches_numpy(places, dtype, distribution):
    ordered = np.sort(values_of(dtype, distribution, 30011, seed=len(places)))
    array = sharded.ShardedArray.from_numpy(places, ordered)
    check_numpy_queries(array, ordered, queries_for(ordered, dtype, 5000, seed=3))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_searchsorted_nans_infinities_and_signed_zeros(places, dtype):
    host = values_of(dtype, "special", 20000, seed=5)
    ordered = np.sort(host)  # NaNs of both signs last, -0.0 and 0.0 mixed
    check_numpy_queries(sharded.ShardedArray.from_numpy(places, ordered), ordered,
                        queries_for(ordered, dtype, 3000, seed=8))
    # sorted by sharded.sort: every NaN rewritten as the positive quiet NaN
    array = sharded.sort(sharded.ShardedArray.from_numpy(places, host))
    check_numpy_queries(array, ordered, queries_for(ordered, dtype, 3000, seed=9))


@pytest.mark.gpu
def test_searchsorted_large_sorted_array(places):
    # 2^22 elements: the table's samples are 1024 elements apart, the search goes below them
    rng = np.random.default_rng(1)
    ordered = np.sort(rng.random(1 << 22, dtype=np.float32))
    array = sharded.ShardedArray.from_numpy(places, ordered)
    queries = np.concatenate([rng.random(1 << 16, dtype=np.float32), ordered[::997]])
    check_numpy_queries(array, ordered, queries)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [[0, 0, 0, 7], [1, 0, 0, 1], [0, 5000, 0, 3], [4096, 1, 9000, 0],
                                   [3, 3, 3, 20000], [1, 1, 1, 1], [0, 0, 0, 0]])
@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.uint64])
def test_searchsorted_explicit_and_empty_shards(sizes, dtype):
    group = sharded.PlaceGroup.by_devices([place % max(DEVICE_COUNT, 1) for place in range(4)])
    n = sum(sizes)
    ordered = np.sort(values_of(dtype, "few" if n > 100 else "uniform", n, seed=n))
    array = sharded.ShardedArray.from_numpy(group, ordered, sizes=sizes)
    check_numpy_queries(array, ordered, queries_for(ordered, dtype, 500, seed=n + 1))


@pytest.mark.gpu
def test_searchsorted_uneven_and_contiguous(places):
    n = 40009
    ordered = np.sort(values_of(np.int64, "uniform", n, seed=12))
    queries = queries_for(ordered, np.int64, 4000, seed=13)
    check_numpy_queries(sharded.ShardedArray.from_numpy(places, ordered, sizes=uneven(places, n)), ordered,
                        queries)
    contiguous = sharded.ShardedArray.from_numpy(places, ordered, contiguous=True)
    assert contiguous.is_contiguous
    check_numpy_queries(contiguous, ordered, queries)


@pytest.mark.gpu
def test_searchsorted_query_shapes_and_casts(three_places):
    ordered = np.sort(values_of(np.float32, "uniform", 1000, seed=2))
    array = sharded.ShardedArray.from_numpy(three_places, ordered)
    grid = np.linspace(-300, 300, 24).reshape(4, 6)  # float64, cast to float32
    for side in SIDES:
        got = sharded.searchsorted(array, grid, side=side)
        assert got.shape == (4, 6)
        np.testing.assert_array_equal(got, np.searchsorted(ordered, grid.astype(np.float32), side=side))
        scalar = sharded.searchsorted(array, 0.5, side=side)
        assert isinstance(scalar, np.int64)
        assert scalar == np.searchsorted(ordered, np.float32(0.5), side=side)
        listed = sharded.searchsorted(array, [1, -1, 2], side=side)  # ints, cast to float32
        np.testing.assert_array_equal(listed, np.searchsorted(ordered, np.float32([1, -1, 2]), side=side))
    empty = sharded.searchsorted(array, np.zeros((0, 3), np.float32))
    assert empty.shape == (0, 3) and empty.dtype == np.int64
    ints = sharded.ShardedArray.from_numpy(three_places, np.arange(10, dtype=np.int32))
    np.testing.assert_array_equal(sharded.searchsorted(ints, np.array([3, 20], np.int64)), [3, 10])


@pytest.mark.gpu
def test_searchsorted_into_an_empty_array(places):
    array = sharded.ShardedArray.allocate(places, 0, np.int32)
    np.testing.assert_array_equal(sharded.searchsorted(array, [1, 2, 3]), [0, 0, 0])
    queries = sharded.ShardedArray.from_numpy(places, np.arange(7, dtype=np.int32))
    np.testing.assert_array_equal(sharded.searchsorted(array, queries, side="right").to_numpy(), np.zeros(7))


# ---- GPU: ShardedArray queries ------------------------------------------------------------

def check_sharded_queries(array, ordered: np.ndarray, queries) -> None:
    host = queries.to_numpy()
    for side in SIDES:
        positions = sharded.searchsorted(array, queries, side=side)
        assert isinstance(positions, sharded.ShardedArray)
        assert positions.dtype == np.int64
        assert positions.group is queries.group and positions.shard_sizes == queries.shard_sizes
        np.testing.assert_array_equal(positions.to_numpy(), np.searchsorted(ordered, host, side=side))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_searchsorted_sharded_queries_on_the_same_group(places, dtype):
    ordered = np.sort(values_of(dtype, "few", 25000, seed=4))
    array = sharded.ShardedArray.from_numpy(places, ordered)
    host = queries_for(ordered, dtype, 9000, seed=5)
    check_sharded_queries(array, ordered, sharded.ShardedArray.from_numpy(places, host))
    check_sharded_queries(array, ordered,
                          sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_searchsorted_sharded_queries_on_other_groups(places, one_place, three_places, dtype):
    ordered = np.sort(values_of(dtype, "uniform", 30001, seed=6))
    array = sharded.ShardedArray.from_numpy(places, ordered)
    host = queries_for(ordered, dtype, 7000, seed=7)
    for group in (one_place, three_places, sharded.PlaceGroup.by_devices(list(reversed(places.devices)))):
        check_sharded_queries(array, ordered, sharded.ShardedArray.from_numpy(group, host))
    sizes = [0, host.size, 0]
    check_sharded_queries(array, ordered, sharded.ShardedArray.from_numpy(three_places, host, sizes=sizes))


@pytest.mark.gpu
def test_searchsorted_right_after_sort(places, one_place):
    # the sort returns before its merges end: the search waits for them on every stream
    host = values_of(np.int32, "uniform", 300007, seed=14)
    ordered = np.sort(host)
    queries = queries_for(ordered, np.int32, 20000, seed=15)
    for group in (places, one_place):
        array = sharded.ShardedArray.from_numpy(places, host)
        sharded.sort(array)
        positions = sharded.searchsorted(array, sharded.ShardedArray.from_numpy(group, queries))
        np.testing.assert_array_equal(positions.to_numpy(), np.searchsorted(ordered, queries))


@pytest.mark.gpu
def test_searchsorted_in_adopted_shards(places):
    # another allocator's memory: read where it lies on its own device, copied elsewhere
    cp = cupy_or_skip()
    ordered = np.sort(values_of(np.float64, "uniform", 20000, seed=16))
    sizes = sharded.ShardedArray.allocate(places, ordered.size, np.float64).shard_sizes
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    buffers = []
    for place, device in enumerate(places.devices):
        with cp.cuda.Device(device):
            buffers.append(cp.asarray(ordered[offsets[place]:offsets[place + 1]]))
            cp.cuda.Device(device).synchronize()
    array = sharded.ShardedArray.adopt(places, buffers)
    queries = queries_for(ordered, np.float64, 3000, seed=17)
    check_numpy_queries(array, ordered, queries)
    one = sharded.PlaceGroup.by_devices([places.devices[-1]])
    check_sharded_queries(array, ordered, sharded.ShardedArray.from_numpy(one, queries))


@pytest.mark.gpu
def test_searchsorted_of_freed_arrays(one_place):
    array = sharded.ShardedArray.from_numpy(one_place, np.arange(5, dtype=np.float32))
    queries = sharded.ShardedArray.from_numpy(one_place, np.arange(3, dtype=np.float32))
    queries.free()
    with pytest.raises(ValueError, match="values: the array was freed"):
        sharded.searchsorted(array, queries)
    array.free()
    with pytest.raises(ValueError, match="sorted_a: the array was freed"):
        sharded.searchsorted(array, [1.0])


# ---- GPU: a comparator's order ------------------------------------------------------------

def check_compare(array, compare, keys, queries, query_keys, groups) -> None:
    """searchsorted(array, queries, compare=...) against np.searchsorted of the order's keys
    (`keys` ascending, the sorted elements' keys; `query_keys` the queries'), for numpy
    queries and for ShardedArray queries on each of `groups`."""
    for side in SIDES:
        expected = np.searchsorted(keys, query_keys, side=side)
        got = sharded.searchsorted(array, queries, side=side, compare=compare)
        assert isinstance(got, np.ndarray) and got.dtype == np.int64
        np.testing.assert_array_equal(got, expected)
        for group, sizes in groups:
            on_group = sharded.ShardedArray.from_numpy(group, queries, sizes=sizes)
            positions = sharded.searchsorted(array, on_group, side=side, compare=compare)
            assert positions.group is group and positions.shard_sizes == on_group.shard_sizes
            np.testing.assert_array_equal(positions.to_numpy(), expected)


def query_groups(places, one_place, n):
    return [(places, None), (places, uneven(places, n)), (one_place, None),
            (sharded.PlaceGroup.by_devices(list(reversed(places.devices))), None)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.float32, np.int64, np.float64])
def test_searchsorted_compare_descending(places, one_place, dtype):
    rng = np.random.default_rng(len(places))
    host = rng.integers(0, 2000, 40009).astype(dtype)  # many ties, across shard boundaries
    ordered = np.sort(host)[::-1].copy()
    queries = np.concatenate([rng.integers(-5, 2010, 3000).clip(0).astype(dtype), ordered[:3], ordered[-3:]])
    array = sharded.ShardedArray.from_numpy(places, ordered, sizes=uneven(places, ordered.size))
    # descending: the keys -x ascending (in int64 / float64: no overflow)
    keys, query_keys = -ordered.astype(np.float64), -queries.astype(np.float64)
    check_compare(array, lambda x, y: x > y, keys, queries, query_keys, query_groups(places, one_place, queries.size))


@pytest.mark.gpu
def test_searchsorted_compare_abs_order_after_sort(places, one_place):
    rng = np.random.default_rng(7)
    host = rng.integers(-3000, 3000, 50021).astype(np.int64)
    array = sharded.ShardedArray.from_numpy(places, host)
    sharded.sort(array, compare=lambda x, y: abs(x) < abs(y))  # the search waits for the sort
    ordered_keys = np.sort(np.abs(host))
    queries = np.concatenate([rng.integers(-3100, 3100, 4000), [0, 3000, -3000, 2999, -1]]).astype(np.int64)
    check_compare(array, lambda x, y: abs(x) < abs(y), ordered_keys, queries, np.abs(queries),
                  query_groups(places, one_place, queries.size))
    # a scalar query, and an array with no elements
    assert sharded.searchsorted(array, np.int64(5), compare=lambda x, y: abs(x) < abs(y)) == \
        np.searchsorted(ordered_keys, 5)
    empty = sharded.ShardedArray.allocate(places, 0, np.int64)
    np.testing.assert_array_equal(sharded.searchsorted(empty, queries, compare=lambda x, y: abs(x) < abs(y)),
                                  np.zeros(queries.size, np.int64))


@pytest.mark.gpu
def test_searchsorted_compare_records_by_a_field(places, one_place):
    point = np.dtype([("x", np.float32), ("y", np.int32)], align=True)
    rng = np.random.default_rng(9)
    host = np.zeros(30011, point)
    host["x"] = np.round(rng.standard_normal(host.size) * 50)
    host["y"] = rng.integers(0, 100, host.size)
    ordered = host[np.argsort(host["x"], kind="stable")]
    queries = np.zeros(2500, point)
    queries["x"] = np.round(rng.standard_normal(queries.size) * 60)
    queries["y"] = -1
    array = sharded.ShardedArray.from_numpy(places, ordered, sizes=uneven(places, ordered.size))
    check_compare(array, lambda p, q: p.x < q.x, ordered["x"], queries, queries["x"],
                  query_groups(places, one_place, queries.size))


# ---- CPU: argument errors, before anything runs -----------------------------------------

class _Reached(Exception):
    pass


@pytest.fixture
def shim_search(monkeypatch):
    """Replaces _shim.searchsorted and the shim's array allocation: each records its
    arguments and raises _Reached, so that a check made too late shows as a wrong exception."""
    calls = []

    def search(*args):
        calls.append(("searchsorted", args))
        raise _Reached

    class StandIn:
        @staticmethod
        def even_sizes(n, places):
            return [n // places + (1 if place < n % places else 0) for place in range(places)]

        @staticmethod
        def allocate(*args):
            calls.append(("allocate", args))
            raise _Reached

    def search_compare(*args):
        calls.append(("search_compare", args))
        raise _Reached

    monkeypatch.setattr(_shim, "searchsorted", search)
    monkeypatch.setattr(_shim, "search_compare", search_compare)
    monkeypatch.setattr(_shim, "ShardedArray", StandIn)
    return calls


def test_searchsorted_refuses_bad_arguments(shim_search):
    group = stand_in_group()
    array = stand_in_array(group)
    record = np.dtype([("x", np.float32), ("y", np.float32)], align=True)
    with pytest.raises(TypeError, match="sorted_a: expected a ShardedArray, got ndarray"):
        sharded.searchsorted(np.arange(3.0), [1.0])
    for side in ("middle", "LEFT", None, 0, b"left"):
        with pytest.raises(ValueError, match="side: expected 'left' or 'right', got"):
            sharded.searchsorted(array, [1.0], side=side)
    with pytest.raises(TypeError, match="sorted_a: searchsorted takes arrays of numbers, not records"):
        sharded.searchsorted(stand_in_array(group, dtype=record), [1.0])
    with pytest.raises(TypeError, match="values: searchsorted takes arrays of numbers, not records"):
        sharded.searchsorted(array, stand_in_array(group, dtype=record))
    with pytest.raises(TypeError, match="values: dtype float64 differs from sorted_a's float32"):
        sharded.searchsorted(array, stand_in_array(stand_in_group(2), (5, 5), np.float64))
    assert shim_search == []


@pytest.mark.parametrize("dtype, values, error, message", [
    (np.int32, [1.5], TypeError, "values: cannot search float64 values in a int32 array"),
    (np.int32, np.array([5, 1 << 40], np.uint64), ValueError, "values: 1099511627776 does not fit int32"),
    (np.uint32, [1, 2], TypeError, "values: cannot search int64 values in a uint32 array"),
    (np.float32, ["a"], TypeError, "values: cannot search <U1 values in a float32 array"),
    (np.float32, [object()], TypeError, "values: cannot search object values in a float32 array"),
    (np.float64, [1 + 2j], TypeError, "values: cannot search complex128 values in a float64 array"),
    (np.int32, [1, 1 << 40], ValueError, "values: 1099511627776 does not fit int32"),
    (np.int64, np.array([1 << 63], np.uint64), ValueError, "values: 9223372036854775808 does not fit int64"),
    (np.uint32, np.array([1 << 33], np.uint64), ValueError, "values: 8589934592 does not fit uint32"),
])
def test_searchsorted_refuses_numpy_values_that_do_not_cast(shim_search, dtype, values, error, message):
    with pytest.raises(error, match=message):
        sharded.searchsorted(stand_in_array(stand_in_group(), dtype=dtype), values)
    assert shim_search == []


@pytest.mark.parametrize("dtype, values, cast", [
    (np.float32, np.array([0.1, 2.0]), "float32"),   # float64 -> float32
    (np.float64, [1, 2, 3], "float64"),               # int64 -> float64
    (np.int32, np.array([7], np.int64), "int32"),     # fits
    (np.uint64, np.array([7], np.uint8), "uint64"),
    (np.float32, 3, "float32"),                       # a scalar
])
def test_searchsorted_casts_numpy_values_to_the_sorted_dtype(shim_search, dtype, values, cast):
    with pytest.raises(_Reached):
        sharded.searchsorted(stand_in_array(stand_in_group(), dtype=dtype), values)
    (what, (_, sizes, name, *_)), = shim_search
    assert what == "allocate" and name == cast
    assert sum(sizes) == np.asarray(values).size


def test_searchsorted_empty_numpy_values_need_no_gpu(shim_search):
    result = sharded.searchsorted(stand_in_array(stand_in_group()), np.zeros((2, 0), np.float32))
    assert result.shape == (2, 0) and result.dtype == np.int64
    assert shim_search == []


def test_searchsorted_compare_refuses_bad_comparators_and_values(shim_search, fresh_cache):
    group = stand_in_group()
    array = stand_in_array(group, dtype=np.int64)

    def broken(x, y):
        return x.no_such_attribute < y

    for values in ([1, 2], stand_in_array(group, dtype=np.int64)):
        with pytest.raises(TypeError) as info:
            sharded.searchsorted(array, values, compare=broken)
        assert "broken" in str(info.value) and "no_such_attribute" in str(info.value)
        with pytest.raises(TypeError, match="returns int64 .*a comparator returns a bool"):
            sharded.searchsorted(array, values, compare=lambda x, y: x - y)
        with pytest.raises(TypeError, match="takes 1 argument, but searchsorted \\(compare\\) passes 2"):
            sharded.searchsorted(array, values, compare=lambda x: x)
    with pytest.raises(TypeError, match="compare: expected an operator"):
        sharded.searchsorted(array, [1], compare="less")
    with pytest.raises(TypeError, match="values: dtype float64 differs from sorted_a's int64"):
        sharded.searchsorted(array, stand_in_array(group, dtype=np.float64), compare=lambda x, y: x < y)
    with pytest.raises(TypeError, match="values: cannot search float64 values in a int64 array"):
        sharded.searchsorted(array, [1.5], compare=lambda x, y: x < y)
    point = np.dtype([("x", np.float32), ("y", np.int32)], align=True)
    records = stand_in_array(group, dtype=point)
    with pytest.raises(TypeError, match="values: expected a ShardedArray or a numpy array of sorted_a's dtype"):
        sharded.searchsorted(records, [(1.0, 2)], compare=lambda p, q: p.x < q.x)
    with pytest.raises(TypeError, match="values: expected a ShardedArray or a numpy array of sorted_a's dtype"):
        sharded.searchsorted(records, np.zeros(2, np.float32), compare=lambda p, q: p.x < q.x)
    assert shim_search == []
