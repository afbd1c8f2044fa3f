"""The collective contract of from_mpi groups, and the agreement that keeps an error one rank
hits alone from hanging the others.

The contract: every call on the arrays of a from_mpi group (transform, reduce, the scans,
from_numpy, to_numpy, ...) is a collective. Every rank of the group makes it, in the same
order, with arrays of the same shard sizes; its result (a host value: a reduction, a count,
a histogram) is returned on every rank.

Each collective agrees at least twice: before anything moves between the ranks (or runs,
where nothing moves), and at its end. An agreement is one allreduce (MAX) of three int64 per
rank: `size - rank` when this rank failed (else 0), and a 61-bit hash of the call's signature
(name, shard sizes, dtype, ...) with its negation, whose maximum and minimum agree only when
every rank made the same call. Then, only when needed, the lowest failing rank broadcasts its
exception (class and arguments; every rank raises it, with the same text), or the signatures
are allgathered for a ValueError that names the first rank that differs.

A rank that fails between agreements meets its peers at their next one: it agrees on its
error and raises; they see it there and raise it too, and nobody agrees again in that call.
Every collective ends with an agreement, so there always is a next one. An error while data
moves between ranks cannot wait for that (a peer may be inside MPI, waiting for this rank's
data): the communicator is aborted (MPI_Abort) with the error on stderr, and the job ends
rather than hangs.

MPI has no timeouts: a rank that never makes the call at all (it left a loop early, or died
outside a collective) leaves the others waiting. Bound jobs with the scheduler's time limit,
or `timeout` around mpiexec, as the tests do.
"""

from __future__ import annotations

import hashlib
import pickle
import sys
import threading
import traceback
from contextlib import contextmanager

import numpy as np

from ._mpi import mpi

_AGREED = "_csj_agreed"  # set on an exception every rank raises: no further agreement for it


def signature_code(signature) -> int:
    """A 61-bit hash of `signature`'s repr, the same in every process (Python's own hash of a
    str is salted per process)."""
    digest = hashlib.blake2b(repr(signature).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 3


def portable_error(error: BaseException) -> tuple:
    """(class, args) that rebuild `error` with the same text in another process of the same
    program: its own, or its text alone, else a RuntimeError that names its class."""
    cls = type(error)
    text = str(error)
    for candidate in ((cls, tuple(error.args)), (cls, (text,))):
        try:
            pickle.dumps(candidate)
            if str(candidate[0](*candidate[1])) == text:
                return candidate
        except Exception:  # noqa: BLE001 - any failure means: try the next form
            continue
    return RuntimeError, (f"{cls.__module__}.{cls.__qualname__}: {text}",)


def rebuild_error(portable: tuple) -> BaseException:
    cls, args = portable
    try:
        return cls(*args)
    except Exception:  # noqa: BLE001
        return RuntimeError(*args)


def _note(error: BaseException, failing: int, size: int) -> None:
    if hasattr(error, "add_note") and not getattr(error, _AGREED, False):
        error.add_note(f"cuda_sharded_jit: raised on rank {failing} of {size}; every rank of the "
                       f"group raises it")


def _mark(error: BaseException) -> BaseException:
    try:
        setattr(error, _AGREED, True)
    except (AttributeError, TypeError):
        pass
    return error


def is_agreed(error: BaseException) -> bool:
    """Whether every rank raises `error` (it came out of an agreement)."""
    return getattr(error, _AGREED, False)


def _fields(signature) -> dict:
    return {label: value for label, value in signature[1:]} if signature else {}


def mismatch_message(signatures: list) -> str:
    """What differs between rank 0's call and the first rank whose call differs."""
    first = signatures[0]
    rank = next(rank for rank, signature in enumerate(signatures) if signature != first)
    other = signatures[rank]
    contract = ("every rank must make the same collective calls, in the same order, on arrays "
                "of the same shard sizes")
    if not first or not other or first[0] != other[0]:
        at = lambda signature: signature[0] if signature else "no collective"  # noqa: E731
        return f"collective: rank {rank} is at {at(other)} where rank 0 is at {at(first)}: {contract}"
    mine, theirs = _fields(first), _fields(other)
    labels = [label for label in dict.fromkeys([*mine, *theirs]) if mine.get(label) != theirs.get(label)]
    differences = "; ".join(f"{label} {theirs.get(label)!r} on rank {rank}, {mine.get(label)!r} on rank 0"
                            for label in labels)
    return f"{first[0]}: called with {differences}: {contract}"


def agree(comm, local_error: BaseException | None = None, signature=None) -> None:
    """Every rank of `comm` calls this at the same point. Returns when no rank failed and all
    made the same call (`signature`: a tuple (name, (label, value), ...)); otherwise raises
    on every rank: the lowest failing rank's exception (the same class and text), or a
    ValueError naming how the first differing rank's call differs from rank 0's.

    >>> agree(MPI.COMM_WORLD, None, ("reduce", ("shard sizes", (5, 5))))   # doctest: +SKIP
    """
    MPI = mpi()
    size, rank = comm.Get_size(), comm.Get_rank()
    code = signature_code(signature)
    status = np.array([size - rank if local_error is not None else 0, code, -code], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, status, op=MPI.MAX)
    if status[0] > 0:
        failing = size - int(status[0])
        portable = comm.bcast(portable_error(local_error) if rank == failing else None, root=failing)
        error = local_error if rank == failing else rebuild_error(portable)
        _note(error, failing, size)
        raise _mark(error)
    if status[1] != -status[2]:
        signatures = comm.allgather(signature)
        raise _mark(ValueError(mismatch_message(signatures)))


# ---- collectives: the calls that run under the contract -------------------------------------

_state = threading.local()


class _Call:
    """One running collective of this thread; `moving` while data moves between ranks."""

    __slots__ = ("moving",)

    def __init__(self):
        self.moving = False


def _calls() -> list:
    calls = getattr(_state, "calls", None)
    if calls is None:
        calls = _state.calls = []
    return calls


def abort(comm, name: str, error: BaseException) -> None:
    """Writes `error` to stderr and aborts `comm` (MPI_Abort): the job ends, no rank hangs."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    sys.stderr.write(f"cuda_sharded_jit: rank {comm.Get_rank()} of {comm.Get_size()}: {name} failed while "
                     f"data moved between the ranks, where the others may be waiting for it; aborting "
                     f"the communicator (MPI_Abort) rather than leaving them waiting.\n{text}")
    sys.stderr.flush()
    comm.Abort(1)


def run(group, name: str, function, args=(), kwargs=None):
    """function(*args, **kwargs) as a collective of `group` (its `comm` and `_lock`): an error
    before data moves is agreed on, one while it moves aborts, and the call ends with an
    agreement. This process's collectives on one group run one at a time (the lock)."""
    comm = group.comm
    call = _Call()
    calls = _calls()
    with group._lock:
        calls.append(call)
        try:
            result = function(*args, **(kwargs or {}))
            agree(comm, None, (f"the end of {name}",))
            return result
        except BaseException as error:
            if is_agreed(error) or isinstance(error, (SystemExit, GeneratorExit)):
                raise
            if call.moving:
                abort(comm, name, error)
            agree(comm, error, (f"the end of {name}",))
            raise  # agree raised already; kept for readers
        finally:
            calls.pop()


@contextmanager
def moving(group):
    """Marks the running collective as moving data between ranks: an error inside aborts the
    communicator (the peers may be waiting inside MPI); the mark stays on an error."""
    calls = _calls()
    call = calls[-1] if calls else None
    if call is None:
        yield
        return
    previous = call.moving
    call.moving = True
    yield
    call.moving = previous


def begin(group, signature) -> None:
    """The agreement before a collective's data moves (or its kernels run)."""
    agree(group.comm, None, tuple(signature))


def gather(group, value, signature) -> list:
    """Agrees (`signature`), then allgathers `value`: every rank's, in rank order."""
    begin(group, signature)
    with moving(group):
        return group.comm.allgather(value)
