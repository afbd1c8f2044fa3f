"""GPU tests of ShardedArray: allocation, round trips, views, adoption, errors."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import ALL_DTYPES, DEVICE_COUNT, cupy_or_skip, needs_devices, sample

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("contiguous", [False, True])
def test_round_trip_every_dtype(group, dtype, contiguous):
    host = sample(dtype, 1001)
    array = sharded.ShardedArray.from_numpy(group, host, contiguous=contiguous)
    assert array.dtype == np.dtype(dtype) and array.size == 1001
    assert array.is_contiguous == contiguous
    np.testing.assert_array_equal(array.to_numpy(), host)
    np.testing.assert_array_equal(np.asarray(array), host)


def test_even_split_gives_extra_elements_to_the_first_shards(three_places):
    array = sharded.ShardedArray.allocate(three_places, 11, np.float32)
    assert array.shard_sizes == (4, 4, 3)
    assert array.shard_offsets == (0, 4, 8)
    assert array.num_shards == 3 and len(array) == 11


def test_explicit_sizes_with_empty_shards(three_places):
    host = sample(np.int64, 10)
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=[0, 10, 0])
    assert array.shard_sizes == (0, 10, 0)
    np.testing.assert_array_equal(array.to_numpy(), host)
    assert array.shard(0).__cuda_array_interface__["shape"] == (0,)
    empty = sharded.ShardedArray.allocate(three_places, 0, np.float64)
    assert empty.to_numpy().shape == (0,)


def test_contiguous_shards_follow_the_base_pointer(three_places):
    sizes = [1000, 0, 3000]
    host = sample(np.float64, sum(sizes))
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=sizes, contiguous=True)
    base = array.base_pointer
    assert base != 0
    for place, offset in enumerate(array.shard_offsets):
        if sizes[place]:
            pointer = array.shard(place).__cuda_array_interface__["data"][0]
            assert pointer == base + offset * 8
    assert sum(array._impl.physical_chunk_bytes) >= host.nbytes
    np.testing.assert_array_equal(array.to_numpy(), host)


def test_contiguous_data_read_back_through_each_shard_view(three_places):
    cp = cupy_or_skip()
    host = sample(np.float32, 5000)
    array = sharded.ShardedArray.from_numpy(three_places, host, contiguous=True)
    for place in range(3):
        view = cp.asarray(array.shard(place))
        start = array.shard_offsets[place]
        np.testing.assert_array_equal(cp.asnumpy(view), host[start:start + array.shard_sizes[place]])


def test_shard_view_interface(three_places):
    array = sharded.ShardedArray.allocate(three_places, [5, 6, 7], np.uint32)
    for place in range(3):
        interface = array.shard(place).__cuda_array_interface__
        assert interface["version"] == 3
        assert interface["shape"] == (array.shard_sizes[place],)
        assert interface["typestr"] == np.dtype(np.uint32).str
        assert interface["strides"] is None
        assert interface["data"][1] is False and interface["data"][0] != 0
        assert interface["stream"] == three_places.stream(place)
    with pytest.raises(IndexError):
        array.shard(3)


def test_shard_views_through_numba(three_places):
    from numba import cuda

    host = sample(np.int32, 300)
    array = sharded.ShardedArray.from_numpy(three_places, host)
    for place in range(3):
        device_view = cuda.as_cuda_array(array.shard(place))
        start = array.shard_offsets[place]
        np.testing.assert_array_equal(device_view.copy_to_host(),
                                      host[start:start + array.shard_sizes[place]])


def test_adopt_cupy_arrays_both_ways(three_places):
    cp = cupy_or_skip()
    buffers = [cp.arange(n, dtype=cp.float64) * (place + 1) for place, n in enumerate([4, 0, 6])]
    array = sharded.ShardedArray.adopt(three_places, buffers)
    assert array.storage == "adopted" and array.shard_sizes == (4, 0, 6)
    expected = np.concatenate([cp.asnumpy(b) for b in buffers])
    np.testing.assert_array_equal(array.to_numpy(), expected)
    # we write, CuPy reads
    replacement = sample(np.float64, 10)
    written = sharded.ShardedArray.from_numpy(three_places, replacement, sizes=[4, 0, 6])
    for place in range(3):
        cp.asarray(array.shard(place))[...] = cp.asarray(written.shard(place))
    cp.cuda.Device().synchronize()
    np.testing.assert_array_equal(cp.asnumpy(buffers[2]), replacement[4:])
    np.testing.assert_array_equal(array.to_numpy(), replacement)


def test_adopted_buffers_stay_alive_and_are_not_freed(one_place):
    cp = cupy_or_skip()
    buffer = cp.full(100, 7, dtype=cp.int32)
    array = sharded.ShardedArray.adopt(one_place, [buffer])
    del buffer
    gc.collect()
    np.testing.assert_array_equal(array.to_numpy(), np.full(100, 7, np.int32))
    kept = cp.full(50, 3, dtype=cp.int32)
    other = sharded.ShardedArray.adopt(one_place, [kept])
    other.free()
    del other
    gc.collect()
    assert int(kept.sum()) == 150  # still valid memory, never freed by us


def test_adopt_errors(one_place, three_places):
    cp = cupy_or_skip()
    with pytest.raises(ValueError, match="buffers: expected one buffer per place"):
        sharded.ShardedArray.adopt(three_places, [cp.zeros(3)])
    with pytest.raises(ValueError, match=r"buffers\[0\]: ndarray lives in host memory"):
        sharded.ShardedArray.adopt(one_place, [np.zeros(3)])
    with pytest.raises(ValueError, match=r"buffers\[0\]: not C-contiguous"):
        sharded.ShardedArray.adopt(one_place, [cp.zeros(10)[::2]])
    with pytest.raises(TypeError, match=r"buffers\[1\]: dtype float32 differs"):
        sharded.ShardedArray.adopt(sharded.PlaceGroup.by_devices([0, 0]),
                                   [cp.zeros(3, cp.float64), cp.zeros(3, cp.float32)])
    with pytest.raises(TypeError, match=r"buffers\[0\]: unsupported dtype int8"):
        sharded.ShardedArray.adopt(one_place, [cp.zeros(3, cp.int8)])


@needs_devices(2)
def test_adopt_rejects_a_buffer_on_the_wrong_device():
    cp = cupy_or_skip()
    group = sharded.PlaceGroup.by_devices([0, 1])
    with cp.cuda.Device(0):
        on_zero = cp.zeros(4)
        also_zero = cp.zeros(4)
    with pytest.raises(ValueError, match=r"buffers\[1\]: lives on device 0, expected device 1"):
        sharded.ShardedArray.adopt(group, [on_zero, also_zero])


def test_size_errors(three_places):
    with pytest.raises(ValueError, match="sizes: shard 1 has negative size"):
        sharded.ShardedArray.allocate(three_places, [1, -1, 1], np.float32)
    with pytest.raises(ValueError, match="sizes: expected one size per place"):
        sharded.ShardedArray.allocate(three_places, [1, 2], np.float32)
    with pytest.raises(ValueError, match="sizes: shard sizes sum to 5, but host has 6"):
        sharded.ShardedArray.from_numpy(three_places, np.zeros(6), sizes=[1, 2, 2])
    with pytest.raises(ValueError, match="n: expected a non-negative"):
        sharded.ShardedArray.allocate(three_places, -3, np.float32)
    with pytest.raises(TypeError, match="unsupported dtype"):
        sharded.ShardedArray.allocate(three_places, 3, np.complex64)
    with pytest.raises(ValueError, match="1-D"):
        sharded.ShardedArray.from_numpy(three_places, np.zeros((2, 2)))


def _free_bytes(device=0):
    from numba import cuda

    with cuda.gpus[device]:
        return cuda.current_context().get_memory_info().free


@pytest.mark.parametrize("contiguous", [False, True])
def test_allocation_failure_is_memory_error_and_leaks_nothing(contiguous):
    group = sharded.PlaceGroup.by_devices([0, 0])
    group.release_cached_memory()
    before = _free_bytes()
    make = sharded.ShardedArray.allocate_contiguous if contiguous else sharded.ShardedArray.allocate
    # the second shard cannot fit after the first: a failure half way
    with pytest.raises(MemoryError):
        make(group, [1 << 20, 200 << 27], np.float64)  # 200 GiB on one 141 GiB GPU
    group.release_cached_memory()
    assert abs(_free_bytes() - before) < (64 << 20)


def test_free_releases_memory_and_blocks_reuse(one_place):
    one_place.release_cached_memory()
    before = _free_bytes()
    array = sharded.ShardedArray.allocate(one_place, 1 << 28, np.float32)  # 1 GiB
    one_place.sync()
    assert _free_bytes() <= before - (1 << 30) + (64 << 20)
    array.free()
    array.free()  # idempotent
    one_place.release_cached_memory()
    assert _free_bytes() >= before - (64 << 20)
    assert array.is_freed
    with pytest.raises(ValueError, match="freed"):
        array.to_numpy()
    with pytest.raises(ValueError, match="freed"):
        array.shard(0)


def test_collected_arrays_release_memory(one_place):
    one_place.release_cached_memory()
    before = _free_bytes()
    for _ in range(3):
        array = sharded.ShardedArray.allocate(one_place, 1 << 28, np.float32)
        del array
    gc.collect()
    one_place.release_cached_memory()
    assert _free_bytes() >= before - (64 << 20)


def test_contiguous_free_returns_memory(one_place):
    one_place.release_cached_memory()
    before = _free_bytes()
    array = sharded.ShardedArray.allocate_contiguous(one_place, 1 << 28, np.float32)
    assert _free_bytes() <= before - (1 << 30) + (64 << 20)
    array.free()
    assert _free_bytes() >= before - (64 << 20)


def test_repr_shows_sizes_devices_and_dtype(three_places):
    text = repr(sharded.ShardedArray.allocate(three_places, 10, np.int32))
    assert "size=10" in text and "int32" in text and "4@cuda:0, 3@cuda:0, 3@cuda:0" in text


@needs_devices(2)
def test_contiguous_across_two_devices():
    group = sharded.PlaceGroup.by_devices([0, 1])
    host = sample(np.float32, 3 << 20)
    array = sharded.ShardedArray.from_numpy(group, host, contiguous=True)
    chunks = array._impl.physical_chunk_bytes
    assert chunks[0] > 0 and chunks[1] > 0
    np.testing.assert_array_equal(array.to_numpy(), host)
