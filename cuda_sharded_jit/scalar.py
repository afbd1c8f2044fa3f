"""DeviceScalar: one number that lives on the GPUs of a group, a copy on every place.

Reductions write it (`sharded.reduce(a, op, init, out=s)`) without a host round trip, so a
loop of reductions and elementwise steps (one conjugate-gradient iteration: dots, a ratio,
axpys) can stay on the device and be captured into a CUDA graph. Reading `s.value` (or
`float(s)`) waits for the work queued on place 0 and copies the number back.

Its storage is a ShardedArray of one element per place: place p's kernels read place p's
copy, and a reduction into it writes every copy, each on its own place's stream.
"""

from __future__ import annotations

import numpy as np

from . import _collective
from ._dtypes import as_dtype, exact_cast
from .array import ShardedArray
from .places import PlaceGroup


class DeviceScalar:
    """A number of `dtype` held on every place of `group`, starting at `value`.

    >>> s = sharded.DeviceScalar(g, np.float64)                          # doctest: +SKIP
    >>> sharded.reduce(a, lambda x, y: x + y, 0.0, out=s)                # doctest: +SKIP
    >>> float(s)                                                         # doctest: +SKIP
    """

    def __init__(self, group: PlaceGroup, dtype, value=0):
        if not isinstance(group, PlaceGroup):
            raise TypeError(f"group: expected a PlaceGroup, got {type(group).__name__}")
        if group._distributed:
            raise ValueError("group: a DeviceScalar on a PlaceGroup.from_mpi group is not supported; "
                             "use a group of one process (PlaceGroup.by_devices)")
        if isinstance(dtype, np.dtype) and dtype.names is not None:
            raise TypeError(f"dtype: a DeviceScalar holds one number, not a record ({dtype})")
        dtype = as_dtype(dtype)
        host = np.full(len(group), exact_cast(value, dtype, "value"), dtype=dtype)
        self._array = ShardedArray.allocate(group, [1] * len(group), dtype)
        self._array._impl.copy_from_host(host.ctypes.data, host.nbytes)

    @property
    def group(self) -> PlaceGroup:
        """The group whose every place holds a copy."""
        return self._array.group

    @property
    def dtype(self) -> np.dtype:
        """The number's dtype (one of the supported numeric dtypes)."""
        return self._array.dtype

    @property
    def _impl(self):
        """The shim array of the copies (one element per place), for the algorithms."""
        return self._array._impl

    @property
    def value(self):
        """The number, as a numpy scalar: place 0's copy, after the work queued there."""
        _collective.refuse_host_wait("reading a DeviceScalar's value")
        host = np.empty(1, self.dtype)
        self._array._impl.copy_range_to_host(0, 1, host.ctypes.data, host.nbytes)
        return host[0]

    def __float__(self) -> float:
        return float(self.value)

    def __int__(self) -> int:
        return int(self.value)

    def __repr__(self) -> str:
        if self._array._impl.is_freed:
            return f"DeviceScalar({self.dtype}, freed)"
        return f"DeviceScalar({self.value!r}, on {len(self.group)} place(s))"


__all__ = ["DeviceScalar"]
