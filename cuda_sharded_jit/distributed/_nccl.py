"""NCCL, found and loaded at run time, so that the package imports and runs (one process, or
several over the "mpi" transport) where no NCCL is installed.

Where it comes from, in order: CUDA_SHARDED_JIT_NCCL (the path of a site's own libnccl.so.2,
which wins), the nvidia-nccl-cu13 wheel through cuda.pathfinder (it ships libnccl.so.2 and
no unversioned libnccl.so), then the system loader's libnccl.so.2. Loading fails with a
RuntimeError that says what was tried.

This version only finds the library and reads its version (transport="auto" does not pick
NCCL yet, see docs/distributed.md). The calls that move data will declare their prototypes
here, beside ncclGetVersion's, and hold a lock per communicator: NCCL is not thread-safe on
one communicator.
"""

from __future__ import annotations

import ctypes
import os
import threading

ENV_NCCL = "CUDA_SHARDED_JIT_NCCL"
SONAME = "libnccl.so.2"

_lock = threading.Lock()
_loaded: ctypes.CDLL | None = None


def _candidates() -> list[tuple[str, object]]:
    """(where, how to load) in the order tried: the override alone when it is set."""
    override = os.environ.get(ENV_NCCL)
    if override:
        return [(f"{ENV_NCCL}={override}", lambda: ctypes.CDLL(override))]

    def from_wheel():
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return ctypes.CDLL(load_nvidia_dynamic_lib("nccl").abs_path)

    return [("the nvidia-nccl-cu13 wheel (cuda.pathfinder)", from_wheel),
            (f"the system loader ({SONAME})", lambda: ctypes.CDLL(SONAME))]


def load_nccl() -> ctypes.CDLL:
    """The loaded NCCL library (once per process); RuntimeError naming what was tried.

    >>> load_nccl().ncclGetVersion                                        # doctest: +SKIP
    """
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        tried = []
        for where, load in _candidates():
            try:
                library = load()
                library.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
                library.ncclGetVersion.restype = ctypes.c_int
            except Exception as error:  # noqa: BLE001 - OSError, a missing symbol, pathfinder's own
                tried.append(f"{where}: {error}")
                continue
            _loaded = library
            return library
        raise RuntimeError(f"NCCL: {SONAME} could not be loaded (pip install nvidia-nccl-cu13, or set "
                           f"{ENV_NCCL} to the path of the site's); tried " + "; ".join(tried))


def nccl_version() -> tuple[int, int, int]:
    """(major, minor, patch) of the NCCL that load_nccl finds.

    >>> nccl_version()                                                    # doctest: +SKIP
    (2, 28, 9)
    """
    code = ctypes.c_int(0)
    status = load_nccl().ncclGetVersion(ctypes.byref(code))
    if status != 0:
        raise RuntimeError(f"NCCL: ncclGetVersion failed with status {status}")
    value = code.value  # X * 10000 + Y * 100 + Z since 2.9 (X * 1000 + Y * 100 + Z before)
    if value >= 10000:
        return value // 10000, value // 100 % 100, value % 100
    return value // 1000, value // 100 % 10, value % 100


def nccl_loads() -> bool:
    """Whether NCCL can be loaded here (loading it, once)."""
    try:
        load_nccl()
    except RuntimeError:
        return False
    return True
