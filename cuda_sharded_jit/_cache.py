"""Compiled-kernel caches: in memory (per process) and on disk (across processes).

Disk entries are single files named by the key's SHA-256, written to a temporary file and
renamed into place (atomic: concurrent writers leave one valid entry). Each entry carries a
digest of its body; an entry that fails the check is reported, recompiled and replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
import warnings
from pathlib import Path

ENV_CACHE_DIR = "CUDA_SHARDED_JIT_CACHE_DIR"
ENV_DISABLE = "CUDA_SHARDED_JIT_DISABLE_CACHE"
_MAGIC = b"CSJKERN1"
_SUFFIX = ".kernel"


class CacheWarning(UserWarning):
    """A disk cache entry or directory could not be used; the kernel was recompiled.

    >>> warnings.simplefilter("error", sharded.CacheWarning)   # make it loud in CI  # doctest: +SKIP
    """


def cache_dir() -> Path | None:
    """The on-disk cache directory, or None when the disk cache is disabled.

    `$CUDA_SHARDED_JIT_CACHE_DIR` if set, else `$XDG_CACHE_HOME/cuda_sharded_jit`, else
    `~/.cache/cuda_sharded_jit`. `CUDA_SHARDED_JIT_DISABLE_CACHE=1` turns the disk cache off.

    >>> sharded.cache_dir()                                               # doctest: +SKIP
    PosixPath('/home/me/.cache/cuda_sharded_jit')
    """
    if os.environ.get(ENV_DISABLE, "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    explicit = os.environ.get(ENV_CACHE_DIR)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cuda_sharded_jit"


def disk_key(material: str) -> str:
    return hashlib.sha256(material.encode()).hexdigest()


def read_entry(key: str) -> tuple[dict, bytes] | None:
    """(header, body) of a valid entry, or None (missing, disabled, corrupt: with a warning)."""
    directory = cache_dir()
    if directory is None:
        return None
    path = directory / f"{key}{_SUFFIX}"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        warnings.warn(f"kernel cache entry {path} is unreadable ({error}); recompiling",
                      CacheWarning, stacklevel=4)
        return None
    try:
        if not data.startswith(_MAGIC):
            raise ValueError("bad magic")
        (header_size,) = struct.unpack_from("<Q", data, len(_MAGIC))
        start = len(_MAGIC) + 8
        header = json.loads(data[start:start + header_size])
        body = data[start + header_size:]
        if len(body) != header["body_size"] or hashlib.sha256(body).hexdigest() != header["body_sha256"]:
            raise ValueError("body does not match its digest (truncated or corrupt)")
        return header, body
    except (ValueError, KeyError, struct.error, UnicodeDecodeError) as error:
        warnings.warn(f"kernel cache entry {path} is corrupt ({error}); recompiling and replacing it",
                      CacheWarning, stacklevel=4)
        return None


def write_entry(key: str, header: dict, body: bytes) -> None:
    """Atomically store an entry; a directory that cannot be written only warns."""
    directory = cache_dir()
    if directory is None:
        return
    header = dict(header, body_size=len(body), body_sha256=hashlib.sha256(body).hexdigest())
    encoded = json.dumps(header, sort_keys=True).encode()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{key[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(_MAGIC + struct.pack("<Q", len(encoded)) + encoded + body)
            os.replace(temporary, directory / f"{key}{_SUFFIX}")
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
    except OSError as error:
        warnings.warn(f"kernel cache directory {directory} is not writable ({error}); "
                      f"the kernel works but is not cached on disk", CacheWarning, stacklevel=4)


def disk_entries() -> list[Path]:
    directory = cache_dir()
    if directory is None or not directory.is_dir():
        return []
    return sorted(directory.glob(f"*{_SUFFIX}"))


def clear_disk() -> int:
    """Delete every entry of the disk cache; returns how many were removed."""
    removed = 0
    for path in disk_entries():
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    directory = cache_dir()
    if directory is not None and directory.is_dir():
        for leftover in directory.glob(".*.tmp"):
            try:
                leftover.unlink()
            except OSError:
                pass
    return removed


class MemoryCache:
    """A dict whose misses are built once even when many threads miss at the same time.

    A build that raises (a type error, KeyboardInterrupt) stores nothing: the next call builds
    again.
    """

    def __init__(self):
        self._entries: dict = {}
        self._lock = threading.Lock()
        self._building: dict = {}

    def get(self, key):
        return self._entries.get(key)

    def get_or_build(self, key, build):
        value = self._entries.get(key)
        if value is not None:
            return value
        with self._lock:
            key_lock = self._building.setdefault(key, threading.Lock())
        with key_lock:  # a KeyboardInterrupt while waiting here leaves the builder's lock be
            try:
                value = self._entries.get(key)
                if value is None:
                    value = build()
                    self._entries[key] = value
            finally:
                with self._lock:
                    if self._building.get(key) is key_lock:
                        del self._building[key]
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

