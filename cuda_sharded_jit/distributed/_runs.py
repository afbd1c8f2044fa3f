"""The algorithms over runs of equal keys on from_mpi groups (scans by key, reduce_by_key,
unique_by_key, unique), each inside its collective: every rank runs the one-process
algorithm on its own shards, and only the runs that cross ranks need more.

- unique_by_key / unique: the head flags take the halo of adjacent_difference (a rank's
  first key meets the last key of the nearest earlier rank holding any); the compaction is
  per rank, its outputs' shard sizes allgathered.
- the scans by key and reduce_by_key: each rank's local reduce_by_key gives its edges (first
  and last keys, its first and last runs' folds); they are allgathered and folded on the
  host in rank order (_plans.run_carries, with the operators' Python functions on numpy
  scalars), giving each rank the carry of the run that continues into it. A rank with a
  carry scans its part with the carry in front (one element more, host staged), so its first
  run goes on from the carry; reduce_by_key replaces a rank's first run by the whole run
  (its first key, the carry folded with it) and drops a last run that goes on in a later rank.

For integer values (and any associative op whose results do not depend on association) the
results are by_devices' bit for bit; floating-point folds may round differently where a run
crosses a rank (the carry is folded once, in front, where one process folds it chunk by
chunk), and the host evaluates the operators in numpy, whose float32 arithmetic is the
GPU's for the operators' own float32 operations.
"""

from __future__ import annotations

import numpy as np

from .._layout import layout_of
from ..array import ShardedArray
from ._agreement import gather
from ._plans import RunEdges, run_carries
from ._sorting import _to_host, local


def _value(dtype: np.dtype, host: np.ndarray, index: int):
    """Element `index` as the operators take it: a numpy scalar, or a tuple of them (records)."""
    element = host[index]
    if layout_of(dtype).is_record:
        return tuple(element[name] for name in dtype.names)
    return element


def _element(dtype: np.dtype, value) -> np.ndarray:
    """An operator's result as one element of `dtype`."""
    if layout_of(dtype).is_record:
        return np.array([tuple(value)], dtype)
    return np.array([value]).astype(dtype)


def _host_op(op, dtype):
    def fold(x, y):
        with np.errstate(all="ignore"):  # integers wrap, as on the GPU
            return _value(dtype, _element(dtype, op(x, y)), 0)
    return fold


def _local_equal(equal):
    """`equal` as the one-process calls take it: None for the default (typed once, there)."""
    from ..algorithms.by_key import _EQUAL

    return None if equal is _EQUAL else equal


def _edges(keys, values, op, equal, name: str):
    """(this rank's local reduce_by_key, this rank's RunCarry)."""
    from ..algorithms.by_key import reduce_by_key

    unique_keys, folds = reduce_by_key(local(keys), local(values), op, _local_equal(equal))
    edge = None
    if keys._impl.size:
        key_host = _to_host(local(keys))
        head_host, fold_host = _to_host(unique_keys), _to_host(folds)
        edge = RunEdges(key_host[0], key_host[-1], int(head_host.size), _value(values.dtype, fold_host, 0),
                        _value(values.dtype, fold_host, -1), head_host[-1])
    every = gather(keys.group, edge, (name, ("shard sizes", keys.shard_sizes), ("keys", keys.dtype.str),
                                      ("values", values.dtype.str)))
    carries = run_carries(every, equal, _host_op(op, values.dtype))
    return unique_keys, folds, carries[keys.group.rank]


def _local_from_host(group, host: np.ndarray, sizes) -> ShardedArray:
    array = ShardedArray.allocate(group._local, list(sizes), host.dtype)
    array._impl.copy_from_host(host.ctypes.data, host.nbytes)
    return array


def scan_by_key(keys, source, out, op, equal, exclusive: bool, init) -> None:
    """The scans by key on a from_mpi group: `source` holds values in the result's dtype."""
    from ..algorithms.by_key import exclusive_scan_by_key, inclusive_scan_by_key

    name = "exclusive_scan_by_key" if exclusive else "inclusive_scan_by_key"
    _, _, mine = _edges(keys, source, op, equal, name)

    def scan(k, v, into=None):
        if exclusive:
            return exclusive_scan_by_key(k, v, op, init, out=into, equal=_local_equal(equal))
        return inclusive_scan_by_key(k, v, op, out=into, equal=_local_equal(equal))

    if mine.carry is None:
        scan(local(keys), local(source), local(out))
        return
    group = keys.group
    sizes = list(local(keys).shard_sizes)
    sizes[0] += 1  # the carry in front, with the first key
    key_host, value_host = _to_host(local(keys)), _to_host(local(source))
    front_keys = _local_from_host(group, np.concatenate([key_host[:1], key_host]), sizes)
    front_values = _local_from_host(group, np.concatenate([_element(source.dtype, mine.carry), value_host]), sizes)
    scanned = _to_host(scan(front_keys, front_values))[1:]
    out._impl.copy_from_host(scanned.ctypes.data, scanned.nbytes)


def reduce_by_key(keys, values, op, equal):
    """reduce_by_key on a from_mpi group: (unique keys, folds), shard i holding the runs
    that end in shard i."""
    unique_keys, folds, mine = _edges(keys, values, op, equal, "reduce_by_key")
    if mine.carry is not None or mine.continues:
        sizes = list(unique_keys.shard_sizes)
        head_host, fold_host = _to_host(unique_keys), _to_host(folds)
        if mine.carry is not None:  # the run from earlier ranks ends here: its first key, the whole fold
            head_host[0] = mine.head
            whole = _host_op(op, values.dtype)(mine.carry, _value(values.dtype, fold_host, 0))
            fold_host[0] = _element(values.dtype, whole)[0]
        if mine.continues:  # its last run ends on a later rank, which writes it
            last = max(place for place, size in enumerate(sizes) if size)
            sizes[last] -= 1
            head_host, fold_host = head_host[:-1], fold_host[:-1]
        unique_keys = _local_from_host(keys.group, np.ascontiguousarray(head_host), sizes)
        folds = _local_from_host(keys.group, np.ascontiguousarray(fold_host), sizes)
    return tuple(_gathered(keys, [unique_keys, folds], "reduce_by_key"))


def _gathered(a, parts, name):
    from ._sorting import selected

    return selected(a, parts, name)
