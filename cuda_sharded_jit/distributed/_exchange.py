"""The all-to-all-v that moves array data between the ranks of a from_mpi group (the sort's
pieces, resharding), on the group's transport. One plan, three ways to carry it out:

- host staged ("mpi" transport, by default): each rank copies its part from
  its GPUs into a pinned host buffer, MPI_Alltoallv moves the bytes, the receiver copies
  them up;
- device buffers through MPI ("mpi" transport over a CUDA-aware MPI, when
  CUDA_SHARDED_JIT_MPI_CUDA_AWARE=1 says so): the pieces go straight from shard to shard,
  one MPI_Isend / MPI_Irecv per piece;
- NCCL ("nccl" transport): the same pieces, one ncclSend / ncclRecv each, every place its
  own NCCL rank, all of them in one NCCL group on the places' streams.

A rank's part is its shards' elements in order (its local range). The flows (`Flows`, every
rank's part of the all-to-all-v, which every rank can compute) say how many elements of its
local range each rank sends to each, from where, and where in the receiver's local range
they land. `pieces` cuts those flows at both sides' shard boundaries: every piece goes from one
shard to one shard, and every rank derives the same list from global facts alone, so the
two ends of each piece agree without any further message.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ._agreement import moving
from ._mpi import mpi
from ._plans import AllToAll, Flows

ENV_CUDA_AWARE = "CUDA_SHARDED_JIT_MPI_CUDA_AWARE"  # "1": MPI takes device buffers; else staged


class Piece(NamedTuple):
    """`count` elements from shard `source` (at element `source_offset` in it) to shard
    `dest` (at `dest_offset`); shards are global place indices."""

    source: int
    source_offset: int
    dest: int
    dest_offset: int
    count: int


def _cuts(shard_sizes: Sequence[int], places: Sequence[int], start: int, count: int):
    """(place, offset in that shard, elements) covering [start, start + count) of the local
    range made of the shards `places` (their sizes `shard_sizes[place]`), in order."""
    at = 0
    for place in places:
        size = shard_sizes[place]
        low, high = max(start, at), min(start + count, at + size)
        if low < high:
            yield place, low - at, high - low
        at += size


def pieces(flows: Flows, source_sizes: Sequence[int], dest_sizes: Sequence[int], owners: Sequence[int],
           rank: int | None = None) -> list[Piece]:
    """The pieces of the all-to-all-v `flows` (every rank's, [sender, receiver]) from an
    array of shard sizes `source_sizes` to one of `dest_sizes` (global, in place order;
    `owners[p]`: the rank of place p), ordered by sending rank, receiving rank, then
    position: both ends of every pair of ranks list its pieces in the same order. `rank`:
    only the pieces it sends or receives (O(R) pairs, not R^2)."""
    nranks = len(flows.counts)
    held = [[] for _ in range(nranks)]
    for place, owner in enumerate(owners):
        held[owner].append(place)
    if rank is None:
        pairs = [(sender, receiver) for sender in range(nranks) for receiver in range(nranks)]
    else:
        pairs = sorted({(rank, other) for other in range(nranks)} | {(other, rank) for other in range(nranks)})
    out = []
    for sender, receiver in pairs:
        count = int(flows.counts[sender, receiver])
        if not count:
            continue
        sources = list(_cuts(source_sizes, held[sender], int(flows.starts[sender, receiver]), count))
        dests = list(_cuts(dest_sizes, held[receiver], int(flows.lands[sender, receiver]), count))
        s = d = 0
        while s < len(sources):  # merge the two cuttings of the same `count` elements
            (source, source_offset, source_left), (dest, dest_offset, dest_left) = sources[s], dests[d]
            step = min(source_left, dest_left)
            out.append(Piece(source, source_offset, dest, dest_offset, step))
            sources[s] = (source, source_offset + step, source_left - step)
            dests[d] = (dest, dest_offset + step, dest_left - step)
            s += sources[s][2] == 0
            d += dests[d][2] == 0
    return out


def cuda_aware() -> bool:
    """Whether this rank's MPI is to take device buffers: CUDA_SHARDED_JIT_MPI_CUDA_AWARE="1"
    says so ("0" or unset: the pieces are staged through pinned host memory). An opt-in,
    not the library's own answer (Open MPI's MPIX_Query_cuda_support): the shards live in
    stream-ordered pools, which an MPI's CUDA IPC between the ranks of one node may not
    handle, and the path has not been run on GPUs."""
    override = os.environ.get(ENV_CUDA_AWARE)
    if override is None:
        return False
    if override not in ("0", "1"):
        raise ValueError(f"{ENV_CUDA_AWARE}: expected 0 or 1, got {override!r}")
    return override == "1"


# ---- carrying a plan out ---------------------------------------------------------------------------


def _pointer(array, group, place: int, offset: int) -> int:
    return array._impl.shard_pointer(group._local_index(place)) + offset * array.dtype.itemsize


def move(group, source, dest, flows: Flows, source_sizes, dest_sizes, host: np.ndarray | None) -> None:
    """Moves this rank's part of `source` (a one-process view of its shards; every rank's
    shard sizes `source_sizes`) into `dest` (another array: the same for `dest_sizes`) as
    `flows` say, on the group's transport. `host`: the source's bytes on the host, from
    `stage` (what the staged move sends; None elsewhere). Called after the agreement that
    precedes the move: an error inside aborts the communicator."""
    how = group._exchange_how
    with moving(group):
        if how == "staged":
            _staged(group, source, dest, flows.plan(group.rank), host)
            return
        mine = pieces(flows, source_sizes, dest_sizes, group.place_ranks, group.rank)
        if how == "nccl":
            group._nccl.exchange(group, source, dest, mine)
        else:
            _device_mpi(group, source, dest, mine)


def stage(group, parts, slots, receive_bytes: int, always=()) -> list:
    """Everything a staged move takes from the group's pinned buffers, taken before the
    agreement that precedes the move (so that a failure is agreed, not aborted): each of
    `parts` copied into its slot `slots[i]` (also when the move will not stage, for the
    indices in `always`: the sort's keys, which its split searches on the host; else None),
    and the receive slot grown to `receive_bytes`."""
    staged = group._exchange_how == "staged"
    copies = [host_copy(group, part, slot) if staged or index in always else None
              for index, (part, slot) in enumerate(zip(parts, slots))]
    if staged:
        group._staging.take("receive", receive_bytes)
    return copies


def host_copy(group, array, slot: str) -> np.ndarray:
    """This rank's part of `array` in the group's pinned buffer `slot` (uint8)."""
    host = group._staging.take(slot, array._impl.size * array._impl.itemsize)
    array._impl.copy_to_host(host.ctypes.data, host.nbytes)
    return host


def _staged(group, source, dest, plan: AllToAll, sent: np.ndarray) -> None:
    MPI = mpi()
    itemsize = source.dtype.itemsize
    sent = sent.reshape(-1).view(np.uint8)
    received = group._staging.take("receive", dest._impl.size * itemsize)
    scale = lambda counts: [count * itemsize for count in counts]  # noqa: E731
    group.comm.Alltoallv([sent, (scale(plan.send_counts), scale(plan.send_displacements)), MPI.BYTE],
                         [received, (scale(plan.receive_counts), scale(plan.receive_displacements)), MPI.BYTE])
    dest._impl.copy_from_host(received.ctypes.data, received.nbytes)


def _device_mpi(group, source, dest, mine: list[Piece]) -> None:
    """One Isend / Irecv per piece between device buffers (a CUDA-aware MPI reads them); a
    piece's tag is its index among the pieces of its pair of ranks, in both ends' order."""
    MPI = mpi()
    itemsize = source.dtype.itemsize
    ranks = group.place_ranks
    group.sync()  # the source's shards are written (their streams' work done) before MPI reads
    requests, tags = [], {}
    for piece in mine:
        pair = (ranks[piece.source], ranks[piece.dest])
        tag = tags[pair] = tags.get(pair, -1) + 1
        nbytes = piece.count * itemsize
        if ranks[piece.dest] == group.rank:
            buffer = MPI.buffer.fromaddress(_pointer(dest, group, piece.dest, piece.dest_offset), nbytes)
            requests.append(group.comm.Irecv([buffer, MPI.BYTE], source=pair[0], tag=tag))
        if ranks[piece.source] == group.rank:
            buffer = MPI.buffer.fromaddress(_pointer(source, group, piece.source, piece.source_offset), nbytes)
            requests.append(group.comm.Isend([buffer, MPI.BYTE], dest=pair[1], tag=tag))
    MPI.Request.Waitall(requests)


# ---- pinned staging ----------------------------------------------------------------------------------


class Staging:
    """A rank's pinned host buffers for staged moves, one per slot (the sorts' keys and
    values, what a rank sends and what it receives), used by one collective at a time (the group's lock): each grows to
    the largest move that used it and lives as long as the group. `allocate(nbytes) ->
    (address, free)` makes page-locked memory (the shim's)."""

    def __init__(self, allocate: Callable[[int], tuple[int, Callable[[], None]]]):
        self._allocate = allocate
        self._slots: dict[str, tuple[int, int, Callable[[], None]]] = {}

    def take(self, slot: str, nbytes: int) -> np.ndarray:
        """A uint8 array of `nbytes` over slot `slot`'s buffer, valid until the slot's next take."""
        if nbytes == 0:
            return np.empty(0, np.uint8)
        address, size, free = self._slots.get(slot, (0, 0, None))
        if nbytes > size:
            if free is not None:
                del self._slots[slot]
                free()
            address, free = self._allocate(nbytes)
            size = nbytes
            self._slots[slot] = (address, size, free)
        import ctypes

        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))

    def release(self) -> None:
        """Gives every buffer back (a later take allocates again)."""
        slots, self._slots = self._slots, {}
        for _, _, free in slots.values():
            free()
