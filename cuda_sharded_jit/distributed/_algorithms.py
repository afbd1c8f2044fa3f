"""The cross-rank steps of the algorithms on from_mpi groups, each inside its collective
(the algorithm's own call, see _collective.py): the shim computes this rank's per-place
parts exactly as one process computes them per place, the ranks allgather them, and every
rank folds them in global place order with the shim's fold kernel, whose association is the
one-process cross-place fold's. So a from_mpi group of P places gives the same bits as
by_devices with the same P places and shard sizes.

- reduce / transform_reduce / tuple accumulators / argmin / count_if: one accumulator per
  place, allgathered, folded in place order (init first).
- inclusive and exclusive scans: the first pass on every place, its totals allgathered and
  folded into each place's seed (an exclusive prefix, with init), then the second pass
  seeded with it: one call of the shim, which calls back between the passes.
- count and histogram_even: integer counts, added by an allreduce (any order, same sum).
- adjacent_difference: every rank's last element allgathered; a rank's first non-empty
  place takes its neighbour (the halo plan's, across empty shards and ranks) from there.
"""

from __future__ import annotations

import numpy as np

from .. import _shim
from ._agreement import begin, gather, moving
from ._mpi import mpi
from ._plans import halo_plan, in_place_order, present, rank_counts, reduce_result, scan_seeds


def _fold(a, acc_size: int, libraries, builtin):
    """The fold primitive (values, init) -> (prefixes, total) of the shim's fold kernel, on
    this rank's first place, with the operator of `libraries` (or the built-in one)."""
    group = a.group._impl
    if builtin is not None:
        name = a.dtype.name
        return lambda values, init: _shim.fold_builtin(builtin, name, group, values, init)
    return lambda values, init: _shim.fold(libraries, group, acc_size, values, init)


def _signature(name: str, a, *fields):
    return (name, ("shard sizes", a.shard_sizes), ("dtype", a.dtype.str), *fields)


def reduce(a, acc_size: int, init: bytes, libraries=None, builtin=None) -> tuple[bool, bytes]:
    """(valid, accumulator bytes), as the shim's reduce returns them, over every rank."""
    if builtin is None:
        partials = _shim.reduce_partials(libraries, a._impl, acc_size)
    else:
        partials = _shim.reduce_builtin_partials(builtin, a._impl)
    gathered = gather(a.group, partials, _signature("reduce", a, ("accumulator bytes", acc_size)))
    values = present(in_place_order(gathered))
    return reduce_result(values, init, _fold(a, acc_size, libraries, builtin))


def scan(a, out, acc_size: int, init: bytes, exclusive: bool, libraries=None, builtin=None) -> None:
    """The shim's scan over every rank: the places' totals meet between the two passes."""
    group = a.group
    signature = _signature("scan", a, ("accumulator bytes", acc_size), ("exclusive", exclusive))
    fold = _fold(a, acc_size, libraries, builtin)

    def carry(totals):
        gathered = gather(group, [value if valid else None for valid, value in totals], signature)
        seeds = scan_seeds(in_place_order(gathered), init, fold)
        return [seeds[place] for place in group.local_places]

    if builtin is None:
        _shim.scan_carried(libraries, a._impl, out._impl, acc_size, exclusive, carry)
    else:
        _shim.scan_builtin_carried(builtin, a._impl, out._impl, exclusive, carry)


def count(a, value: bytes) -> int:
    """The shim's count over every rank."""
    local = _shim.count(a._impl, value)
    return sum(gather(a.group, local, _signature("count", a)))


def histogram_even(a, num_bins: int, edges: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The shim's histogram_even over every rank, into `counts` (int64, num_bins)."""
    _shim.histogram_even(a._impl, num_bins, edges.ctypes.data, edges.nbytes, counts.ctypes.data, counts.nbytes)
    begin(a.group, _signature("histogram_even", a, ("bins", num_bins), ("edges", edges[[0, -1]].tolist())))
    MPI = mpi()
    with moving(a.group):
        a.group.comm.Allreduce(MPI.IN_PLACE, counts, op=MPI.SUM)
    return counts


def adjacent_difference(difference, first, a, out) -> None:
    """The shim's adjacent_difference over every rank: the neighbour of a rank's first
    element is the last element of the nearest earlier rank that holds any."""
    group = a.group
    rank = group.rank
    counts, _ = rank_counts(a.shard_sizes, group.place_ranks, group.nranks)
    last = None
    if counts[rank]:
        element = np.empty(1, a.dtype)
        a._impl.copy_range_to_host(counts[rank] - 1, counts[rank], element.ctypes.data, element.nbytes)
        last = element.tobytes()
    gathered = gather(group, last, _signature("adjacent_difference", a, ("out dtype", out.dtype.str)))
    halo = b""
    for needed in halo_plan(a.shard_sizes, group.place_ranks):
        if needed.rank == rank and needed.source_rank != rank:
            halo = gathered[needed.source_rank]
    _shim.adjacent_difference(difference, first, a._impl, out._impl, False, halo)
