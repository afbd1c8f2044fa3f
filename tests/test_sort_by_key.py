"""sort_by_key, argsort and sort(key=) against numpy's stable sorts: every key dtype, values of
every dtype and record size, hard key distributions, 1 to 4 places, uneven, empty and
contiguous shards."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import ALL_DTYPES
from test_records import MIXED, POINT, SAMPLE, WIDE, XYZ, random_records
from test_errors import shim_untouched, stand_in_array, stand_in_group  # noqa: F401 (fixture)
from test_sort import DISTRIBUTIONS, keys, places  # noqa: F401 (fixture)


def dense_ranks(host: np.ndarray) -> np.ndarray:
    """Each key's rank among the distinct keys in the sort's order: -0.0 and 0.0 one key,
    every NaN one key after all the others."""
    canonical = host.copy()
    if host.dtype.kind == "f":
        canonical[canonical == 0] = 0
    return np.unique(canonical, return_inverse=True)[1].reshape(-1)


def stable_order(host: np.ndarray, descending: bool = False) -> np.ndarray:
    """The permutation a stable sort gives: by key (descending: the reverse order of the
    distinct keys), equal keys in index order."""
    ranks = dense_ranks(host)
    return np.lexsort((np.arange(host.size), -ranks if descending else ranks))


def values_for(dtype, n: int, seed: int = 1) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.names:
        return random_records(dtype, n, seed)
    return np.arange(n).astype(dtype) if dtype.kind != "f" else np.random.default_rng(seed).random(n).astype(dtype)


def check_keys(result: np.ndarray, host: np.ndarray, order: np.ndarray) -> None:
    """Sorted keys equal the reference's, reading -0.0 and 0.0 alike (the sort keeps which
    was which) and NaNs as equal."""
    np.testing.assert_array_equal(result, host[order])


@pytest.mark.gpu
@pytest.mark.parametrize("key_dtype", ALL_DTYPES)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_sort_by_key_matches_numpy(places, key_dtype, distribution):
    host = keys(key_dtype, distribution, 20011, seed=len(places))
    values = np.arange(host.size, dtype=np.int64)
    for descending in (False, True):
        order = stable_order(host, descending)
        k = sharded.ShardedArray.from_numpy(places, host)
        v = sharded.ShardedArray.from_numpy(places, values)
        out_k, out_v = sharded.sort_by_key(k, v, descending=descending)
        assert out_k is k and out_v is v
        np.testing.assert_array_equal(v.to_numpy(), values[order])
        check_keys(k.to_numpy(), host, order)


@pytest.mark.gpu
@pytest.mark.parametrize("value_dtype", ALL_DTYPES + [POINT, XYZ, SAMPLE, MIXED, WIDE],
                         ids=lambda d: np.dtype(d).name if not np.dtype(d).names else f"record{np.dtype(d).itemsize}")
def test_sort_by_key_moves_every_value_type(places, value_dtype):
    host = keys(np.int32, "few", 9001, seed=3)  # many ties: stability shows
    values = values_for(value_dtype, host.size)
    k = sharded.ShardedArray.from_numpy(places, host)
    v = sharded.ShardedArray.from_numpy(places, values)
    out_k = sharded.ShardedArray.allocate(places, list(k.shard_sizes), np.int32)
    out_v = sharded.ShardedArray.allocate(places, list(v.shard_sizes), v.dtype)
    result = sharded.sort_by_key(k, v, out_keys=out_k, out_values=out_v)
    assert result[0] is out_k and result[1] is out_v  # the out= arrays themselves
    order = stable_order(host)
    np.testing.assert_array_equal(out_v.to_numpy(), values[order])
    np.testing.assert_array_equal(out_k.to_numpy(), host[order])
    np.testing.assert_array_equal(k.to_numpy(), host)  # the inputs are left as they were
    np.testing.assert_array_equal(v.to_numpy(), values)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sort_by_key_nan_and_zeros(places, dtype):
    host = keys(dtype, "special", 7001, seed=5)
    values = np.arange(host.size, dtype=np.uint32)
    for descending in (False, True):
        k = sharded.ShardedArray.from_numpy(places, host)
        v = sharded.ShardedArray.from_numpy(places, values)
        sharded.sort_by_key(k, v, descending=descending)
        order = stable_order(host, descending)
        np.testing.assert_array_equal(v.to_numpy(), values[order])


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [[0, 5000, 0, 3], [1, 0, 7000, 1], [4000, 0], [0, 0, 1, 0]])
def test_sort_by_key_explicit_and_empty_shards(sizes):
    group = sharded.PlaceGroup.by_devices([0] * len(sizes))
    host = keys(np.float32, "uniform", sum(sizes), seed=7)
    values = values_for(XYZ, host.size)
    k = sharded.ShardedArray.from_numpy(group, host, sizes=sizes)
    v = sharded.ShardedArray.from_numpy(group, values, sizes=sizes)
    sharded.sort_by_key(k, v, descending=True)
    order = stable_order(host, True)
    np.testing.assert_array_equal(v.to_numpy(), values[order])
    assert k.shard_sizes == tuple(sizes) and v.shard_sizes == tuple(sizes)


@pytest.mark.gpu
def test_sort_by_key_contiguous(places):
    host = keys(np.uint64, "uniform", 12345, seed=11)
    values = np.arange(host.size, dtype=np.float64)
    k = sharded.ShardedArray.from_numpy(places, host, contiguous=True)
    v = sharded.ShardedArray.from_numpy(places, values, contiguous=True)
    sharded.sort_by_key(k, v)
    order = stable_order(host)
    np.testing.assert_array_equal(v.to_numpy(), values[order])
    np.testing.assert_array_equal(k.to_numpy(), host[order])


@pytest.mark.gpu
def test_sort_by_key_large_across_rounds(places):
    """Enough keys for several chunks per shard and every splitter round."""
    host = keys(np.int64, "uniform", 600_000, seed=13)
    values = np.arange(host.size, dtype=np.int32)
    k = sharded.ShardedArray.from_numpy(places, host)
    v = sharded.ShardedArray.from_numpy(places, values)
    sharded.sort_by_key(k, v)
    order = stable_order(host)
    np.testing.assert_array_equal(v.to_numpy(), values[order])
    np.testing.assert_array_equal(k.to_numpy(), host[order])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("descending", [False, True])
def test_argsort_matches_numpy(places, dtype, descending):
    host = keys(dtype, "few" if dtype == np.uint32 else "uniform", 15013, seed=17)
    a = sharded.ShardedArray.from_numpy(places, host)
    indices = sharded.argsort(a, descending=descending)
    assert indices.dtype == np.int64 and indices.shard_sizes == a.shard_sizes
    np.testing.assert_array_equal(indices.to_numpy(), stable_order(host, descending))
    np.testing.assert_array_equal(a.to_numpy(), host)
    if not descending:
        np.testing.assert_array_equal(indices.to_numpy(), np.argsort(host, kind="stable"))


@pytest.mark.gpu
def test_argsort_wide_indices(places, monkeypatch):
    """Arrays past 2^32 elements sort int64 indices directly (here: forced on a small one)."""
    from cuda_sharded_jit.algorithms import sort as sort_module

    monkeypatch.setattr(sort_module, "_NARROW_INDICES", 0)
    host = keys(np.float64, "few", 7001, seed=41)
    indices = sharded.argsort(sharded.ShardedArray.from_numpy(places, host), descending=True)
    assert indices.dtype == np.int64
    np.testing.assert_array_equal(indices.to_numpy(), stable_order(host, True))


@pytest.mark.gpu
def test_argsort_ranks_rows_by_a_score(places):
    """The README's example: order rows by a computed score, take the rows back to numpy."""
    rows = random_records(SAMPLE, 5000, 19)
    table = sharded.ShardedArray.from_numpy(places, rows)
    score = sharded.transform(lambda r: r.value * r.count, table)
    order = sharded.argsort(score, descending=True).to_numpy()
    expected = stable_order(rows["value"] * rows["count"], descending=True)
    np.testing.assert_array_equal(order, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("descending", [False, True])
def test_sort_with_a_number_key(places, descending):
    host = keys(np.int32, "uniform", 10007, seed=23)
    a = sharded.ShardedArray.from_numpy(places, host)
    result = sharded.sort(a, key=lambda x: x % 100, descending=descending)
    assert result is a
    np.testing.assert_array_equal(a.to_numpy(), host[stable_order(host % 100, descending)])


@pytest.mark.gpu
def test_sort_records_by_a_field(places):
    rows = random_records(MIXED, 8011, 29)
    a = sharded.ShardedArray.from_numpy(places, rows)
    out = sharded.ShardedArray.allocate(places, list(a.shard_sizes), MIXED)
    result = sharded.sort(a, key=lambda r: r.b, out=out)
    assert result is out
    np.testing.assert_array_equal(out.to_numpy(), rows[stable_order(rows["b"])])
    np.testing.assert_array_equal(a.to_numpy(), rows)


@pytest.mark.gpu
@pytest.mark.parametrize("descending", [False, True])
def test_sort_with_a_tuple_key(places, descending):
    """Lexicographic: by the first component, then the second, ties in index order."""
    rows = random_records(SAMPLE, 6007, 31)
    rows["count"] %= 7
    a = sharded.ShardedArray.from_numpy(places, rows)
    sharded.sort(a, key=lambda r: (r.count, -r.value), descending=descending)
    first, second = dense_ranks(rows["count"]), dense_ranks(-rows["value"])
    sign = -1 if descending else 1
    order = np.lexsort((np.arange(rows.size), sign * second, sign * first))
    np.testing.assert_array_equal(a.to_numpy(), rows[order])


@pytest.mark.gpu
def test_sort_by_key_twice_is_deterministic(places):
    host = keys(np.float32, "few", 50021, seed=37)
    values = values_for(WIDE, host.size)
    results = []
    for _ in range(2):
        k = sharded.ShardedArray.from_numpy(places, host)
        v = sharded.ShardedArray.from_numpy(places, values)
        sharded.sort_by_key(k, v)
        results.append(v.to_numpy())
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], values[stable_order(host)])


# ---- argument errors (no GPU needed: they fail before anything runs) ----

def test_sort_by_key_rejects_bad_arguments(shim_untouched):
    group = stand_in_group(2)
    k = stand_in_array(group, [4, 4], np.int32)
    v = stand_in_array(group, [4, 4], np.float64)
    with pytest.raises(ValueError, match="values: shard sizes"):
        sharded.sort_by_key(k, stand_in_array(group, [5, 3], np.float64))
    with pytest.raises(ValueError, match="values: must be another array"):
        sharded.sort_by_key(k, k)
    with pytest.raises(TypeError, match="keys: sort_by_key takes arrays of numbers"):
        sharded.sort_by_key(stand_in_array(group, [4, 4], POINT), v)
    with pytest.raises(TypeError, match="values: expected a ShardedArray"):
        sharded.sort_by_key(k, np.zeros(8))
    with pytest.raises(ValueError, match="out_values: dtype"):
        sharded.sort_by_key(k, v, out_values=stand_in_array(group, [4, 4], np.float32))
    with pytest.raises(ValueError, match="out_keys: shard sizes"):
        sharded.sort_by_key(k, v, out_keys=stand_in_array(group, [8, 0], np.int32))
    same = stand_in_array(group, [4, 4], np.int32)
    with pytest.raises(ValueError, match="need arrays of their own"):
        sharded.sort_by_key(k, same, out_values=k)
    with pytest.raises(ValueError, match="need arrays of their own"):
        sharded.sort_by_key(k, same, out_keys=same)
    with pytest.raises(TypeError, match="descending"):
        sharded.sort_by_key(k, v, descending="yes")
    with pytest.raises(TypeError, match="a: argsort takes arrays of numbers"):
        sharded.argsort(stand_in_array(group, [4, 4], POINT))
