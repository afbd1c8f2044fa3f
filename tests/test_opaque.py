"""fill, sequence, count and histogram_even against numpy, at shard boundaries."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import ALL_DTYPES, sample

SIZES = [[0, 0, 0], [1, 0, 2], [5000, 0, 4097], [4095, 4097, 1]]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("sizes", SIZES)
def test_fill_and_sequence(three_places, dtype, sizes):
    array = sharded.ShardedArray.allocate(three_places, sizes, dtype)
    assert sharded.fill(array, 7) is array
    np.testing.assert_array_equal(array.to_numpy(), np.full(sum(sizes), 7, dtype))
    sharded.sequence(array, start=3, step=2)
    np.testing.assert_array_equal(array.to_numpy(), (3 + 2 * np.arange(sum(sizes))).astype(dtype))
    sharded.sequence(array)
    np.testing.assert_array_equal(array.to_numpy(), np.arange(sum(sizes)).astype(dtype))


@pytest.mark.gpu
def test_sequence_of_floats_is_exact_for_large_indices(one_place):
    array = sharded.ShardedArray.allocate(one_place, (1 << 25) + 3, np.float32)
    sharded.sequence(array, start=0.5, step=0.25)
    expected = (0.5 + 0.25 * np.arange(array.size, dtype=np.float64)).astype(np.float32)
    np.testing.assert_array_equal(array.to_numpy(), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("sizes", SIZES)
def test_count(three_places, dtype, sizes):
    host = (np.abs(np.round(sample(np.float64, sum(sizes), seed=3) * 3)) % 7).astype(dtype)
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=sizes)
    for value in (0, 3, 6, 100):
        assert sharded.count(array, value) == int(np.count_nonzero(host == value))
    assert sharded.count(array, 2.5) == int(np.count_nonzero(host == 2.5))


@pytest.mark.gpu
def test_count_nan(one_place):
    host = np.array([np.nan, 1.0, np.nan, 2.0])
    array = sharded.ShardedArray.from_numpy(one_place, host)
    assert sharded.count(array, np.nan) == 0  # NaN equals nothing, as in numpy
    assert sharded.count(array, 1.0) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("num_bins", [1, 7, 64, 10000])
def test_histogram_matches_numpy(three_places, dtype, num_bins):
    rng = np.random.default_rng(num_bins)
    if np.dtype(dtype).kind == "f":
        host = rng.uniform(-0.25, 1.25, 300_001).astype(dtype)
        host[::97] = np.nan
        host[1::101] = 1.0  # the closed last edge
        lower, upper = 0.0, 1.0
    else:
        host = rng.integers(0, 300, 300_001).astype(dtype)
        lower, upper = 10.0, 250.0
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=[100_000, 1, 200_000])
    expected, _ = np.histogram(host, bins=num_bins, range=(lower, upper))
    got = sharded.histogram_even(array, num_bins, lower, upper)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)


@pytest.mark.gpu
def test_histogram_calls_in_a_row(three_places):
    """Each call starts from zero counts whatever the calls before counted (the counts live in
    reused per-device slots that a call's last block clears), at the slot path's limit of
    2048 bins and beyond it, and whether the places' data sit on the one device or not."""
    rng = np.random.default_rng(5)
    host = rng.uniform(0.0, 1.0, 200_003).astype(np.float32)
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=[70_001, 0, 130_002])
    for num_bins in (64, 2048, 7, 64, 2049, 64, 1365, 2048):  # 1365: 48 KiB of shared memory
        expected, _ = np.histogram(host, bins=num_bins, range=(0.0, 1.0))
        np.testing.assert_array_equal(sharded.histogram_even(array, num_bins, 0.0, 1.0), expected)
    wide = sharded.ShardedArray.from_numpy(three_places, host.astype(np.float64), sizes=[70_001, 0, 130_002])
    for num_bins in (6142, 6143, 12288):  # float64 edges with the sub-histogram in all 48 KiB
        np.testing.assert_array_equal(sharded.histogram_even(wide, num_bins, 0.0, 1.0),
                                      np.histogram(host.astype(np.float64), bins=num_bins, range=(0.0, 1.0))[0])
    half = sharded.ShardedArray.from_numpy(three_places, host[:1000])
    np.testing.assert_array_equal(sharded.histogram_even(half, 64, 0.25, 0.75),
                                  np.histogram(host[:1000], bins=64, range=(0.25, 0.75))[0])


@pytest.mark.gpu
@pytest.mark.parametrize("num_bins", [64, 1000, 5000])
def test_histogram_of_few_values(three_places, num_bins):
    """Every lane of a warp on one counter, then on two, for each kind of sub-histogram the
    kernel keeps in shared memory: a column per lane (64 bins), a copy per warp (1000) and one
    per block (5000)."""
    same = np.full(300_001, 0.3, np.float32)
    two = same.copy()
    two[1::2] = 0.7
    for host in (same, two):
        array = sharded.ShardedArray.from_numpy(three_places, host, sizes=[100_000, 1, 200_000])
        expected, _ = np.histogram(host, bins=num_bins, range=(0.0, 1.0))
        np.testing.assert_array_equal(sharded.histogram_even(array, num_bins, 0.0, 1.0), expected)


@pytest.mark.gpu
def test_histogram_across_the_ticket_s_wrap(one_place):
    """More calls than the slot's 16-bit ticket counts (a thread takes back the slot it gave
    back), on two arrays in turn: each call reads its own counts, never the last call's."""
    host = np.random.default_rng(9).uniform(0.0, 1.0, 1000).astype(np.float32)
    arrays = [sharded.ShardedArray.from_numpy(one_place, part) for part in (host, host[:500])]
    expected = [np.histogram(part, bins=16, range=(0.0, 1.0))[0] for part in (host, host[:500])]
    wrong = [call for call in range(66_000)
             if not np.array_equal(sharded.histogram_even(arrays[call % 2], 16, 0.0, 1.0), expected[call % 2])]
    assert wrong == []


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, num_bins, lower, upper", [
    (np.float32, 64, 0.0, 1.0),
    (np.float32, 37, -3.7, 12.9),       # edges that are not exact in binary
    (np.float32, 1000, 1000.0, 1001.0),  # narrow bins far from zero: most values settle
    (np.float64, 37, -3.7, 12.9),
    (np.int32, 30, 0.0, 300.0),          # integers exactly on edges
    (np.int64, 7, -50.0, 20.0),
])
def test_histogram_of_edge_values(one_place, dtype, num_bins, lower, upper):
    """Values on every edge and one step either side land where numpy puts them (the
    kernel's fast bin estimate defers to the edges near a boundary)."""
    edges = np.histogram_bin_edges(np.zeros(1, dtype), bins=num_bins, range=(lower, upper))
    if np.dtype(dtype).kind == "f":
        edges = edges.astype(dtype)
        host = np.concatenate([edges, np.nextafter(edges, dtype(-np.inf)), np.nextafter(edges, dtype(np.inf))])
    else:
        whole = np.floor(edges).astype(dtype)
        host = np.concatenate([whole - 1, whole, whole + 1])
    host = np.tile(host.astype(dtype), 3)
    array = sharded.ShardedArray.from_numpy(one_place, host)
    expected, _ = np.histogram(host, bins=num_bins, range=(lower, upper))
    np.testing.assert_array_equal(sharded.histogram_even(array, num_bins, lower, upper), expected)


@pytest.mark.gpu
def test_histogram_argument_errors(one_place):
    array = sharded.ShardedArray.allocate(one_place, 10, np.float32)
    with pytest.raises(ValueError, match="num_bins: expected a positive"):
        sharded.histogram_even(array, 0, 0.0, 1.0)
    with pytest.raises(TypeError, match="num_bins: expected an int"):
        sharded.histogram_even(array, 2.5, 0.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        sharded.histogram_even(array, 4, 0.0, float("nan"))
    with pytest.raises(ValueError, match="finite"):
        sharded.histogram_even(array, 4, -np.inf, 1.0)
    with pytest.raises(ValueError, match="lower < upper"):
        sharded.histogram_even(array, 4, 1.0, 1.0)
    with pytest.raises(ValueError, match="value: -1 does not fit uint32"):
        sharded.fill(sharded.ShardedArray.allocate(one_place, 3, np.uint32), -1)


def test_opaque_algorithms_check_their_array():
    for call in (lambda: sharded.fill(np.zeros(3), 1), lambda: sharded.count([1, 2], 1),
                 lambda: sharded.sequence(None), lambda: sharded.histogram_even(np.zeros(3), 4, 0.0, 1.0)):
        with pytest.raises(TypeError, match="a: expected a ShardedArray"):
            call()
