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
  seeded with it: one call of the shim, which calls back between the passes. Where one
  place holds every element, its rank scans it as one process scans a lone shard (in one
  pass where the accumulator allows), so the bits are one process's there too.
- count and histogram_even: integer counts, added by an allreduce (any order, same sum).
- adjacent_difference: every rank's last element allgathered; a rank's first non-empty
  place takes its neighbour (the halo plan's, across empty shards and ranks) from there.
- segmented_reduce: each rank folds the segments that begin in its part; a segment that
  goes on into later ranks hands its fold so far (the carry) from rank to rank, in order.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .. import _shim
from ..array import ShardedArray
from ._agreement import begin, gather, moving
from ._arrays import _from_numpy
from ._mpi import mpi
from ._plans import halo_plan, in_place_order, present, rank_counts, reduce_result, scan_seeds
from ._sorting import local


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
    if sum(1 for size in a.shard_sizes if size) <= 1:  # nothing to carry: the lone shard's rank scans it
        begin(group, signature)
        if builtin is None:
            _shim.scan(libraries, a._impl, out._impl, acc_size, init, exclusive)
        else:
            _shim.scan_builtin(builtin, a._impl, out._impl, init, exclusive)
        return
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
    _shim.histogram_even(a._impl, num_bins, edges.ctypes.data, edges.nbytes, counts)
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


def _folds(part, positions: np.ndarray, libraries, acc_dtype: np.dtype, init: bytes) -> np.ndarray:
    """One process's segmented_reduce of this rank's part (a one-process array) at local
    `positions`, with `init` (packed), to the host."""
    out = ShardedArray.allocate(part.group, len(positions) - 1, acc_dtype)
    try:
        _shim.segmented_reduce(libraries, part._impl, positions.ctypes.data, len(positions), out._impl,
                               acc_dtype.itemsize, init)
        return out.to_numpy()
    finally:
        out.free()


def segmented_reduce(a, positions: np.ndarray, libraries, acc_dtype: np.dtype, init: bytes):
    """The shim's segmented_reduce over every rank (`positions`: the checked global offsets,
    the same on every rank; `init` packed). Each rank folds its part in one process's call:
    the segments that begin there (init first) and, in front of them, the piece of a segment
    that began on an earlier rank. That piece must start from the carry (init and the
    earlier ranks' pieces, folded): the carry passes from rank to rank in rank order, and a
    rank that a segment enters makes its call again with the carry as init and keeps that
    segment's fold. Its places hold the same pieces as in one process's call, so the kernel
    folds them alike, and its Combine(carry, piece) is csj_fold's step: the results are
    by_devices' bit for bit. The result: S values split evenly over the group."""
    group, rank = a.group, a.group.rank
    counts, starts = rank_counts(a.shard_sizes, group.place_ranks, group.nranks)
    lo, hi = starts[rank], starts[rank] + counts[rank]
    begins, ends = positions[:-1], positions[1:]
    # a segment belongs to the rank whose part holds its beginning; an empty one at len(a)
    # to the last rank holding elements, whose last place takes them in one process too
    owners = np.searchsorted(np.asarray(starts), begins, side="right") - 1
    holding = [r for r in range(group.nranks) if counts[r]]
    owners[begins == a.size] = holding[-1] if holding else group.nranks - 1
    owned = np.flatnonzero(owners == rank)
    entering = None  # the segment that began on an earlier rank and goes on into this part
    first = int(np.searchsorted(begins, lo, side="left"))
    if counts[rank] and first > 0 and ends[first - 1] > lo:
        entering = first - 1
    cuts = ([lo] if entering is not None else []) + begins[owned].tolist()
    last = owned[-1] if owned.size else entering
    local_positions = np.array(cuts + ([min(int(ends[last]), hi)] if cuts else []), np.int64) - lo
    part = local(a)
    folds = _folds(part, local_positions, libraries, acc_dtype, init) if owned.size else np.empty(0, acc_dtype)
    begin(group, ("segmented_reduce", ("shard sizes", a.shard_sizes), ("dtype", a.dtype.str),
                  ("accumulator", acc_dtype.str), ("segments", len(begins)),
                  ("offsets", hashlib.blake2b(positions.tobytes(), digest_size=8).hexdigest())))
    shift = 1 if entering is not None else 0
    finals = {int(s): folds[shift + k] for k, s in enumerate(owned) if ends[s] <= hi}
    outgoing = folds[-1].tobytes() if owned.size and ends[owned[-1]] > hi else None
    previous = max((r for r in holding if r < rank), default=None)
    waiting = entering is not None
    while True:
        with moving(group):
            seen = group.comm.allgather((waiting, outgoing))
            if not any(pending for pending, _ in seen):
                break
            if waiting and seen[previous][1] is not None:
                fold = _folds(part, local_positions, libraries, acc_dtype, seen[previous][1])[0]
                if ends[entering] <= hi:
                    finals[entering] = fold
                else:
                    outgoing = fold.tobytes()
                waiting = False
    indices = np.array(sorted(finals), np.int64)
    values = np.array([finals[s] for s in indices.tolist()], acc_dtype)
    everywhere = gather(group, (indices, values), ("segmented_reduce: results",))
    result = np.empty(len(begins), acc_dtype)
    for where, folded in everywhere:
        result[where] = folded
    return _from_numpy(group, result, None, False, None)  # every rank keeps its part of the even split
