"""Inputs that used to get past the checks: adopted buffers' extents, shapes and streams,
histograms too large for memory, and kernel libraries unloaded under queued work.

Each error names its argument and comes before anything is allocated, adopted or queued.
The checks made in Python run here without a GPU on stand-in groups and arrays (the shim
replaced by stand-ins that fail the test when reached); the ones the shim makes carry the
`gpu` marker.
"""

from __future__ import annotations

import gc
import os
import re

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim
from cuda_sharded_jit.algorithms import opaque

from conftest import cupy_or_skip, free_device_bytes, needs_devices, sample
from test_errors import shim_untouched, stand_in_array, stand_in_group  # noqa: F401 (fixture)


class Claim:
    """A __cuda_array_interface__ that says what the test chooses, over memory someone else
    owns (`owner` keeps it alive). With `stream` left at ... the interface has no stream."""

    def __init__(self, pointer, shape, typestr="<f4", stream=..., owner=None):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "strides": None,
                                          "data": (pointer, False), "version": 3}
        if stream is not ...:
            self.__cuda_array_interface__["stream"] = stream


class _Reached(Exception):
    pass


@pytest.fixture
def shim_adopt(monkeypatch):
    """Replaces the shim's ShardedArray: `adopt` records its arguments and raises _Reached,
    so a check that Python should have made and did not shows as a wrong exception."""
    calls = []

    class StandIn:
        @staticmethod
        def adopt(*args):
            calls.append(args)
            raise _Reached

        @staticmethod
        def even_sizes(n, places):
            raise AssertionError("sizes were split before adopt was reached")

    monkeypatch.setattr(_shim, "ShardedArray", StandIn)
    return calls


# ---- adopt: shapes (CPU) ------------------------------------------------------------------

@pytest.mark.parametrize("shape, typestr, error, message", [
    # np.prod gave 2**32 (the product wrapped around int64), a size the shim accepted
    (((1 << 32), (1 << 32) + 1), "<f4", ValueError, r"has more elements than fit in 64 bits"),
    (((1 << 63),), "<f4", ValueError, r"has more elements than fit in 64 bits"),
    # np.prod gave 0 and 2**63 * 8 bytes wrapped to 0
    (((1 << 62),), "<f8", ValueError, r"of 8-byte elements spans more bytes than fit in 64 bits"),
    # np.prod gave 3: two negative extents made a positive size
    (((-1, -3)), "<f4", ValueError, r"has a negative extent"),
    (((4, -2)), "<f4", ValueError, r"has a negative extent"),
    (((4.0,)), "<f4", TypeError, r"holds float 4.0, expected ints"),
    (((True, 2)), "<f4", TypeError, r"holds bool True, expected ints"),
])
def test_adopt_refuses_shapes_that_do_not_make_a_size(shim_adopt, shape, typestr, error, message):
    group = stand_in_group(3)
    buffers = [Claim(1 << 20, (8,), typestr), Claim(1 << 20, shape, typestr), Claim(1 << 20, (8,), typestr)]
    with pytest.raises(error, match=r"buffers\[1\]: shape \(.*\) " + message):
        sharded.ShardedArray.adopt(group, buffers)
    assert shim_adopt == []


def test_adopt_sizes_are_exact_products(shim_adopt):
    shapes = [(3, 5, 7), (), (0, 1 << 40), (1 << 40, 4)]
    buffers = [Claim(1 << 20, shape, "<i4") for shape in shapes]
    with pytest.raises(_Reached):
        sharded.ShardedArray.adopt(stand_in_group(4), buffers)
    (_, _, sizes, *_), = shim_adopt
    assert list(sizes) == [105, 1, 0, 1 << 42]


# ---- adopt: streams (CPU) -----------------------------------------------------------------

@pytest.mark.parametrize("stream, error, message", [
    (0, ValueError, r"stream 0 is disallowed by the CUDA Array Interface \(v3\)"),
    (True, TypeError, r"stream must be an int \(a cudaStream_t, 1 or 2\) or None, got bool"),
    (np.True_, TypeError, r"stream must be an int .* got bool"),
    (1.0, TypeError, r"stream must be an int .* got float"),
    ("7", TypeError, r"stream must be an int .* got str"),
    (-3, ValueError, r"stream -3 is not a CUDA stream handle"),
    (1 << 64, ValueError, rf"stream {1 << 64} is not a CUDA stream handle"),
])
def test_adopt_refuses_streams_that_are_no_stream(shim_adopt, stream, error, message):
    """Every buffer is checked before the shim adopts anything (here: the last one fails)."""
    buffers = [Claim(1 << 20, (8,), stream=1), Claim(1 << 20, (8,)), Claim(1 << 20, (8,), stream=stream)]
    with pytest.raises(error, match=r"buffers\[2\]: " + message):
        sharded.ShardedArray.adopt(stand_in_group(3), buffers)
    assert shim_adopt == []


def test_adopt_passes_each_stream_to_the_shim(shim_adopt):
    """None and no stream at all mean no synchronisation (0 to the shim); the default streams
    and handles pass as they are, numpy integers too."""
    streams = [None, ..., 1, 2, np.uint64(0x7F00_1234_5670)]
    buffers = [Claim(1 << 20, (8,), stream=stream) for stream in streams]
    with pytest.raises(_Reached):
        sharded.ShardedArray.adopt(stand_in_group(5), buffers)
    (*_, passed), = shim_adopt
    assert list(passed) == [0, 0, 1, 2, 0x7F00_1234_5670]


# ---- histogram_even: host memory (CPU) ----------------------------------------------------

def test_histogram_too_large_for_host_memory_is_memory_error_before_anything(
        shim_untouched, monkeypatch):
    """2147483000 bins used to allocate their edges (gigabytes, through np.linspace) before
    anything asked whether they fit."""
    available = int(3.2 * (1 << 30))
    monkeypatch.setattr(opaque, "_available_host_bytes", lambda: available)

    def no_linspace(*args, **kwargs):
        raise AssertionError("np.linspace was reached: host memory was taken before the check")

    monkeypatch.setattr(opaque.np, "linspace", no_linspace)
    num_bins = 2147483000
    with pytest.raises(MemoryError, match=r"num_bins: 2147483000 bins need ([\d.]+) GiB of host "
                                          r"memory; 3.2 GiB is available") as raised:
        sharded.histogram_even(stand_in_array(stand_in_group(3)), num_bins, 0.0, 1.0)
    need = float(re.search(r"need ([\d.]+) GiB", str(raised.value)).group(1))
    # at least the int64 counts it returns and the float32 edges numpy's histogram makes
    assert need >= (num_bins * 8 + (num_bins + 1) * 4) / (1 << 30) - 0.05


def test_histogram_that_fits_asks_the_shim(shim_untouched, monkeypatch):
    """Enough host memory: the next step is the shim's device-memory check."""
    monkeypatch.setattr(opaque, "_available_host_bytes", lambda: 1 << 50)
    with pytest.raises(AssertionError, match="check_histogram_memory was reached"):
        sharded.histogram_even(stand_in_array(stand_in_group(3)), 1 << 27, 0.0, 1.0)
    shim_untouched.clear()


def test_available_host_memory_is_at_most_what_the_machine_has():
    available = opaque._available_host_bytes()
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        pytest.skip("the platform does not report its physical memory")
    assert available is not None and 0 < available <= physical


# ---- adopt: extents (GPU) -----------------------------------------------------------------

@pytest.mark.gpu
def test_adopt_refuses_a_claim_past_the_end_of_its_allocation(one_place):
    cp = cupy_or_skip()
    memory = cp.cuda.Memory(400)  # its own cudaMalloc: 100 float32, nothing of CuPy's pool around
    values = cp.ndarray((100,), cp.float32, cp.cuda.MemoryPointer(memory, 0))
    values[...] = cp.arange(100, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    start = hex(memory.ptr)
    with pytest.raises(ValueError, match=rf"^buffers\[0\]: its 4000 bytes run past the end of the "
                                         rf"allocation at {start} \(400 bytes\)$"):
        sharded.ShardedArray.adopt(one_place, [Claim(memory.ptr, (1000,), owner=memory)])
    with pytest.raises(ValueError, match=rf"^buffers\[0\]: its 400 bytes run past the end of the "
                                         rf"allocation at {start} \(400 bytes\), starting 200 bytes into it$"):
        sharded.ShardedArray.adopt(one_place, [Claim(memory.ptr + 200, (100,), owner=memory)])
    # the same memory, claimed as it is: whole, and its last half
    whole = sharded.ShardedArray.adopt(one_place, [Claim(memory.ptr, (100,), owner=memory)])
    np.testing.assert_array_equal(whole.to_numpy(), np.arange(100, dtype=np.float32))
    tail = sharded.ShardedArray.adopt(one_place, [Claim(memory.ptr + 200, (50,), owner=memory)])
    np.testing.assert_array_equal(tail.to_numpy(), np.arange(50, 100, dtype=np.float32))


@pytest.mark.gpu
def test_adopt_takes_a_sub_view_inside_a_larger_buffer(three_places):
    cp = cupy_or_skip()
    big = cp.arange(1000, dtype=cp.float32)
    buffers = [Claim(big.data.ptr + 400, (500,), stream=1, owner=big),
               Claim(big.data.ptr, (100,), stream=1, owner=big),
               Claim(big.data.ptr + 3996, (1,), stream=1, owner=big)]
    array = sharded.ShardedArray.adopt(three_places, buffers)
    expected = np.concatenate([np.arange(100, 600), np.arange(100), [999]]).astype(np.float32)
    np.testing.assert_array_equal(array.to_numpy(), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("contiguous", [False, True])
def test_adopt_takes_our_own_shards_back(three_places, contiguous):
    """Pool allocations, and the shards of one VMM range mapped in several chunks."""
    # shards of 4 MiB and 16 bytes: a contiguous array's 2 MiB chunks end 16 bytes into the next shard
    host = sample(np.int64, 3 * (1 << 19) + 5)
    array = sharded.ShardedArray.from_numpy(three_places, host, contiguous=contiguous)
    again = sharded.ShardedArray.adopt(three_places, [array.shard(place) for place in range(3)])
    np.testing.assert_array_equal(again.to_numpy(), host)


def _driver(result):
    """The values of a cuda.bindings driver call, asserting it succeeded."""
    from cuda.bindings import driver

    status, *values = result
    assert status == driver.CUresult.CUDA_SUCCESS, status
    return values[0] if len(values) == 1 else values


@pytest.mark.gpu
def test_adopt_refuses_a_claim_over_an_unmapped_part_of_a_vmm_range(one_place):
    """A reserved range is one allocation to the driver, mapped or not (torch's expandable
    segments grow that way): the claim must stay on mapped chunks."""
    from cuda.bindings import driver

    prop = driver.CUmemAllocationProp()
    prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = one_place.devices[0]
    granule = _driver(driver.cuMemGetAllocationGranularity(
        prop, driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    base = _driver(driver.cuMemAddressReserve(2 * granule, granule, 0, 0))
    handle = _driver(driver.cuMemCreate(granule, prop, 0))
    mapped = False
    try:
        _driver(driver.cuMemMap(base, granule, 0, handle, 0))
        mapped = True
        access = driver.CUmemAccessDesc()
        access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = one_place.devices[0]
        access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        _driver(driver.cuMemSetAccess(base, granule, [access], 1))
        _driver(driver.cuMemsetD32(base, 0x07070707, granule // 4))
        _driver(driver.cuCtxSynchronize())
        start = int(base)
        with pytest.raises(ValueError, match=rf"^buffers\[0\]: its 128 bytes run past the mapped memory "
                                             rf"of the range at {hex(start)}: nothing is mapped at "
                                             rf"{hex(start + granule)}$"):
            sharded.ShardedArray.adopt(one_place, [Claim(start + granule - 64, (32,), "<i4")])
        adopted = sharded.ShardedArray.adopt(one_place, [Claim(start, (granule // 4,), "<i4")])
        np.testing.assert_array_equal(adopted.to_numpy(), np.full(granule // 4, 0x07070707, np.int32))
        adopted.free()
        del adopted
        gc.collect()
        one_place.sync()
    finally:
        if mapped:
            _driver(driver.cuMemUnmap(base, granule))
        _driver(driver.cuMemRelease(handle))
        _driver(driver.cuMemAddressFree(base, 2 * granule))


# ---- adopt: streams (GPU) -----------------------------------------------------------------
# A destroyed stream's handle, or an arbitrary number, cannot be checked: the driver takes
# handles on trust and crashes on them (cuStreamGetCtx and cuStreamQuery on a destroyed
# stream segfaulted on the H200's driver 580), so no test hands one over.

@pytest.mark.gpu
def test_adopt_refuses_a_stream_of_another_context(one_place):
    """A live stream of device 0, but of a context the group does not use: events of the
    group cannot be recorded on it."""
    cp = cupy_or_skip()
    from cuda.bindings import driver

    buffer = cp.arange(16, dtype=cp.float32)
    device = _driver(driver.cuDeviceGet(one_place.devices[0]))
    context = _driver(driver.cuCtxCreate(None, 0, device))  # current on this thread now
    try:
        stream = _driver(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
        _driver(driver.cuCtxPopCurrent())
        handle = int(stream)
        with pytest.raises(ValueError, match=rf"^buffers\[0\]: stream {hex(handle)} is not a live CUDA "
                                             rf"stream of device 0 in the context the group uses"):
            sharded.ShardedArray.adopt(one_place, [Claim(buffer.data.ptr, (16,), stream=handle,
                                                         owner=buffer)])
        _driver(driver.cuCtxPushCurrent(context))
        _driver(driver.cuStreamDestroy(stream))
        _driver(driver.cuCtxPopCurrent())
    finally:
        _driver(driver.cuCtxDestroy(context))
    # the group's own context is untouched: the same buffer on CuPy's stream adopts
    adopted = sharded.ShardedArray.adopt(one_place, [buffer])
    np.testing.assert_array_equal(adopted.to_numpy(), np.arange(16, dtype=np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("handle", [3, 0x1234, 0xFFFF, 1 << 57, (1 << 64) - 1])
def test_adopt_refuses_values_no_stream_can_have(one_place, handle):
    """Nothing is ever mapped in a process's lowest 64 KiB, nor above 2^57: refused without
    asking the driver (which would crash on them)."""
    cp = cupy_or_skip()
    buffer = cp.zeros(8, cp.float32)
    with pytest.raises(ValueError, match=rf"^buffers\[0\]: stream {hex(handle)} is not a live CUDA "
                                         rf"stream of device 0$"):
        sharded.ShardedArray.adopt(one_place, [Claim(buffer.data.ptr, (8,), stream=handle, owner=buffer)])


@pytest.mark.gpu
def test_adopt_waits_for_a_producer_stream(one_place):
    """A live non-blocking CuPy stream passes the check, and our reads start after its work."""
    cp = cupy_or_skip()
    n = 1 << 24
    with cp.cuda.Stream(non_blocking=True) as stream:
        buffer = cp.arange(n, dtype=cp.int64)
        for _ in range(20):
            buffer += 1
        interface = buffer.__cuda_array_interface__
        assert interface["stream"] == stream.ptr
        adopted = sharded.ShardedArray.adopt(one_place, [buffer])
    np.testing.assert_array_equal(adopted.to_numpy(), np.arange(n, dtype=np.int64) + 20)


@pytest.mark.gpu
@needs_devices(2)
def test_adopt_refuses_a_stream_of_another_device():
    cp = cupy_or_skip()
    group = sharded.PlaceGroup.by_devices([0, 1])
    with cp.cuda.Device(0):
        on_zero = cp.zeros(4, cp.float32)
        stream_of_zero = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.Device(1):
        on_one = cp.zeros(4, cp.float32)
    claims = [on_zero, Claim(on_one.data.ptr, (4,), stream=stream_of_zero.ptr, owner=on_one)]
    with pytest.raises(ValueError, match=rf"^buffers\[1\]: stream {hex(stream_of_zero.ptr)} is not a "
                                         rf"live CUDA stream of device 1 \(it is a stream of device 0\)$"):
        sharded.ShardedArray.adopt(group, claims)


# ---- histogram_even: device memory (GPU) --------------------------------------------------

@pytest.mark.gpu
def test_histogram_too_large_for_device_memory_is_memory_error_before_anything(three_places, one_place):
    host = np.arange(3000, dtype=np.float64)
    array = sharded.ShardedArray.from_numpy(three_places, host)
    alone = sharded.ShardedArray.from_numpy(one_place, host)
    for group in (three_places, one_place):
        group.release_cached_memory()
    hog = sharded.ShardedArray.allocate(one_place, (free_device_bytes() - (1 << 30)) // 8, np.float64)
    try:
        one_place.sync()
        free = free_device_bytes()
        num_bins = 1 << 27
        per_place = (num_bins + 1) * 8 + num_bins * 8  # float64 edges and int64 counts
        with pytest.raises(MemoryError, match=rf"^num_bins: {num_bins} bins need 2.0 GiB of device "
                                              rf"memory per place, 6.0 GiB on device 0 \(3 places\); "
                                              rf"device 0 has ([\d.]+) GiB free$") as raised:
            sharded.histogram_even(array, num_bins, 0.0, 3000.0)
        with pytest.raises(MemoryError, match=rf"^num_bins: {num_bins} bins need 2.0 GiB of device "
                                              rf"memory per place; device 0 has ([\d.]+) GiB free$"):
            sharded.histogram_even(alone, num_bins, 0.0, 3000.0)
        reported = float(re.search(r"has ([\d.]+) GiB", str(raised.value)).group(1))
        assert abs(reported - free / (1 << 30)) < 0.1 and reported * (1 << 30) < per_place
        assert abs(free_device_bytes() - free) < (64 << 20)  # nothing was allocated
    finally:
        hog.free()
        for group in (three_places, one_place):
            group.release_cached_memory()
    np.testing.assert_array_equal(sharded.histogram_even(array, 7, 0.0, 3000.0),
                                  np.histogram(host, bins=7, range=(0.0, 3000.0))[0])


@pytest.mark.gpu
def test_memory_the_pool_keeps_counts_as_free(one_place):
    """A second large histogram reuses the scratch the first one left in the group's pool:
    the check must not refuse it for what cudaMemGetInfo alone reports."""
    cp = cupy_or_skip()
    host = sample(np.float64, 10_000)
    array = sharded.ShardedArray.from_numpy(one_place, host)
    num_bins = 1 << 26  # 1 GiB of scratch
    expected = np.histogram(host, bins=num_bins, range=(-4.0, 4.0))[0]
    one_place.release_cached_memory()
    np.testing.assert_array_equal(sharded.histogram_even(array, num_bins, -4.0, 4.0), expected)
    one_place.sync()
    hog = cp.cuda.Memory(free_device_bytes() - (512 << 20))  # outside our pool: leaves 0.5 GiB free
    try:
        assert free_device_bytes() < (1 << 30)
        np.testing.assert_array_equal(sharded.histogram_even(array, num_bins, -4.0, 4.0), expected)
    finally:
        del hog
        one_place.release_cached_memory()


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [[0, 0, 0], [0, 700, 0], [0, 5, 995], [400, 0, 600]])
def test_histogram_with_empty_places(three_places, sizes):
    host = sample(np.float32, sum(sizes))
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=sizes)
    np.testing.assert_array_equal(sharded.histogram_even(array, 9, -2.0, 2.0),
                                  np.histogram(host, bins=9, range=(-2.0, 2.0))[0])


# ---- kernel libraries unloaded with work queued (GPU) ------------------------------------

_ROUNDS = 20_000


def _slow(x):
    for _ in range(_ROUNDS):
        x = x * 0.999 + 0.001
    return x


@pytest.mark.gpu
def test_library_dropped_with_its_kernel_queued_waits_for_it(one_place):
    """A library evicted from the compile caches may still have kernels queued: its
    destructor waits for the devices it launched on before unloading it. (Driver 580's own
    cuLibraryUnload was seen to wait as well, which its documentation does not promise.)"""
    from cuda.bindings import driver

    kernel = sharded.compile(_slow, "transform", (np.float64,), arch=one_place.archs[0])
    blocker = _shim.KernelLibrary(kernel.cubin, ["csj_transform"])  # two loads of one cubin
    dropped = _shim.KernelLibrary(kernel.cubin, ["csj_transform"])
    n = 1 << 24
    starts = np.array([0.0, 0.5, 2.0, -1.0])
    a = sharded.ShardedArray.from_numpy(one_place, np.tile(starts, n // 4))
    once = sharded.ShardedArray.allocate(one_place, n, np.float64)
    twice = sharded.ShardedArray.allocate(one_place, n, np.float64)
    _shim.transform([blocker], [a._impl], once._impl, b"", False)
    _shim.transform([dropped], [once._impl], twice._impl, b"", False)  # queued behind it
    stream = driver.CUstream(one_place.stream(0))
    (queued,) = driver.cuStreamQuery(stream)
    del dropped  # the last reference: unloads here
    (after,) = driver.cuStreamQuery(stream)
    assert queued == driver.CUresult.CUDA_ERROR_NOT_READY  # the premise: work was still queued
    assert after == driver.CUresult.CUDA_SUCCESS
    expected = starts.copy()
    for _ in range(2 * _ROUNDS):
        expected = expected * 0.999 + 0.001
    np.testing.assert_allclose(twice.to_numpy(), np.tile(expected, n // 4), rtol=1e-12)
    del blocker
