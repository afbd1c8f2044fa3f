"""NCCL, found and loaded at run time, so that the package imports and runs (one process, or
several over the "mpi" transport) where no NCCL is installed.

Where it comes from, in order: CUDA_SHARDED_JIT_NCCL (the path of a site's own libnccl.so.2,
which wins), the nvidia-nccl-cu13 wheel through cuda.pathfinder (it ships libnccl.so.2 and
no unversioned libnccl.so), then the system loader's libnccl.so.2. Loading fails with a
RuntimeError that says what was tried.

The prototypes of the calls used are declared here (ctypes: each call releases the GIL).
`Communicators` holds one NCCL communicator per place of this rank (an NCCL rank per global
place, so a rank with several GPUs takes part with each) and carries out the exchange's
pieces as grouped ncclSend / ncclRecv on the places' streams, under a lock: NCCL is not
thread-safe on one communicator.
"""

from __future__ import annotations

import ctypes
import os
import threading
from contextlib import contextmanager

ENV_NCCL = "CUDA_SHARDED_JIT_NCCL"
SONAME = "libnccl.so.2"

_lock = threading.Lock()
_loaded: ctypes.CDLL | None = None


_UNIQUE_ID_BYTES = 128
_UINT8 = 1  # ncclUint8


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * _UNIQUE_ID_BYTES)]


def _declare(library: ctypes.CDLL) -> None:
    """The prototypes of the NCCL calls used (every call answers an ncclResult_t)."""
    handle, status = ctypes.c_void_p, ctypes.c_int
    prototypes = {
        "ncclGetVersion": [ctypes.POINTER(ctypes.c_int)],
        "ncclGetUniqueId": [ctypes.POINTER(_UniqueId)],
        "ncclCommInitRank": [ctypes.POINTER(handle), ctypes.c_int, _UniqueId, ctypes.c_int],
        "ncclCommAbort": [handle],
        "ncclCommGetAsyncError": [handle, ctypes.POINTER(status)],
        "ncclGroupStart": [],
        "ncclGroupEnd": [],
        # (buffer, count, datatype, peer, comm, stream)
        "ncclSend": [handle, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, handle, handle],
        "ncclRecv": [handle, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, handle, handle],
    }
    for name, arguments in prototypes.items():
        function = getattr(library, name)
        function.argtypes = arguments
        function.restype = status
    library.ncclGetErrorString.argtypes = [status]
    library.ncclGetErrorString.restype = ctypes.c_char_p
    if hasattr(library, "ncclGetLastError"):  # NCCL 2.13 and later
        library.ncclGetLastError.argtypes = [handle]
        library.ncclGetLastError.restype = ctypes.c_char_p


def _check(library: ctypes.CDLL, status: int, what: str, comm=None) -> None:
    if status != 0:
        last = getattr(library, "ncclGetLastError", None)
        detail = last(comm).decode(errors="replace") if comm is not None and last is not None else ""
        raise RuntimeError(f"NCCL: {what} failed: {library.ncclGetErrorString(status).decode()}"
                           + (f" ({detail})" if detail else ""))


def _set_device(device: int) -> None:
    from cuda.bindings import runtime

    status, = runtime.cudaSetDevice(device)
    if status != runtime.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaSetDevice({device}) failed: {status}")


@contextmanager
def _current_device_kept():
    """The thread's current CUDA device as it was, after the block (NCCL's calls need each
    place's device current; the program's own current device, which CuPy or torch use, stays).
    A thread with no current context is left with the block's last (making device 0's
    context, on every rank, would cost each a context on GPU 0)."""
    from cuda.bindings import driver, runtime

    try:
        status, context = driver.cuCtxGetCurrent()
        current = status == driver.CUresult.CUDA_SUCCESS and int(context) != 0  # else nothing to put back
    except RuntimeError:  # no driver to load (cuda.pathfinder's error): no context either
        current = False
    status, previous = runtime.cudaGetDevice()
    try:
        yield
    finally:
        if current and status == runtime.cudaError_t.cudaSuccess:
            runtime.cudaSetDevice(previous)


def set_devices(devices) -> None:
    """Makes each device current once (its primary context made): what can fail on one rank
    alone before the communicators' creation, which is collective."""
    with _current_device_kept():
        for device in devices:
            _set_device(device)


class Communicators:
    """This rank's NCCL communicators, one per local place (NCCL rank = global place index),
    made collectively over the MPI communicator `comm`: rank 0 makes the unique id (a
    failure there is broadcast and raised on every rank), MPI broadcasts it, and every rank
    initialises its places' communicators in one NCCL group. A failure in that group, where
    the peers wait inside NCCL, aborts `comm` (MPI_Abort): run set_devices, and agree, first."""

    def __init__(self, comm, nplaces: int, places, devices):
        from ._agreement import abort

        self._library = load_nccl()
        library = self._library
        made = None
        if comm.Get_rank() == 0:
            identity = _UniqueId()
            try:
                _check(library, library.ncclGetUniqueId(ctypes.byref(identity)), "ncclGetUniqueId")
                made = bytes(identity)  # all 128 bytes (the field's value stops at its first NUL)
            except RuntimeError as error:
                made = str(error)
        made = comm.bcast(made, root=0)
        if isinstance(made, str):
            raise RuntimeError(f"NCCL: rank 0 could not make the communicators' id: {made}")
        identity = _UniqueId.from_buffer_copy(made)
        self._comms = [ctypes.c_void_p() for _ in places]
        self._places, self._devices, self._set_device = tuple(places), tuple(devices), _set_device
        self._lock = threading.Lock()
        try:
            with _current_device_kept():
                _check(library, library.ncclGroupStart(), "ncclGroupStart")
                for handle, place, device in zip(self._comms, places, devices):
                    _set_device(device)
                    _check(library, library.ncclCommInitRank(ctypes.byref(handle), nplaces, identity, place),
                           f"ncclCommInitRank (place {place} on cuda:{device})")
                _check(library, library.ncclGroupEnd(), "ncclGroupEnd (the communicators' creation)")
        except Exception as error:  # noqa: BLE001 - the peers wait inside NCCL's bootstrap
            abort(comm, "PlaceGroup.from_mpi (the NCCL communicators)", error)
            raise

    def exchange(self, group, source, dest, pieces) -> None:
        """Every piece this rank sends or receives (`_exchange.Piece`, global places, element
        offsets in the shards of `source` / `dest`, one-process views of this rank's shards),
        as one NCCL group of sends and receives on the places' streams; then the places'
        streams are waited for and every communicator's asynchronous error checked."""
        from ._exchange import _pointer  # the addresses the MPI path sends from and receives into

        library = self._library
        itemsize = source.dtype.itemsize
        local = {place: index for index, place in enumerate(self._places)}
        with self._lock:
            _check(library, library.ncclGroupStart(), "ncclGroupStart")
            try:
                for piece in pieces:
                    nbytes = piece.count * itemsize
                    if piece.source in local:
                        index = local[piece.source]
                        address = _pointer(source, group, piece.source, piece.source_offset)
                        _check(library, library.ncclSend(address, nbytes, _UINT8, piece.dest, self._comms[index],
                                                         group._impl.stream(index)), "ncclSend", self._comms[index])
                    if piece.dest in local:
                        index = local[piece.dest]
                        address = _pointer(dest, group, piece.dest, piece.dest_offset)
                        _check(library, library.ncclRecv(address, nbytes, _UINT8, piece.source, self._comms[index],
                                                         group._impl.stream(index)), "ncclRecv", self._comms[index])
            finally:
                _check(library, library.ncclGroupEnd(), "ncclGroupEnd (an exchange)")
            group.sync()
            for handle in self._comms:
                status = ctypes.c_int(0)
                _check(library, library.ncclCommGetAsyncError(handle, ctypes.byref(status)), "ncclCommGetAsyncError")
                _check(library, status.value, "an exchange (asynchronous error)", handle)

    def close(self) -> None:
        """Frees the communicators. Every exchange ends with its streams waited for, so
        nothing is in flight: ncclCommAbort frees them without waiting for the peers (a rank
        may drop its group, or exit, before the others), where ncclCommDestroy would."""
        with self._lock, _current_device_kept():
            comms, self._comms = self._comms, []
            for handle, device in zip(comms, self._devices):
                if handle.value:
                    self._set_device(device)
                    self._library.ncclCommAbort(handle)


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
                _declare(library)
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
