"""GPU tests of PlaceGroup."""

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import DEVICE_COUNT, needs_devices

pytestmark = pytest.mark.gpu


def test_by_devices_defaults_to_every_device():
    group = sharded.PlaceGroup.by_devices()
    assert len(group) == DEVICE_COUNT
    assert group.devices == tuple(range(DEVICE_COUNT))


def test_repeated_device_gets_one_stream_per_place():
    group = sharded.PlaceGroup.by_devices([0, 0, 0])
    assert len(group) == 3 and group.devices == (0, 0, 0)
    streams = [group.stream(place) for place in range(3)]
    assert len(set(streams)) == 3 and all(isinstance(s, int) and s > 2 for s in streams)
    group.sync()


def test_errors():
    with pytest.raises(ValueError, match="devices: unknown device id 4096"):
        sharded.PlaceGroup.by_devices([0, 4096])
    with pytest.raises(ValueError, match="devices: unknown device id -1"):
        sharded.PlaceGroup.by_devices([-1])
    with pytest.raises(ValueError, match="empty list"):
        sharded.PlaceGroup.by_devices([])
    group = sharded.PlaceGroup.by_devices([0])
    with pytest.raises(IndexError):
        group.stream(1)


def test_locality_domains_keep_each_domain_adjacent():
    group = sharded.PlaceGroup.by_locality_domains()
    assert sorted(group.devices) == list(range(DEVICE_COUNT))
    domains = group.locality_domains
    assert len(domains) == DEVICE_COUNT
    assert list(domains) == sorted(domains)  # one run per domain
    for domain in set(domains):
        devices = [d for d, dom in zip(group.devices, domains) if dom == domain]
        assert devices == sorted(devices)


def test_repr_shows_places_and_devices():
    text = repr(sharded.PlaceGroup.by_devices([0, 0]))
    assert text.startswith("PlaceGroup([0: cuda:0") and "1: cuda:0" in text


def test_archs():
    group = sharded.PlaceGroup.by_devices([0])
    assert group.archs[0].startswith("sm_")


@needs_devices(2)
def test_distinct_devices_have_peer_access():
    group = sharded.PlaceGroup.by_devices([0, 1])
    assert group._impl.can_access_peer(0, 1) and group._impl.can_access_peer(1, 0)


def _free_bytes() -> int:
    from cuda.bindings import runtime

    assert runtime.cudaSetDevice(0)[0] == runtime.cudaError_t.cudaSuccess
    status, free, _ = runtime.cudaMemGetInfo()
    assert status == runtime.cudaError_t.cudaSuccess
    return free


def test_the_device_default_pool_is_left_as_the_driver_made_it():
    """CuPy and torch may allocate from the device's default pool: its release threshold
    stays 0 (memory goes back at each synchronisation) however we use the device."""
    from cuda.bindings import runtime

    group = sharded.PlaceGroup.by_devices([0, 0])
    array = sharded.ShardedArray.from_numpy(group, np.arange(1 << 20, dtype=np.int64))
    assert sharded.sum(array) == (1 << 20) * ((1 << 20) - 1) // 2
    array.free()
    group.sync()
    status, pool = runtime.cudaDeviceGetDefaultMemPool(0)
    assert status == runtime.cudaError_t.cudaSuccess
    status, threshold = runtime.cudaMemPoolGetAttribute(
        pool, runtime.cudaMemPoolAttr.cudaMemPoolAttrReleaseThreshold)
    assert status == runtime.cudaError_t.cudaSuccess
    assert int(threshold) == 0


def test_the_library_pool_keeps_freed_memory_until_released():
    """Repeated calls reuse cached memory (no cudaMalloc per call); release_cached_memory
    gives it back to the driver."""
    group = sharded.PlaceGroup.by_devices([0])
    group.release_cached_memory()
    before = _free_bytes()
    array = sharded.ShardedArray.allocate(group, 1 << 28, np.float32)  # 1 GiB
    array.free()
    group.sync()
    assert _free_bytes() <= before - (1 << 30) + (64 << 20)  # still cached by the pool
    again = sharded.ShardedArray.allocate(group, 1 << 28, np.float32)  # served from the cache
    group.sync()
    assert _free_bytes() >= before - (1 << 30) - (64 << 20)
    again.free()
    group.release_cached_memory()
    assert _free_bytes() >= before - (64 << 20)
