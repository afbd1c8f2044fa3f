"""ShardedArray.resharded and sharded.redistribute: the same elements in global order on other
shard sizes (even, explicit, with empty shards, everything on one place), every dtype and
records, 1 to 4 places; the source left as it was. CPU tests: every argument error, before
anything runs."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import ALL_DTYPES, sample, uneven
from test_errors import shim_untouched, stand_in_array, stand_in_group  # noqa: F401 (fixture)
from test_records import MIXED, POINT, WIDE, random_records
from test_select import untouched  # noqa: F401 (fixture: the selection family's entry points guarded)


def target_layouts(count: int, n: int) -> list[list[int]]:
    layouts = [[n] + [0] * (count - 1), [0] * (count - 1) + [n]]
    if count >= 2:
        layouts.append([n - n // 3] + [0] * (count - 2) + [n // 3])
    return layouts


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_resharded_even_and_explicit(places, dtype):
    n = 10_007
    host = sample(dtype, n, seed=3)
    source_sizes = uneven(places, n)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=source_sizes)
    even = a.resharded()
    assert even.shard_sizes == tuple(sharded.ShardedArray.allocate(places, n, dtype).shard_sizes)
    np.testing.assert_array_equal(even.to_numpy(), host)
    for sizes in target_layouts(len(places), n):
        b = sharded.redistribute(a, sizes)
        assert b.shard_sizes == tuple(sizes)
        np.testing.assert_array_equal(b.to_numpy(), host)
        for place, piece in enumerate(np.split(host, np.cumsum(sizes)[:-1])):
            view = np.asarray(b.shard(place).__cuda_array_interface__["shape"])
            assert int(view[0]) == len(piece)
    assert a.shard_sizes == tuple(source_sizes)
    np.testing.assert_array_equal(a.to_numpy(), host)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [POINT, MIXED, WIDE], ids=lambda d: f"{d.itemsize}B")
def test_resharded_records(three_places, dtype):
    host = random_records(dtype, 5003, seed=1)
    a = sharded.ShardedArray.from_numpy(three_places, host, sizes=[0, 5003, 0])
    b = a.resharded([1000, 3, 4000])
    assert b.dtype == dtype and b.shard_sizes == (1000, 3, 4000)
    np.testing.assert_array_equal(b.to_numpy(), host)


@pytest.mark.gpu
def test_resharded_round_trip_and_empty(three_places):
    host = np.arange(3000, dtype=np.int64)
    a = sharded.ShardedArray.from_numpy(three_places, host)
    back = a.resharded([3000, 0, 0]).resharded([1, 1, 2998]).resharded()
    assert back.shard_sizes == a.shard_sizes
    np.testing.assert_array_equal(back.to_numpy(), host)
    empty = sharded.ShardedArray.allocate(three_places, 0, np.float32).resharded([0, 0, 0])
    assert len(empty) == 0


@pytest.mark.gpu
def test_resharded_after_a_transform_is_stream_ordered(three_places):
    host = sample(np.float32, 200_000, seed=9)
    a = sharded.ShardedArray.from_numpy(three_places, host)
    doubled = sharded.transform(lambda x: x * 2, a)
    b = doubled.resharded([200_000, 0, 0])
    np.testing.assert_array_equal(b.to_numpy(), host * 2)


# ---- argument errors (CPU: stand-ins, nothing reaches the shim) ---------------------------

def test_redistribute_rejects_bad_sizes(untouched):
    a = stand_in_array(stand_in_group(), (4, 3, 3))
    with pytest.raises(TypeError, match="a: expected a ShardedArray"):
        sharded.redistribute(np.zeros(10), [10, 0, 0])
    with pytest.raises(ValueError, match=r"sizes: \[5, 5, 5\] add up to 15, not a's size 10"):
        sharded.redistribute(a, [5, 5, 5])
    with pytest.raises(ValueError, match="sizes: expected 3 shard sizes"):
        a.resharded([10])
    with pytest.raises(ValueError, match=r"sizes\[1\]: shard sizes are non-negative"):
        a.resharded([11, -1, 0])
    with pytest.raises(TypeError, match=r"sizes\[0\]: expected an int"):
        a.resharded([10.0, 0, 0])
    with pytest.raises(TypeError, match="sizes: expected a sequence"):
        a.resharded(10)
