"""Faults: a missing or failing toolchain library, an interrupted compile or call, disk cache
damage, device memory running out. Each leaves a clear error and a usable library behind.

The disk cache's corrupt, truncated and bad-header entries and two processes racing on one
key are tested in test_compile.py; what it refuses to trust (planted, foreign, linked,
oversized entries, shared directories) in test_cache_trust.py.
"""

from __future__ import annotations

import _thread
import concurrent.futures
import errno
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _cache, _link, compiler

from conftest import free_device_bytes

ARCH = "sm_90"


# ---- a missing toolchain library names what to install ----------------------------------

_MISSING_LIBRARY_CHILD = textwrap.dedent("""
    import sys
    import cuda.pathfinder as pathfinder

    hidden = sys.argv[1]
    found = pathfinder.load_nvidia_dynamic_lib

    def load(name, *args, **kwargs):  # as if the library's wheel were not installed
        if name == hidden:
            raise pathfinder.DynamicLibNotFoundError(f"Failure finding lib{name}.so: not found")
        return found(name, *args, **kwargs)

    pathfinder.load_nvidia_dynamic_lib = load
    import numpy as np, cuda_sharded_jit as sharded
    try:
        sharded.compile(lambda x: x * 3 + 1, "transform", (np.float32,), arch="sm_90")
    except RuntimeError as error:
        print(type(error).__name__ + ": " + str(error))
    else:
        print("compiled")
""")


@pytest.mark.parametrize("library, package", [("nvvm", "nvidia-nvvm"),
                                              ("nvrtc", "nvidia-cuda-nvrtc"),
                                              ("nvJitLink", "nvidia-nvjitlink")])
def test_missing_library_names_the_package_to_install(tmp_path, library, package):
    env = dict(os.environ, CUDA_SHARDED_JIT_DISABLE_CACHE="1")
    result = subprocess.run([sys.executable, "-c", _MISSING_LIBRARY_CHILD, library], env=env,
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("RuntimeError: "), result.stdout
    assert f"pip install '{package}>=13,<14'" in result.stdout
    assert f"lib{library}.so" in result.stdout  # the loader's own words are kept


def test_missing_library_is_found_behind_a_wrapping_error():
    class DynamicLibNotFoundError(RuntimeError):
        pass

    try:
        try:
            raise DynamicLibNotFoundError("Failure finding libnvJitLink.so.13")
        except RuntimeError as cause:
            raise ValueError("lowering failed") from cause
    except ValueError as wrapped:
        error = _link.missing_library_error(wrapped)
    assert isinstance(error, RuntimeError)
    assert "nvJitLink" in str(error) and "pip install 'nvidia-nvjitlink>=13,<14'" in str(error)
    assert _link.missing_library_error(ValueError("something else")) is None


def test_missing_numba_names_the_package(tmp_path):
    code = textwrap.dedent("""
        import sys
        sys.modules["numba"] = None  # as if numba-cuda were not installed
        import numpy as np, cuda_sharded_jit as sharded
        try:
            sharded.compile(lambda x: x, "transform", (np.float32,), arch="sm_90")
        except ImportError as error:
            print(error)
    """)
    env = dict(os.environ, CUDA_SHARDED_JIT_DISABLE_CACHE="1")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pip install 'numba-cuda>=0.30.1'" in result.stdout


# ---- a failing nvJitLink ----------------------------------------------------------------

@pytest.mark.parametrize("status, error, message", [
    ("ERROR_PTX_COMPILE", RuntimeError, r"nvJitLink failed to link transform_o8_i8 for sm_90"),
    ("ERROR_OUTDATED_LIBRARY", sharded.VersionSkewError, r"nvJitLink \d+\.\d+ is too old .*pip install -U nvidia-nvjitlink"),
])
def test_failing_link_is_reported_and_leaves_nothing_behind(fresh_cache, monkeypatch, status, error, message):
    from cuda.bindings import nvjitlink

    def failing_complete(handle):
        raise nvjitlink.nvJitLinkError(getattr(nvjitlink.Result, status))

    op = sharded.op(lambda x: x * 5 - 2)
    real_complete = nvjitlink.complete
    monkeypatch.setattr(nvjitlink, "complete", failing_complete)
    with pytest.raises(error, match=message):
        sharded.compile(op, "transform", (np.float64,), arch=ARCH)
    assert not list(fresh_cache.glob("*.kernel"))  # nothing cached from the failure
    monkeypatch.setattr(nvjitlink, "complete", real_complete)
    kernel = sharded.compile(op, "transform", (np.float64,), arch=ARCH)
    assert not kernel.cache_hit and kernel.cubin[:4] == b"\x7fELF"


# ---- an interrupted compile -------------------------------------------------------------

def test_keyboard_interrupt_during_a_compile_leaves_the_caches_usable(fresh_cache, monkeypatch):
    real_link = _link.link

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    op = sharded.op(lambda x, y: x * y + 7)
    monkeypatch.setattr(_link, "link", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sharded.compile(op, "transform", (np.int64, np.int64), arch=ARCH)
    assert compiler._kernels._building == {}  # no stale per-key lock
    assert len(compiler._kernels) == 0
    assert not list(fresh_cache.glob("*.kernel")) and not list(fresh_cache.glob(".*.tmp"))
    monkeypatch.setattr(_link, "link", real_link)
    kernel = sharded.compile(op, "transform", (np.int64, np.int64), arch=ARCH)
    assert not kernel.cache_hit and kernel.out_dtype == np.int64
    assert sharded.compile(op, "transform", (np.int64, np.int64), arch=ARCH).cache_hit


def test_keyboard_interrupt_while_writing_the_disk_entry_leaves_no_temporary(fresh_cache, monkeypatch):
    real_replace = os.replace

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_cache.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sharded.compile(lambda x: x + 12, "transform", (np.int32,), arch=ARCH)
    monkeypatch.setattr(_cache.os, "replace", real_replace)
    assert not list(fresh_cache.glob(".*.tmp")) and not list(fresh_cache.glob("*.kernel"))
    assert sharded.compile(lambda x: x + 12, "transform", (np.int32,), arch=ARCH).cubin


# ---- disk cache faults not covered in test_compile.py -----------------------------------

def test_unreadable_entry_warns_and_recompiles(fresh_cache):
    op = sharded.op(lambda x: x * 9)
    first = sharded.compile(op, "transform", (np.int32,), arch=ARCH)
    entry = fresh_cache / f"{first.cache_key}.kernel"
    entry.unlink()
    entry.mkdir()  # unreadable as a file, and not replaceable either
    sharded.clear_cache(memory=True, disk=False)
    with pytest.warns(sharded.CacheWarning) as caught:
        again = sharded.compile(op, "transform", (np.int32,), arch=ARCH)
    messages = [str(warning.message) for warning in caught]
    # (match the reasons, not just a word: the test's own path contains "unreadable")
    assert any("is not a regular file (a directory)" in message for message in messages)
    assert any("is not writable" in message for message in messages)
    assert again.cubin == first.cubin and not list(fresh_cache.glob(".*.tmp"))


def test_read_only_cache_directory_only_warns(fresh_cache, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):  # creating a file in the cache directory fails
        if flags & os.O_CREAT and kwargs.get("dir_fd") is not None:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, flags, *args, **kwargs)

    fresh_cache.mkdir(parents=True)
    monkeypatch.setattr(_cache.os, "open", read_only)
    with pytest.warns(sharded.CacheWarning, match="not writable"):
        kernel = sharded.compile(lambda x: x - 13, "transform", (np.int64,), arch=ARCH)
    assert kernel.cubin and not list(fresh_cache.iterdir())


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores permissions")
def test_unwritable_directory_by_permissions_only_warns(fresh_cache):
    fresh_cache.mkdir(parents=True)
    fresh_cache.chmod(0o500)
    try:
        with pytest.warns(sharded.CacheWarning, match="not writable"):
            kernel = sharded.compile(lambda x: x - 14, "transform", (np.int64,), arch=ARCH)
    finally:
        fresh_cache.chmod(0o700)
    assert kernel.cubin


# ---- device memory runs out (GPU) -------------------------------------------------------

@pytest.mark.gpu
def test_scratch_allocation_failure_is_memory_error_and_leaks_nothing(three_places, one_place):
    """histogram_even's scratch cannot be allocated on a nearly full device: MemoryError,
    nothing leaked, and the group keeps working. (Places of one device reuse each other's
    freed scratch through the stream-ordered pool, so the room left must be below one
    place's need.)"""
    host = np.arange(3000, dtype=np.float64)
    array = sharded.ShardedArray.from_numpy(three_places, host)
    for group in (three_places, one_place):
        group.release_cached_memory()
    before = free_device_bytes()
    # leave 0.5 GiB: a 2^26-bin histogram needs 1 GiB of edges and counts per place
    hog = sharded.ShardedArray.allocate(one_place, (before - (512 << 20)) // 8, np.float64)
    with pytest.raises(MemoryError):
        sharded.histogram_even(array, 1 << 26, 0.0, 3000.0)
    hog.free()
    for group in (three_places, one_place):
        group.release_cached_memory()
    assert abs(free_device_bytes() - before) < (64 << 20)
    np.testing.assert_array_equal(sharded.histogram_even(array, 3, 0.0, 3000.0),
                                  np.histogram(host, bins=3, range=(0.0, 3000.0))[0])
    assert sharded.sum(array) == host.sum()


@pytest.mark.gpu
@pytest.mark.parametrize("contiguous", [False, True])
def test_array_larger_than_the_device_is_memory_error_and_leaks_nothing(three_places, contiguous):
    three_places.release_cached_memory()
    before = free_device_bytes()
    make = sharded.ShardedArray.allocate_contiguous if contiguous else sharded.ShardedArray.allocate
    with pytest.raises(MemoryError):  # the last shard does not fit: a failure half way
        make(three_places, [1 << 20, 1 << 20, before // 4 + (1 << 30)], np.float64)
    three_places.release_cached_memory()
    assert abs(free_device_bytes() - before) < (64 << 20)
    array = make(three_places, 3000, np.int32)
    sharded.sequence(array)
    np.testing.assert_array_equal(array.to_numpy(), np.arange(3000, dtype=np.int32))


# ---- an interrupted call (GPU) ----------------------------------------------------------

@pytest.mark.gpu
def test_keyboard_interrupt_between_calls_leaves_the_group_usable(three_places):
    """Ctrl-C reaches Python between shim calls, never inside one (each releases the GIL and
    runs to completion), so an interrupted loop leaves every array and the group consistent."""
    big = sharded.ShardedArray.allocate(three_places, 1 << 26, np.float32)
    sharded.fill(big, 1.0)
    keep = sharded.ShardedArray.from_numpy(three_places, np.arange(1000, dtype=np.int64))
    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    deadline = time.monotonic() + 30
    try:
        with pytest.raises(KeyboardInterrupt):
            while time.monotonic() < deadline:  # bounded: fails (no interrupt) after 30 s
                sharded.transform(sharded.ops.add_scalar(1.0), big, out=big)
                three_places.sync()
    finally:
        timer.cancel()
    three_places.sync()
    values = big.to_numpy()
    assert np.all(values == values[0]) and values[0] >= 1.0  # every element saw every call
    assert sharded.sum(keep) == 499500
    np.testing.assert_array_equal(sharded.inclusive_scan(keep).to_numpy(), np.cumsum(np.arange(1000)))


def test_memory_cache_builds_once_and_forgets_failed_builds():
    cache = _cache.MemoryCache()
    builds, release = [], threading.Event()

    def slow_build():
        builds.append(1)
        release.wait(10)
        return "value"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(cache.get_or_build, "key", slow_build) for _ in range(8)]
        time.sleep(0.2)  # every thread is now building or waiting for the builder
        release.set()
        assert [future.result(timeout=30) for future in futures] == ["value"] * 8
    assert len(builds) == 1 and cache._building == {}

    def failing_build():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.get_or_build("other", failing_build)
    assert cache._building == {} and cache.get("other") is None
    assert cache.get_or_build("other", lambda: "built again") == "built again"
