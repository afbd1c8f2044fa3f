"""CPU tests of what the kernel cache refuses to trust (its bounds and the debug dump:
test_cache_bounds.py).

A disk entry is machine code the process runs, so each test here plants something a cache
must not serve (another kernel under this key, an entry of another user or another secret,
links, FIFOs, huge files, a shared directory) and checks it is a miss that says why. Entries
are built here from the documented layout (_cache's docstring), not with _cache's helpers.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _cache

ARCH = "sm_90"
from helpers.cache_entries import (  # noqa: F401 - fresh_process_state is an autouse fixture
    MAGIC, STRANGER, entry_path, fresh_process_state, key, messages, needs_root, read_quietly, secret_of, sign,
    tag_verifies)


# ---- 1. the directory -------------------------------------------------------------------

def test_directory_is_created_private_whatever_the_umask(tmp_path, monkeypatch):
    directory = tmp_path / "parents" / "made" / "cache"
    monkeypatch.setenv(_cache.ENV_CACHE_DIR, str(directory))
    previous = os.umask(0)
    try:
        _cache.write_entry(key("a"), {}, b"body")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "secret.key").stat().st_mode) == 0o600
    assert _cache.read_entry(key("a")) == ({"body_size": 4}, b"body")


def test_directory_readable_by_others_but_not_writable_is_used(fresh_cache):
    fresh_cache.mkdir()
    fresh_cache.chmod(0o755)  # what older versions and plain mkdir made
    with warnings.catch_warnings():
        warnings.simplefilter("error", sharded.CacheWarning)
        _cache.write_entry(key("a"), {}, b"body")
        assert _cache.read_entry(key("a")) == ({"body_size": 4}, b"body")


@pytest.mark.parametrize("mode", [0o1777, 0o770, 0o757])
def test_directory_writable_by_others_is_not_used(fresh_cache, mode):
    fresh_cache.mkdir()
    fresh_cache.chmod(mode)
    with pytest.warns(sharded.CacheWarning) as caught:
        _cache.write_entry(key("a"), {}, b"body")
        assert _cache.read_entry(key("a")) is None
        assert _cache.read_entry(key("b")) is None
        assert _cache.disk_usage() == (0, 0) and _cache.clear_disk() == 0
    assert len(caught) == 1  # once per directory and reason, not on every miss
    text = messages(caught)
    assert f"writable by group or others (mode {mode:o})" in text
    assert f"chmod 700 {fresh_cache}" in text and _cache.ENV_CACHE_DIR in text
    assert list(fresh_cache.iterdir()) == []  # neither written nor keyed


def test_directory_warning_is_repeated_only_for_a_new_reason(fresh_cache):
    fresh_cache.mkdir()
    fresh_cache.chmod(0o777)
    with pytest.warns(sharded.CacheWarning) as caught:
        for _ in range(3):
            _cache.read_entry(key("a"))
        fresh_cache.chmod(0o775)
        for _ in range(3):
            _cache.read_entry(key("a"))
    assert [str(warning.message).count("(mode 777)") for warning in caught] == [1, 0]
    assert "(mode 775)" in str(caught[1].message)


@needs_root
def test_directory_of_another_user_is_not_used(fresh_cache):
    fresh_cache.mkdir()
    fresh_cache.chmod(0o700)
    os.chown(fresh_cache, STRANGER, STRANGER)
    with pytest.warns(sharded.CacheWarning, match=f"owned by uid {STRANGER}, not you"):
        _cache.write_entry(key("a"), {}, b"body")
    assert list(fresh_cache.iterdir()) == []


def test_missing_entry_or_directory_is_a_silent_miss(fresh_cache):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _cache.read_entry(key("a")) is None
        assert not fresh_cache.exists()  # a read creates nothing
        fresh_cache.mkdir(mode=0o700)
        assert _cache.read_entry(key("a")) is None
        assert list(fresh_cache.iterdir()) == []


def test_keys_that_are_not_disk_keys_are_refused(fresh_cache):
    for bad in ["../../outside", key("a").upper(), key("a")[:-1], key("a") + "/x"]:
        with pytest.raises(ValueError, match="64 hex digits"):
            _cache.read_entry(bad)
        with pytest.raises(ValueError, match="64 hex digits"):
            _cache.write_entry(bad, {}, b"")


# ---- 2. entries: links, FIFOs, other file types, size, owner -----------------------------

def test_symlinked_entry_is_refused_and_the_link_replaced(fresh_cache, tmp_path):
    _cache.write_entry(key("a"), {"who": "outside"}, b"outside")
    outside = tmp_path / "outside.kernel"
    entry_path(fresh_cache, key("a")).rename(outside)  # an authentic entry, reached by a link
    entry_path(fresh_cache, key("a")).symlink_to(outside)
    planted = outside.read_bytes()
    result, warned = read_quietly(key("a"))
    assert result is None and any("is a symbolic link" in message for message in warned)
    _cache.write_entry(key("a"), {}, b"rebuilt")
    assert not entry_path(fresh_cache, key("a")).is_symlink()
    assert outside.read_bytes() == planted  # the link was replaced, not its target
    assert _cache.read_entry(key("a")) == ({"body_size": 7}, b"rebuilt")


_READ_IN_A_CHILD = textwrap.dedent("""
    import sys, warnings
    warnings.simplefilter("always")
    from cuda_sharded_jit import _cache
    print(_cache.read_entry(sys.argv[1]))
""")


def test_fifo_at_an_entry_path_neither_hangs_nor_stays(fresh_cache):
    _cache.write_entry(key("other"), {}, b"")  # the directory and its key
    os.mkfifo(entry_path(fresh_cache, key("a")), 0o600)
    env = dict(os.environ, **{_cache.ENV_CACHE_DIR: str(fresh_cache)})
    # in a child: a regression blocks in open() forever, and must fail here, not hang the suite
    child = subprocess.run([sys.executable, "-c", _READ_IN_A_CHILD, key("a")], env=env,
                           capture_output=True, text=True, timeout=60, cwd=fresh_cache.parent)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "None"
    assert "is not a regular file (a FIFO); recompiling and replacing it" in child.stderr
    _cache.write_entry(key("a"), {}, b"rebuilt")
    assert stat.S_ISREG(entry_path(fresh_cache, key("a")).lstat().st_mode)
    assert _cache.read_entry(key("a")) == ({"body_size": 7}, b"rebuilt")


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_link_to_a_huge_sparse_file_is_refused_before_reading(fresh_cache, tmp_path, link):
    _cache.write_entry(key("other"), {}, b"")
    huge = tmp_path / "huge"
    huge.touch()
    os.truncate(huge, 1 << 40)  # 1 TiB of nothing: reading it would be a MemoryError
    if link == "symbolic":
        entry_path(fresh_cache, key("a")).symlink_to(huge)
        reason = "is a symbolic link"
    else:
        os.link(huge, entry_path(fresh_cache, key("a")))
        reason = f"is too large ({1 << 40} bytes; the limit is {64 << 20})"
    result, warned = read_quietly(key("a"))
    assert result is None and any(reason in message for message in warned)
    _cache.write_entry(key("a"), {}, b"rebuilt")
    assert huge.stat().st_size == 1 << 40 and _cache.read_entry(key("a")) == ({"body_size": 7}, b"rebuilt")
    huge.unlink()


def test_entry_size_cap_is_64_mib():
    assert _cache.MAX_ENTRY_BYTES == 64 * 1024 * 1024


@needs_root
def test_entry_of_another_user_is_refused(fresh_cache):
    _cache.write_entry(key("a"), {}, b"body")
    os.chown(entry_path(fresh_cache, key("a")), STRANGER, STRANGER)
    result, warned = read_quietly(key("a"))
    assert result is None and any(f"is not owned by you (owner uid {STRANGER})" in m for m in warned)


def _plant_socket(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(path.parent)  # a relative name: the full path may exceed a socket address
    try:
        server.bind(path.name)
    finally:
        os.chdir(cwd)
    return server


@pytest.mark.parametrize("kind, reason", [
    ("directory", "is not a regular file (a directory)"),
    ("socket", "is not a regular file (a socket)"),
    ("dangling symlink", "is a symbolic link"),
])
def test_other_file_types_are_misses_never_errors(fresh_cache, kind, reason):
    _cache.write_entry(key("other"), {}, b"")
    path = entry_path(fresh_cache, key("a"))
    keep_open = None
    if kind == "directory":
        path.mkdir()
    elif kind == "socket":
        keep_open = _plant_socket(path)
    else:
        path.symlink_to(fresh_cache / "nowhere")
    try:
        result, warned = read_quietly(key("a"))
        assert result is None and any(reason in message for message in warned)
        if kind != "directory":  # a directory cannot be renamed over; the rest are replaced
            _cache.write_entry(key("a"), {}, b"rebuilt")
            assert _cache.read_entry(key("a")) == ({"body_size": 7}, b"rebuilt")
    finally:
        if keep_open is not None:
            keep_open.close()


# ---- 3. authentication ------------------------------------------------------------------

def test_entry_signed_with_another_secret_is_a_miss(fresh_cache, tmp_path, monkeypatch):
    elsewhere = tmp_path / "someone-elses-cache"
    monkeypatch.setenv(_cache.ENV_CACHE_DIR, str(elsewhere))
    _cache.write_entry(key("a"), {"module": "m"}, b"their kernel")
    assert _cache.read_entry(key("a")) is not None  # authentic where it was written
    monkeypatch.setenv(_cache.ENV_CACHE_DIR, str(fresh_cache))
    _cache.write_entry(key("other"), {}, b"")
    shutil.copyfile(entry_path(elsewhere, key("a")), entry_path(fresh_cache, key("a")))
    assert secret_of(elsewhere) != secret_of(fresh_cache)
    result, warned = read_quietly(key("a"))
    assert result is None and any("authentication tag does not verify" in m for m in warned)


def test_entry_copied_under_another_key_is_a_miss(fresh_cache):
    _cache.write_entry(key("a - b"), {"module": "m"}, b"kernel of a - b")
    shutil.copyfile(entry_path(fresh_cache, key("a - b")), entry_path(fresh_cache, key("a + b")))
    result, warned = read_quietly(key("a + b"))
    assert result is None and any("authentication tag does not verify" in m for m in warned)
    assert _cache.read_entry(key("a - b")) == ({"body_size": 15, "module": "m"}, b"kernel of a - b")


def test_entries_are_tagged_as_documented(fresh_cache):
    _cache.write_entry(key("a"), {"module": "m"}, b"body")
    data = entry_path(fresh_cache, key("a")).read_bytes()
    assert tag_verifies(secret_of(fresh_cache), key("a"), data)
    assert not tag_verifies(secret_of(fresh_cache), key("b"), data)


def test_damaged_entries_are_misses_never_errors(fresh_cache):
    _cache.write_entry(key("a"), {"module": "transform_o4_i4", "out_dtype": "<f4"}, b"\x7fELF cubin")
    path = entry_path(fresh_cache, key("a"))
    good = path.read_bytes()
    damaged = [good[:size] for size in range(len(good))]                      # every truncation
    damaged += [good[:i] + bytes([good[i] ^ 0x20]) + good[i + 1:] for i in range(len(good))]  # every byte
    damaged += [good + b"x", b"", os.urandom(200), b"CSJKERN2" + os.urandom(100)]
    for data in damaged:
        path.write_bytes(data)
        result, warned = read_quietly(key("a"))
        assert result is None and len(warned) == 1, (data, warned)
    path.write_bytes(good)
    assert _cache.read_entry(key("a")) is not None


def test_old_unauthenticated_format_is_a_miss(fresh_cache):
    _cache.write_entry(key("other"), {}, b"")
    body = b"kernel"  # CSJKERN1, as the previous version wrote it: a digest anyone can compute
    header = json.dumps({"body_size": len(body), "body_sha256": hashlib.sha256(body).hexdigest(),
                         "module": "m"}, sort_keys=True).encode()
    old_entry = b"CSJKERN1" + struct.pack("<Q", len(header)) + header + body
    entry_path(fresh_cache, key("a")).write_bytes(old_entry)
    result, warned = read_quietly(key("a"))
    assert result is None and any("older, unauthenticated CSJKERN1 format" in m for m in warned)


# ---- 4. the header ----------------------------------------------------------------------

@pytest.mark.parametrize("header", [
    b"[1, 2]", b'"a string"', b"3", b"null", b"true",
    json.dumps({"body_size": 5}).encode(), json.dumps({"body_size": "4"}).encode(),
    json.dumps({"body_size": True}).encode(), json.dumps({"module": "m"}).encode(),
    b"{not json", b"\xff\xfe\xfa", b"[" * 100_000,
], ids=lambda header: header[:16].decode(errors="replace"))
def test_header_must_be_an_object_with_the_body_size(fresh_cache, header):
    _cache.write_entry(key("other"), {}, b"")
    secret = secret_of(fresh_cache)
    # a correctly signed entry is read back, so what follows fails on its header alone
    entry_path(fresh_cache, key("a")).write_bytes(sign(secret, key("a"), {"body_size": 4, "m": 1}, b"body"))
    assert _cache.read_entry(key("a")) == ({"body_size": 4, "m": 1}, b"body")
    entry_path(fresh_cache, key("a")).write_bytes(sign(secret, key("a"), header, b"body"))
    result, warned = read_quietly(key("a"))
    assert result is None and len(warned) == 1 and "is corrupt" in warned[0]


def test_header_length_past_the_end_is_a_miss(fresh_cache):
    _cache.write_entry(key("other"), {}, b"")
    signed = struct.pack("<Q", 1 << 62) + b"{}"
    tag = hmac.new(secret_of(fresh_cache), MAGIC + key("a").encode() + signed, hashlib.sha256).digest()
    entry_path(fresh_cache, key("a")).write_bytes(MAGIC + tag + signed)
    result, warned = read_quietly(key("a"))
    assert result is None and any("runs past the end" in message for message in warned)


# ---- 3. the secret key ------------------------------------------------------------------

def test_secret_key_is_private_random_and_per_directory(fresh_cache, tmp_path, monkeypatch):
    _cache.write_entry(key("a"), {}, b"")
    status = (fresh_cache / "secret.key").lstat()
    assert stat.S_ISREG(status.st_mode) and stat.S_IMODE(status.st_mode) == 0o600
    assert status.st_size == 32 and status.st_uid == os.geteuid()
    monkeypatch.setenv(_cache.ENV_CACHE_DIR, str(tmp_path / "second"))
    _cache.write_entry(key("a"), {}, b"")
    assert secret_of(tmp_path / "second") != secret_of(fresh_cache)


def _widen(path: Path, outside: Path) -> None:
    path.chmod(0o644)


def _shorten(path: Path, outside: Path) -> None:
    os.truncate(path, 31)


def _relink(path: Path, outside: Path) -> None:
    path.rename(outside)  # a good key, reached through a link
    path.symlink_to(outside)


def _give_away(path: Path, outside: Path) -> None:
    os.chown(path, STRANGER, STRANGER)


@pytest.mark.parametrize("damage, reason", [
    (_widen, "readable or writable by group or others (mode 644)"),
    (_shorten, "31 bytes, not 32"),
    (_relink, "a symbolic link"),
    pytest.param(_give_away, f"not owned by you (owner uid {STRANGER})", marks=needs_root),
], ids=["mode 644", "31 bytes", "symlink", "other owner"])
def test_bad_secret_key_is_replaced(fresh_cache, tmp_path, damage, reason):
    _cache.write_entry(key("a"), {}, b"body")
    path, outside = fresh_cache / "secret.key", tmp_path / "outside.key"
    old_secret = secret_of(fresh_cache)
    damage(path, outside)
    kept = outside.read_bytes() if outside.exists() else None
    result, warned = read_quietly(key("a"))
    assert result is None  # entries signed with the key it replaced are misses now
    assert any(f"secret key {path} is {reason}; replacing it" in message for message in warned)
    status = path.lstat()
    assert stat.S_ISREG(status.st_mode) and stat.S_IMODE(status.st_mode) == 0o600
    assert status.st_size == 32 and path.read_bytes() != old_secret
    if kept is not None:
        assert outside.read_bytes() == kept
    _cache.write_entry(key("a"), {}, b"body")
    assert _cache.read_entry(key("a")) == ({"body_size": 4}, b"body")


def test_a_process_that_loses_the_key_race_uses_the_winners_key(fresh_cache, monkeypatch):
    winner, real_link = b"W" * 32, os.link

    def another_process_first(source, target, *, src_dir_fd, dst_dir_fd, **kwargs):
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dst_dir_fd)
        os.write(fd, winner)
        os.close(fd)
        return real_link(source, target, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, **kwargs)

    monkeypatch.setattr(_cache.os, "link", another_process_first)
    _cache.write_entry(key("a"), {}, b"body")
    assert secret_of(fresh_cache) == winner  # not overwritten by the loser
    assert tag_verifies(winner, key("a"), entry_path(fresh_cache, key("a")).read_bytes())
    assert sorted(path.name for path in fresh_cache.iterdir()) == [f"{key('a')}.kernel", "secret.key"]


_WRITE_IN_A_CHILD = textwrap.dedent("""
    import sys
    from cuda_sharded_jit import _cache
    _cache.write_entry(sys.argv[1], {}, sys.argv[1].encode())
""")


def test_processes_racing_on_a_new_directory_share_one_key(fresh_cache):
    env = dict(os.environ, **{_cache.ENV_CACHE_DIR: str(fresh_cache)})
    keys = [key(f"racer {index}") for index in range(6)]
    children = [subprocess.Popen([sys.executable, "-c", _WRITE_IN_A_CHILD, disk_key], env=env,
                                 cwd=fresh_cache.parent) for disk_key in keys]
    assert all(child.wait(timeout=120) == 0 for child in children)
    for disk_key in keys:  # every entry verifies with the one key the directory kept
        assert _cache.read_entry(disk_key) == ({"body_size": 64}, disk_key.encode())
    assert not list(fresh_cache.glob(".*.tmp"))


def test_interrupted_key_or_entry_write_leaves_no_temporary(fresh_cache, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(_cache.os, "link", interrupted)
        with pytest.raises(KeyboardInterrupt):
            _cache.write_entry(key("a"), {}, b"body")
    assert list(fresh_cache.iterdir()) == []
    with monkeypatch.context() as patch:
        patch.setattr(_cache.os, "replace", interrupted)
        with pytest.raises(KeyboardInterrupt):
            _cache.write_entry(key("a"), {}, b"body")
    assert [path.name for path in fresh_cache.iterdir()] == ["secret.key"]
    _cache.write_entry(key("a"), {}, b"body")
    assert _cache.read_entry(key("a")) == ({"body_size": 4}, b"body")


# ---- the attack from the review, end to end ---------------------------------------------

def _plus(a, b):
    return a + b


def _minus(a, b):
    return a - b


def _compile(func) -> sharded.CompiledKernel:
    sharded.clear_cache(memory=True, disk=False)
    return sharded.compile(sharded.op(func), "transform", (np.float32, np.float32), arch=ARCH)


def _plant_minus_under_plus(directory: Path, plus_key: str, minus_key: str, monkeypatch) -> None:
    """What an attacker controlling `directory` does with this very library: write the
    `a - b` kernel under the key of `a + b`, as authentic as that directory can make it."""
    monkeypatch.setenv(_cache.ENV_CACHE_DIR, str(directory))
    header, body = _cache.read_entry(minus_key)
    _cache.write_entry(plus_key, header, body)


def _genuine(directory: Path, monkeypatch):
    monkeypatch.setenv(_cache.ENV_CACHE_DIR, str(directory))
    plus, minus = _compile(_plus), _compile(_minus)
    assert plus.cubin != minus.cubin
    return plus, minus


def test_planted_kernel_in_a_shared_directory_is_never_run(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    plus, minus = _genuine(shared, monkeypatch)
    _plant_minus_under_plus(shared, plus.cache_key, minus.cache_key, monkeypatch)
    assert _cache.read_entry(plus.cache_key)[1].startswith(minus.cubin)  # it would be served...
    shared.chmod(0o1777)  # ...were the directory private; it is anyone's
    planted = {path.name: path.read_bytes() for path in shared.iterdir()}
    with pytest.warns(sharded.CacheWarning, match=r"writable by group or others \(mode 1777\)"):
        again = _compile(_plus)
    assert not again.cache_hit and again.cubin == plus.cubin
    assert {path.name: path.read_bytes() for path in shared.iterdir()} == planted  # untouched
    # cached in memory only, and no second warning for the same directory
    with warnings.catch_warnings():
        warnings.simplefilter("error", sharded.CacheWarning)
        assert sharded.compile(sharded.op(_plus), "transform", (np.float32, np.float32), arch=ARCH).cache_hit


def test_kernel_signed_with_another_secret_is_never_run(tmp_path, monkeypatch):
    attacker, victim = tmp_path / "attacker", tmp_path / "victim"
    _genuine(victim, monkeypatch)
    plus, minus = _genuine(attacker, monkeypatch)
    _plant_minus_under_plus(attacker, plus.cache_key, minus.cache_key, monkeypatch)
    shutil.copyfile(entry_path(attacker, plus.cache_key), entry_path(victim, plus.cache_key))
    monkeypatch.setenv(_cache.ENV_CACHE_DIR, str(victim))
    with pytest.warns(sharded.CacheWarning, match="authentication tag does not verify"):
        again = _compile(_plus)
    assert not again.cache_hit and again.cubin == plus.cubin
    assert _compile(_plus).cache_hit  # the genuine entry replaced the planted one


_CHILD = textwrap.dedent("""
    import hashlib, sys, warnings
    import numpy as np, cuda_sharded_jit as sharded
    operators = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b}
    warnings.simplefilter("always")
    kernel = sharded.compile(operators[sys.argv[1]], "transform", (np.float32, np.float32), arch="sm_90")
    print(kernel.cache_key, kernel.cache_hit, hashlib.sha256(kernel.cubin).hexdigest())
""")


def _child(directory: Path, operator: str) -> tuple[str, bool, str, str]:
    """(disk key, cache hit, sha256 of the cubin, stderr) of a compile in a new process."""
    env = dict(os.environ, **{_cache.ENV_CACHE_DIR: str(directory)})
    result = subprocess.run([sys.executable, "-c", _CHILD, operator], capture_output=True,
                            text=True, env=env, check=True, timeout=300, cwd=directory.parent)
    disk_key, hit, digest = result.stdout.split()
    return disk_key, hit == "True", digest, result.stderr


@pytest.fixture(scope="module")
def genuine_cache(tmp_path_factory):
    """A cache directory holding `a + b` and `a - b`, compiled by other processes."""
    directory = tmp_path_factory.mktemp("genuine") / "cache"
    plus_key, _, plus_digest, _ = _child(directory, "plus")
    minus_key, _, minus_digest, _ = _child(directory, "minus")
    assert plus_digest != minus_digest
    return directory, plus_key, plus_digest, minus_key


@pytest.mark.parametrize("attack", ["shared directory", "another secret", "copied under the key"])
def test_planted_kernel_is_never_run_by_another_process(genuine_cache, tmp_path, monkeypatch, attack):
    source, plus_key, plus_digest, minus_key = genuine_cache
    victim = tmp_path / "victim"
    shutil.copytree(source, victim)
    if attack == "shared directory":
        _plant_minus_under_plus(victim, plus_key, minus_key, monkeypatch)
        victim.chmod(0o1777)
        reason = "writable by group or others (mode 1777)"
    elif attack == "another secret":
        attacker = tmp_path / "attacker"  # the attacker's own cache, with its own key
        _child(attacker, "minus")
        _plant_minus_under_plus(attacker, plus_key, minus_key, monkeypatch)
        shutil.copyfile(entry_path(attacker, plus_key), entry_path(victim, plus_key))
        reason = "authentication tag does not verify"
    else:
        shutil.copyfile(entry_path(victim, minus_key), entry_path(victim, plus_key))
        reason = "authentication tag does not verify"
    disk_key, hit, digest, stderr = _child(victim, "plus")
    assert (disk_key, hit, digest) == (plus_key, False, plus_digest)
    assert reason in stderr
    if attack != "shared directory":
        assert _child(victim, "plus")[1:3] == (True, plus_digest)  # replaced by the genuine one

