"""select, partition, three_way_partition and the flagged compaction against numpy's boolean
indexing: keeping none, all, one element, only in one shard; empty shards; uneven and explicit
sizes; 1 to 4 places; every dtype and records; the global index. Each result's shard i must
hold exactly what shard i kept. select's single pass and the two passes it falls back to,
each over more tiles than a wave of blocks. CPU tests: every argument error, before anything
runs."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim
from cuda_sharded_jit.algorithms import select as select_module
from cuda_sharded_jit.algorithms.select import select_flagged

from conftest import ALL_DTYPES, sample, uneven
from helpers.sass import cuobjdump, resource_usage, shared_fits_sm90, static_shared
from test_errors import shim_untouched, stand_in_array, stand_in_group  # noqa: F401 (fixture)
from test_records import MIXED, POINT, WIDE, XYZ, random_records

# several tiles of every element size (4096 4-byte elements, 2048 8-byte ones; twice that in
# the single pass), no multiple
LARGE = 100_003


def shard_pieces(host: np.ndarray, sizes) -> list[np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return [host[offsets[i]:offsets[i + 1]] for i in range(len(sizes))]


@pytest.fixture(params=[True, False], ids=["single pass", "two passes"])
def engine(request, monkeypatch):
    """select's two engines: the single pass, and the two passes forced by the internal switch."""
    monkeypatch.setattr(select_module, "_SINGLE_PASS", request.param)
    return request.param


def check_per_shard(result: sharded.ShardedArray, host: np.ndarray, sizes, keep: np.ndarray) -> None:
    """result holds host[keep] in global order, shard i holding what shard i kept."""
    expected_sizes = tuple(int(piece.sum()) for piece in shard_pieces(keep, sizes))
    assert result.shard_sizes == expected_sizes
    assert len(result) == int(keep.sum())
    np.testing.assert_array_equal(result.to_numpy(), host[keep])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_select_matches_numpy(engine, places, dtype):
    host = sample(dtype, LARGE, seed=3)
    sizes = uneven(places, LARGE)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    result = sharded.select(a, lambda x: x > 0)
    check_per_shard(result, host, sizes, host > 0)


@pytest.mark.gpu
@pytest.mark.parametrize("name, pred, keep", [
    ("none", lambda x: x < 0, lambda host: np.zeros(len(host), bool)),
    ("all", lambda x: x >= 0, lambda host: np.ones(len(host), bool)),
    ("one", lambda x: x == 4097, lambda host: host == 4097),
    ("first shard only", lambda x: x < 10, lambda host: host < 10),
    ("last shard only", lambda x: x >= 99_990, lambda host: host >= 99_990),
])
def test_select_edge_cases(engine, places, name, pred, keep):
    host = np.arange(LARGE, dtype=np.int64)
    sizes = uneven(places, LARGE)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    check_per_shard(sharded.select(a, pred), host, sizes, keep(host))


@pytest.mark.gpu
def test_select_explicit_sizes_with_empty_shards(engine, three_places):
    host = sample(np.float32, 9000, seed=1)
    sizes = [0, 9000, 0]
    a = sharded.ShardedArray.from_numpy(three_places, host, sizes=sizes)
    check_per_shard(sharded.select(a, lambda x: x < 0.5), host, sizes, host < 0.5)


@pytest.mark.gpu
def test_select_of_an_empty_array(engine, three_places):
    a = sharded.ShardedArray.allocate(three_places, [0, 0, 0], np.float64)
    result = sharded.select(a, lambda x: x > 0)
    assert result.shard_sizes == (0, 0, 0) and len(result) == 0


@pytest.mark.gpu
def test_select_with_index(engine, places):
    host = sample(np.int32, LARGE, seed=5)
    sizes = uneven(places, LARGE)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    result = sharded.select(a, lambda x, i: i % 3 == 0 and x > 0, with_index=True)
    index = np.arange(LARGE)
    check_per_shard(result, host, sizes, (index % 3 == 0) & (host > 0))


@pytest.mark.gpu
def test_select_integer_predicate(three_places):
    host = np.arange(10_000, dtype=np.uint32)
    a = sharded.ShardedArray.from_numpy(three_places, host)
    check_per_shard(sharded.select(a, lambda x: x & 1), host, a.shard_sizes, (host & 1) != 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [POINT, XYZ, MIXED, WIDE], ids=lambda d: f"{d.itemsize}B")
def test_select_records(engine, places, dtype):
    host = random_records(dtype, 20_011, seed=2)
    field = dtype.names[0]
    sizes = uneven(places, len(host))
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    result = sharded.select(a, lambda r: r[0] > 0)
    assert result.dtype == dtype
    check_per_shard(result, host, sizes, host[field] > 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_partition_matches_numpy(places, dtype):
    host = sample(dtype, LARGE, seed=7)
    sizes = uneven(places, LARGE)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    median = np.sort(host)[LARGE // 2]
    yes, no = sharded.partition(a, lambda x: x < median)
    keep = host < median
    check_per_shard(yes, host, sizes, keep)
    check_per_shard(no, host, sizes, ~keep)


@pytest.mark.gpu
def test_partition_all_one_side(three_places):
    host = np.arange(5000, dtype=np.float64)
    a = sharded.ShardedArray.from_numpy(three_places, host, sizes=[2000, 0, 3000])
    yes, no = sharded.partition(a, lambda x: x >= 0)
    check_per_shard(yes, host, [2000, 0, 3000], np.ones(5000, bool))
    assert no.shard_sizes == (0, 0, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_three_way_partition_matches_numpy(places, dtype):
    host = sample(dtype, LARGE, seed=11)
    sizes = uneven(places, LARGE)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    ordered = np.sort(host)
    low, high = ordered[LARGE // 3], ordered[2 * LARGE // 3]
    first, second, rest = sharded.three_way_partition(a, lambda x: x < low, lambda x: x < high)
    in_first = host < low
    in_second = ~in_first & (host < high)
    check_per_shard(first, host, sizes, in_first)
    check_per_shard(second, host, sizes, in_second)
    check_per_shard(rest, host, sizes, ~in_first & ~in_second)


@pytest.mark.gpu
def test_three_way_partition_overlapping_predicates(three_places):
    """An element true for both predicates goes to the first part only."""
    host = np.arange(9000, dtype=np.int64)
    a = sharded.ShardedArray.from_numpy(three_places, host)
    first, second, rest = sharded.three_way_partition(a, lambda x: x % 2 == 0, lambda x: x % 3 == 0)
    in_first = host % 2 == 0
    in_second = ~in_first & (host % 3 == 0)
    check_per_shard(first, host, a.shard_sizes, in_first)
    check_per_shard(second, host, a.shard_sizes, in_second)
    check_per_shard(rest, host, a.shard_sizes, ~in_first & ~in_second)


@pytest.mark.gpu
@pytest.mark.parametrize("flag_dtype", [np.int32, np.uint32, np.int64, np.uint64])
def test_select_flagged(places, flag_dtype):
    n = 30_001
    sizes = uneven(places, n)
    rng = np.random.default_rng(4)
    flags = (rng.random(n) < 0.3).astype(flag_dtype)
    keys = sample(np.int64, n, seed=1)
    values = random_records(MIXED, n, seed=2)
    extra = [sample(dtype, n, seed=seed) for seed, dtype in enumerate(ALL_DTYPES)]
    arrays = [sharded.ShardedArray.from_numpy(places, host, sizes=sizes) for host in [keys, values] + extra]
    flag_array = sharded.ShardedArray.from_numpy(places, flags, sizes=sizes)
    results = select_flagged(arrays, flag_array)
    keep = flags != 0
    assert len(results) == len(arrays)
    for result, host in zip(results, [keys, values] + extra):
        assert result.dtype == host.dtype
        check_per_shard(result, host, sizes, keep)


# ---- many tiles: the single pass's look-back, the shrink ------------------------------------
#
# A tile of the two passes is 4096 elements of 4 bytes, 2048 of 8, 1024 records of 16 bytes;
# of the single pass 8192, 4096 and 1024 (select_params.hpp). MANY_TILES 4-byte elements are
# 550 single-pass tiles and a piece, more than a wave of its blocks on an H200 (132
# multiprocessors, 4 blocks each), so tiles are taken from the counter by blocks of later
# waves and look-backs cross many tiles; 8-byte elements make twice as many. The single pass
# keeps an output shard's allocation when it keeps at least a quarter of its elements and
# copies it to an exact one otherwise: the fractions below take both ways.
MANY_TILES = 4096 * 1100 + 37


def uniform(n, seed):
    return np.random.default_rng(seed).random(n).astype(np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("threshold", [0.0, 0.03125, 0.5, 0.96875, 1.0])  # exact in float32
def test_select_many_tiles(engine, places, threshold):
    host = uniform(MANY_TILES, seed=21)
    sizes = uneven(places, MANY_TILES)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    check_per_shard(sharded.select(a, lambda x: x < threshold), host, sizes, host < np.float32(threshold))


@pytest.mark.gpu
def test_select_many_waves_of_tiles(engine, one_place):
    """A long shard: some 3000 single-pass tiles, many waves of blocks, look-backs across them."""
    n = 4096 * 6000 + 101
    host = uniform(n, seed=26)
    a = sharded.ShardedArray.from_numpy(one_place, host)
    for threshold in (0.5, 0.001):
        check_per_shard(sharded.select(a, lambda x: x < threshold), host, [n], host < np.float32(threshold))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_select_unaligned_shards(engine, three_places, dtype):
    """Shards of one address range start at odd elements, not 16-byte aligned."""
    sizes = [4096 * 700 + 3, 4096 * 300 + 1, 4096 * 500 + 7]
    host = sample(dtype, sum(sizes), seed=27)
    a = sharded.ShardedArray.from_numpy(three_places, host, sizes=sizes, contiguous=True)
    check_per_shard(sharded.select(a, lambda x: x % 2 == 0), host, sizes, host % 2 == 0)


@pytest.mark.gpu
def test_select_many_tiles_8_byte(engine, places):
    host = sample(np.int64, MANY_TILES, seed=22)
    sizes = uneven(places, MANY_TILES)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    check_per_shard(sharded.select(a, lambda x: x % 3 != 0), host, sizes, host % 3 != 0)


@pytest.mark.gpu
def test_select_many_tiles_with_index(engine, places):
    """The index a tile's elements get (tiles taken in counter order, not by block) is global."""
    host = uniform(MANY_TILES, seed=23)
    sizes = uneven(places, MANY_TILES)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    result = sharded.select(a, lambda x, i: i % 7 == 3 or x < 0.25, with_index=True)
    index = np.arange(MANY_TILES)
    check_per_shard(result, host, sizes, (index % 7 == 3) | (host < np.float32(0.25)))


@pytest.mark.gpu
def test_select_many_tiles_records(engine, one_place):
    n = 1024 * 700 + 5  # 16-byte records: 700 tiles and a piece
    dtype = np.dtype([("x", np.float32), ("y", np.int32), ("z", np.float64)], align=True)
    host = np.zeros(n, dtype)
    rng = np.random.default_rng(24)
    host["x"], host["y"], host["z"] = rng.standard_normal(n), rng.integers(-9, 9, n), rng.standard_normal(n)
    a = sharded.ShardedArray.from_numpy(one_place, host)
    result = sharded.select(a, lambda r: r[1] > 2)
    assert result.dtype == dtype
    check_per_shard(result, host, [n], host["y"] > 2)


@pytest.mark.gpu
def test_select_many_tiles_empty_shards_between(engine, three_places):
    host = uniform(2 * MANY_TILES, seed=25)
    sizes = [MANY_TILES + 4000, 0, MANY_TILES - 4000]
    a = sharded.ShardedArray.from_numpy(three_places, host, sizes=sizes)
    check_per_shard(sharded.select(a, lambda x: x < 0.75), host, sizes, host < np.float32(0.75))


@pytest.mark.gpu
def test_select_result_is_an_ordinary_array(engine, one_place):
    """A shrunk result (its allocation kept, or copied to an exact one) reduces, takes writes
    and frees like any other array."""
    host = sample(np.int64, MANY_TILES, seed=26)
    a = sharded.ShardedArray.from_numpy(one_place, host)
    for bound in (-900, 900):  # about 95% kept (the allocation kept), 5% (copied)
        kept = sharded.select(a, lambda x: x > bound)
        expected = host[host > bound]
        assert kept.shard_sizes == (len(expected),)
        assert int(sharded.reduce(kept, op="sum")) == int(expected.sum())
        sharded.fill(kept, 5)
        np.testing.assert_array_equal(kept.to_numpy(), np.full(len(expected), 5, np.int64))
        kept.free()


@pytest.mark.gpu
def test_partition_many_tiles(places):
    host = sample(np.int64, MANY_TILES, seed=27)
    sizes = uneven(places, MANY_TILES)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    yes, no = sharded.partition(a, lambda x: x < -400)
    keep = host < -400
    check_per_shard(yes, host, sizes, keep)
    check_per_shard(no, host, sizes, ~keep)


@pytest.mark.gpu
def test_single_pass_repeats_bitwise(one_place):
    """Whatever order the look-back meets the tiles in, the positions are the same."""
    host = uniform(MANY_TILES, seed=29)
    a = sharded.ShardedArray.from_numpy(one_place, host)
    runs = [sharded.select(a, lambda x: x < 0.5).to_numpy() for _ in range(3)]
    np.testing.assert_array_equal(runs[0], host[host < np.float32(0.5)])
    for run in runs[1:]:
        np.testing.assert_array_equal(run, runs[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_single_pass_fits_its_budget(dtype):
    """Linked for sm_90, the single pass stages its tile of 32 KiB (32 4-byte or 16 8-byte items
    a thread) in shared memory by a bulk copy (UBLKCP) and holds at most 40 registers with no
    local memory: its launch bounds, 6 blocks of 256 threads a multiprocessor, which the 228 KiB
    of shared memory an sm_90 multiprocessor has (1 KiB of it reserved a block) also fit. Needs
    no GPU; cuobjdump from the nvidia-cuda-cuobjdump wheel or PATH."""
    tool = cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    from cuda_sharded_jit import compiler

    op = sharded.Op(lambda x: x < 0.5)
    spec = compiler.select_spec(None, False)
    kernel = compiler._lookup(op, ("select", op.identity(), compiler._map_identity(spec),
                                   (("array", np.dtype(dtype)),), None, "sm_90"), spec)
    registers, stack = resource_usage(tool, kernel.cubin)["csj_select_single"]
    assert registers <= 40 and stack == 0, (registers, stack)
    shared = static_shared(tool, kernel.cubin)["csj_select_single"]
    assert 32 * 1024 < shared and shared_fits_sm90(shared, 6), shared
    single = kernel.sass().split("Function : csj_select_single")[1].split("Function : ")[0]
    assert "UBLKCP" in single


# ---- argument errors (CPU: stand-ins, nothing reaches the shim) ---------------------------

@pytest.fixture
def untouched(shim_untouched, monkeypatch):
    """shim_untouched, with this family's shim entry points guarded too."""
    for name in ("select", "select_flagged", "redistribute"):
        def entry(*args, _name=name, **kwargs):
            shim_untouched.append(_name)
            raise AssertionError(f"_shim.{_name} was reached: the error came too late")
        monkeypatch.setattr(_shim, name, entry)
    return shim_untouched


@pytest.mark.parametrize("single_pass", [True, False])
def test_engine_switch_reaches_the_shim(monkeypatch, single_pass):
    """select._SINGLE_PASS (the tests' and A/B runs' way to the two passes) is what the shim
    is told, for every member of the family (the shim takes one pass for a select only)."""
    calls = []
    monkeypatch.setattr(select_module, "kernel_libraries", lambda *args: (None, ["library"] * 3))
    monkeypatch.setattr(_shim, "select", lambda libraries, a, outputs, one_pass: calls.append((outputs, one_pass))
                        or [])
    monkeypatch.setattr(select_module, "_SINGLE_PASS", single_pass)
    a = stand_in_array(stand_in_group())
    for call in (lambda: sharded.select(a, lambda x: x > 0), lambda: sharded.partition(a, lambda x: x > 0),
                 lambda: sharded.three_way_partition(a, lambda x: x > 0, lambda x: x > 1)):
        try:
            call()
        except (IndexError, ValueError):  # the stand-in shim returns no arrays to unpack
            pass
    assert calls == [(1, single_pass), (2, single_pass), (3, single_pass)]


def test_select_rejects_bad_arguments(untouched):
    group = stand_in_group()
    a = stand_in_array(group)
    with pytest.raises(TypeError, match="a: expected a ShardedArray"):
        sharded.select(np.zeros(3), lambda x: x > 0)
    with pytest.raises(TypeError, match="pred"):
        sharded.select(a, 3)
    with pytest.raises(TypeError, match="takes 1 argument, but select .with the index. passes 2"):
        sharded.select(a, lambda x: x > 0, with_index=True)
    with pytest.raises(TypeError, match="takes 2 arguments, but select passes 1"):
        sharded.select(a, lambda x, i: x > 0)
    with pytest.raises(TypeError, match="with_index"):
        sharded.select(a, lambda x: x > 0, with_index="yes")


def test_select_rejects_a_predicate_without_a_bool(untouched):
    a = stand_in_array(stand_in_group())
    with pytest.raises(TypeError, match=r"pred: predicate .* returns float64"):
        sharded.select(a, lambda x: x * 2.0)
    with pytest.raises(TypeError, match=r"second: predicate .* returns float64"):
        sharded.three_way_partition(a, lambda x: x > 0, lambda x: x + 1.0)


def test_partition_rejects_bad_arguments(untouched):
    a = stand_in_array(stand_in_group())
    with pytest.raises(TypeError, match="a: expected a ShardedArray"):
        sharded.partition([1, 2], lambda x: x > 0)
    with pytest.raises(TypeError, match="takes 2 arguments, but partition passes 1"):
        sharded.partition(a, lambda x, y: x > y)


def test_three_way_partition_rejects_bad_arguments(untouched):
    a = stand_in_array(stand_in_group())
    with pytest.raises(TypeError, match="first"):
        sharded.three_way_partition(a, None, lambda x: x > 0)
    with pytest.raises(TypeError, match="second"):
        sharded.three_way_partition(a, lambda x: x > 0, "x > 0")
    with pytest.raises(TypeError, match=r"three_way_partition \(second\) passes 1"):
        sharded.three_way_partition(a, lambda x: x > 0, lambda x, y: x > y)


def test_select_flagged_rejects_bad_arguments(untouched):
    group = stand_in_group()
    flags = stand_in_array(group, dtype=np.int32)
    keys = stand_in_array(group, dtype=np.float64)
    with pytest.raises(TypeError, match="flags: expected a ShardedArray"):
        select_flagged([keys], np.ones(10, np.int32))
    with pytest.raises(TypeError, match="flags: expected 0/1 flags"):
        select_flagged([keys], stand_in_array(group, dtype=np.float32))
    with pytest.raises(TypeError, match="arrays: expected a list"):
        select_flagged(keys, flags)
    with pytest.raises(ValueError, match="arrays: expected at least one"):
        select_flagged([], flags)
    with pytest.raises(TypeError, match=r"arrays\[1\]: expected a ShardedArray"):
        select_flagged([keys, np.zeros(10)], flags)
    with pytest.raises(ValueError, match=r"arrays\[0\]: belongs to another PlaceGroup"):
        select_flagged([stand_in_array(stand_in_group())], flags)
    with pytest.raises(ValueError, match=r"arrays\[0\]: shard sizes \(5, 3, 2\) differ"):
        select_flagged([stand_in_array(group, (5, 3, 2))], flags)
