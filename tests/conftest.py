"""Shared fixtures. GPU tests carry the `gpu` marker and skip where no GPU is visible."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

# Keep the suite's compiled kernels out of the user's cache.
os.environ.setdefault("CUDA_SHARDED_JIT_CACHE_DIR", tempfile.mkdtemp(prefix="csj-test-cache-"))

import cuda_sharded_jit as sharded  # noqa: E402
from cuda_sharded_jit import _cache, _shim  # noqa: E402

ALL_DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64]


def _device_count() -> int:
    try:
        return _shim.visible_device_count()
    except RuntimeError:
        return 0


DEVICE_COUNT = _device_count()


def pytest_collection_modifyitems(config, items):
    if DEVICE_COUNT:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU is visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def sample(dtype, n, seed=0):
    """Random values of `dtype` that stay exact through small arithmetic."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(n).astype(dtype)
    if dtype.kind == "u":
        return rng.integers(0, 1000, n).astype(dtype)
    return rng.integers(-1000, 1000, n).astype(dtype)


@pytest.fixture(scope="session")
def one_place():
    return sharded.PlaceGroup.by_devices([0])


@pytest.fixture(scope="session")
def three_places():
    """Three places on device 0: every cross-place path on one GPU."""
    return sharded.PlaceGroup.by_devices([0, 0, 0])


@pytest.fixture(scope="session")
def all_devices():
    return sharded.PlaceGroup.by_devices()


@pytest.fixture(scope="session", params=["one", "three", "all"])
def group(request, one_place, three_places, all_devices):
    return {"one": one_place, "three": three_places, "all": all_devices}[request.param]


def _place_counts():
    devices = max(DEVICE_COUNT, 1)
    return [[place % devices for place in range(count)] for count in (1, 2, 3, 4)]


@pytest.fixture(scope="module", params=_place_counts(), ids=lambda devices: f"{len(devices)}places")
def places(request):
    """1 to 4 places over the visible GPUs (round robin): repeated devices where fewer."""
    return sharded.PlaceGroup.by_devices(request.param)


def uneven(places, n):
    """Uneven shard sizes with an empty shard where there are at least three places
    (`places`: a group, or how many places)."""
    count = places if isinstance(places, int) else len(places)
    if count == 1:
        return [n]
    weights = np.arange(1, count + 1, dtype=np.float64)
    sizes = np.floor(weights / weights.sum() * n).astype(np.int64)
    if count >= 3:
        sizes[1] = 0
    sizes[-1] += n - sizes.sum()
    return [int(size) for size in sizes]


def free_device_bytes(device: int = 0) -> int:
    """The device's free memory, as the driver reports it (cudaMemGetInfo)."""
    from cuda.bindings import runtime

    (status,) = runtime.cudaSetDevice(device)
    assert status == runtime.cudaError_t.cudaSuccess
    status, free, _ = runtime.cudaMemGetInfo()
    assert status == runtime.cudaError_t.cudaSuccess
    return free


def needs_devices(count: int):
    return pytest.mark.skipif(DEVICE_COUNT < count, reason=f"needs {count} GPUs")


def cupy_or_skip():
    return pytest.importorskip("cupy")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty disk cache directory and an empty memory cache for one test."""
    monkeypatch.setenv(_cache.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.delenv(_cache.ENV_DISABLE, raising=False)
    sharded.clear_cache(memory=True, disk=False)
    yield tmp_path / "cache"
    sharded.clear_cache(memory=True, disk=False)
