"""GPU tests of inclusive / exclusive scans and adjacent_difference against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import ALL_DTYPES, cupy_or_skip, sample
from test_reduce import _matmul_packed, _matrices

pytestmark = pytest.mark.gpu

SIZES = [[0, 0, 0], [1, 0, 0], [0, 5000, 1], [(1 << 16) + 7, 3, 1 << 17], [700_001, 0, 299_999]]


def _running(values, op):
    out = np.empty_like(values)
    acc = None
    for index, value in enumerate(values):
        acc = value if acc is None else op(acc, value)
        out[index] = acc
    return out


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_inclusive_sum_every_dtype(group, dtype):
    host = sample(dtype, 1_000_003, seed=1)
    array = sharded.ShardedArray.from_numpy(group, host)
    expected = np.cumsum(host, dtype=dtype)
    for op in ("sum", lambda x, y: x + y):
        result = sharded.inclusive_scan(array, op)
        assert result.dtype == np.dtype(dtype)
        if np.dtype(dtype).kind == "f":
            np.testing.assert_allclose(result.to_numpy(), np.cumsum(host.astype(np.float64)),
                                       rtol=1e-3, atol=1e-2)
        else:
            np.testing.assert_array_equal(result.to_numpy(), expected)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_running_max_and_exclusive(three_places, dtype):
    host = sample(dtype, 200_011, seed=2)
    array = sharded.ShardedArray.from_numpy(three_places, host)
    np.testing.assert_array_equal(sharded.inclusive_scan(array, lambda x, y: x if x > y else y).to_numpy(),
                                  np.maximum.accumulate(host))
    np.testing.assert_array_equal(sharded.inclusive_scan(array, "min").to_numpy(),
                                  np.minimum.accumulate(host))
    exclusive = sharded.exclusive_scan(array, lambda x, y: x + y, 5).to_numpy()
    expected = np.concatenate([[5], 5 + np.cumsum(host.astype(np.float64))[:-1]])
    if np.dtype(dtype).kind == "f":
        np.testing.assert_allclose(exclusive, expected, rtol=1e-3, atol=1e-2)
    else:
        np.testing.assert_array_equal(exclusive, expected.astype(dtype))


@pytest.mark.parametrize("sizes", SIZES)
def test_uneven_and_empty_shards_in_place(three_places, sizes):
    host = sample(np.int64, sum(sizes), seed=3)
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=sizes)
    out = sharded.inclusive_scan(array, lambda x, y: x + y, init=10)
    np.testing.assert_array_equal(out.to_numpy(), 10 + np.cumsum(host))
    same = sharded.exclusive_scan(array, "sum", 0, out=array)  # in place
    assert same is array
    np.testing.assert_array_equal(array.to_numpy(), np.concatenate([[0], np.cumsum(host)])[:host.size])


def test_non_commutative_scan(three_places):
    host = _matrices(20_003, seed=12)
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=[7_000, 13_000, 3])
    result = sharded.inclusive_scan(array, _matmul_packed).to_numpy()
    expected = _running([int(v) for v in host], _matmul_packed)
    np.testing.assert_array_equal(result, np.array(expected, dtype=np.int64))
    right = sharded.inclusive_scan(array, lambda x, y: y).to_numpy()
    np.testing.assert_array_equal(right, host)


def test_a_lone_shard_scans_alike_in_any_group(one_place):
    """A lone non-empty shard scans in one pass whatever group holds it: alone on one place
    and as the only non-empty shard of two places, float sums agree bit for bit (built-in and
    Python operators, an exclusive scan with a seed). Beside a second non-empty shard it scans
    in two passes (another association): near the float64 sums, and the same bits again."""
    two_places = sharded.PlaceGroup.by_devices([0, 0])
    host = sample(np.float32, 2_400_011, seed=31)
    alone = sharded.ShardedArray.from_numpy(one_place, host)
    lone = sharded.ShardedArray.from_numpy(two_places, host, sizes=[0, host.size])
    beside = sharded.ShardedArray.from_numpy(two_places, np.append(host, np.float32(1.0)), sizes=[host.size, 1])
    running = np.cumsum(host.astype(np.float64))
    for scan, args, expected in ((sharded.inclusive_scan, (lambda x, y: x + y,), running),
                                 (sharded.inclusive_scan, ("sum",), running),
                                 (sharded.exclusive_scan, (lambda x, y: x + y, 0.25),
                                  0.25 + np.concatenate([[0.0], running[:-1]]))):
        one = scan(alone, *args).to_numpy()
        np.testing.assert_array_equal(one.view(np.uint32), scan(lone, *args).to_numpy().view(np.uint32))
        np.testing.assert_allclose(one, expected, rtol=1e-3, atol=1e-2)
        two = scan(beside, *args).to_numpy()[:host.size]
        np.testing.assert_array_equal(two.view(np.uint32), scan(beside, *args).to_numpy()[:host.size].view(np.uint32))
        np.testing.assert_allclose(two, expected, rtol=1e-3, atol=1e-2)


def test_a_scan_links_only_the_kernels_it_runs(fresh_cache):
    """A scan of an array with at most one non-empty shard links the single pass alone; with
    two non-empty shards, the two passes alone. Each answers as numpy does."""
    group = sharded.PlaceGroup.by_devices([0, 0])
    host = sample(np.int64, 100_003, seed=5)
    for sizes, runs, spared in (([0, host.size], "scan_one_pass", "scan"), (None, "scan", "scan_one_pass")):
        sharded.clear_cache(memory=True, disk=True)
        op = sharded.op(lambda x, y: x + y)
        array = sharded.ShardedArray.from_numpy(group, host, sizes=sizes)
        np.testing.assert_array_equal(sharded.inclusive_scan(array, op).to_numpy(), np.cumsum(host))
        assert sharded.compile(op, runs, np.int64, out_dtype=np.int64).cache_hit
        assert not sharded.compile(op, spared, np.int64, out_dtype=np.int64).cache_hit


def test_the_single_pass_alone_refuses_two_non_empty_shards():
    """The shim checks the libraries against the array before anything runs: the single pass
    alone cannot scan two non-empty shards, and `out` is left as it was."""
    from cuda_sharded_jit import _shim, compiler

    group = sharded.PlaceGroup.by_devices([0, 0])
    a = sharded.ShardedArray.from_numpy(group, np.arange(10, dtype=np.int32))
    out = sharded.ShardedArray.from_numpy(group, np.full(10, 7, np.int32))
    _, libraries = compiler.kernel_libraries(sharded.op(lambda x, y: x + y), "scan_one_pass", (("array", a.dtype),),
                                             a.dtype, group.archs)
    with pytest.raises(ValueError, match="single-pass scan alone.*2 non-empty shards"):
        _shim.scan(libraries, a._impl, out._impl, 4, b"", False)
    np.testing.assert_array_equal(out.to_numpy(), np.full(10, 7, np.int32))


@pytest.mark.parametrize("dtype", [np.int32, np.uint64])
def test_one_pass_at_tile_edges(one_place, dtype):
    """One place's scan in one pass, at sizes around its tiles (8192 elements for 4-byte
    accumulators, 4096 for 8-byte ones) and over a thousand tiles: integer sums equal numpy's
    (wrapping alike), inclusive with and without init and exclusive."""
    for size in (1, 4095, 4096, 4097, 8191, 8192, 8193, (1 << 23) + 5):
        host = sample(dtype, size, seed=size % 997)
        array = sharded.ShardedArray.from_numpy(one_place, host)
        running = np.cumsum(host, dtype=dtype)
        np.testing.assert_array_equal(sharded.inclusive_scan(array, lambda x, y: x + y).to_numpy(), running)
        np.testing.assert_array_equal(sharded.inclusive_scan(array, "sum", init=dtype(9)).to_numpy(),
                                      (running + dtype(9)).astype(dtype))
        np.testing.assert_array_equal(sharded.exclusive_scan(array, lambda x, y: x + y, dtype(4)).to_numpy(),
                                      np.concatenate([[dtype(4)], running[:-1] + dtype(4)]).astype(dtype))


def test_one_pass_into_a_narrower_accumulator(one_place):
    """int64 elements scanned into int32 (out=): 8-byte inputs take tiles of 4096 elements;
    the sums equal numpy's of the int32 values, inclusive and exclusive."""
    host = sample(np.int64, 3 * 4096 + 5, seed=43)
    array = sharded.ShardedArray.from_numpy(one_place, host)
    out = sharded.ShardedArray.allocate(one_place, [host.size], np.int32)
    running = np.cumsum(host.astype(np.int32), dtype=np.int32)
    np.testing.assert_array_equal(sharded.inclusive_scan(array, lambda x, y: x + y, out=out).to_numpy(), running)
    np.testing.assert_array_equal(sharded.exclusive_scan(array, lambda x, y: x + y, np.int32(2), out=out).to_numpy(),
                                  np.concatenate([[2], running[:-1] + 2]).astype(np.int32))


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_one_pass_off_sixteen_byte_alignment(one_place, dtype):
    """The single pass copies 16-byte chunks where the input and output are 16-byte aligned and
    moves elements one by one where they are not: views of CuPy buffers one element in (input)
    and three in (output), over several tiles and a partial one, give the bits of the aligned
    scan (integers: numpy's sums), inclusive, exclusive and in place."""
    cp = cupy_or_skip()
    host = sample(dtype, 3 * 8192 + 77, seed=47)
    aligned = sharded.ShardedArray.from_numpy(one_place, host)
    buffer = cp.zeros(host.size + 1, dtype=dtype)
    buffer[1:] = cp.asarray(host)
    shifted = sharded.ShardedArray.adopt(one_place, [buffer[1:]])
    target = cp.zeros(host.size + 3, dtype=dtype)
    out = sharded.ShardedArray.adopt(one_place, [target[3:]])
    cp.cuda.runtime.deviceSynchronize()  # CuPy's writes, before our streams read the buffers
    for scan, args in ((sharded.inclusive_scan, (lambda x, y: x + y,)),
                       (sharded.exclusive_scan, (lambda x, y: x + y, dtype(2)))):
        expected = scan(aligned, *args).to_numpy()
        if dtype == np.int64:
            running = np.cumsum(host)
            np.testing.assert_array_equal(
                expected, running if scan is sharded.inclusive_scan else np.concatenate([[2], running[:-1] + 2]))
        got = scan(shifted, *args).to_numpy()
        np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))
        scan(aligned, *args, out=out)
        one_place.sync()  # before CuPy reads what our stream wrote
        np.testing.assert_array_equal(cp.asnumpy(target[3:]).view(np.uint8), expected.view(np.uint8))
    sharded.inclusive_scan(shifted, lambda x, y: x + y, out=shifted)
    one_place.sync()
    np.testing.assert_array_equal(cp.asnumpy(buffer[1:]).view(np.uint8),
                                  sharded.inclusive_scan(aligned, lambda x, y: x + y).to_numpy().view(np.uint8))


def test_one_pass_float_bits_over_many_tiles(one_place):
    """Over 2049 tiles, where look-backs find their nearest published prefix at whatever
    distance the timing gives, a float32 sum is the same bits on every call (the tiles fold
    as one left fold) and near the float64 sums; a float64 running maximum is exact."""
    host = sample(np.float32, (1 << 24) + 11, seed=41)
    array = sharded.ShardedArray.from_numpy(one_place, host)
    first = sharded.inclusive_scan(array, lambda x, y: x + y).to_numpy()
    for _ in range(3):
        np.testing.assert_array_equal(sharded.inclusive_scan(array, lambda x, y: x + y).to_numpy().view(np.uint32),
                                      first.view(np.uint32))
    np.testing.assert_allclose(first, np.cumsum(host.astype(np.float64)), rtol=1e-3, atol=0.25)
    wide = sharded.ShardedArray.from_numpy(one_place, host.astype(np.float64))
    np.testing.assert_array_equal(sharded.inclusive_scan(wide, "max").to_numpy(),
                                  np.maximum.accumulate(host.astype(np.float64)))


def test_one_place_scans_in_a_row(one_place):
    """The first pass's block counter lives with the place and each kernel leaves it at zero:
    calls of shifting sizes (so of shifting block counts) in a row, a non-commutative operator
    among them, each against numpy; then the lone non-empty shard of a larger group."""
    matrices = _matrices(700_001, seed=32)
    stacked = sharded.ShardedArray.from_numpy(one_place, matrices)
    for size in (2_000_003, 17, 1 << 20, 4097, 1_500_000, 1, 2_000_003):
        host = sample(np.int64, size, seed=size % 1000)
        array = sharded.ShardedArray.from_numpy(one_place, host)
        np.testing.assert_array_equal(sharded.inclusive_scan(array, lambda x, y: x + y).to_numpy(), np.cumsum(host))
        np.testing.assert_array_equal(sharded.exclusive_scan(array, "sum", 7).to_numpy(),
                                      np.concatenate([[7], 7 + np.cumsum(host)[:-1]]))
        if size == 4097:
            running = _running(matrices.astype(object), _matmul_packed)  # Python ints: the words mod 2^64
            expected = np.array([int(v) % (1 << 64) for v in running], dtype=np.uint64).view(np.int64)
            np.testing.assert_array_equal(sharded.inclusive_scan(stacked, _matmul_packed).to_numpy(), expected)
    # the lone non-empty shard of a larger group, here the second place's
    two_places = sharded.PlaceGroup.by_devices([0, 0])
    host = sample(np.int64, 1_000_001, seed=33)
    last = sharded.ShardedArray.from_numpy(two_places, host, sizes=[0, host.size])
    np.testing.assert_array_equal(sharded.exclusive_scan(last, lambda x, y: x + y, 3).to_numpy(),
                                  np.concatenate([[3], 3 + np.cumsum(host)[:-1]]))


def test_scan_deterministic_and_out_dtype(group):
    host = sample(np.float32, 3_000_017, seed=4)
    array = sharded.ShardedArray.from_numpy(group, host)
    first = sharded.inclusive_scan(array, lambda x, y: x + y).to_numpy()
    np.testing.assert_array_equal(sharded.inclusive_scan(array, lambda x, y: x + y).to_numpy(), first)
    wide = sharded.ShardedArray.allocate(group, list(array.shard_sizes), np.float64)
    sharded.inclusive_scan(array, lambda x, y: x + y, out=wide)
    np.testing.assert_allclose(wide.to_numpy(), np.cumsum(host.astype(np.float64)), rtol=1e-9, atol=1e-6)


def test_contiguous_and_adopted(three_places):
    host = sample(np.int32, 50_001, seed=5)
    contiguous = sharded.ShardedArray.from_numpy(three_places, host, contiguous=True)
    np.testing.assert_array_equal(sharded.inclusive_scan(contiguous, "sum").to_numpy(), np.cumsum(host, dtype=np.int32))
    cp = cupy_or_skip()
    adopted = sharded.ShardedArray.adopt(three_places, [cp.asarray(p) for p in np.array_split(host, 3)])
    sharded.inclusive_scan(adopted, lambda x, y: x + y, out=adopted)
    np.testing.assert_array_equal(adopted.to_numpy(), np.cumsum(host, dtype=np.int32))


def test_empty_scan_returns_empty(three_places):
    empty = sharded.ShardedArray.allocate(three_places, 0, np.float32)
    assert sharded.inclusive_scan(empty, lambda x, y: x + y).size == 0
    assert sharded.exclusive_scan(empty, "sum", 0.0).size == 0


def test_scan_errors(three_places):
    array = sharded.ShardedArray.allocate(three_places, 10, np.float32)
    with pytest.raises(ValueError, match="init"):
        sharded.exclusive_scan(array, "sum", None)
    other = sharded.ShardedArray.allocate(three_places, [1, 1, 8], np.float32)
    with pytest.raises(ValueError, match="shard sizes"):
        sharded.inclusive_scan(array, lambda x, y: x + y, out=other)


@pytest.mark.parametrize("sizes", [[1, 1, 1], [5, 0, 7], [0, 0, 9], [1000, 1, 2001]])
@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.uint64])
def test_adjacent_difference_crosses_shards(three_places, sizes, dtype):
    host = sample(dtype, sum(sizes), seed=7)
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=sizes)
    result = sharded.adjacent_difference(array)
    assert result.dtype == np.dtype(dtype)
    with np.errstate(over="ignore"):
        expected = np.concatenate([host[:1], np.diff(host)]).astype(dtype)
    np.testing.assert_array_equal(result.to_numpy(), expected)
    custom = sharded.adjacent_difference(array, op=lambda x, prev: x + prev)
    np.testing.assert_allclose(custom.to_numpy(),
                               np.concatenate([host[:1], host[1:].astype(np.float64) + host[:-1]]))


@pytest.mark.parametrize("contiguous", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_adjacent_difference_many_tiles(three_places, dtype, contiguous):
    """Shards of many tiles, whole or (contiguous: one address range) starting at odd elements,
    which the pass reads word by word; a non-commutative operator into another dtype shows
    each element's neighbour and the argument order."""
    sizes = [4096 * 70 + 3, 4096 * 30 + 1, 4096 * 50 + 6]
    host = sample(dtype, sum(sizes), seed=11)
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=sizes, contiguous=contiguous)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(sharded.adjacent_difference(array).to_numpy(),
                                      np.concatenate([host[:1], np.diff(host)]).astype(dtype))
    out = sharded.ShardedArray.allocate(three_places, sizes, np.float64)
    sharded.adjacent_difference(array, out=out, op=lambda x, previous: x * 3 - previous)
    wide = host.astype(np.float64)
    np.testing.assert_allclose(out.to_numpy(), np.concatenate([wide[:1], wide[1:] * 3 - wide[:-1]]),
                               rtol=1e-6)


def test_adjacent_difference_rejects_aliasing(three_places):
    array = sharded.ShardedArray.from_numpy(three_places, np.arange(10.0))
    with pytest.raises(ValueError, match="must not alias"):
        sharded.adjacent_difference(array, out=array)
