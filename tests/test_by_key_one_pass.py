"""The by-key engine's single pass (in one process: each tile read once, joined to the tiles
before it by a look-back in the kernel; runs crossing shards fixed up from the earlier shards'
totals) against numpy answers: many tiles, runs over several whole tiles, runs starting exactly
at tile edges, every element its own run, one run for everything, sizes that are no multiple of
a tile, runs across shards, a non-commutative operator, floats the same bits on every call; and
the two-pass engine forced on the same cases (CSJ_X_BY_KEY=two_pass, the A/B switch, read at
every call: the `engine` fixture sets it). Tiles hold 2048 elements for keys and values of up to 8 bytes, 1024
for 16-byte values (shim/kernels/by_key_params.hpp)."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from helpers.sass import cuobjdump, resource_usage

gpu = pytest.mark.gpu

TILE = 2048  # elements of a tile for keys and values of up to 8 bytes
AFFINE = np.dtype([("a", np.int64), ("b", np.int64)], align=True)  # 16 bytes: tiles of 1024


def _then(p, q):
    """x -> a x + b, then q: associative, not commutative."""
    return (p.a * q.a, p.b * q.a + q.b)


def _heads(keys: np.ndarray) -> np.ndarray:
    return np.r_[True, keys[1:] != keys[:-1]]


def _sum_answers(keys: np.ndarray, values: np.ndarray, init: int = 0):
    """(inclusive, exclusive from init, unique keys, run sums) by numpy, in int64."""
    heads = _heads(keys)
    starts = np.flatnonzero(heads)
    wide = values.astype(np.int64)
    totals = np.cumsum(wide)
    before = np.r_[0, totals][starts][np.cumsum(heads) - 1]  # the sum before each run's head
    inclusive = totals - before
    return inclusive, inclusive - wide + init, keys[starts], np.add.reduceat(wide, starts)


def _affine_answers(keys: np.ndarray, host: np.ndarray):
    """The inclusive scan and the run folds of maps x -> a x + b (a = +-1) composed in order:
    a run's prefix up to i is A_i x + B_i with A_i the product of its a's and B_i = A_i times
    the sum of b_j * (the product of its a's up to j), each a its own inverse."""
    heads = _heads(keys)
    starts = np.flatnonzero(heads)
    run = np.cumsum(heads) - 1
    signs = np.cumprod(host["a"])
    before = np.r_[1, signs][starts][run]  # the product before each run
    within = signs * before  # the product of the run's a's up to i
    weighted = np.cumsum(host["b"] * within)
    weighted_before = np.r_[0, weighted][starts][run]
    scan = np.zeros(keys.size, AFFINE)
    scan["a"] = within
    scan["b"] = within * (weighted - weighted_before)
    last = np.r_[starts[1:], keys.size] - 1
    return scan, scan[last]


def _affine_values(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    host = np.zeros(n, AFFINE)
    host["a"] = rng.choice([-1, 1], n)
    host["b"] = rng.integers(-50, 50, n)
    return host


def _check_affine_by_key(keys: np.ndarray, k, v, host: np.ndarray):
    """Both scans by key and reduce_by_key of the affine maps `host` (on the device as `v`, keys
    `k`) against numpy's sequential answers; returns reduce_by_key's folds."""
    scan, folds = _affine_answers(keys, host)
    got = sharded.inclusive_scan_by_key(k, v, _then).to_numpy()
    np.testing.assert_array_equal(got["a"], scan["a"])
    np.testing.assert_array_equal(got["b"], scan["b"])
    exclusive = sharded.exclusive_scan_by_key(k, v, _then, (1, 0)).to_numpy()  # the identity map first
    shifted = np.r_[np.zeros(1, AFFINE), scan[:-1]]
    shifted[_heads(keys)] = np.array([(1, 0)], AFFINE)
    np.testing.assert_array_equal(exclusive["a"], shifted["a"])
    np.testing.assert_array_equal(exclusive["b"], shifted["b"])
    got_keys, got_folds = sharded.reduce_by_key(k, v, _then)
    np.testing.assert_array_equal(got_keys.to_numpy(), keys[_heads(keys)])
    np.testing.assert_array_equal(got_folds.to_numpy()["a"], folds["a"])
    np.testing.assert_array_equal(got_folds.to_numpy()["b"], folds["b"])
    return got_folds


def _key_cases():
    """(name, keys) for the single pass's edges; values are drawn separately."""
    rng = np.random.default_rng(40)
    n = 37 * TILE + 555  # many tiles, the last one partial
    random_runs = np.repeat(np.arange(n, dtype=np.int32) * 3, rng.integers(1, 12, n))[:n]
    long_runs = np.repeat(np.arange(8, dtype=np.int32), [5, 3 * TILE + 17, 1, 9 * TILE, 2 * TILE - 1, 4, 6 * TILE,
                                                        n])[:n]  # runs over several whole tiles
    at_edges = (np.arange(n, dtype=np.int64) // TILE).astype(np.int32)  # every run starts a tile
    at_edges[5 * TILE:8 * TILE] = 99  # and one spans three tiles exactly
    return [("random_runs", random_runs), ("runs_over_tiles", long_runs), ("runs_at_tile_edges", at_edges),
            ("every_element_its_own_run", np.arange(n, dtype=np.int32)),
            ("one_run", np.full(n, 7, np.int32)),
            ("one_partial_tile", np.repeat(np.arange(40, dtype=np.int32), 25)[:TILE - 3]),
            ("one_element", np.array([5], np.int32))]


@pytest.fixture(params=["one_pass", "two_pass"])
def engine(request, monkeypatch):
    """The single pass (the default where it applies), or the two passes forced by the A/B
    switch, which the engine reads at every call."""
    if request.param == "two_pass":
        monkeypatch.setenv("CSJ_X_BY_KEY", "two_pass")
    else:
        monkeypatch.delenv("CSJ_X_BY_KEY", raising=False)
    return request.param


@gpu
@pytest.mark.parametrize("case", _key_cases(), ids=lambda case: case[0])
@pytest.mark.parametrize("sizes", ["one_place", "middle_of_three"])
def test_int32_sums_by_key(engine, case, sizes):
    """int32 keys and values (the fast case): both scans and reduce_by_key against numpy, on one
    place, and on the middle place of three whose other shards are empty (the single pass too)."""
    keys = case[1]
    n = keys.size
    values = np.random.default_rng(41).integers(-100, 100, n).astype(np.int32)
    if sizes == "one_place":
        group, shard_sizes = sharded.PlaceGroup.by_devices([0]), [n]
    else:
        group, shard_sizes = sharded.PlaceGroup.by_devices([0, 0, 0]), [0, n, 0]
    k = sharded.ShardedArray.from_numpy(group, keys, sizes=shard_sizes)
    v = sharded.ShardedArray.from_numpy(group, values, sizes=shard_sizes)
    inclusive, exclusive, unique_keys, sums = _sum_answers(keys, values, init=3)
    add = lambda x, y: x + y  # noqa: E731
    got = sharded.inclusive_scan_by_key(k, v, add)
    assert got.dtype == np.int32 and got.shard_sizes == tuple(shard_sizes)
    np.testing.assert_array_equal(got.to_numpy(), inclusive)
    np.testing.assert_array_equal(sharded.exclusive_scan_by_key(k, v, add, np.int32(3)).to_numpy(), exclusive)
    got_keys, got_sums = sharded.reduce_by_key(k, v, add)
    np.testing.assert_array_equal(got_keys.to_numpy(), unique_keys)
    np.testing.assert_array_equal(got_sums.to_numpy(), sums)
    expected_sizes = tuple(unique_keys.size if size else 0 for size in shard_sizes)
    assert got_keys.shard_sizes == got_sums.shard_sizes == expected_sizes


@gpu
def test_twelve_byte_records(engine):
    """12-byte records (two float32 and an int32) by int32 keys: elements that no 16-byte
    vector holds whole, so even aligned full tiles load them one by one (tiles of 128). Sums
    of small integers, exact in float32: the inclusive scan and reduce_by_key against numpy,
    over many tiles and runs that cross them."""
    record = np.dtype([("x", np.float32), ("y", np.float32), ("count", np.int32)], align=True)
    assert record.itemsize == 12
    keys = _key_cases()[0][1]
    n = keys.size
    rng = np.random.default_rng(44)
    host = np.zeros(n, record)
    host["x"] = rng.integers(-8, 8, n)
    host["y"] = rng.integers(0, 4, n)
    host["count"] = 1
    group = sharded.PlaceGroup.by_devices([0])
    k = sharded.ShardedArray.from_numpy(group, keys)
    v = sharded.ShardedArray.from_numpy(group, host)
    op = lambda p, q: (p.x + q.x, p.y + q.y, p.count + q.count)  # noqa: E731
    got = sharded.inclusive_scan_by_key(k, v, op).to_numpy()
    unique_keys, reduced = sharded.reduce_by_key(k, v, op)
    for field in ("x", "y", "count"):
        inclusive, _, expected_keys, sums = _sum_answers(keys, host[field].astype(np.int64))
        np.testing.assert_array_equal(got[field].astype(np.int64), inclusive)
        np.testing.assert_array_equal(reduced.to_numpy()[field].astype(np.int64), sums)
        np.testing.assert_array_equal(unique_keys.to_numpy(), expected_keys)


@gpu
@pytest.mark.parametrize("value_dtype", [np.int32, np.int64])
def test_shards_off_the_vector_alignment(value_dtype):
    """A contiguous array whose first shard holds 3 elements starts its second 12 (or, for
    int64 values, 24) bytes into a 16-byte word: that shard's full tiles take the single
    pass's element-by-element loads instead of its 16-byte vectors. Both scans and
    reduce_by_key against numpy, runs crossing the shard boundary and many tile edges."""
    keys = _key_cases()[0][1]
    n = keys.size
    values = np.random.default_rng(43).integers(-100, 100, n).astype(value_dtype)
    group = sharded.PlaceGroup.by_devices([0, 0])
    sizes = [3, n - 3]
    k = sharded.ShardedArray.from_numpy(group, keys, sizes=sizes, contiguous=True)
    v = sharded.ShardedArray.from_numpy(group, values, sizes=sizes, contiguous=True)
    for array in (k, v):  # the second shard is off the 16-byte alignment
        assert array.shard(1).__cuda_array_interface__["data"][0] % 16 != 0
    inclusive, exclusive, unique_keys, sums = _sum_answers(keys, values, init=3)
    add = lambda x, y: x + y  # noqa: E731
    np.testing.assert_array_equal(sharded.inclusive_scan_by_key(k, v, add).to_numpy(), inclusive.astype(value_dtype))
    np.testing.assert_array_equal(sharded.exclusive_scan_by_key(k, v, add, value_dtype(3)).to_numpy(),
                                  exclusive.astype(value_dtype))
    got_keys, got_sums = sharded.reduce_by_key(k, v, add)
    np.testing.assert_array_equal(got_keys.to_numpy(), unique_keys)
    np.testing.assert_array_equal(got_sums.to_numpy(), sums.astype(value_dtype))


@gpu
@pytest.mark.parametrize("case", _key_cases()[:5], ids=lambda case: case[0])
def test_non_commutative_records(engine, case):
    """16-byte records under an associative, non-commutative operator (tiles of 1024, so the key
    cases' runs cross twice as many tile edges): the sequential answer, as numpy composes it."""
    keys = case[1].astype(np.int64)
    n = keys.size
    host = _affine_values(n, seed=42)
    group = sharded.PlaceGroup.by_devices([0])
    k = sharded.ShardedArray.from_numpy(group, keys)
    v = sharded.ShardedArray.from_numpy(group, host)
    _check_affine_by_key(keys, k, v, host)


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_floats_are_the_same_bits_on_every_call(engine, dtype):
    """A float sum by key over 1 500 tiles with runs over many tiles: the look-back's fold has
    one association whatever tile it stops at, so two calls give the same bits (and near the
    float64 answer)."""
    rng = np.random.default_rng(43)
    n = 1500 * TILE + 77
    keys = np.repeat(np.arange(400, dtype=np.int32), rng.integers(1, 4 * n // 400, 400))[:n]
    keys = np.r_[keys, np.full(n - keys.size, 1000, np.int32)]
    values = rng.standard_normal(n).astype(dtype)
    group = sharded.PlaceGroup.by_devices([0])
    k = sharded.ShardedArray.from_numpy(group, keys)
    v = sharded.ShardedArray.from_numpy(group, values)
    add = lambda x, y: x + y  # noqa: E731
    scans = [sharded.inclusive_scan_by_key(k, v, add).to_numpy() for _ in range(3)]
    assert scans[0].tobytes() == scans[1].tobytes() == scans[2].tobytes()
    folds = [sharded.reduce_by_key(k, v, add)[1].to_numpy() for _ in range(3)]
    assert folds[0].tobytes() == folds[1].tobytes() == folds[2].tobytes()
    exact = values.astype(np.float64)
    heads = _heads(keys)
    starts = np.flatnonzero(heads)
    totals = np.cumsum(exact)
    inclusive = totals - np.r_[0.0, totals][starts][np.cumsum(heads) - 1]
    tolerance = 1e-2 if dtype == np.float32 else 1e-8
    np.testing.assert_allclose(scans[0], inclusive, rtol=tolerance, atol=tolerance * 100)
    np.testing.assert_allclose(folds[0], np.add.reduceat(exact, starts), rtol=tolerance, atol=tolerance * 100)


@gpu
@pytest.mark.parametrize("runs", [[1 << 22], [1000, (1 << 21) + 3, (1 << 21) - 1003]], ids=["one_run", "three_runs"])
def test_look_backs_far_behind(runs):
    """Runs over thousands of tiles (2^22 elements; warp tiles of 512 for 4-byte keys and values,
    128 for 16-byte records): no tile after a run's first holds a head, so each look-back folds
    its group's tiles back to the group's first and the groups back to the nearest known
    prefix, which look-backs passing groups that still wait on theirs publish on the way.
    int32 sums exact against numpy (both scans, reduce_by_key),
    float32 sums the same bits on every call and near the float64 answer, and the composition
    of affine maps (16-byte records: the flagged look-back) against numpy."""
    n = sum(runs)
    keys = np.repeat(np.arange(len(runs), dtype=np.int32) * 5, runs)
    rng = np.random.default_rng(47)
    group = sharded.PlaceGroup.by_devices([0])
    k = sharded.ShardedArray.from_numpy(group, keys)
    add = lambda x, y: x + y  # noqa: E731
    values = rng.integers(-100, 100, n).astype(np.int32)
    v = sharded.ShardedArray.from_numpy(group, values)
    inclusive, exclusive, unique_keys, sums = _sum_answers(keys, values, init=3)
    np.testing.assert_array_equal(sharded.inclusive_scan_by_key(k, v, add).to_numpy(), inclusive)
    np.testing.assert_array_equal(sharded.exclusive_scan_by_key(k, v, add, np.int32(3)).to_numpy(), exclusive)
    got_keys, got_sums = sharded.reduce_by_key(k, v, add)
    np.testing.assert_array_equal(got_keys.to_numpy(), unique_keys)
    np.testing.assert_array_equal(got_sums.to_numpy(), sums)

    floats = rng.random(n, dtype=np.float32)
    f = sharded.ShardedArray.from_numpy(group, floats)
    scans = [sharded.inclusive_scan_by_key(k, f, add).to_numpy() for _ in range(3)]
    assert scans[0].tobytes() == scans[1].tobytes() == scans[2].tobytes()
    folds = [sharded.reduce_by_key(k, f, add)[1].to_numpy() for _ in range(3)]
    assert folds[0].tobytes() == folds[1].tobytes() == folds[2].tobytes()
    heads = _heads(keys)
    starts = np.flatnonzero(heads)
    totals = np.cumsum(floats.astype(np.float64))
    exact = totals - np.r_[0.0, totals][starts][np.cumsum(heads) - 1]
    np.testing.assert_allclose(scans[0], exact, rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(folds[0], np.add.reduceat(floats.astype(np.float64), starts), rtol=1e-3)

    host = _affine_values(n, 48)
    a = sharded.ShardedArray.from_numpy(group, host)
    scan, folded = _affine_answers(keys, host)
    got = sharded.inclusive_scan_by_key(k, a, _then).to_numpy()
    np.testing.assert_array_equal(got["a"], scan["a"])
    np.testing.assert_array_equal(got["b"], scan["b"])
    got_folds = sharded.reduce_by_key(k, a, _then)[1].to_numpy()
    np.testing.assert_array_equal(got_folds["a"], folded["a"])
    np.testing.assert_array_equal(got_folds["b"], folded["b"])


@gpu
@pytest.mark.parametrize("sizes", [[3 * TILE + 5, TILE, 0, 2 * TILE + 100, 77], [1, 5 * TILE, 1, 1, TILE - 1],
                                   [TILE, TILE, TILE]])
def test_runs_across_shards(engine, sizes):
    """Several places of one GPU: each shard's single pass starts with no carry, and a run that
    comes in from earlier shards (over whole shards, or ending at a shard's first element) gets
    their fold through the fix-up; the non-commutative operator gives the sequential answer."""
    n = sum(sizes)
    lengths = [2, 4 * TILE, 1, 3 * TILE + 40, 9, TILE, 2 * TILE, 1, n]
    keys = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)[:n]
    host = _affine_values(n, seed=45)
    group = sharded.PlaceGroup.by_devices([0] * len(sizes))
    k = sharded.ShardedArray.from_numpy(group, keys, sizes=sizes)
    v = sharded.ShardedArray.from_numpy(group, host, sizes=sizes)
    got_folds = _check_affine_by_key(keys, k, v, host)
    ends = np.flatnonzero(np.append(keys[1:] != keys[:-1], True))  # each run's last index
    bounds = np.cumsum([0] + sizes)
    assert got_folds.shard_sizes == tuple(int(((ends >= lo) & (ends < hi)).sum()) for lo, hi in zip(bounds, bounds[1:]))
    # int32 sums, tiles of 2048
    values = np.random.default_rng(46).integers(-100, 100, n).astype(np.int32)
    w = sharded.ShardedArray.from_numpy(group, values, sizes=sizes)
    k32 = sharded.ShardedArray.from_numpy(group, keys.astype(np.int32), sizes=sizes)
    inclusive, exclusive, unique_keys, sums = _sum_answers(keys, values, init=-4)
    np.testing.assert_array_equal(sharded.inclusive_scan_by_key(k32, w, "sum").to_numpy(), inclusive)
    np.testing.assert_array_equal(sharded.exclusive_scan_by_key(k32, w, lambda x, y: x + y, np.int32(-4)).to_numpy(),
                                  exclusive)
    got_keys, got_sums = sharded.reduce_by_key(k32, w, "sum")
    np.testing.assert_array_equal(got_keys.to_numpy(), unique_keys)
    np.testing.assert_array_equal(got_sums.to_numpy(), sums)


@gpu
@pytest.mark.parametrize("values_kind", ["int32", "affine"])
def test_fix_ups_stop_in_a_later_look_back_group(engine, values_kind):
    """Two places of one GPU; the run from the first shard ends early in the second, and a run
    of over 32 pass tiles follows it (the look-back joins tiles in groups of 32: a tile's local
    record in the next group holds no head of its own, the groups' prefix does). The fix-up
    that adds the first shard's fold must stop at that first run's end; int32 sums exact
    (packed records) and composed affine maps (wider records) against numpy."""
    wide = values_kind == "affine"
    pass_tile = 128 if wide else 512  # int32 keys: lanes of 16 items, 16-byte values 4
    lengths = [1000 + 3 * pass_tile, 40 * pass_tile + 7, 33 * pass_tile, 5, 2 * pass_tile]
    keys = np.repeat(np.arange(len(lengths), dtype=np.int32) * 7, lengths)
    n = keys.size
    sizes = [1000, n - 1000]
    group = sharded.PlaceGroup.by_devices([0, 0])
    k = sharded.ShardedArray.from_numpy(group, keys, sizes=sizes)
    if wide:
        host = _affine_values(n, seed=49)
        v = sharded.ShardedArray.from_numpy(group, host, sizes=sizes)
        _check_affine_by_key(keys, k, v, host)
    else:
        values = np.random.default_rng(50).integers(-100, 100, n).astype(np.int32)
        v = sharded.ShardedArray.from_numpy(group, values, sizes=sizes)
        inclusive, exclusive, unique_keys, sums = _sum_answers(keys, values, init=5)
        add = lambda x, y: x + y  # noqa: E731
        np.testing.assert_array_equal(sharded.inclusive_scan_by_key(k, v, add).to_numpy(), inclusive)
        np.testing.assert_array_equal(sharded.exclusive_scan_by_key(k, v, add, np.int32(5)).to_numpy(), exclusive)
        got_keys, got_sums = sharded.reduce_by_key(k, v, add)
        np.testing.assert_array_equal(got_keys.to_numpy(), unique_keys)
        np.testing.assert_array_equal(got_sums.to_numpy(), sums)


@gpu
@pytest.mark.parametrize("layout", ["a_head_in_every_tile", "one_run_over_many_tiles"])
@pytest.mark.parametrize("values_kind", ["int32", "affine"])
def test_reduce_by_key_look_backs(engine, layout, values_kind):
    """reduce_by_key's two look-backs against numpy: the run ends before a tile (CUB's, over
    integers) and the pairs (a left fold, stopped by the nearest head tile). With a head in
    every tile each pair look-back stops at the tile before while the run-end count must
    still cover every tile; with one run over hundreds of whole tiles the pair look-back
    walks back far while no tile before the run's end counts an end. A non-commutative
    operator gives the sequential answer only where the pair fold keeps tile order."""
    rng = np.random.default_rng(47)
    if layout == "a_head_in_every_tile":
        n = 300 * TILE + 1001
        lengths = rng.integers(1, TILE // 2, n)  # runs shorter than half a tile
        keys = np.repeat(np.arange(n, dtype=np.int64) * 5 - n, lengths)[:n]
    else:
        n = 700 * TILE + 333
        # a short run, one over 600 whole tiles that starts off a tile edge, then short runs
        lengths = np.r_[[TILE // 3, 600 * TILE + 77], rng.integers(1, 200, n)]
        keys = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)[:n]
    heads = _heads(keys)
    group = sharded.PlaceGroup.by_devices([0])
    if values_kind == "int32":
        keys32 = keys.astype(np.int32)
        values = rng.integers(-1000, 1000, n).astype(np.int32)
        k = sharded.ShardedArray.from_numpy(group, keys32)
        v = sharded.ShardedArray.from_numpy(group, values)
        _, _, unique_keys, sums = _sum_answers(keys32, values)
        got_keys, got_sums = sharded.reduce_by_key(k, v, lambda x, y: x + y)
        np.testing.assert_array_equal(got_keys.to_numpy(), unique_keys)
        np.testing.assert_array_equal(got_sums.to_numpy(), sums.astype(np.int32))
        assert got_keys.shard_sizes == got_sums.shard_sizes == (int(heads.sum()),)
    else:
        host = _affine_values(n, seed=48)
        k = sharded.ShardedArray.from_numpy(group, keys)
        v = sharded.ShardedArray.from_numpy(group, host)
        _, folds = _affine_answers(keys, host)
        got_keys, got_folds = sharded.reduce_by_key(k, v, _then)
        np.testing.assert_array_equal(got_keys.to_numpy(), keys[heads])
        np.testing.assert_array_equal(got_folds.to_numpy()["a"], folds["a"])
        np.testing.assert_array_equal(got_folds.to_numpy()["b"], folds["b"])
        assert got_folds.shard_sizes == (int(heads.sum()),)


@gpu
@pytest.mark.parametrize("values_kind", ["int32", "int32_off_alignment", "affine", "twelve_bytes"])
def test_reduce_by_key_with_more_groups_than_resident_blocks(values_kind):
    """reduce_by_key's single pass launches only the blocks resident at once, which loop over
    groups of tiles, each warp copying its next tile in while it works on the current one: a
    shard of several times as many groups as an H100 or H200 holds blocks (about 530 groups of
    4096 int32 pairs; 16- and 12-byte values take tiles of 128), runs of 1 to 200 crossing
    every tile edge, against numpy. Also a shard off the 16-byte alignment (4-byte copies), a
    non-commutative operator (the sequential answer), and 12-byte records (no prefetch)."""
    rng = np.random.default_rng(49)
    n = 6_000_000 + 333 if values_kind.startswith("int32") else 2_000_000 + 77
    keys = np.repeat(np.arange(n, dtype=np.int64) * 3 - n, rng.integers(1, 200, n))[:n]
    heads = _heads(keys)
    if values_kind.startswith("int32"):
        keys = keys.astype(np.int32)
        host = rng.integers(-1000, 1000, n).astype(np.int32)
    elif values_kind == "affine":
        host = _affine_values(n, seed=50)
    else:
        keys = keys.astype(np.int32)
        host = np.zeros(n, np.dtype([("x", np.float32), ("y", np.float32), ("count", np.int32)], align=True))
        host["x"] = rng.integers(-8, 8, n)
        host["y"] = rng.integers(0, 4, n)
        host["count"] = 1
    if values_kind == "int32_off_alignment":
        group, sizes = sharded.PlaceGroup.by_devices([0, 0]), [3, n - 3]
    else:
        group, sizes = sharded.PlaceGroup.by_devices([0]), [n]
    k = sharded.ShardedArray.from_numpy(group, keys, sizes=sizes, contiguous=True)
    v = sharded.ShardedArray.from_numpy(group, host, sizes=sizes, contiguous=True)
    if values_kind == "affine":
        op = _then
        _, expected = _affine_answers(keys, host)
        fields = ("a", "b")
    elif values_kind == "twelve_bytes":
        op = lambda p, q: (p.x + q.x, p.y + q.y, p.count + q.count)  # noqa: E731
        starts = np.flatnonzero(heads)
        expected = {field: np.add.reduceat(host[field].astype(np.int64), starts) for field in host.dtype.names}
        fields = host.dtype.names
    else:
        op = lambda x, y: x + y  # noqa: E731
        expected = {None: _sum_answers(keys, host)[3]}
        fields = (None,)
    got_keys, got_values = sharded.reduce_by_key(k, v, op)
    np.testing.assert_array_equal(got_keys.to_numpy(), keys[heads])
    got = got_values.to_numpy()
    for field in fields:
        column = got if field is None else got[field]
        np.testing.assert_array_equal(column.astype(np.int64), expected[field].astype(np.int64))
    assert sum(got_values.shard_sizes) == int(heads.sum())


@gpu
def test_scan_in_place_over_values():
    """out=values: each tile reads its own values before writing them, the look-back reads only
    published records, so scanning into the values is safe."""
    rng = np.random.default_rng(44)
    n = 21 * TILE + 9
    keys = np.repeat(np.arange(n, dtype=np.int64), rng.integers(1, 5000, n))[:n]
    values = rng.integers(-100, 100, n).astype(np.int64)
    group = sharded.PlaceGroup.by_devices([0])
    k = sharded.ShardedArray.from_numpy(group, keys)
    v = sharded.ShardedArray.from_numpy(group, values)
    assert sharded.inclusive_scan_by_key(k, v, "sum", out=v) is v
    np.testing.assert_array_equal(v.to_numpy(), _sum_answers(keys, values)[0])


def test_the_single_pass_kernels_fit_the_register_budget():
    """Linked for sm_90 with int32 keys and values and a numba add, the single pass's three
    kernels, their fix-ups and reduce_by_key's gather are in their modules and hold at most 64
    registers a thread (4 blocks of 256 threads a multiprocessor) with no local memory (no
    spills). Needs no GPU; cuobjdump from the nvidia-cuda-cuobjdump wheel or PATH."""
    tool = cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    from cuda_sharded_jit import compiler
    from cuda_sharded_jit.algorithms import by_key

    key = value = np.dtype(np.int32)
    op = sharded.Op(lambda x, y: x + y)
    spec = (compiler.BY_KEY_MAP, by_key._EQUAL)
    kinds = (("array", key), ("array", value))
    modes = ("inclusive", "exclusive", "reduce")
    found = {}
    for call in modes:
        kernel = compiler._lookup(op, (f"by_key_{call}", op.identity(), compiler._map_identity(spec), kinds, value,
                                       "sm_90"), spec)
        found.update((name, usage) for name, usage in resource_usage(tool, kernel.cubin).items()
                     if name.startswith("csj_by_key_one_pass_"))
    expected = {f"csj_by_key_one_pass_{fix}{mode}" for mode in modes for fix in ("", "fix_")}
    assert set(found) == expected | {"csj_by_key_one_pass_gather"}, found
    for name, (registers, stack) in found.items():
        assert registers <= 64 and stack == 0, (name, registers, stack)
