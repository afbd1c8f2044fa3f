"""Which public calls are collectives on a multi-process group (PlaceGroup.from_mpi), and the
one test that sends them there.

On a one-process group every call passes straight through: until a from_mpi array exists
the decorator tests one module variable, after that the type of each argument. When an
argument is an array of a from_mpi group, the call runs as a collective
(distributed/_agreement.py): every rank of the group must make it, in the same order, and an
error that one rank hits alone is raised on every rank, the same exception with the same
text, never a hang.

Nothing here imports mpi4py: the package imports, and runs on one process, without it.
"""

from __future__ import annotations

import functools
import threading

# The array class of from_mpi groups, once distributed/_arrays.py is imported (by the first
# from_mpi group's array): until then every call takes the one-process path at the cost of
# one test, and after it, one type test an argument (an attribute lookup that fails, on an
# operator or a scalar, would cost a caught exception).
_array_type = None

# The captures in progress (_capture.py's sessions) by thread: every public call of a thread
# that captures shows its session its arguments first, so that the capture starts on the group
# of the first call it records. Empty (one test a call) while nothing is captured.
capturing: dict = {}


def capture_session():
    """This thread's capture in progress, or None."""
    return capturing.get(threading.get_ident()) if capturing else None


def refuse_host_wait(what: str) -> None:
    """ValueError while this thread captures: `what` would wait on the host."""
    if capturing and threading.get_ident() in capturing:
        raise ValueError(f"capture: {what} waits on the host, which a captured function may not do; read "
                         f"values after a replay (reduce into a DeviceScalar inside the capture)")


def register_array_type(cls) -> None:
    """Called once by distributed/_arrays.py with its DistributedArray."""
    global _array_type
    _array_type = cls


def _distributed_group(args, kwargs):
    """The group of the first argument that is a from_mpi array, else None."""
    for value in args:
        if type(value) is _array_type:
            return value._group
    for value in kwargs.values():
        if type(value) is _array_type:
            return value._group
    return None


def collective(name: str):
    """Marks a public call as a collective of from_mpi groups: given an array of one, the call
    runs as a collective (distributed/_agreement.run)."""

    def wrap(function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            if capturing:
                session = capture_session()
                if session is not None:
                    session.see(args, kwargs)
            group = None if _array_type is None else _distributed_group(args, kwargs)
            if group is None:
                return function(*args, **kwargs)
            from .distributed._agreement import run

            return run(group, name, function, args, kwargs)

        return call

    return wrap


def begin(group, *signature) -> None:
    """Before a collective's kernels run, on a from_mpi group (callers test
    `group._distributed` first, so that one process builds no signature): every rank agrees
    that its checks passed and that it makes the same call (`signature`)."""
    from .distributed._agreement import begin as agree_to_begin

    agree_to_begin(group, signature)
