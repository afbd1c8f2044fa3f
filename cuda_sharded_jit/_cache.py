"""Compiled-kernel caches: in memory (per process, bounded) and on disk (across processes).

A disk entry is machine code this process will load and run, so the disk cache only serves
what this user's own cache wrote:
- the directory must be owned by this user and writable by no one else; it is checked on
  the open directory at every use, and entries are named relative to that descriptor. A
  shared or foreign directory is not used at all (a CacheWarning says how to fix it);
- every entry carries an HMAC-SHA256 tag, keyed by a per-user secret kept in the directory
  (`secret.key`, 0600), over the entry's disk key and its whole contents: an entry written
  by anyone else, copied under another key, truncated or corrupt is a miss, never a hit;
- entries are opened without following a symbolic link and without blocking (a FIFO), and
  must be this user's regular files of at most MAX_ENTRY_BYTES, checked before reading.
An unusable entry warns, is recompiled, and the new entry replaces the path itself (never a
link's target). Disk entries total at most `$CUDA_SHARDED_JIT_CACHE_MAX_BYTES`; each memory
cache holds at most `$CUDA_SHARDED_JIT_MEMORY_CACHE_ENTRIES` values; least recently used go.

Entry layout: magic (8) | tag (32) | header length (u64 LE) | header (JSON object) | body,
tag = HMAC-SHA256(secret, magic + disk key (64 hex digits, ASCII) + all bytes after the tag).

Beside it: _files.py (opening and checking files by descriptor, the warnings), _memory_cache.py
(the bounded in-memory maps) and _dump.py (CUDA_SHARDED_JIT_DUMP); this module re-exports
what callers use of them.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import struct
import threading
import time
from pathlib import Path

# the cache's other parts, re-exported: the compiler and the tests ask this module for them
from ._dump import write_dump  # noqa: F401
from ._files import CacheWarning  # noqa: F401
from ._files import CREATE_FLAGS, DIRECTORY_FLAGS, _make_directory, _open_own_file, _read_exactly, _Refused
from ._files import _unlink_quietly, _warn, _warn_once, _write_all
from ._memory_cache import DEFAULT_MEMORY_ENTRIES, ENV_MEMORY_ENTRIES, MemoryCache  # noqa: F401

ENV_CACHE_DIR = "CUDA_SHARDED_JIT_CACHE_DIR"
ENV_DISABLE = "CUDA_SHARDED_JIT_DISABLE_CACHE"
ENV_MAX_BYTES = "CUDA_SHARDED_JIT_CACHE_MAX_BYTES"

# A cubin with its LTO-IR is well under 1 MiB; the cap is checked (fstat) before reading, so
# a link to a huge or sparse file costs nothing.
MAX_ENTRY_BYTES = 64 << 20
DEFAULT_MAX_DISK_BYTES = 1 << 30
STALE_TEMPORARY_SECONDS = 3600  # a temporary this old was left by a process killed mid-write

KEY_FILE = "secret.key"
_MAGIC = b"CSJKERN2"
_OLD_MAGICS = (b"CSJKERN1",)  # unauthenticated: never trusted, replaced on the next write
_SECRET_SIZE = 32
_TAG_SIZE = 32
_LENGTH = struct.Struct("<Q")
_HEADER_START = len(_MAGIC) + _TAG_SIZE + _LENGTH.size
_SUFFIX = ".kernel"
_DISK_KEY = re.compile(r"[0-9a-f]{64}")
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.kernel")
_TEMPORARY_NAME = re.compile(r"\..+\.tmp")
_BYTE_COUNT = re.compile(r"(\d+)\s*([KMG]?)(?:I?B)?")




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
    """The disk key (64 hex digits, an entry's file name) of a full cache key's text.

    >>> len(disk_key("('transform', ...)"))
    64
    """
    return hashlib.sha256(material.encode()).hexdigest()


# ---- the directory ----------------------------------------------------------------------

class _Directory:
    """The cache directory, open and checked. Entries are named relative to `fd`, so the
    directory that passed the check is the one used even if its path is swapped meanwhile."""

    def __init__(self, path: Path, fd: int, status: os.stat_result):
        self.path, self.fd, self.status = path, fd, status

    def __enter__(self) -> _Directory:
        return self

    def __exit__(self, *exc_info) -> None:
        os.close(self.fd)


def _distrust(status: os.stat_result) -> str | None:
    """Why a directory with this status must not hold kernels, or None."""
    if status.st_uid != os.geteuid():
        return f"owned by uid {status.st_uid}, not you (uid {os.geteuid()})"
    if status.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(status.st_mode):o})"
    return None


def _open_directory(create: bool) -> _Directory | None:
    """The checked cache directory, or None: disabled, missing (and not `create`), or unusable
    (with a CacheWarning, once per directory and reason)."""
    path = cache_dir()
    if path is None:
        return None
    try:
        created = create and _make_directory(path)
        fd = os.open(path, DIRECTORY_FLAGS)
    except OSError as error:
        if not create and error.errno in (errno.ENOENT, errno.ENOTDIR):
            return None  # nothing cached yet: a write creates it, or says why it cannot
        _warn_once(path, ("not writable", error.errno),
                   f"kernel cache directory {path} is not writable ({error}); "
                   f"the kernel works but is not cached on disk")
        return None
    try:
        status = os.fstat(fd)
        if created and status.st_uid == os.geteuid():
            os.fchmod(fd, 0o700)  # mkdir's mode went through the umask
            status = os.fstat(fd)
    except OSError as error:
        os.close(fd)
        _warn_once(path, ("unusable", error.errno),
                   f"kernel cache directory {path} is unusable ({error}); "
                   f"the kernel works but is not cached on disk")
        return None
    reason = _distrust(status)
    if reason is not None:
        os.close(fd)
        _warn_once(path, reason,
                   f"kernel cache directory {path} is {reason}: whoever can write there could "
                   f"plant kernels this process would run, so the disk cache is not used "
                   f"(kernels are cached in memory only). fix: chmod 700 {path}, or point "
                   f"{ENV_CACHE_DIR} at a private directory")
        return None
    return _Directory(path, fd, status)


# ---- the secret key ---------------------------------------------------------------------

# (st_dev, st_ino) of a directory -> ((st_dev, st_ino) of its key file, key)
_secrets: dict = {}
_secrets_lock = threading.Lock()


def _secret_problem(status: os.stat_result) -> str | None:
    if status.st_mode & 0o077:
        return f"readable or writable by group or others (mode {stat.S_IMODE(status.st_mode):o})"
    if status.st_size != _SECRET_SIZE:
        return f"{status.st_size} bytes, not {_SECRET_SIZE}"
    return None


def _read_secret(directory: _Directory) -> tuple[bytes, os.stat_result]:
    """The directory's key and its file's status; FileNotFoundError, _Refused, OSError."""
    fd, status = _open_own_file(directory.fd, KEY_FILE, _SECRET_SIZE)
    try:
        problem = _secret_problem(status)
        if problem is not None:
            raise _Refused(problem, status)
        key = _read_exactly(fd, _SECRET_SIZE)
        if len(key) != _SECRET_SIZE:
            raise _Refused(f"{len(key)} bytes, not {_SECRET_SIZE}", status)
        return key, status
    finally:
        os.close(fd)


def _create_secret(directory: _Directory) -> None:
    """Publish a new key unless one exists: written complete under a temporary name, then
    hard-linked to KEY_FILE, which fails when another process got there first. Both then
    read the winner's key: a rename would let the loser overwrite it and orphan its entries."""
    temporary = f".secret.{secrets.token_hex(8)}.tmp"
    fd = os.open(temporary, CREATE_FLAGS, 0o600, dir_fd=directory.fd)
    try:
        try:
            _write_all(fd, secrets.token_bytes(_SECRET_SIZE))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temporary, KEY_FILE, src_dir_fd=directory.fd, dst_dir_fd=directory.fd)
        except FileExistsError:
            pass
    finally:
        _unlink_quietly(directory.fd, temporary)


def _secret(directory: _Directory) -> bytes | None:
    """This directory's key (read once per process, created if missing), or None with a
    warning. OSError when it cannot be read or created."""
    directory_id = (directory.status.st_dev, directory.status.st_ino)
    cached = _secrets.get(directory_id)
    if cached is not None:
        try:  # one lstat: still the file that was checked and read, still private?
            status = os.stat(KEY_FILE, dir_fd=directory.fd, follow_symlinks=False)
            if ((status.st_dev, status.st_ino) == cached[0] and stat.S_ISREG(status.st_mode)
                    and status.st_uid == os.geteuid() and _secret_problem(status) is None):
                return cached[1]
        except OSError:
            pass
    path = directory.path / KEY_FILE
    with _secrets_lock:
        for _ in range(3):
            try:
                key, status = _read_secret(directory)
            except FileNotFoundError:
                _create_secret(directory)
                continue
            except _Refused as refused:
                _warn(f"kernel cache secret key {path} is {refused}; replacing it (entries "
                      f"signed with it will be recompiled)")
                if refused.status is None or _same_file(directory.fd, KEY_FILE, refused.status):
                    _unlink_quietly(directory.fd, KEY_FILE)
                _create_secret(directory)
                continue
            _secrets[directory_id] = ((status.st_dev, status.st_ino), key)
            return key
    _warn(f"kernel cache secret key {path} keeps changing or cannot be made private; "
          f"the kernel works but the disk cache is not used")
    return None


def _same_file(directory_fd: int, name: str, status: os.stat_result) -> bool:
    """Whether `name` is still the file `status` describes (so removing it removes that one,
    not a key another process has just put in its place)."""
    try:
        now = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (status.st_dev, status.st_ino)


def _tag(secret: bytes, key: str, signed) -> bytes:
    mac = hmac.new(secret, _MAGIC, hashlib.sha256)
    mac.update(key.encode("ascii"))
    mac.update(signed)
    return mac.digest()


# ---- entries ----------------------------------------------------------------------------

def _entry_name(key: str) -> str:
    if not (isinstance(key, str) and _DISK_KEY.fullmatch(key)):
        raise ValueError(f"key: expected a disk key of 64 hex digits (from disk_key), got {key!r}")
    return key + _SUFFIX


def _decode(secret: bytes, key: str, data: bytes) -> tuple[dict, bytes]:
    """(header, body) of an entry's bytes; _Refused("corrupt (...)") otherwise."""
    if len(data) < _HEADER_START or not data.startswith(_MAGIC):
        if data[:len(_MAGIC)] in _OLD_MAGICS:
            raise _Refused(f"in the older, unauthenticated {data[:len(_MAGIC)].decode()} format")
        raise _Refused("corrupt (not a kernel cache entry)")
    view = memoryview(data)
    tag = view[len(_MAGIC):len(_MAGIC) + _TAG_SIZE]
    if not hmac.compare_digest(tag, _tag(secret, key, view[len(_MAGIC) + _TAG_SIZE:])):
        raise _Refused("corrupt, truncated or not written by your cache (its authentication "
                       "tag does not verify)")
    # Authentic from here: what follows guards against our own bugs, not an attacker.
    (header_size,) = _LENGTH.unpack_from(data, len(_MAGIC) + _TAG_SIZE)
    if header_size > len(data) - _HEADER_START:
        raise _Refused("corrupt (its header runs past the end)")
    try:
        header = json.loads(data[_HEADER_START:_HEADER_START + header_size])
    except (ValueError, RecursionError) as error:
        raise _Refused(f"corrupt (its header is not JSON: {error})") from None
    if not isinstance(header, dict):
        raise _Refused(f"corrupt (its header is a JSON {type(header).__name__}, not an object)")
    body = data[_HEADER_START + header_size:]
    body_size = header.get("body_size")
    if type(body_size) is not int or body_size != len(body):
        raise _Refused(f"corrupt (body of {len(body)} bytes, header says {body_size!r})")
    return header, body


def read_entry(key: str) -> tuple[dict, bytes] | None:
    """(header, body) of the entry this user's cache wrote for `key`, else None.

    None silently when the entry is missing or the disk cache disabled; None with a
    CacheWarning when the entry cannot be trusted or used (the caller recompiles, and its
    write_entry replaces the file). Nothing found on disk makes it raise or block. A hit
    marks the entry recently used. `header` is a dict whose integrity is authenticated;
    checking its values against the call is the caller's job.

    >>> read_entry(disk_key("never written")) is None                     # doctest: +SKIP
    True
    """
    name = _entry_name(key)
    directory = _open_directory(create=False)
    if directory is None:
        return None
    with directory:
        path = directory.path / name
        fd = None
        try:
            fd, status = _open_own_file(directory.fd, name, MAX_ENTRY_BYTES)
            data = _read_exactly(fd, status.st_size)
            secret = _secret(directory)
            if secret is None:
                return None
            header, body = _decode(secret, key, data)
            try:
                os.utime(fd)  # recently used: the disk bound removes the oldest first
            except OSError:
                pass
            return header, body
        except FileNotFoundError:
            return None
        except _Refused as refused:
            _warn(f"kernel cache entry {path} is {refused}; recompiling and replacing it")
            return None
        except OSError as error:
            _warn(f"kernel cache entry {path} is unreadable ({error}); recompiling and replacing it")
            return None
        finally:
            if fd is not None:
                os.close(fd)


def write_entry(key: str, header: dict, body: bytes) -> None:
    """Store `body` with `header` (a JSON object) under `key`: signed, atomically (a new file
    renamed over the path: concurrent writers leave one valid entry), then keep the disk
    cache within max_disk_bytes(). A directory that cannot be used only warns.

    >>> write_entry(disk_key("demo"), {"module": "transform_o4_i4"}, cubin)  # doctest: +SKIP
    """
    name = _entry_name(key)
    encoded = json.dumps(dict(header, body_size=len(body)), sort_keys=True).encode()
    signed = _LENGTH.pack(len(encoded)) + encoded + bytes(body)
    if len(_MAGIC) + _TAG_SIZE + len(signed) > MAX_ENTRY_BYTES:
        _warn(f"kernel of {len(body)} bytes is over the cache's MAX_ENTRY_BYTES "
              f"({MAX_ENTRY_BYTES}); it works but is not cached on disk")
        return
    directory = _open_directory(create=True)
    if directory is None:
        return
    with directory:
        try:
            secret = _secret(directory)
            if secret is None:
                return
            _replace(directory.fd, name, _MAGIC + _tag(secret, key, signed) + signed)
        except OSError as error:
            _warn_once(directory.path, ("not writable", error.errno),
                       f"kernel cache directory {directory.path} is not writable ({error}); "
                       f"the kernel works but is not cached on disk")
            return
        _enforce_bound(directory.fd, keep=name)


def _replace(directory_fd: int, name: str, data: bytes) -> None:
    """Write `data` to a new private file and rename it over `name`: this replaces whatever
    `name` is (a symbolic link or FIFO included), never what it points to."""
    temporary = f".{name[:16]}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temporary, CREATE_FLAGS, 0o600, dir_fd=directory_fd)
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(temporary, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
    except BaseException:  # KeyboardInterrupt included: leave no temporary behind
        _unlink_quietly(directory_fd, temporary)
        raise


# ---- the disk bound and inspection ------------------------------------------------------

def max_disk_bytes() -> int:
    """The most bytes disk entries may hold: `$CUDA_SHARDED_JIT_CACHE_MAX_BYTES` (bytes, or
    with a K, M or G suffix: "512M"), else DEFAULT_MAX_DISK_BYTES (1 GiB).

    >>> os.environ["CUDA_SHARDED_JIT_CACHE_MAX_BYTES"] = "512M"; max_disk_bytes()  # doctest: +SKIP
    536870912
    """
    text = os.environ.get(ENV_MAX_BYTES, "").strip()
    if not text:
        return DEFAULT_MAX_DISK_BYTES
    match = _BYTE_COUNT.fullmatch(text.upper())
    if match is None:
        _warn_once(ENV_MAX_BYTES, text,
                   f"{ENV_MAX_BYTES}={text!r} is not a number of bytes (like 1073741824 or 512M); "
                   f"using the default, {DEFAULT_MAX_DISK_BYTES} bytes")
        return DEFAULT_MAX_DISK_BYTES
    return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2)]


def _scan(directory_fd: int) -> list[tuple[int, str, int]]:
    """(mtime_ns, name, size) of every regular file named like an entry; removes stale
    temporaries on the way."""
    entries, now = [], time.time()
    with os.scandir(directory_fd) as listing:
        for item in listing:
            try:
                status = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(status.st_mode):
                continue
            if _ENTRY_NAME.fullmatch(item.name):
                entries.append((status.st_mtime_ns, item.name, status.st_size))
            elif (_TEMPORARY_NAME.fullmatch(item.name)
                  and now - status.st_mtime > STALE_TEMPORARY_SECONDS):
                _unlink_quietly(directory_fd, item.name)
    return entries


def _enforce_bound(directory_fd: int, keep: str) -> None:
    """Remove least recently used entries (oldest mtime; a hit refreshes it) until the total
    is within max_disk_bytes(), never `keep`, the entry just written. Best effort: another
    process may be doing the same."""
    limit = max_disk_bytes()
    try:
        entries = _scan(directory_fd)
    except OSError:
        return
    total = sum(size for _, _, size in entries)
    for _, name, size in sorted(entries):
        if total <= limit:
            break
        if name != keep and _unlink_quietly(directory_fd, name):
            total -= size


def disk_usage() -> tuple[int, int]:
    """(entries, bytes) of the disk cache: regular files named like entries (not checked
    further); (0, 0) when disabled, missing or not usable.

    >>> disk_usage()                                                      # doctest: +SKIP
    (12, 3481600)
    """
    directory = _open_directory(create=False)
    if directory is None:
        return 0, 0
    with directory:
        try:
            entries = _scan(directory.fd)
        except OSError:
            return 0, 0
    return len(entries), sum(size for _, _, size in entries)


def disk_entries() -> list[Path]:
    """Paths of the disk cache's entries (as disk_usage counts them), sorted.

    >>> [path.name for path in disk_entries()][:1]                        # doctest: +SKIP
    ['0f3a...e1.kernel']
    """
    directory = _open_directory(create=False)
    if directory is None:
        return []
    with directory:
        try:
            entries = _scan(directory.fd)
        except OSError:
            return []
    return sorted(directory.path / name for _, name, _ in entries)


def clear_disk() -> int:
    """Delete every entry and temporary of the disk cache (not its secret key); returns how
    many entries were removed.

    >>> clear_disk()                                                      # doctest: +SKIP
    12
    """
    directory = _open_directory(create=False)
    if directory is None:
        return 0
    removed = 0
    with directory:
        try:
            names = os.listdir(directory.fd)
        except OSError:
            return 0
        for name in names:
            if _ENTRY_NAME.fullmatch(name):
                removed += _unlink_quietly(directory.fd, name)
            elif _TEMPORARY_NAME.fullmatch(name):
                _unlink_quietly(directory.fd, name)
    return removed
