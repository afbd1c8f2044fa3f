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
    """A capture in progress on one thread: the group it records, once a call names one, and
    every array and DeviceScalar its calls named (the graph reads and writes their memory,
    so the captured function keeps them alive)."""

    def __init__(self):
        self.group = None
        self.kept = []

    def see(self, args, kwargs) -> None:
        """A public call's arguments: the first that belongs to a group starts the capture;
        a call on another group is refused."""
        from .array import ShardedArray
        from .places import PlaceGroup
        from .scalar import DeviceScalar

        for value in (*args, *kwargs.values()):
            if isinstance(value, ShardedArray):
                group = value._group
            elif isinstance(value, DeviceScalar):
                group = value.group
            elif isinstance(value, PlaceGroup):
                group = value
            else:
                continue
            if self.group is None:
                if group._distributed:
                    raise ValueError("capture: the calls of a PlaceGroup.from_mpi group are collectives over "
                                     "MPI, which a CUDA graph cannot hold; capture on a group of one process")
                _shim.capture_begin(group._impl)
                self.group = group
            elif group is not self.group:
                raise ValueError("capture: fn calls on a second PlaceGroup; a capture records the calls of one")
            if not isinstance(value, PlaceGroup):
                self.kept.append(value)

    def allocating(self) -> None:
        raise ValueError("capture: fn makes a new array (a call without out=, or a constructor); a "
                         "captured function writes into arrays made before the capture")


class Captured:
    """A recorded function: calling it replays the graph (queued, nothing waited for). It
    keeps the arrays, DeviceScalars and kernels the graph uses alive; freeing one of those
    arrays explicitly (`a.free()`) while it lives is an error the graph cannot see."""

    def __init__(self, graph, group, name: str, kept: list):
        self._graph = graph
        self._group = group
        self._name = name
        self._kept = kept

    def __call__(self) -> None:
        if _collective.capture_session() is not None:
            raise ValueError("capture: a captured function replayed inside another capture; call it "
                             "after the capture ends, or call its function instead")
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
    thread = threading.get_ident()
    if thread in _collective.capturing:
        raise ValueError("capture: this thread is already capturing (captures do not nest)")
    session = _Session()
    _collective.capturing[thread] = session
    try:
        fn()
    except BaseException as error:
        del _collective.capturing[thread]
        if session.group is not None:
            _shim.capture_abandon(session.group._impl)
        message = str(error)
        if isinstance(error, RuntimeError) and not message.startswith("capture:") and "captur" in message.lower():
            raise RuntimeError(f"capture: a call in fn cannot be captured ({message}); a captured function may "
                               f"not wait on the host: reduce into a DeviceScalar (out=) and read values "
                               f"after a replay") from error
        raise
    del _collective.capturing[thread]
    if session.group is None:
        raise ValueError("capture: fn made no call of the library on a PlaceGroup, so there is nothing "
                         "to record")
    from .compiler import _loaded_libraries

    graph = _shim.capture_end(session.group._impl)
    return Captured(graph, session.group, getattr(fn, "__name__", "function"),
                    session.kept + _loaded_libraries())


__all__ = ["capture", "Captured"]
