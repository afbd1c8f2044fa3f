"""Segmented reduce: one folded value per segment of a sharded array.

Segments are given by S + 1 global positions; segment s is [offsets[s], offsets[s + 1]). It
runs on the reduce's kernel modules (the same operator compile, accumulators and in-kernel
combine): each place folds the pieces of the segments its shard holds, in element order with
the reduce's association, and a segment that spans shards is finished from its pieces in
place order, so any associative operator gives the sequential answer, deterministically.
"""

from __future__ import annotations

import numpy as np

from .. import _shim
from .._collective import collective
from .._layout import layout_of
from ..array import ShardedArray, check_array
from ..compiler import kernel_libraries
from .reduce import _PYTHON_OPS, _accumulator, _init_request, _map_operator, _operator, _refuse_tuples


_INT64 = np.dtype(np.int64)


def _positions(offsets, a: ShardedArray):
    """(positions, address): offsets as the shim takes them, TypeError or ValueError naming
    it. An int64 ShardedArray on a's group stays on the device (the shim checks its
    positions there, before anything runs; address None); numpy positions come back as
    checked int64 on the host with their address (read once: .ctypes.data takes a µs), as
    do a ShardedArray's on a from_mpi group (whose route cuts pieces on the host)."""
    if isinstance(offsets, ShardedArray):
        # the slots behind .dtype and .group (no subclass overrides them): every call asks
        if offsets._dtype is not _INT64 and offsets._dtype != _INT64:
            raise TypeError(f"offsets: a ShardedArray of offsets must hold int64, not {offsets.dtype}")
        if offsets._group is not a._group:
            raise ValueError("offsets: belongs to another PlaceGroup than a")
        if offsets.size == 0:
            raise ValueError("offsets: expected S + 1 positions (at least one), got none")
        if not a._group._distributed:
            return offsets, None
        host = offsets.to_numpy(root=None)  # on every rank of a from_mpi group
    elif isinstance(offsets, np.ndarray):
        # kinds "i" and "u" are integers and not bool: numpy's subtype test only for the rest
        if offsets.dtype.kind not in "iu" and (offsets.dtype == np.bool_
                                               or not np.issubdtype(offsets.dtype, np.integer)):
            raise TypeError(f"offsets: expected integer positions, got an array of {offsets.dtype}")
        if offsets.ndim != 1:
            raise ValueError(f"offsets: expected a 1-D array of S + 1 positions, got shape {offsets.shape}")
        host = offsets
    else:
        raise TypeError(f"offsets: expected a numpy integer array or an int64 ShardedArray of "
                        f"S + 1 positions, got {type(offsets).__name__}")
    if host.size == 0:
        raise ValueError("offsets: expected S + 1 positions (at least one), got none")
    if host.dtype == np.uint64 and int(host.max()) > a.size:  # would wrap in int64
        raise ValueError(f"offsets: positions must lie in [0, len(a)] = [0, {a.size}]; "
                         f"offsets[{int(np.argmax(host > a.size))}] is {int(host[np.argmax(host > a.size)])}")
    positions = np.ascontiguousarray(host, dtype=np.int64)
    address = positions.ctypes.data
    # the one check of host positions: one pass in the shim, which the route then trusts
    _shim.check_segment_offsets(address, len(positions), a.size)
    return positions, address


@collective("segmented_reduce")
def segmented_reduce(a: ShardedArray, offsets, op, init, *, map_op=None,
                     with_index: bool = False) -> ShardedArray:
    """Fold each segment [offsets[s], offsets[s + 1]) of `a` with an associative operator, in
    element order: result[s] = init op a[offsets[s]] op ... op a[offsets[s + 1] - 1].

    `offsets`: S + 1 non-decreasing global positions in [0, len(a)], a numpy integer array or
    an int64 ShardedArray on a's group. A ShardedArray's positions stay on the device: the
    first blocks of the folds, which read them there, check them (the folds never read
    outside `a`, whatever the positions), and the call waits for the check's verdict, so
    bad positions raise ValueError instead of returning a result; numpy positions are
    checked on the host, before anything runs, and copied to the places from pinned memory.
    Segments may be empty (they give init) and may span shards. `op`:
    an operator of two accumulators, or "sum", "min", "max". The accumulator is a's dtype (or
    init's when init is a wider numpy value); with `map_op`, each element is mapped first
    (`map_op(x)`, or `map_op(x, global_index)` with `with_index`), and a map returning a tuple
    makes a tuple accumulator, as in transform_reduce: `op` then takes and returns tuples and
    init is a tuple. A record array folds its records (init a tuple). Returns a ShardedArray
    of S values split evenly over a's group (a record array for tuple accumulators).

    On a PlaceGroup.from_mpi group (a collective; `offsets` the same on every rank) each
    rank folds the segments that begin in its part; a segment that goes on into later ranks
    carries its fold there, in rank order.

    >>> sums = sharded.segmented_reduce(a, np.array([0, 3, 3, 10]), "sum", 0.0)  # doctest: +SKIP
    >>> sums.to_numpy()                          # a[0:3].sum(), 0.0, a[3:10].sum()  # doctest: +SKIP
    >>> stats = sharded.segmented_reduce(a, offsets, lambda p, q: (p[0] + q[0], p[1] + q[1]),
    ...                                  (0, 0.0), map_op=lambda x: (1, x))  # (count, sum)  # doctest: +SKIP
    """
    check_array(a)
    dtype, group = a._dtype, a._group  # a.dtype and a.group, read once
    values = layout_of(dtype)
    if map_op is None:
        if with_index:
            raise ValueError("with_index: needs a map_op (it receives each element's global index)")
        op = _operator(op, 2, "segmented_reduce", values)
    else:
        map_op = _map_operator(map_op, with_index, "segmented_reduce")
        op = _operator(op, 2, "segmented_reduce")
    if init is None:
        raise ValueError("init: segmented_reduce needs an initial value (empty segments give it)")
    if map_op is None and isinstance(init, tuple) and not values.is_record:
        raise TypeError("init: a tuple accumulator is built from each element by a map: pass "
                        "map_op= (e.g. lambda x: (1, x) for (count, sum))")
    positions, address = _positions(offsets, a)
    builtin = op if isinstance(op, str) else None
    if builtin:
        op = _PYTHON_OPS[builtin]
    if map_op is None:
        acc_dtype = _accumulator(dtype, values, init)
        acc_dtype, libraries = kernel_libraries(op, "segmented_reduce", (("array", dtype),), acc_dtype,
                                                group.archs)
    else:
        try:
            acc_dtype, libraries = kernel_libraries(op, "segmented_reduce", (("array", dtype),),
                                                    _init_request(init), group.archs,
                                                    ("call_index" if with_index else "call", map_op))
        except TypeError as error:
            if builtin and "tuple" in str(error):
                raise TypeError(f"op: {builtin!r} combines single numbers, but the map returns tuples; "
                                f"pass an operator that combines two tuples") from error
            raise
    acc = values if acc_dtype is dtype else layout_of(acc_dtype)
    _refuse_tuples(builtin, acc, "op")
    if isinstance(init, tuple) and not acc.is_record:
        raise TypeError(f"init: a tuple, but the accumulator is a single {acc_dtype}")
    packed = acc.pack_init(init)
    if group._distributed:
        from ..distributed import _algorithms

        return _algorithms.segmented_reduce(a, positions, libraries, acc_dtype, packed)
    # allocate(group, S, acc_dtype) less its checks: a one-process group, an int count and
    # the kernel's accumulator dtype
    out = ShardedArray._new_even(group, positions.size - 1, acc_dtype)
    if address is None:
        try:
            _shim.segmented_reduce_device(libraries, a._impl, positions._impl, out._impl, acc.itemsize, packed)
        except BaseException:
            out.free()  # bad positions: the folds that ran behind the check leave nothing behind
            raise
    else:
        _shim.segmented_reduce(libraries, a._impl, address, len(positions), out._impl, acc.itemsize, packed)
    return out
