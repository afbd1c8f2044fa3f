"""Host indexing (a[i], slices, masks, index arrays, writes) against numpy's indexing of the
same data. The index logic runs here on a host-backed stand-in of the shim's array (copies
of element ranges out of and into a numpy buffer, recording which ranges were asked for); the
gpu tests run the same through real shards."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from test_errors import stand_in_array, stand_in_group

POINT = np.dtype([("x", np.float32), ("y", np.int32)], align=True)


def host_backed(data: np.ndarray, sizes):
    """A stand-in ShardedArray whose range copies read and write `data`; `.ranges` lists the
    [start, stop) ranges copied."""
    array = stand_in_array(stand_in_group(len(sizes)), sizes, data.dtype)
    impl = array._impl
    impl.ranges = []

    def to_host(start, stop, host, nbytes):
        assert nbytes == (stop - start) * data.itemsize
        impl.ranges.append((start, stop))
        ctypes.memmove(host, data[start:stop].ctypes.data, nbytes)

    def from_host(start, stop, host, nbytes):
        assert nbytes == (stop - start) * data.itemsize
        impl.ranges.append((start, stop))
        ctypes.memmove(data[start:stop].ctypes.data, host, nbytes)

    impl.copy_range_to_host, impl.copy_range_from_host = to_host, from_host
    return array


@pytest.mark.parametrize("index", [0, 5, -1, -30, 29, np.int64(7), slice(None), slice(3, 17), slice(-5, None),
                                   slice(2, 25, 3), slice(25, 2, -4), slice(10, 10), slice(None, None, -1),
                                   [4, 0, 29, -2], np.array([3, 3, 1]), np.arange(30) % 3 == 0])
def test_reads_match_numpy(index):
    data = np.arange(30, dtype=np.float64) * 1.5
    a = host_backed(data.copy(), [10, 0, 12, 8])
    expected = data[index if not isinstance(index, list) else np.array(index)]
    got = a[index]
    np.testing.assert_array_equal(got, expected)
    assert np.asarray(got).dtype == data.dtype


def test_reads_copy_only_the_range_they_touch():
    a = host_backed(np.arange(100, dtype=np.int32), [50, 50])
    a[60:70]
    a[np.array([12, 20])]
    assert a._impl.ranges == [(60, 70), (12, 21)]


def test_records_come_back_as_numpy_records():
    data = np.zeros(6, POINT)
    data["x"], data["y"] = np.arange(6) * 0.5, np.arange(6)
    a = host_backed(data.copy(), [3, 3])
    assert a[4] == data[4]
    np.testing.assert_array_equal(a[1:5], data[1:5])


def test_writes_match_numpy():
    data = np.zeros(20, np.int32)
    reference = data.copy()
    a = host_backed(data, [7, 13])
    a[3] = 9
    a[-1] = 2.7          # cast as numpy casts
    a[5:9] = np.array([1, 2, 3, 4])
    a[10:15] = 6         # a number fills the slice
    reference[3], reference[-1], reference[5:9], reference[10:15] = 9, 2.7, [1, 2, 3, 4], 6
    np.testing.assert_array_equal(data, reference)


def test_index_errors_read_well():
    a = host_backed(np.zeros(10), [5, 5])
    with pytest.raises(IndexError, match="index 10 is out of bounds for a ShardedArray of 10"):
        a[10]
    with pytest.raises(IndexError, match="index -11"):
        a[-11]
    with pytest.raises(IndexError, match="mask: shape"):
        a[np.ones(3, bool)]
    with pytest.raises(IndexError, match="outside"):
        a[np.array([0, 10])]
    with pytest.raises(TypeError, match="sharded.select"):
        a[1.5]
    with pytest.raises(TypeError, match="without a step"):
        a[::2] = 1.0
    with pytest.raises(TypeError, match="int or a slice"):
        a[np.array([1, 2])] = 1.0
    with pytest.raises(ValueError, match="3 elements for a slice of 2"):
        a[0:2] = np.ones(3)


@pytest.mark.gpu
def test_indexing_through_real_shards(places):
    data = np.arange(5000, dtype=np.float32)
    a = sharded.ShardedArray.from_numpy(places, data)
    assert a[0] == 0 and a[-1] == 4999 and a[2500] == 2500
    np.testing.assert_array_equal(a[1200:3900:7], data[1200:3900:7])
    np.testing.assert_array_equal(a[data % 17 == 0], data[data % 17 == 0])
    a[10:20] = -1.0
    a[4999] = 7.0
    data[10:20], data[4999] = -1.0, 7.0
    np.testing.assert_array_equal(a.to_numpy(), data)
    np.testing.assert_array_equal(np.asarray(a), data)
