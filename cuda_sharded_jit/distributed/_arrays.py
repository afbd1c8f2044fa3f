"""The arrays of from_mpi groups, and the collectives that move their data in and out and
between ranks: allocate, from_numpy (scatter from a root, or every rank's own copy),
from_local, to_numpy (gather to a root or to all), redistribute (all-to-all-v).

A DistributedArray is a ShardedArray whose shim array holds this rank's shards only (over the
group's local places, its global index origin set, so operators that take the index see global
indices); the Python object knows every shard's size. Data in and out starts or ends in host
memory: MPI's scatterv / gatherv / allgatherv move it from the group's pinned buffers, each
rank copying its part between them and its GPUs. redistribute is an all-to-all-v on the
group's transport (_exchange.py).
"""

from __future__ import annotations

import weakref

import numpy as np

from .._collective import register_array_type
from .._dtypes import as_array_dtype, is_integer
from .._layout import layout_of
from ..array import ShardedArray, ShardView, _shard_sizes, from_local_parts
from ._agreement import begin, gather, moving, run
from ._exchange import host_copy, move, stage
from ._mpi import mpi
from ._plans import in_place_order, index_origin, offsets, rank_counts, reshard_flows

_MAX_ELEMENTS = 1 << 60  # as the shim bounds a total


class DistributedArray(ShardedArray):
    """A ShardedArray of a PlaceGroup.from_mpi group: every shard's size, this rank's shards.

    >>> a = sharded.ShardedArray.from_numpy(g, host, root=None)             # doctest: +SKIP
    >>> a.shard_sizes, [view.place for view in a.local_shards()]          # doctest: +SKIP
    ((500, 500), [1])
    """

    __slots__ = ("_size",)

    def __init__(self, impl, group, dtype: np.dtype, shard_sizes):
        super().__init__(impl, group, dtype)
        self._shard_sizes = tuple(shard_sizes)  # every rank's, in global place order
        self._size = sum(self._shard_sizes)

    @property
    def size(self) -> int:
        """Number of elements over all shards of all ranks."""
        return self._size

    @property
    def shape(self) -> tuple[int]:
        """(size,): the arrays are one-dimensional."""
        return (self._size,)

    def __len__(self) -> int:
        return self._size

    @property
    def num_shards(self) -> int:
        """Number of shards: the group's number of places, over all ranks."""
        return len(self._shard_sizes)

    @property
    def shard_offsets(self) -> tuple[int, ...]:
        """Global index of each shard's first element."""
        return tuple(offsets(self._shard_sizes))

    @property
    def is_contiguous(self) -> bool:
        """False: the shards of a from_mpi group's array live in several processes."""
        return False

    @property
    def base_pointer(self) -> int:
        """0: no virtual range spans processes."""
        return 0

    def to_numpy(self, root: int | None = 0) -> np.ndarray | None:
        """The whole array gathered to rank `root` (None on the others), or to every rank with
        root=None. A collective.

        >>> host = a.to_numpy(root=0)                                    # doctest: +SKIP
        """
        return run(self._group, "to_numpy", _to_numpy, (self, root))

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError("a ShardedArray lives on GPUs: converting it to numpy always copies")
        host = self.to_numpy(root=None)  # every rank converts: a collective
        return host if dtype is None else host.astype(dtype, copy=False)

    def local_shards(self) -> list[ShardView]:
        """Zero-copy views of this rank's shards (`view.place`: the global place).

        >>> [view.place for view in a.local_shards()]                     # doctest: +SKIP
        """
        return [ShardView(self, place) for place in self._group.local_places]

    def _shim_place(self, place: int) -> int:
        return self._group._local_index(place)

    def _host_range(self, start: int, stop: int) -> np.ndarray:
        # bool(a) of a one-element array reads its element: every rank does (a collective)
        return self.to_numpy(root=None)[start:stop]

    def __getitem__(self, index):
        raise TypeError("index: host indexing of a PlaceGroup.from_mpi array is not a collective yet; "
                        "gather with to_numpy(root=...), or read local_shards()")

    def __setitem__(self, index, value) -> None:
        raise TypeError("index: host writes to a PlaceGroup.from_mpi array are not a collective yet; "
                        "use transform (with_index) or fill, or write local_shards()")

    def __repr__(self) -> str:
        group = self._group
        label = layout_of(self._dtype).repr_label
        mine = ", ".join(f"{place}: {self._shard_sizes[place]}" for place in group.local_places)
        return (f"ShardedArray(size={self._size}, dtype={label}, from_mpi rank {group.rank} of "
                f"{group.nranks}, {self.num_shards} shards; this rank's [{mine}])")

    def _repr_html_(self) -> str:
        """A notebook's view: every shard with its rank; this rank's marked."""
        import html

        group = self._group
        itemsize = self._dtype.itemsize
        rows = "".join(
            f"<tr><td>{place}{' *' if owner == group.rank else ''}</td><td>{owner}</td>"
            f"<td>cuda:{device}</td><td>{size}</td><td>{size * itemsize}</td><td>{offset}</td></tr>"
            for place, (owner, device, size, offset) in enumerate(
                zip(group.place_ranks, group.devices, self._shard_sizes, self.shard_offsets)))
        label = html.escape(layout_of(self._dtype).repr_label)
        state = "freed" if self._impl.is_freed else f"{self._impl.storage} storage"
        return (f"<b>ShardedArray</b> of {self._size} elements, {label}, {state}, PlaceGroup.from_mpi "
                f"rank {group.rank} of {group.nranks} (* this rank's)"
                f"<table><tr><th>place</th><th>rank</th><th>device</th><th>shard size</th><th>bytes</th>"
                f"<th>first index</th></tr>{rows}</table>")


register_array_type(DistributedArray)


# ---- making arrays -----------------------------------------------------------------------------


def _check_sizes(group, sizes: list[int]) -> list[int]:
    """The global shard sizes checked whole, so that every rank fails alike (the shim checks
    only this rank's)."""
    if len(sizes) != len(group):
        raise ValueError(f"sizes: expected one size per place ({len(group)}), got {len(sizes)}")
    total = 0
    for place, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"sizes: shard {place} has negative size {size}")
        total += size
    if total > _MAX_ELEMENTS:
        raise ValueError(f"sizes: the total of {len(sizes)} shard sizes exceeds 2^60 elements")
    return sizes


def wrap(local: ShardedArray, group, shard_sizes) -> DistributedArray:
    """The from_mpi array whose shards on this rank are `local`'s (an array of the group's
    local places), taking over its storage and, for adopted buffers, their release."""
    impl = local._impl
    impl.set_index_origin(index_origin(shard_sizes, group.place_ranks, group.rank))
    array = DistributedArray(impl, group, local.dtype, shard_sizes)
    if local._keepalive is not None:
        detached = local._keepalive.detach()
        if detached is not None:
            _, release, args, kwargs = detached
            array._keepalive = weakref.finalize(array, release, *args, **(kwargs or {}))
    return array


def empty(group, shard_sizes: list[int], dtype: np.dtype) -> DistributedArray:
    """An uninitialised array of global `shard_sizes` (checked); this rank allocates its own."""
    shard_sizes = _check_sizes(group, list(shard_sizes))
    local = ShardedArray.allocate(group._local, [shard_sizes[place] for place in group.local_places], dtype)
    return wrap(local, group, shard_sizes)


def allocate(group, n, dtype) -> DistributedArray:
    """ShardedArray.allocate on a from_mpi group: a collective."""
    return run(group, "allocate", _allocate, (group, n, dtype))


def _allocate(group, n, dtype) -> DistributedArray:
    dtype = as_array_dtype(dtype)
    return empty(group, _shard_sizes(group, n), dtype)


def _check_root(group, root) -> int | None:
    if root is None:
        return None
    if isinstance(root, bool) or not is_integer(root):
        raise TypeError(f"root: expected a rank (an int) or None, got {type(root).__name__}")
    root = int(root)
    if not 0 <= root < group.nranks:
        raise ValueError(f"root: expected a rank in [0, {group.nranks}) or None, got {root}")
    return root


def _host_layout(group, host, sizes) -> tuple[np.ndarray, np.dtype, list[int]]:
    """from_numpy's checks of one rank's host array: (contiguous host, dtype, shard sizes)."""
    host = np.asarray(host)
    if host.ndim != 1:
        raise ValueError(f"host: expected a 1-D array, got {host.ndim} dimensions {host.shape}")
    dtype = as_array_dtype(host.dtype, "host")
    shard_sizes = _shard_sizes(group, host.size if sizes is None else sizes, "sizes")
    if sum(shard_sizes) != host.size:
        raise ValueError(f"sizes: shard sizes sum to {sum(shard_sizes)}, but host has {host.size} elements")
    return np.ascontiguousarray(host), dtype, _check_sizes(group, shard_sizes)


def _bytes(array: np.ndarray) -> np.ndarray:
    """A contiguous array's bytes (any dtype, records included), as MPI moves them."""
    return array.reshape(-1).view(np.uint8)


def _byte_counts(counts, itemsize: int) -> list[int]:
    return [count * itemsize for count in counts]


def from_numpy(group, host, sizes, contiguous, root) -> DistributedArray:
    """ShardedArray.from_numpy on a from_mpi group: a collective."""
    return run(group, "from_numpy", _from_numpy, (group, host, sizes, contiguous, root))


def _from_numpy(group, host, sizes, contiguous, root) -> DistributedArray:
    root = _check_root(group, root)
    if contiguous:
        raise ValueError("contiguous: one virtual address range spans the places of one process; the "
                         "arrays of a PlaceGroup.from_mpi group are allocated per rank")
    rank = group.rank
    if root is None:  # every rank has the whole array and keeps its part
        host, dtype, shard_sizes = _host_layout(group, host, sizes)
        array = empty(group, shard_sizes, dtype)
        begin(group, ("from_numpy", ("root", None), ("shard sizes", tuple(shard_sizes)), ("dtype", dtype.str)))
        counts, starts = rank_counts(shard_sizes, group.place_ranks, group.nranks)
        part = host[starts[rank]:starts[rank] + counts[rank]]
        array._impl.copy_from_host(part.ctypes.data, part.nbytes)
        return array
    layout = None
    if rank == root:  # sizes, like host, are the root's
        host, dtype, shard_sizes = _host_layout(group, host, sizes)
        layout = (dtype, tuple(shard_sizes))
    begin(group, ("from_numpy", ("root", root)))
    with moving(group):
        dtype, shard_sizes = group.comm.bcast(layout, root=root)
    array = empty(group, list(shard_sizes), dtype)
    counts, starts = rank_counts(shard_sizes, group.place_ranks, group.nranks)
    part = group._staging.take("receive", counts[rank] * dtype.itemsize)
    begin(group, ("from_numpy: scatter", ("root", root)))
    MPI = mpi()
    itemsize = dtype.itemsize
    with moving(group):
        send = ([_bytes(host), (_byte_counts(counts, itemsize), _byte_counts(starts, itemsize)), MPI.BYTE]
                if rank == root else None)
        group.comm.Scatterv(send, [part, MPI.BYTE], root=root)
    array._impl.copy_from_host(part.ctypes.data, part.nbytes)
    return array


def from_local(group, arrays) -> DistributedArray:
    """ShardedArray.from_local on a from_mpi group: a collective."""
    return run(group, "from_local", _from_local, (group, arrays))


def _from_local(group, arrays) -> DistributedArray:
    if not isinstance(arrays, (str, bytes, np.ndarray)) and hasattr(arrays, "__len__"):
        if len(arrays) != len(group.local_places):
            raise ValueError(f"arrays: rank {group.rank} holds {len(group.local_places)} place(s) "
                             f"{group.local_places}, one array each; got {len(arrays)}")
    local = from_local_parts(group._local, arrays)
    gathered = gather(group, (tuple(local.shard_sizes), local.dtype), ("from_local",))
    dtypes = [dtype for _, dtype in gathered]
    for rank, dtype in enumerate(dtypes):
        if dtype != dtypes[0]:
            raise TypeError(f"arrays: rank {rank} passes {dtype}, rank 0 {dtypes[0]}: every shard of an "
                            f"array has one dtype")
    shard_sizes = _check_sizes(group, in_place_order([sizes for sizes, _ in gathered]))
    return wrap(local, group, shard_sizes)


def _to_numpy(array: DistributedArray, root) -> np.ndarray | None:
    group = array.group
    root = _check_root(group, root)
    rank = group.rank
    counts, starts = rank_counts(array.shard_sizes, group.place_ranks, group.nranks)
    part = host_copy(group, array, "send")
    host = np.empty(array.size, array.dtype) if root is None or rank == root else None
    begin(group, ("to_numpy", ("root", root), ("shard sizes", array.shard_sizes), ("dtype", array.dtype.str)))
    MPI = mpi()
    itemsize = array.dtype.itemsize
    layout = (_byte_counts(counts, itemsize), _byte_counts(starts, itemsize))
    with moving(group):
        if root is None:
            group.comm.Allgatherv([part, MPI.BYTE], [_bytes(host), layout, MPI.BYTE])
        else:
            receive = [_bytes(host), layout, MPI.BYTE] if rank == root else None
            group.comm.Gatherv([part, MPI.BYTE], receive, root=root)
    return host


def redistribute(a: DistributedArray, target: list[int]) -> DistributedArray:
    """sharded.redistribute on a from_mpi group (inside its collective): the elements move to
    the shards of sizes `target` in one all-to-all-v on the group's transport."""
    group = a.group
    flows = reshard_flows(a.shard_sizes, target, group.place_ranks, group.nranks)
    source = ShardedArray(a._impl, group._local, a.dtype)
    counts, _ = rank_counts(target, group.place_ranks, group.nranks)
    host, = stage(group, [source], ["send"], counts[group.rank] * a.dtype.itemsize)
    out = empty(group, target, a.dtype)
    begin(group, ("redistribute", ("shard sizes", a.shard_sizes), ("to", tuple(target)), ("dtype", a.dtype.str)))
    move(group, source, ShardedArray(out._impl, group._local, a.dtype), flows, a.shard_sizes, target, host)
    return out
