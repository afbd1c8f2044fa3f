"""The algorithms over runs of equal keys on from_mpi groups (scans by key, reduce_by_key,
unique_by_key, unique), each inside its collective: every rank runs the one-process engine
on its own shards, told what lies beyond them.

- unique_by_key / unique: the head flags take the halo of adjacent_difference (a rank's
  first key meets the last key of the nearest earlier rank holding any); the compaction is
  per rank, its outputs' shard sizes allgathered.
- the scans by key and reduce_by_key: the shim's by-key engine with edges (its single pass,
  as in one process). Its neighbouring keys come from the nearest ranks holding any
  (allgathered before the call); after the pass it hands back its shards' totals (64-byte
  records), which are allgathered, and
  every carry folds the earlier ranks' totals in front of the rank's own, on the GPU, in
  place order: the records and the folds one process makes over every place. So the results
  are by_devices' bit for bit, floats included, and reduce_by_key's outputs have its shard
  sizes (a run is written once, in the shard where it ends).
"""

from __future__ import annotations

import numpy as np

from ..array import ShardedArray
from ._agreement import gather
from ._sorting import local


def edges(keys, values, name: str) -> tuple:
    """The engine's edges for this rank (a collective): the last key of the nearest earlier
    rank holding any, the first key of the nearest later one (b"" for none), and the totals'
    exchange, which the engine calls once its shards' totals are in (every rank calls it)."""
    group, part = keys.group, local(keys)
    signature = (name, ("shard sizes", keys.shard_sizes), ("keys", keys.dtype.str), ("values", values.dtype.str))
    mine = None
    if part.size:
        ends = np.empty(2, keys.dtype)
        part._impl.copy_range_to_host(0, 1, ends.ctypes.data, keys.dtype.itemsize)
        part._impl.copy_range_to_host(part.size - 1, part.size, ends[1:].ctypes.data, keys.dtype.itemsize)
        mine = (ends[0].tobytes(), ends[1].tobytes())
    every = gather(group, mine, signature)
    rank = group.rank
    before = next((edge[1] for edge in reversed(every[:rank]) if edge is not None), b"")
    after = next((edge[0] for edge in every[rank + 1:] if edge is not None), b"")

    def totals(records: bytes) -> bytes:  # this rank's shards' totals; the earlier ranks' back
        return b"".join(gather(group, records, signature + (("step", "totals"),))[:rank])

    return before, after, totals


def gathered(keys, values, unique_keys, folds) -> tuple:
    """reduce_by_key's outputs on this rank (shim arrays) as from_mpi arrays: their shard
    sizes allgathered (shard i holds the runs that end in shard i, as in one process)."""
    from ._sorting import selected

    parts = [ShardedArray(unique_keys, keys.group._local, keys.dtype),
             ShardedArray(folds, values.group._local, values.dtype)]
    return tuple(selected(keys, parts, "reduce_by_key"))
