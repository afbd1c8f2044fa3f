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
"""

from __future__ import annotations

import errno
import hashlib
import heapq
import hmac
import json
import os
import re
import secrets
import stat
import struct
import sys
import threading
import time
import warnings
from pathlib import Path

ENV_CACHE_DIR = "CUDA_SHARDED_JIT_CACHE_DIR"
ENV_DISABLE = "CUDA_SHARDED_JIT_DISABLE_CACHE"
ENV_MAX_BYTES = "CUDA_SHARDED_JIT_CACHE_MAX_BYTES"
ENV_MEMORY_ENTRIES = "CUDA_SHARDED_JIT_MEMORY_CACHE_ENTRIES"

# A cubin with its LTO-IR is well under 1 MiB; the cap is checked (fstat) before reading, so
# a link to a huge or sparse file costs nothing.
MAX_ENTRY_BYTES = 64 << 20
DEFAULT_MAX_DISK_BYTES = 1 << 30
DEFAULT_MEMORY_ENTRIES = 1024
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

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO opens at once
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


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
    """The disk key (64 hex digits, an entry's file name) of a full cache key's text.

    >>> len(disk_key("('transform', ...)"))
    64
    """
    return hashlib.sha256(material.encode()).hexdigest()


# ---- warnings ---------------------------------------------------------------------------

_warned: set = set()
_warned_lock = threading.Lock()


def _warn(message: str) -> None:
    """A CacheWarning attributed to the first caller outside this package."""
    level, frame = 1, sys._getframe(0)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, CacheWarning, stacklevel=level)


def _warn_once(subject, reason, message: str) -> None:
    """Warn about a directory (or a setting) once per process per reason, not on every miss."""
    with _warned_lock:
        if (str(subject), reason) in _warned:
            return
        _warned.add((str(subject), reason))
    _warn(message)


# ---- files: opened by descriptor, checked before use -------------------------------------

class _Refused(Exception):
    """A file that exists but must not be used; the text says why ("a symbolic link")."""

    def __init__(self, reason: str, status: os.stat_result | None = None):
        super().__init__(reason)
        self.status = status


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return f"file type {stat.S_IFMT(mode):o}"


def _open_own_file(directory_fd: int, name: str, max_size: int) -> tuple[int, os.stat_result]:
    """(descriptor, status) of `name`: this user's regular file of at most `max_size` bytes.

    FileNotFoundError when missing, _Refused when it is anything else, OSError when unreadable.
    """
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=directory_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise _Refused("a symbolic link") from None
        if error.errno != errno.ENOENT:  # a socket (ENXIO), say: name what it is
            _refuse_if_special(directory_fd, name)
        raise
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise _Refused(f"not a regular file ({_kind(status.st_mode)})", status)
        if status.st_uid != os.geteuid():
            raise _Refused(f"not owned by you (owner uid {status.st_uid})", status)
        if status.st_size > max_size:
            raise _Refused(f"too large ({status.st_size} bytes; the limit is {max_size})", status)
    except BaseException:
        os.close(fd)
        raise
    return fd, status


def _refuse_if_special(directory_fd: int, name: str) -> None:
    try:
        status = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except OSError:
        return
    if not stat.S_ISREG(status.st_mode):
        raise _Refused(f"not a regular file ({_kind(status.st_mode)})", status) from None


def _read_exactly(fd: int, size: int) -> bytes:
    """`size` bytes, or fewer when the file shrank meanwhile (then its tag fails)."""
    chunks, remaining = [], size
    while remaining > 0:
        chunk = os.read(fd, remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _unlink_quietly(directory_fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=directory_fd)
        return True
    except OSError:
        return False


def _make_directory(path: Path) -> bool:
    """Create `path` (parents with default modes) unless it exists; whether it was created."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return False
    except FileNotFoundError:
        os.makedirs(path.parent, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            return False
    return True


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
        fd = os.open(path, _DIRECTORY_FLAGS)
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
    fd = os.open(temporary, _CREATE_FLAGS, 0o600, dir_fd=directory.fd)
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
    fd = os.open(temporary, _CREATE_FLAGS, 0o600, dir_fd=directory_fd)
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


# ---- debug dumps (CUDA_SHARDED_JIT_DUMP) ------------------------------------------------

def _dump_name(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return safe if safe.strip(".") else safe.replace(".", "_") or "_"  # never "", "." or ".."


def _same_content(directory_fd: int, name: str, data: bytes) -> bool:
    try:
        fd, status = _open_own_file(directory_fd, name, len(data))
    except (OSError, _Refused):
        return False
    try:
        return status.st_size == len(data) and _read_exactly(fd, len(data)) == data
    except OSError:
        return False
    finally:
        os.close(fd)


def _write_dump(directory: Path, files) -> list[str]:
    """The names left alone because something else is already there."""
    created = _make_directory(directory)
    try:
        fd = os.open(directory, _DIRECTORY_FLAGS | os.O_NOFOLLOW)
    except OSError as error:  # a symbolic link: ELOOP, or ENOTDIR (O_DIRECTORY tested first)
        if error.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(directory):
            raise _Refused("a symbolic link: not followed, nothing written") from None
        raise
    kept = []
    try:
        if created:
            os.fchmod(fd, 0o700)  # mkdir's mode went through the umask
        for name, data in files:
            safe = _dump_name(name)
            try:
                out = os.open(safe, _CREATE_FLAGS, 0o600, dir_fd=fd)
            except FileExistsError:  # ours from an earlier build, or not ours to overwrite
                if not _same_content(fd, safe, data):
                    kept.append(safe)
                continue
            try:
                _write_all(out, data)
            except BaseException:
                os.close(out)
                _unlink_quietly(fd, safe)
                raise
            os.close(out)
    finally:
        os.close(fd)
    return kept


def write_dump(directory: str, files: list[tuple[str, bytes]]) -> None:
    """Write debug files (`CUDA_SHARDED_JIT_DUMP`) into `directory`; never raises.

    The directory is created 0700 if missing and must not be a symbolic link; names are
    reduced to [A-Za-z0-9._-]; each file is created new (0600), never through a link. A name
    already there is left alone: silently when it is this user's file with these bytes.
    Anything else becomes one CacheWarning; the kernel itself is unaffected.

    >>> write_dump("/tmp/dump", [("add.transform_o4_i4.sm_90.cubin", cubin)])  # doctest: +SKIP
    """
    try:
        kept = _write_dump(Path(directory), files)
    except _Refused as refused:
        _warn(f"debug dump directory {directory} is {refused}; the kernel itself is fine")
        return
    except Exception as error:  # a debugging aid must never fail a compile
        _warn(f"debug dump to {directory} failed ({error}); the kernel itself is fine")
        return
    if kept:
        _warn(f"debug dump to {directory}: {', '.join(kept)} already there with other contents "
              f"(or not your regular file), not overwritten; the kernel itself is fine")


# ---- memory -----------------------------------------------------------------------------

def _default_memory_entries() -> int:
    text = os.environ.get(ENV_MEMORY_ENTRIES, "").strip()
    if not text:
        return DEFAULT_MEMORY_ENTRIES
    if text.isdigit() and int(text) > 0:
        return int(text)
    _warn_once(ENV_MEMORY_ENTRIES, text,
               f"{ENV_MEMORY_ENTRIES}={text!r} is not a positive number of entries; "
               f"using the default, {DEFAULT_MEMORY_ENTRIES}")
    return DEFAULT_MEMORY_ENTRIES


class MemoryCache:
    """A bounded map whose misses are built once even when many threads miss at the same time.

    Holds at most `max_entries` values (default `$CUDA_SHARDED_JIT_MEMORY_CACHE_ENTRIES`, else
    DEFAULT_MEMORY_ENTRIES), dropping the least recently used. A build that raises (a type
    error, KeyboardInterrupt) stores nothing: the next call builds again.

    >>> cache = MemoryCache(max_entries=2)
    >>> cache.get_or_build("a", lambda: 1), cache.get_or_build_reporting("a", lambda: 2)
    (1, (1, False))
    """

    def __init__(self, max_entries: int | None = None):
        if max_entries is None:
            max_entries = _default_memory_entries()
        elif isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries: expected a positive int, got {max_entries!r}")
        self.max_entries = max_entries
        # key -> [value, last use]. A hit takes no lock: a dict lookup and a store into the
        # entry's own list. Only a miss (under _lock) adds or removes keys, so the dict never
        # changes size under a reader; two racing hits may lose a clock tick, which only
        # blurs which entry counts as oldest.
        self._entries: dict = {}
        self._clock = 0
        self._lock = threading.Lock()  # inserts, evictions and the per-key build locks
        self._building: dict = {}

    def get(self, key):
        """The value for `key` (now the most recently used), or None."""
        slot = self._entries.get(key)
        if slot is None:
            return None
        self._clock += 1
        slot[1] = self._clock
        return slot[0]

    def get_or_build(self, key, build):
        """The value for `key`, from `build()` on a miss: called once however many threads miss."""
        return self.get_or_build_reporting(key, build)[0]

    def get_or_build_reporting(self, key, build) -> tuple[object, bool]:
        """(value, built_here): built_here is True only in the thread whose `build()` made it
        (a thread that waited for another's build, or found it cached, gets False)."""
        value = self.get(key)
        if value is not None:
            return value, False
        with self._lock:
            key_lock = self._building.setdefault(key, threading.Lock())
        with key_lock:  # a KeyboardInterrupt while waiting here leaves the builder's lock be
            try:
                value = self.get(key)
                if value is not None:
                    return value, False
                value = build()
                self._store(key, value)
                return value, True
            finally:
                with self._lock:
                    if self._building.get(key) is key_lock:
                        del self._building[key]

    def _store(self, key, value) -> None:
        with self._lock:
            self._clock += 1
            slot = [value, self._clock]
            self._entries[key] = slot
            excess = len(self._entries) - self.max_entries
            if excess > 0:
                others = (item for item in self._entries.items() if item[1] is not slot)
                for old_key, _ in heapq.nsmallest(excess, others, key=lambda item: item[1][1]):
                    del self._entries[old_key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
