"""sharded.capture(fn): a Python function made of the library's calls on one group, recorded
once into one CUDA graph over every place's stream, and a callable that replays it.

A solver iteration of a dozen small calls spends most of its time launching them; a replay
launches the whole graph at once, and computes what the calls compute, bit for bit (the same
kernels with the same arguments). The capture records and runs nothing: `fn` is called once
with every place's stream in capture, so its calls queue their kernels, copies and
cross-place waits into the graph. The capture starts on the group of the first call.

What `fn` may do: transforms, fills, scans and reductions into a DeviceScalar
(`reduce(a, op, init, out=s)`), into arrays made before the capture (pass `out=`). What it
may not: make arrays (the graph would own their memory), or wait on the host (a reduction to
a host value, `to_numpy`, `float(s)`): the capture then raises, and nothing is recorded.
Host values (scalars, shapes) are fixed at capture time; DeviceScalars are read on the
device at every replay.
"""

from __future__ import annotations

import threading

from . import _collective, _shim


class _Session:
    """A capture in progress on one thread: the group it records, once a call names one."""

    def __init__(self):
        self.thread = threading.get_ident()
        self.group = None

    def see(self, args, kwargs) -> None:
        """A public call's arguments: the first that belongs to a group starts the capture."""
        if self.group is not None or threading.get_ident() != self.thread:
            return
        group = _group_of(args, kwargs)
        if group is None:
            return
        if group._distributed:
            raise ValueError("capture: the calls of a PlaceGroup.from_mpi group are collectives over MPI, "
                             "which a CUDA graph cannot hold; capture on a group of one process")
        _shim.capture_begin(group._impl)
        self.group = group

    def allocating(self) -> None:
        if threading.get_ident() == self.thread:
            raise ValueError("capture: fn makes a new array (a call without out=, or a constructor); a "
                             "captured function writes into arrays made before the capture")


def _group_of(args, kwargs):
    from .array import ShardedArray
    from .places import PlaceGroup
    from .scalar import DeviceScalar

    for value in (*args, *kwargs.values()):
        if isinstance(value, ShardedArray):
            return value._group
        if isinstance(value, DeviceScalar):
            return value.group
        if isinstance(value, PlaceGroup):
            return value
    return None


class Captured:
    """A recorded function: calling it replays the graph (queued, nothing waited for)."""

    def __init__(self, graph, group, name: str):
        self._graph = graph
        self._group = group
        self._name = name

    def __call__(self) -> None:
        self._graph.replay()

    @property
    def group(self):
        """The group whose places the graph runs on."""
        return self._group

    def __repr__(self) -> str:
        return f"<captured {self._name}: {self._graph.nodes} graph nodes on {len(self._group)} place(s)>"


def capture(fn) -> Captured:
    """Record `fn()` (the library's calls on one group) into one CUDA graph; returns a
    callable that replays it. Nothing runs during the capture.

    >>> step = sharded.capture(lambda: sharded.transform(lambda x, a: a * x, y, s, out=y))  # doctest: +SKIP
    >>> for _ in range(100):                                                                # doctest: +SKIP
    ...     step()
    """
    if not callable(fn):
        raise TypeError(f"fn: expected a callable of no arguments, got {type(fn).__name__}")
    if _collective.capturing is not None:
        raise RuntimeError("capture: a capture is already in progress (captures do not nest)")
    session = _Session()
    _collective.capturing = session
    try:
        fn()
    except BaseException as error:
        _collective.capturing = None
        if session.group is not None:
            _shim.capture_abandon(session.group._impl)
        if isinstance(error, RuntimeError) and "captur" in str(error).lower():
            raise RuntimeError(f"capture: a call in fn cannot be captured ({error}); a captured function may "
                               f"not wait on the host: reduce into a DeviceScalar (out=) and read values "
                               f"after a replay") from error
        raise
    _collective.capturing = None
    if session.group is None:
        raise ValueError("capture: fn made no call of the library on a PlaceGroup, so there is nothing "
                         "to record")
    graph = _shim.capture_end(session.group._impl)
    return Captured(graph, session.group, getattr(fn, "__name__", "function"))


__all__ = ["capture", "Captured"]
