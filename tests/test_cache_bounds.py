"""CPU tests of the kernel caches' bounds (disk by bytes, memory by entries, least recently
used first), their inspection, and the debug dump's refusal to follow links or overwrite."""

from __future__ import annotations

import concurrent.futures
import os
import stat
import threading
import time
import warnings

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _cache

from helpers.cache_entries import (  # noqa: F401 - fresh_process_state is an autouse fixture
    entry_path, fresh_process_state, key)


# ---- 6. the disk bound ------------------------------------------------------------------

def test_disk_bound_removes_least_recently_used_entries(fresh_cache, monkeypatch):
    body = bytes(1000)
    _cache.write_entry(key("1"), {}, body)
    size = entry_path(fresh_cache, key("1")).stat().st_size
    (fresh_cache / "notes.txt").write_bytes(bytes(20 * size))  # not an entry: not counted
    monkeypatch.setenv(_cache.ENV_MAX_BYTES, str(3 * size + size // 2))
    for name in ("2", "3"):
        _cache.write_entry(key(name), {}, body)
    past = time.time() - 1000
    for age, name in enumerate(("1", "2", "3")):  # written in this order, long ago
        os.utime(entry_path(fresh_cache, key(name)), (past + age, past + age))
    assert _cache.read_entry(key("1")) is not None  # a hit makes "1" the most recent
    _cache.write_entry(key("4"), {}, body)
    left = {path.name for path in fresh_cache.glob("*.kernel")}
    assert left == {f"{key(name)}.kernel" for name in ("1", "3", "4")}
    assert _cache.disk_usage() == (3, 3 * size)
    monkeypatch.setenv(_cache.ENV_MAX_BYTES, "1")  # smaller than any entry
    _cache.write_entry(key("5"), {}, body)
    assert [path.name for path in fresh_cache.glob("*.kernel")] == [f"{key('5')}.kernel"]
    assert (fresh_cache / "notes.txt").exists() and (fresh_cache / "secret.key").exists()


def test_stale_temporaries_are_removed_fresh_ones_kept(fresh_cache):
    _cache.write_entry(key("1"), {}, b"")
    stale, fresh = fresh_cache / ".0123456789abcdef.dead.tmp", fresh_cache / ".0123456789abcdef.live.tmp"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    _cache.write_entry(key("2"), {}, b"")
    assert not stale.exists() and fresh.exists()


@pytest.mark.parametrize("text, expected", [
    (None, 1 << 30), ("12345", 12345), ("64K", 64 * 1024), ("3M", 3 * 1024 ** 2),
    ("2G", 2 * 1024 ** 3), ("2g", 2 * 1024 ** 3), (" 10 ", 10), ("0", 0),
])
def test_disk_bound_setting(monkeypatch, text, expected):
    if text is not None:
        monkeypatch.setenv(_cache.ENV_MAX_BYTES, text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _cache.max_disk_bytes() == expected


@pytest.mark.parametrize("text", ["lots", "-5", "1.5G", "12T", "0x10"])
def test_invalid_disk_bound_warns_once_and_uses_the_default(monkeypatch, text):
    monkeypatch.setenv(_cache.ENV_MAX_BYTES, text)
    with pytest.warns(sharded.CacheWarning, match=_cache.ENV_MAX_BYTES) as caught:
        assert [_cache.max_disk_bytes() for _ in range(3)] == [1 << 30] * 3
    assert len(caught) == 1


# ---- 7. the memory bound ----------------------------------------------------------------

def test_memory_cache_drops_the_least_recently_used():
    cache = _cache.MemoryCache(max_entries=3)
    for name in "abc":
        cache.get_or_build(name, lambda name=name: name.upper())
    assert cache.get("a") == "A"  # "b" is now the oldest
    assert cache.get_or_build("d", lambda: "D") == "D"
    assert cache.max_entries == 3 and len(cache) == 3
    assert [cache.get(name) for name in "abcd"] == ["A", None, "C", "D"]


def test_memory_cache_bound_comes_from_the_environment(monkeypatch):
    assert _cache.MemoryCache().max_entries == 1024
    monkeypatch.setenv(_cache.ENV_MEMORY_ENTRIES, "7")
    assert _cache.MemoryCache().max_entries == 7
    for text in ("many", "0"):
        monkeypatch.setenv(_cache.ENV_MEMORY_ENTRIES, text)
        with pytest.warns(sharded.CacheWarning, match=_cache.ENV_MEMORY_ENTRIES):
            assert _cache.MemoryCache().max_entries == 1024
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="max_entries"):
            _cache.MemoryCache(max_entries=bad)


class _NoLock:
    def __enter__(self):
        raise AssertionError("a hit took the lock")

    def __exit__(self, *exc_info):
        return False


def test_memory_cache_hit_takes_no_lock():
    cache = _cache.MemoryCache(max_entries=4)
    cache.get_or_build("a", lambda: "A")
    cache._lock = _NoLock()
    assert cache.get("a") == "A"
    assert cache.get_or_build("a", lambda: "again") == "A"
    assert cache.get_or_build_reporting("a", lambda: "again") == ("A", False)


def test_memory_cache_stays_consistent_under_threads():
    cache, builds = _cache.MemoryCache(max_entries=8), []

    def build(name):
        builds.append(name)
        return ("value of", name)

    def worker(seed):
        rng = np.random.default_rng(seed)
        for name in map(int, rng.integers(0, 40, 3000)):
            assert cache.get_or_build(name, lambda name=name: build(name)) == ("value of", name)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(worker, seed) for seed in range(8)]:
            future.result(timeout=120)
    assert len(cache) <= 8 and cache._building == {}
    for name in range(40):
        assert cache.get(name) in (None, ("value of", name))


def test_get_or_build_reporting_tells_the_builder_from_a_waiter():
    cache, builds = _cache.MemoryCache(), []
    started, release = threading.Event(), threading.Event()

    def slow_build():
        builds.append(1)
        started.set()
        release.wait(30)
        return "value"

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(cache.get_or_build_reporting, "key", slow_build)
        assert started.wait(30)
        second = pool.submit(cache.get_or_build_reporting, "key", slow_build)
        time.sleep(0.2)  # the second thread now waits for the first one's build
        release.set()
        results = [first.result(timeout=30), second.result(timeout=30)]
    assert results == [("value", True), ("value", False)] and len(builds) == 1
    assert cache.get_or_build_reporting("key", slow_build) == ("value", False)

    def failing_build():
        raise ValueError("cannot build")

    with pytest.raises(ValueError):
        cache.get_or_build_reporting("other", failing_build)
    assert cache._building == {} and cache.get("other") is None
    assert cache.get_or_build_reporting("other", lambda: "built") == ("built", True)


# ---- 8. inspection ----------------------------------------------------------------------

def test_inspection_counts_and_clears_entries_only(fresh_cache):
    _cache.write_entry(key("1"), {}, b"one")
    _cache.write_entry(key("2"), {}, b"two, longer")
    (fresh_cache / "notes.txt").write_bytes(b"not an entry")
    (fresh_cache / f"{key('3')}.kernel.bak").write_bytes(b"not an entry either")
    (fresh_cache / ".0123456789abcdef.0000.tmp").write_bytes(b"a fresh temporary")
    entries = sorted(entry_path(fresh_cache, key(name)) for name in ("1", "2"))
    assert _cache.disk_entries() == entries
    assert _cache.disk_usage() == (2, sum(path.stat().st_size for path in entries))
    assert _cache.max_disk_bytes() == _cache.DEFAULT_MAX_DISK_BYTES == 1 << 30
    assert _cache.clear_disk() == 2
    assert sorted(path.name for path in fresh_cache.iterdir()) == sorted(
        ["notes.txt", f"{key('3')}.kernel.bak", "secret.key"])
    assert _cache.disk_usage() == (0, 0) and _cache.disk_entries() == []


# ---- 9. debug dumps ---------------------------------------------------------------------

def test_dump_writes_private_files_with_safe_names(tmp_path):
    directory = tmp_path / "dump" / "here"
    previous = os.umask(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _cache.write_dump(str(directory), [("add<f32>.cubin", b"cubin"),
                                               ("../escape.ltoir", b"ltoir"), ("..", b"dots")])
    finally:
        os.umask(previous)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert sorted(path.name for path in directory.iterdir()) == [".._escape.ltoir", "__", "add_f32_.cubin"]
    assert (directory / "add_f32_.cubin").read_bytes() == b"cubin"
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in directory.iterdir())
    assert not (tmp_path / "dump" / "escape.ltoir").exists()


@pytest.mark.parametrize("target_exists", [True, False], ids=["to a directory", "dangling"])
def test_dump_refuses_a_symlinked_directory(tmp_path, target_exists):
    target = tmp_path / "elsewhere"
    if target_exists:
        target.mkdir()
    (tmp_path / "dump").symlink_to(target)
    with pytest.warns(sharded.CacheWarning, match="is a symbolic link.*the kernel itself is fine"):
        _cache.write_dump(str(tmp_path / "dump"), [("k.cubin", b"cubin")])
    assert (list(target.iterdir()) == []) if target_exists else not target.exists()


def test_dump_never_overwrites_what_it_did_not_write(tmp_path):
    directory, outside = tmp_path / "dump", tmp_path / "outside"
    directory.mkdir()
    outside.write_bytes(b"precious")
    (directory / "theirs.cubin").write_bytes(b"theirs")
    (directory / "link.cubin").symlink_to(outside)
    files = [("theirs.cubin", b"mine"), ("link.cubin", b"mine"), ("new.cubin", b"mine")]
    with pytest.warns(sharded.CacheWarning) as caught:
        _cache.write_dump(str(directory), files)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "theirs.cubin, link.cubin" in message and "not overwritten" in message
    assert (directory / "theirs.cubin").read_bytes() == b"theirs" and outside.read_bytes() == b"precious"
    assert (directory / "new.cubin").read_bytes() == b"mine"
    with warnings.catch_warnings():  # the same dump again (a rebuild): nothing to say
        warnings.simplefilter("error")
        _cache.write_dump(str(directory), [("new.cubin", b"mine")])


def test_dump_failures_only_warn(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.warns(sharded.CacheWarning, match="failed.*the kernel itself is fine"):
        _cache.write_dump(str(tmp_path / "a-file" / "dump"), [("k.cubin", b"cubin")])
    with pytest.warns(sharded.CacheWarning, match="failed"):
        _cache.write_dump(str(tmp_path / "dump"), [("k.cubin", None)])


