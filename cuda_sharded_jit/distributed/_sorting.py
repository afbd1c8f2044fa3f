"""The sorts, selections and searches on from_mpi groups, each inside its collective (the
algorithm's own call, see _collective.py). Each rank runs the one-process algorithm on its
own part (a one-process view of its shards, over its local places); control data crosses
ranks through MPI, the sorts' pieces in one all-to-all-v on the group's transport
(_exchange.py):

- sort, sort_by_key, argsort: each rank sorts its part (the local multi-place sort), the
  exact split of the global order is searched on the host (every rank's sorted order codes
  counted at candidate codes, the counts allreduced: a few rounds), the pieces move in one
  all-to-all-v, and each rank sorts what it received, which lays it out in its shards. The
  global order's element at position k ends in the shard owning k, so the result is
  by_devices' bit for bit (the sorts are stable: ties in global index order). sort(key=)
  is sort_by_key of the computed keys (one round per component of a tuple key); the
  comparator sort searches its split by comparisons (compare_sort).
- select, partition, three_way_partition: each rank selects from its shards; the outputs'
  shard sizes are allgathered (no element crosses ranks, as none crosses places).
- top_k: each rank's best (at most k), allgathered and merged in order on every rank.
- searchsorted (numpy queries, with or without a comparator): each rank counts in its part;
  the counts add up (int64 allreduce: any order, the same sum).
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager

import numpy as np

from .. import _shim
from ..array import ShardedArray
from ._agreement import begin, gather, moving
from ._arrays import empty, wrap
from ._exchange import move, stage
from ._mpi import mpi
from ._plans import (SortedCodes, corank_points, merge_best, narrow, order_codes, rank_counts,
                     search_candidates, sort_flows, split_points)

_WAYS = 16  # candidate codes per bracket a round: 4 bits of a code a round


def local(a) -> ShardedArray:
    """This rank's shards of a from_mpi array as a one-process array (the same storage)."""
    return ShardedArray(a._impl, a.group._local, a.dtype)


def _split(group, codes: SortedCodes, shard_sizes) -> list[list[int]]:
    """points[r][d - 1]: how many of rank r's sorted elements go to ranks before d, found by
    the multi-way search of the codes (every rank's `codes`: its sorted part's)."""
    MPI = mpi()
    comm = group.comm
    counts, starts = rank_counts(shard_sizes, group.place_ranks, group.nranks)
    targets = starts[1:]
    total = sum(counts)
    if not targets or total == 0:
        return [[0] * len(targets) for _ in range(group.nranks)]
    with moving(group):
        ends = comm.allgather(tuple(int(code) for code in codes.at([0, codes.size - 1])) if codes.size else None)
        present = [end for end in ends if end is not None]
        low = [min(first for first, _ in present)] * len(targets)
        high = [max(last for _, last in present)] * len(targets)
        while any(lo < hi for lo, hi in zip(low, high)):
            candidates = search_candidates(low, high, _WAYS)
            flat = np.array([cut for cuts in candidates for cut in cuts], dtype=codes.dtype)
            found = codes.searchsorted(flat, side="right")
            comm.Allreduce(MPI.IN_PLACE, found, op=MPI.SUM)
            totals, at = [], 0
            for cuts in candidates:
                totals.append(found[at:at + len(cuts)].tolist())
                at += len(cuts)
            low, high = narrow(low, high, candidates, totals, targets)
        splitters = np.array(low, dtype=codes.dtype)
        before = codes.searchsorted(splitters, side="left")
        equal = codes.searchsorted(splitters, side="right") - before
        gathered = comm.allgather((before.tolist(), equal.tolist()))
    return split_points(targets, [b for b, _ in gathered], [e for _, e in gathered])


def _agree(name: str, keys, values, descending: bool) -> None:
    """Every rank makes the same sort (before any rank sorts its part)."""
    begin(keys.group, (name, ("shard sizes", keys.shard_sizes), ("dtype", keys.dtype.str),
                       ("values", None if values is None else values.dtype.str), ("descending", descending)))


def _exchange(group, shard_sizes, keys: ShardedArray, values: ShardedArray | None,
              descending: bool) -> list[ShardedArray]:
    """New local arrays holding the pieces of the global order that this rank owns, in rank
    order (keys, and values when given: this rank's part sorted). Everything that can fail on
    one rank alone (the host copy, the codes, the arrays that receive) comes before the
    agreement that precedes the data's movement."""
    parts = [keys] + ([] if values is None else [values])
    hosts = stage(group, parts, ["keys", "values"], max(_nbytes(part) for part in parts), always=(0,))
    key_host = hosts[0].view(keys.dtype)
    codes = SortedCodes(key_host, descending)
    received = _receivers(group, parts)
    try:
        begin(group, ("sort: exchange",))
        points = _split(group, codes, shard_sizes)
        _move(group, shard_sizes, points, parts, received, hosts)
    except BaseException:
        _free(received)
        raise
    return received


def _receivers(group, parts) -> list[ShardedArray]:
    """An array for each of `parts` (local views) to receive its pieces: the same shard sizes."""
    made = []
    try:
        for part in parts:
            made.append(ShardedArray.allocate(group._local, list(part.shard_sizes), part.dtype))
    except BaseException:
        _free(made)
        raise
    return made


def _free(arrays) -> None:
    for array in arrays:
        array.free()


@contextmanager
def _freed(arrays):
    """`arrays` (the pieces received), freed when the block ends, however it ends."""
    try:
        yield arrays
    finally:
        _free(arrays)


def _nbytes(array: ShardedArray) -> int:
    return array._impl.size * array._impl.itemsize


def _move(group, shard_sizes, points, parts, received, hosts) -> None:
    """Each local array of `parts` (this rank's sorted part) sends the pieces of the global
    order that the split `points` gives to each rank; `received[i]` takes those of `parts[i]`
    that this rank owns, in rank order. `hosts`: the parts staged (_exchange.stage)."""
    counts, _ = rank_counts(shard_sizes, group.place_ranks, group.nranks)
    flows = sort_flows(points, counts)
    for part, into, host in zip(parts, received, hosts):
        move(group, part, into, flows, shard_sizes, shard_sizes, host)


def compare_sort(a, out, libraries, *signature):
    """sharded.sort(compare=...) on a from_mpi group, into `out` (which may be `a`).
    `libraries`: the comparator's merge sort modules for this rank's places, built with the
    sort's key and direction; `signature`: what every rank must agree on besides the arrays.
    Each rank sorts its part with the comparator; the split is searched by comparisons alone
    (corank_points: a binary search per rank and target, each round's probe elements
    allgathered and counted on every rank by the comparator's search kernel, the positions
    summed by an allreduce); the pieces move in one all-to-all-v, and each rank sorts the
    runs it received (stable: they arrive in rank order)."""
    group = a.group
    mine, target = local(a), local(out)
    held = mine.size > 0
    if held:
        _shim.sort_compare(libraries, mine._impl, target._impl)
    staged, = stage(group, [target], ["keys"], _nbytes(target), always=(0,))
    host = staged.view(a.dtype)
    received, = _receivers(group, [target])
    with _freed([received]):
        begin(group, ("sort (compare)", ("shard sizes", a.shard_sizes), ("dtype", a.dtype.str), *signature))
        counts, starts = rank_counts(a.shard_sizes, group.place_ranks, group.nranks)
        rank, MPI = group.rank, mpi()

        def count(queries: np.ndarray, right: bool) -> np.ndarray:  # this rank's elements before each query
            asked = ShardedArray.from_numpy(target.group, queries)
            found = ShardedArray.allocate(target.group, list(asked.shard_sizes), np.int64)
            try:
                _shim.search_compare(libraries, target._impl, asked._impl, found._impl, right)
                return found.to_numpy()
            finally:
                asked.free()
                found.free()

        def positions(probes):
            elements = group.comm.allgather(host[[j for q, j in probes if q == rank]])
            taken = [0] * group.nranks
            queries = np.empty(len(probes), a.dtype)
            for k, (q, _) in enumerate(probes):  # the probes are sorted: each rank's in its order
                queries[k] = elements[q][taken[q]]
                taken[q] += 1
            found = np.zeros(len(probes), np.int64)
            if held:
                lower, upper = count(queries, False), count(queries, True)
                for k, (q, j) in enumerate(probes):  # earlier ranks' equal elements go first
                    found[k] = j if q == rank else (upper[k] if rank < q else lower[k])
            group.comm.Allreduce(MPI.IN_PLACE, found, op=MPI.SUM)
            return found.tolist()

        with moving(group):  # a failure between the rounds' collectives aborts: peers wait in them
            points = corank_points(counts, starts[1:], positions)
        _move(group, a.shard_sizes, points, [target], [received], [staged])
        if held:
            _shim.sort_compare(libraries, received._impl, target._impl)
    return out


def sort(a, out, descending: bool):
    """sharded.sort of numbers on a from_mpi group (into `out`, which may be `a`)."""
    _agree("sort", a, None, descending)
    mine, target = local(a), local(out)
    held = mine.size > 0  # a rank may hold no elements: it only takes part in the exchange
    if held:
        _shim.sort(mine._impl, target._impl, descending)
    with _freed(_exchange(a.group, a.shard_sizes, target, None, descending)) as (received,):
        if held:  # the received runs, in rank order: stable
            _shim.sort(received._impl, target._impl, descending)
    return out


def sort_by_key(keys, values, out_keys, out_values, descending: bool):
    """sharded.sort_by_key on a from_mpi group."""
    from ..algorithms.sort import _sort_values

    _agree("sort_by_key", keys, values, descending)
    parts = [local(array) for array in (keys, out_keys, values, out_values)]
    held = parts[0].size > 0
    if held:
        _sort_values(*parts, descending)
    _, sorted_keys, _, sorted_values = parts
    with _freed(_exchange(keys.group, keys.shard_sizes, sorted_keys, sorted_values, descending)) as received:
        if held:
            _sort_values(received[0], sorted_keys, received[1], sorted_values, descending)
    return out_keys, out_values


def argsort(a, descending: bool):
    """sharded.argsort on a from_mpi group: the elements sorted with their global indices."""
    from ..algorithms.opaque import sequence

    group = a.group
    _agree("argsort", a, None, descending)
    indices = empty(group, list(a.shard_sizes), np.dtype(np.int64))
    sequence(local(indices))  # its index origin is this rank's: global indices
    keys = local(a).copy()
    held = keys.size > 0
    try:
        if held:
            _shim.sort_by_key(keys._impl, keys._impl, indices._impl, indices._impl, descending)
        with _freed(_exchange(group, a.shard_sizes, keys, local(indices), descending)) as received:
            if held:
                _shim.sort_by_key(received[0]._impl, keys._impl, received[1]._impl, indices._impl, descending)
    finally:
        keys.free()
    return indices


def selected(a, parts: list[ShardedArray], name: str) -> list:
    """The outputs of a selection on this rank's shards (`parts`, one-process arrays), as
    from_mpi arrays: their shard sizes allgathered."""
    group = a.group
    sizes = gather(group, [tuple(part.shard_sizes) for part in parts],
                   (name, ("shard sizes", a.shard_sizes), ("dtype", a.dtype.str), ("outputs", len(parts))))
    return [wrap(part, group, [size for per_rank in sizes for size in per_rank[index]])
            for index, part in enumerate(parts)]


def top_k(a, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """sharded.top_k on a from_mpi group: every rank's best, merged on every rank."""
    mine = local(a)
    count = min(k, mine.size)
    values = np.empty(count, dtype=a.dtype)
    indices = np.empty(count, dtype=np.int64)
    if count:
        _shim.top_k(mine._impl, count, largest, values.ctypes.data, values.nbytes, indices.ctypes.data,
                    indices.nbytes)
        indices += a._impl.index_origin
    gathered = gather(a.group, (values, indices),
                      ("top_k", ("shard sizes", a.shard_sizes), ("dtype", a.dtype.str), ("k", k),
                       ("largest", largest)))
    every_value = np.concatenate([v for v, _ in gathered])
    every_index = np.concatenate([i for _, i in gathered])
    return merge_best(every_value, every_index, order_codes(every_value, largest), k)


def searchsorted(sorted_a, host: np.ndarray, right: bool, compare=None):
    """sharded.searchsorted of numpy queries (`host`, already cast) on a from_mpi group, in
    the order of `compare` when given (already compiled on every rank)."""
    from ..algorithms.search import searchsorted as search

    fields = [host[name] for name in host.dtype.names] if host.dtype.names else [host]  # no padding bytes
    digest = hashlib.blake2b(b"".join(np.ascontiguousarray(field).tobytes() for field in fields),
                             digest_size=8).hexdigest()
    result = np.zeros(host.shape, dtype=np.int64)
    if host.size and sorted_a._impl.size:
        result = np.asarray(search(local(sorted_a), host, "right" if right else "left", compare), dtype=np.int64)
        result = result.reshape(host.shape)
    begin(sorted_a.group, ("searchsorted", ("shard sizes", sorted_a.shard_sizes), ("dtype", sorted_a.dtype.str),
                           ("queries", (host.shape, digest)), ("side", right), ("compare", compare is not None)))
    MPI = mpi()
    flat = np.ascontiguousarray(result).reshape(-1)
    with moving(sorted_a.group):
        sorted_a.group.comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    result = flat.reshape(host.shape)
    return result[()] if result.ndim == 0 else result
