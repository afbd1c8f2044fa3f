"""`CUDA_SHARDED_JIT_DUMP=<dir>`: each newly linked operator's LTO-IR and cubin, written as
files a user inspects. New files only, never through a link, and a failure only warns: a
debugging aid must never fail a compile or overwrite something it did not write.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from ._files import (CREATE_FLAGS, DIRECTORY_FLAGS, _make_directory, _open_own_file, _read_exactly, _Refused,
                     _unlink_quietly, _warn, _write_all)


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
        fd = os.open(directory, DIRECTORY_FLAGS | os.O_NOFOLLOW)
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
                out = os.open(safe, CREATE_FLAGS, 0o600, dir_fd=fd)
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
