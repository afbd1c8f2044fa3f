"""The by-key family (inclusive/exclusive_scan_by_key, reduce_by_key, unique_by_key, unique)
against sequential Python and numpy answers: runs spanning two and three shards, empty
shards, 1 to 4 places, records as values, a non-commutative operator, a custom `equal`, each on
both by-key engines (the `by_key_engine` fixture); and, without a GPU, the argument errors on
stand-in arrays (nothing compiles or runs first)."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import ALL_DTYPES, uneven
from test_errors import shim_untouched, stand_in_array, stand_in_group  # noqa: F401 - a fixture

gpu = pytest.mark.gpu

AFFINE = np.dtype([("a", np.int64), ("b", np.int64)], align=True)
Affine = collections.namedtuple("Affine", "a b")


@pytest.fixture(autouse=True, params=["one_pass", "two_pass"])
def by_key_engine(request, monkeypatch):
    """Every GPU case on both engines: the single pass (the default in one process) and the two
    passes (which ranks take), forced by the A/B switch CSJ_X_BY_KEY, read at every call."""
    if request.param == "two_pass":
        if request.node.get_closest_marker("gpu") is None:
            pytest.skip("the engine is chosen on a GPU only")
        monkeypatch.setenv("CSJ_X_BY_KEY", "two_pass")
    else:
        monkeypatch.delenv("CSJ_X_BY_KEY", raising=False)
    return request.param


def _then(p, q):
    """x -> a x + b, then q: associative, not commutative (the answer changes with the order)."""
    return (p.a * q.a, p.b * q.a + q.b)


def _runs(n: int, seed: int, longest: int = 9) -> np.ndarray:
    """Sorted-looking int32 keys in runs of 1..longest (equal keys never recur apart)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, longest + 1, n)
    keys = np.repeat(np.arange(lengths.size, dtype=np.int32) * 3, lengths)[:n]
    return keys


def _heads(keys, equal=lambda x, y: x == y) -> list[bool]:
    return [index == 0 or not equal(keys[index - 1], keys[index]) for index in range(len(keys))]


def _scan_reference(keys, values, op, init=None, equal=lambda x, y: x == y) -> list:
    """The sequential answer: inclusive (init None) or exclusive scan restarting at each run."""
    out, acc = [], None
    for value, head in zip(values, _heads(keys, equal)):
        if init is None:
            acc = value if head else op(acc, value)
            out.append(acc)
        else:
            if head:
                acc = init
            out.append(acc)
            acc = op(acc, value)
    return out


def _reduce_reference(keys, values, op, equal=lambda x, y: x == y):
    heads = _heads(keys, equal)
    unique_keys, reduced = [], []
    for key, value, head in zip(keys, values, heads):
        if head:
            unique_keys.append(key)
            reduced.append(value)
        else:
            reduced[-1] = op(reduced[-1], value)
    return unique_keys, reduced


def _affine_values(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    host = np.zeros(n, AFFINE)
    host["a"] = rng.choice([-1, 1], n)  # products stay exact
    host["b"] = rng.integers(-50, 50, n)
    return host


def _as_affines(host) -> list:
    return [Affine(int(record["a"]), int(record["b"])) for record in host]


def _python_then(p, q):
    return Affine(*_then(p, q))


# ---- runs of equal keys across shards ---------------------------------------------------------

@gpu
@pytest.mark.parametrize("n", [1, 2, 37, 100_003])
def test_inclusive_and_exclusive_sums_by_key(places, n):
    keys = _runs(n, seed=n, longest=40)
    values = np.random.default_rng(1).integers(-1000, 1000, n).astype(np.int64)
    k = sharded.ShardedArray.from_numpy(places, keys, sizes=uneven(places, n))
    v = sharded.ShardedArray.from_numpy(places, values, sizes=uneven(places, n))
    add = lambda x, y: x + y  # noqa: E731
    inclusive = sharded.inclusive_scan_by_key(k, v, add)
    assert inclusive.dtype == np.int64 and inclusive.shard_sizes == v.shard_sizes
    np.testing.assert_array_equal(inclusive.to_numpy(), _scan_reference(keys, values.tolist(), add))
    np.testing.assert_array_equal(sharded.exclusive_scan_by_key(k, v, add, 5).to_numpy(),
                                  _scan_reference(keys, values.tolist(), add, init=5))
    np.testing.assert_array_equal(sharded.inclusive_scan_by_key(k, v, "sum").to_numpy(),
                                  inclusive.to_numpy())


@gpu
@pytest.mark.parametrize("sizes", [[3, 4, 5], [2, 0, 9, 1], [0, 12, 0], [11, 1, 0, 0], [1, 1, 1, 9]])
def test_runs_spanning_two_and_three_shards(sizes):
    group = sharded.PlaceGroup.by_devices([0] * len(sizes))
    keys = np.array([7, 7, 7, 7, 7, 7, 7, 7, 1, 1, 1, 2], np.int32)  # one run over up to three shards
    values = np.arange(1, 13, dtype=np.int64)
    k = sharded.ShardedArray.from_numpy(group, keys, sizes=sizes)
    v = sharded.ShardedArray.from_numpy(group, values, sizes=sizes)
    last = lambda x, y: y  # noqa: E731 - associative, not commutative
    first = lambda x, y: x  # noqa: E731
    for op in (last, first, lambda x, y: x + y):
        np.testing.assert_array_equal(sharded.inclusive_scan_by_key(k, v, op).to_numpy(),
                                      _scan_reference(keys, values.tolist(), op))
        np.testing.assert_array_equal(sharded.exclusive_scan_by_key(k, v, op, 100).to_numpy(),
                                      _scan_reference(keys, values.tolist(), op, init=100))
        unique_keys, reduced = sharded.reduce_by_key(k, v, op)
        expected_keys, expected = _reduce_reference(keys, values.tolist(), op)
        np.testing.assert_array_equal(unique_keys.to_numpy(), expected_keys)
        np.testing.assert_array_equal(reduced.to_numpy(), expected)
        assert unique_keys.shard_sizes == reduced.shard_sizes
    unique_keys, unique_values = sharded.unique_by_key(k, v)
    np.testing.assert_array_equal(unique_keys.to_numpy(), [7, 1, 2])
    np.testing.assert_array_equal(unique_values.to_numpy(), [1, 9, 12])
    # shard i keeps the runs that start in shard i
    starts = np.cumsum([0] + sizes[:-1])
    expected_sizes = tuple(int(sum(1 for index in (0, 8, 11) if start <= index < start + size))
                           for start, size in zip(starts, sizes))
    assert unique_keys.shard_sizes == expected_sizes


@gpu
def test_runs_longer_than_tiles_and_chunks(places):
    """Runs of up to 40 000 elements: tiles (2048) and chunks (8192) without a run head, runs
    over whole shards; an associative, non-commutative operator must give the sequential answer,
    each run's result in the shard where the run ends."""
    rng = np.random.default_rng(12)
    lengths = np.concatenate([rng.integers(1, 40_000, 12), rng.integers(1, 5, 50), [20_000]])
    keys = np.repeat(np.arange(lengths.size, dtype=np.int64) * 5, lengths)
    n = keys.size
    host = _affine_values(n, seed=13)
    sizes = uneven(places, n)
    k = sharded.ShardedArray.from_numpy(places, keys, sizes=sizes)
    v = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    got = sharded.inclusive_scan_by_key(k, v, _then).to_numpy()
    assert [Affine(int(a), int(b)) for a, b in got.tolist()] == _scan_reference(keys, _as_affines(host), _python_then)
    unique_keys, reduced = sharded.reduce_by_key(k, v, _then)
    expected_keys, expected = _reduce_reference(keys, _as_affines(host), _python_then)
    assert unique_keys.to_numpy().tolist() == expected_keys
    assert [Affine(int(a), int(b)) for a, b in reduced.to_numpy().tolist()] == expected
    ends = np.flatnonzero(np.append(keys[1:] != keys[:-1], True))  # each run's last index
    bounds = np.cumsum([0] + list(sizes))
    assert reduced.shard_sizes == tuple(int(((ends >= lo) & (ends < hi)).sum()) for lo, hi in zip(bounds, bounds[1:]))


@gpu
@pytest.mark.parametrize("value_dtype, first", [(np.int64, 8_388_609 + 5), (AFFINE, 4_198_401 + 5)])
def test_more_chunks_than_one_group_holds(value_dtype, first):
    """A shard of more than 1024 chunks (8192 elements a chunk for 4- and 8-byte values, 4096
    for 16-byte records), so the chunk prefixes come from two levels: runs of 10 007 keys cross
    chunk and group edges, and the sweep's start folds a group's prefix into a run."""
    n = first + 3
    keys = (np.arange(n, dtype=np.int64) // 10_007).astype(np.int32)
    heads = np.r_[True, keys[1:] != keys[:-1]]
    starts = np.flatnonzero(heads)
    places = sharded.PlaceGroup.by_devices([0, 0])
    sizes = [first, n - first]
    k = sharded.ShardedArray.from_numpy(places, keys, sizes=sizes)
    if value_dtype is AFFINE:
        host = _affine_values(n, seed=31)
        v = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
        _, reduced = sharded.reduce_by_key(k, v, _then)
        # a run of maps x -> a_i x + b_i (a_i = +-1) composes to A x + B with A the product of
        # its a's and B = sum_i b_i * (product of the a's after i) = A * sum_i b_i * P_i, P_i
        # the product of its a's up to i (each +-1, its own inverse)
        signs = np.cumprod(host["a"])
        before = np.r_[1, signs][starts][np.cumsum(heads) - 1]  # the product before each run
        within = signs * before
        a_total = np.multiply.reduceat(host["a"], starts)
        b_total = a_total * np.add.reduceat(host["b"] * within, starts)
        np.testing.assert_array_equal(reduced.to_numpy()["a"], a_total)
        np.testing.assert_array_equal(reduced.to_numpy()["b"], b_total)
        return
    values = np.random.default_rng(30).integers(-1000, 1000, n).astype(np.int64)
    v = sharded.ShardedArray.from_numpy(places, values, sizes=sizes)
    totals = np.cumsum(values)
    before = np.r_[0, totals][starts][np.cumsum(heads) - 1]  # the sum before each run's head
    np.testing.assert_array_equal(sharded.inclusive_scan_by_key(k, v, "sum").to_numpy(), totals - before)
    np.testing.assert_array_equal(sharded.exclusive_scan_by_key(k, v, lambda x, y: x + y, np.int64(7)).to_numpy(),
                                  totals - values - before + 7)
    unique_keys, reduced = sharded.reduce_by_key(k, v, "sum")
    np.testing.assert_array_equal(unique_keys.to_numpy(), keys[heads])
    np.testing.assert_array_equal(reduced.to_numpy(), np.add.reduceat(values, starts))


@gpu
def test_scan_by_key_into_its_own_keys(places):
    keys = np.repeat(np.arange(300, dtype=np.int64), np.random.default_rng(15).integers(1, 900, 300))
    k = sharded.ShardedArray.from_numpy(places, keys, sizes=uneven(places, keys.size))
    add = lambda x, y: x + y  # noqa: E731
    expected = _scan_reference(keys, keys.tolist(), add)
    assert sharded.inclusive_scan_by_key(k, k, add, out=k) is k
    np.testing.assert_array_equal(k.to_numpy(), expected)


@gpu
def test_float_scans_by_key_are_deterministic(places):
    """The same bits on every call (a fixed association), near the float64 answer."""
    rng = np.random.default_rng(14)
    keys = np.repeat(np.arange(400, dtype=np.int32), rng.integers(1, 3000, 400))
    values = rng.standard_normal(keys.size).astype(np.float32)
    sizes = uneven(places, keys.size)
    k = sharded.ShardedArray.from_numpy(places, keys, sizes=sizes)
    v = sharded.ShardedArray.from_numpy(places, values, sizes=sizes)
    add = lambda x, y: x + y  # noqa: E731
    first = sharded.inclusive_scan_by_key(k, v, add).to_numpy()
    again = sharded.inclusive_scan_by_key(k, v, add).to_numpy()
    assert first.tobytes() == again.tobytes()
    reference = np.array(_scan_reference(keys, values.astype(np.float64).tolist(), add))
    np.testing.assert_allclose(first, reference, rtol=1e-3, atol=1e-2)
    sums = [sharded.reduce_by_key(k, v, add)[1].to_numpy() for _ in range(2)]
    assert sums[0].tobytes() == sums[1].tobytes()
    np.testing.assert_allclose(sums[0], _reduce_reference(keys, values.astype(np.float64).tolist(), add)[1],
                               rtol=1e-3, atol=1e-2)


@gpu
def test_non_commutative_records_as_values(places):
    n = 50_021
    keys = _runs(n, seed=3, longest=200)
    host = _affine_values(n, seed=4)
    k = sharded.ShardedArray.from_numpy(places, keys, sizes=uneven(places, n))
    v = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, n))
    expected = _scan_reference(keys, _as_affines(host), _python_then)
    got = sharded.inclusive_scan_by_key(k, v, _then).to_numpy()
    assert got.dtype == AFFINE
    assert _as_affines(got) == expected
    expected = _scan_reference(keys, _as_affines(host), _python_then, init=Affine(1, 0))
    assert _as_affines(sharded.exclusive_scan_by_key(k, v, _then, (1, 0)).to_numpy()) == expected
    unique_keys, reduced = sharded.reduce_by_key(k, v, _then)
    expected_keys, expected = _reduce_reference(keys, _as_affines(host), _python_then)
    np.testing.assert_array_equal(unique_keys.to_numpy(), expected_keys)
    assert _as_affines(reduced.to_numpy()) == expected
    # a plain (unnamed) record reaches the operator as a plain tuple
    plain = host.astype(np.dtype([("f0", np.int64), ("f1", np.int64)], align=True))
    p = sharded.ShardedArray.from_numpy(places, plain, sizes=uneven(places, n))
    got = sharded.inclusive_scan_by_key(k, p, lambda x, y: (x[0] * y[0], x[1] * y[0] + y[1])).to_numpy()
    assert [Affine(int(a), int(b)) for a, b in got.tolist()] == \
        _scan_reference(keys, _as_affines(host), _python_then)


@gpu
def test_three_and_four_field_records(three_places):
    record = np.dtype([("x", np.float64), ("y", np.float64), ("count", np.int32)], align=True)
    n = 9_001
    keys = _runs(n, seed=5)
    host = np.zeros(n, record)
    host["x"] = np.arange(n) % 7
    host["y"] = np.arange(n) % 5
    host["count"] = 1
    k = sharded.ShardedArray.from_numpy(three_places, keys)
    v = sharded.ShardedArray.from_numpy(three_places, host)
    op = lambda p, q: (p.x + q.x, p.y + q.y, p.count + q.count)  # noqa: E731
    got = sharded.inclusive_scan_by_key(k, v, op).to_numpy()
    Point = collections.namedtuple("Point", "x y count")
    expected = _scan_reference(keys, [Point(*r) for r in host.tolist()], lambda p, q: Point(*op(p, q)))
    assert [tuple(r) for r in got.tolist()] == [(float(x), float(y), int(c)) for x, y, c in expected]
    unique_keys, reduced = sharded.reduce_by_key(k, v, op)
    expected_keys, expected = _reduce_reference(keys, [Point(*r) for r in host.tolist()], lambda p, q: Point(*op(p, q)))
    assert unique_keys.to_numpy().tolist() == expected_keys
    assert [tuple(r) for r in reduced.to_numpy().tolist()] == [(float(x), float(y), int(c)) for x, y, c in expected]
    four = np.dtype([("a", np.int64), ("b", np.int64), ("c", np.int64), ("d", np.int64)], align=True)
    wide = np.zeros(n, four)
    for index, name in enumerate("abcd"):
        wide[name] = (np.arange(n) * (index + 1)) % 11
    w = sharded.ShardedArray.from_numpy(three_places, wide)
    add4 = lambda p, q: (p.a + q.a, p.b + q.b, p.c + q.c, p.d + q.d)  # noqa: E731
    Four = collections.namedtuple("Four", "a b c d")
    rows = [Four(*r) for r in wide.tolist()]
    assert [Four(*r) for r in sharded.inclusive_scan_by_key(k, w, add4).to_numpy().tolist()] == \
        _scan_reference(keys, rows, lambda p, q: Four(*add4(p, q)))
    unique_keys, reduced = sharded.reduce_by_key(k, w, add4)
    expected_keys, expected = _reduce_reference(keys, rows, lambda p, q: Four(*add4(p, q)))
    assert unique_keys.to_numpy().tolist() == expected_keys
    assert [Four(*r) for r in reduced.to_numpy().tolist()] == expected


@gpu
def test_custom_equal(three_places):
    rng = np.random.default_rng(6)
    keys = np.cumsum(rng.choice([0.1, 0.2, 2.0], 30_011)).astype(np.float64)
    values = rng.integers(0, 100, keys.size).astype(np.int32)
    near = lambda x, y: abs(x - y) < 1.0  # noqa: E731 - neighbours closer than 1 share a run
    k = sharded.ShardedArray.from_numpy(three_places, keys)
    v = sharded.ShardedArray.from_numpy(three_places, values)
    add = lambda x, y: x + y  # noqa: E731
    np.testing.assert_array_equal(sharded.inclusive_scan_by_key(k, v, add, equal=near).to_numpy(),
                                  _scan_reference(keys, values.tolist(), add, equal=near))
    unique_keys, reduced = sharded.reduce_by_key(k, v, add, equal=near)
    expected_keys, expected = _reduce_reference(keys, values.tolist(), add, equal=near)
    np.testing.assert_array_equal(unique_keys.to_numpy(), expected_keys)  # each run's first key
    np.testing.assert_array_equal(reduced.to_numpy(), expected)
    heads = np.array(_heads(keys, near))
    np.testing.assert_array_equal(sharded.unique_by_key(k, equal=near)[0].to_numpy(), keys[heads])


@gpu
@pytest.mark.parametrize("value_dtype", [np.int32, np.uint32, np.float64, "record"])
def test_unique_by_key_on_one_place(value_dtype):
    """One place: each run's first key and value, with == and with a custom `equal` (neighbours
    closer than 1 share a run), against numpy; numbers take reduce_by_key's single pass (the
    first value of each run), records the heads' selection; empty keys."""
    group = sharded.PlaceGroup.by_devices([0])
    rng = np.random.default_rng(12)
    keys = np.cumsum(rng.choice([0.0, 0.3, 2.0], 50_003, p=[0.6, 0.3, 0.1])).astype(np.float64)
    if value_dtype == "record":
        value_dtype = np.dtype([("a", np.float64), ("b", np.int32)], align=True)
        values = np.zeros(keys.size, value_dtype)
        values["a"] = rng.standard_normal(keys.size)
        values["b"] = np.arange(keys.size)
    else:
        values = rng.integers(0, 120, keys.size).astype(value_dtype)
    k = sharded.ShardedArray.from_numpy(group, keys)
    v = sharded.ShardedArray.from_numpy(group, values)
    near = lambda x, y: abs(x - y) < 1.0  # noqa: E731
    for equal in (None, near):
        heads = np.array(_heads(keys) if equal is None else _heads(keys, near))
        unique_keys, first_values = sharded.unique_by_key(k, v, equal=equal)
        assert first_values.dtype == values.dtype
        np.testing.assert_array_equal(unique_keys.to_numpy(), keys[heads])
        np.testing.assert_array_equal(first_values.to_numpy(), values[heads])
        assert unique_keys.shard_sizes == first_values.shard_sizes == (int(heads.sum()),)
    empty = sharded.ShardedArray.from_numpy(group, np.zeros(0, np.int64))
    no_values = sharded.ShardedArray.from_numpy(group, np.zeros(0, value_dtype))
    unique_keys, first_values = sharded.unique_by_key(empty, no_values)
    assert unique_keys.size == first_values.size == 0


@gpu
def test_out_and_empty(three_places):
    keys = _runs(1000, seed=7)
    values = np.arange(1000, dtype=np.float32)
    k = sharded.ShardedArray.from_numpy(three_places, keys)
    v = sharded.ShardedArray.from_numpy(three_places, values)
    out = sharded.ShardedArray.allocate(three_places, list(v.shard_sizes), np.float64)
    result = sharded.inclusive_scan_by_key(k, v, lambda x, y: x + y, out=out)
    assert result is out
    np.testing.assert_array_equal(out.to_numpy(), _scan_reference(keys, values.astype(np.float64).tolist(),
                                                                  lambda x, y: x + y))
    sharded.exclusive_scan_by_key(k, v, lambda x, y: x + y, 0.0, out=v)  # in place
    np.testing.assert_array_equal(v.to_numpy(), _scan_reference(keys, values.tolist(), lambda x, y: x + y, 0.0))
    empty_keys = sharded.ShardedArray.from_numpy(three_places, np.zeros(0, np.int32))
    empty_values = sharded.ShardedArray.from_numpy(three_places, np.zeros(0, np.float32))
    assert sharded.inclusive_scan_by_key(empty_keys, empty_values, lambda x, y: x + y).size == 0
    assert sharded.exclusive_scan_by_key(empty_keys, empty_values, lambda x, y: x + y, 0.0).size == 0
    unique_keys, reduced = sharded.reduce_by_key(empty_keys, empty_values, lambda x, y: x + y)
    assert unique_keys.size == reduced.size == 0
    unique_keys, no_values = sharded.unique_by_key(empty_keys)
    assert unique_keys.size == 0 and no_values is None
    assert sharded.unique(empty_keys).size == 0


@gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_unique_every_dtype(places, dtype):
    rng = np.random.default_rng(8)
    host = rng.integers(0, 500, 70_001).astype(dtype)
    if np.dtype(dtype).kind == "f":
        host[::997] = np.nan  # np.unique keeps one NaN
    array = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size))
    np.testing.assert_array_equal(sharded.unique(array).to_numpy(), np.unique(host))
    np.testing.assert_array_equal(array.to_numpy(), host)  # left as it was


@gpu
@pytest.mark.parametrize("sizes", [[5000, 0, 1, 4999], [0, 10_000], [3333, 3333, 3334]])
def test_unique_by_key_int64_keys_with_record_values(sizes):
    """8-byte keys whose runs cross shards (a one-element shard inside a run, an empty shard
    between), and 24-byte records riding along: each run's first element, in order."""
    group = sharded.PlaceGroup.by_devices([0] * len(sizes))
    rng = np.random.default_rng(11)
    keys = np.repeat(rng.integers(-2**40, 2**40, 700), rng.integers(1, 30, 700))[:10_000].astype(np.int64)
    record = np.dtype([("a", "<f8"), ("b", "<i4"), ("c", "<i4"), ("d", "<f4")], align=True)
    values = np.zeros(keys.size, record)
    values["a"] = rng.standard_normal(keys.size)
    values["b"] = np.arange(keys.size)
    values["c"] = -np.arange(keys.size)
    values["d"] = rng.standard_normal(keys.size).astype(np.float32)
    k = sharded.ShardedArray.from_numpy(group, keys, sizes=sizes)
    v = sharded.ShardedArray.from_numpy(group, values, sizes=sizes)
    unique_keys, first_values = sharded.unique_by_key(k, v)
    heads = np.array(_heads(keys))
    np.testing.assert_array_equal(unique_keys.to_numpy(), keys[heads])
    np.testing.assert_array_equal(first_values.to_numpy(), values[heads])
    starts = np.cumsum([0] + sizes[:-1])
    where = np.flatnonzero(heads)
    assert unique_keys.shard_sizes == tuple(int(np.count_nonzero((where >= start) & (where < start + size)))
                                            for start, size in zip(starts, sizes))
    assert first_values.shard_sizes == unique_keys.shard_sizes


@gpu
def test_unique_by_key_of_sorted_keys_with_values(places):
    keys = np.sort(np.random.default_rng(9).integers(0, 3000, 200_003)).astype(np.int32)
    values = np.arange(keys.size, dtype=np.int32)
    k = sharded.ShardedArray.from_numpy(places, keys, sizes=uneven(places, keys.size))
    v = sharded.ShardedArray.from_numpy(places, values, sizes=uneven(places, keys.size))
    unique_keys, first_values = sharded.unique_by_key(k, v)
    expected_keys, first_index = np.unique(keys, return_index=True)
    np.testing.assert_array_equal(unique_keys.to_numpy(), expected_keys)
    np.testing.assert_array_equal(first_values.to_numpy(), values[first_index])
    reduced_keys, counts = sharded.reduce_by_key(k, sharded.transform(lambda x: 1, v, out=sharded.ShardedArray.allocate(
        places, list(v.shard_sizes), np.int64)), lambda x, y: x + y)
    np.testing.assert_array_equal(reduced_keys.to_numpy(), expected_keys)
    np.testing.assert_array_equal(counts.to_numpy(), np.unique(keys, return_counts=True)[1])


# ---- argument errors, before anything compiles or runs (no GPU) --------------------------------

def test_keys_and_values_must_match(shim_untouched):
    group = stand_in_group()
    keys = stand_in_array(group, dtype=np.int32)
    add = lambda x, y: x + y  # noqa: E731
    calls = {
        "inclusive_scan_by_key": lambda values: sharded.inclusive_scan_by_key(keys, values, add),
        "exclusive_scan_by_key": lambda values: sharded.exclusive_scan_by_key(keys, values, add, 0),
        "reduce_by_key": lambda values: sharded.reduce_by_key(keys, values, add),
        "unique_by_key": lambda values: sharded.unique_by_key(keys, values),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match="values: belongs to another PlaceGroup than keys"):
            call(stand_in_array(stand_in_group(), dtype=np.int32))
        with pytest.raises(ValueError, match=r"values: shard sizes \(5, 3, 2\) differ from keys': \(4, 3, 3\)"):
            call(stand_in_array(group, (5, 3, 2), np.int32))
        with pytest.raises(TypeError, match="values: expected a ShardedArray, got ndarray"):
            call(np.zeros(10, np.int32))
    record = np.dtype([("x", np.float32), ("y", np.float32)], align=True)
    with pytest.raises(TypeError, match="keys: reduce_by_key takes arrays of numbers, not records"):
        sharded.reduce_by_key(stand_in_array(group, dtype=record), keys, add)
    with pytest.raises(TypeError, match="keys: expected a ShardedArray, got list"):
        sharded.unique_by_key([1, 2, 3])
    with pytest.raises(TypeError, match="a: unique takes arrays of numbers, not records"):
        sharded.unique(stand_in_array(group, dtype=record))


def test_operators_init_and_out(shim_untouched):
    group = stand_in_group()
    keys = stand_in_array(group, dtype=np.int32)
    values = stand_in_array(group, dtype=np.int64)
    pair = np.dtype([("x", np.int64), ("y", np.int64)], align=True)
    pairs = stand_in_array(group, dtype=pair)
    with pytest.raises(TypeError, match="op: 'sum' combines numbers, but values hold records"):
        sharded.inclusive_scan_by_key(keys, pairs, "sum")
    with pytest.raises(ValueError, match="init: an exclusive scan by key needs an initial value"):
        sharded.exclusive_scan_by_key(keys, values, lambda x, y: x + y, None)
    with pytest.raises(TypeError, match=r"init: values hold records \(x: int64, y: int64\), so init is a tuple"):
        sharded.exclusive_scan_by_key(keys, pairs, lambda p, q: p, 0)
    with pytest.raises(TypeError, match="init: values hold int64 numbers; got a tuple"):
        sharded.exclusive_scan_by_key(keys, values, lambda x, y: x + y, (0, 0))
    with pytest.raises(ValueError, match=r"out: shard sizes \(1, 1, 8\) differ from values"):
        sharded.inclusive_scan_by_key(keys, values, lambda x, y: x + y,
                                      out=stand_in_array(group, (1, 1, 8), np.int64))
    with pytest.raises(TypeError, match=r"out: holds \(x: int64, y: int64\), values int64"):
        sharded.inclusive_scan_by_key(keys, values, lambda x, y: x + y, out=pairs)


def test_equal_must_return_a_bool(shim_untouched):
    group = stand_in_group()
    keys = stand_in_array(group, dtype=np.float32)
    with pytest.raises(TypeError, match="equal: operator .* returns float"):
        sharded.unique_by_key(keys, equal=lambda x, y: x - y)
    with pytest.raises(TypeError, match="equal: operator .* returns .*Tuple"):
        sharded.reduce_by_key(keys, keys, lambda x, y: x + y, equal=lambda x, y: (x, y))
    with pytest.raises(TypeError, match="equal"):
        sharded.inclusive_scan_by_key(keys, keys, lambda x, y: x + y, equal=lambda x: True)


def test_the_by_key_engine_compiles_without_a_gpu():
    """The by-key engine's modules link for sm_90 with the values' operator and the keys'
    equality (keys of 4 and 8 bytes; numbers and records; a custom equal; each call's module,
    holding that call's kernels alone); and the head flags the selections by key compute."""
    from cuda_sharded_jit import compiler
    from cuda_sharded_jit.algorithms import by_key

    cases = ((np.int32, np.int64, lambda x, y: x + y, None), (np.float64, AFFINE, _then, None),
             (np.int64, np.float32, lambda x, y: x * y, lambda a, b: abs(a - b) < 1),
             (np.uint32, np.dtype([("x", np.float32), ("y", np.float32), ("z", np.float32)], align=True),
              lambda p, q: (p.x + q.x, p.y, q.z), None),
             (np.int32, np.dtype([("x", np.float64), ("y", np.float64), ("z", np.float64)], align=True),
              lambda p, q: (p.x + q.x, p.y, q.z), None),
             (np.int64, np.dtype([(name, np.int64) for name in "abcd"], align=True),
              lambda p, q: (p.a + q.a, p.b, p.c, q.d), None))
    calls = [("inclusive", "exclusive", "reduce")[index % 3] for index in range(len(cases))]
    cases += ((np.int32, np.int32, by_key._first, None), (np.float64, np.float64, by_key._first, None))
    calls += ["heads", "heads"]
    for (key, value, op, equal), call in zip(cases, calls):
        key, value = np.dtype(key), np.dtype(value)
        op = sharded.Op(op)
        spec = (compiler.BY_KEY_MAP, by_key._EQUAL if equal is None else sharded.Op(equal))
        kinds = (("array", key), ("array", value))
        kernel = compiler._lookup(op, (f"by_key_{call}", op.identity(), compiler._map_identity(spec), kinds, value,
                                       "sm_90"), spec)
        assert kernel.module == (f"by_key_heads_k{key.itemsize}" if call == "heads"
                                 else f"by_key_{call}_k{key.itemsize}_v{value.itemsize}")
        assert kernel.out_dtype == value and kernel.cubin[:4] == b"\x7fELF" and kernel.map_ltoir
        functions = set(re.findall(r"Function : (\w+)", kernel.sass()))
        call_kernels = ({"csj_by_key_heads_count", "csj_by_key_heads_scatter"} if call == "heads" else
                        {"csj_by_key_reduce", "csj_by_key_chunks", "csj_by_key_groups", "csj_by_key_carry",
                         f"csj_by_key_sweep_{call}", f"csj_by_key_one_pass_{call}", f"csj_by_key_one_pass_fix_{call}"}
                        | ({"csj_by_key_one_pass_gather"} if call == "reduce" else set()))
        assert functions == call_kernels == set(compiler._entry_points(kernel)), (call, functions)
    flags = by_key._head_flag(by_key._EQUAL_NAN)
    assert sharded.compile(flags, "transform", (np.float32, np.float32), arch="sm_90",
                           out_dtype=np.int32).out_dtype == np.int32
