"""Files the kernel cache and the debug dump touch, opened by descriptor and checked before use.

A cache entry is code the process will run and a dump a file a user will read, so neither
follows a symbolic link, blocks on a FIFO, reads a file it does not own or one larger than a
cap, or writes over a file it did not create. The checks are made on the open descriptor
(fstat), not on a path that could change between check and use. Warnings about what could
not be used go through here, attributed to the caller outside the package.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
import warnings
from pathlib import Path

DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO opens at once
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class CacheWarning(UserWarning):
    """A disk cache entry or directory could not be used; the kernel was recompiled.

    >>> warnings.simplefilter("error", sharded.CacheWarning)   # make it loud in CI  # doctest: +SKIP
    """


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
        fd = os.open(name, READ_FLAGS, dir_fd=directory_fd)
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
