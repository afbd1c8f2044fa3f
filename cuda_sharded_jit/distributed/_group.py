"""PlaceGroup.from_mpi: a group whose places span the ranks of an MPI communicator.

A from_mpi group is a PlaceGroup whose shim group (`_impl`, what the shim drives) holds this
rank's places only; the group knows the global layout beside it: every place's rank and
device, numbered in rank order, then local order, so that shard i lives on global place i as
in one process. Its arrays (distributed/_arrays.py) hold this rank's shards and know every
shard's size. The communicator is the library's own duplicate of the one given, so its
messages never meet the program's.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Sequence

from .. import _shim
from ..places import PlaceGroup
from ._agreement import agree
from ._exchange import Staging, cuda_aware
from ._mpi import mpi
from ._nccl import Communicators, nccl_loads, set_devices
from ._plans import TRANSPORTS, choose_transport, local_places, place_layout


class DistributedPlaceGroup(PlaceGroup):
    """A PlaceGroup over the places of every rank of an MPI communicator (PlaceGroup.from_mpi).

    len(g), devices and locality_domains cover every place of every rank; `archs` are this
    rank's places' (the kernels it loads), sync() and stream(place) this rank's.

    >>> g = PlaceGroup.from_mpi(transport="mpi")                             # doctest: +SKIP
    >>> g.rank, g.nranks, g.local_places, g.transport                       # doctest: +SKIP
    (1, 4, (1,), 'mpi')
    """

    __slots__ = ("_comm", "_owners", "_local_places", "_local_index_of", "_all_devices", "_all_domains",
                 "_transport", "_lock", "_local", "_exchange_how", "_staging", "_nccl")
    _distributed = True

    def __init__(self, impl, comm, owners, devices, domains, transport: str, exchange_how: str = "staged"):
        super().__init__(impl)
        self._comm = comm
        self._owners = tuple(owners)
        self._local_places = local_places(self._owners, comm.Get_rank())
        self._local_index_of = {place: index for index, place in enumerate(self._local_places)}
        self._all_devices = tuple(devices)
        self._all_domains = tuple(domains)
        self._transport = transport
        self._lock = threading.RLock()  # this process's collectives on the group, one at a time
        self._local = PlaceGroup(impl)  # this rank's places as a one-process group
        # how the all-to-all-v moves arrays: "nccl", "device" (device buffers through a
        # CUDA-aware MPI) or "staged" (through this rank's pinned buffers, self._staging)
        self._exchange_how = exchange_how
        self._staging = Staging(_pinned)
        weakref.finalize(self, self._staging.release)
        self._nccl = None

    @property
    def rank(self) -> int:
        """This process's rank in the group's communicator."""
        return self._comm.Get_rank()

    @property
    def nranks(self) -> int:
        """The number of ranks (processes) of the group."""
        return self._comm.Get_size()

    @property
    def local_places(self) -> tuple[int, ...]:
        """The global indices of the places this rank holds, in order (consecutive)."""
        return self._local_places

    @property
    def place_ranks(self) -> tuple[int, ...]:
        """The rank that holds each place."""
        return self._owners

    @property
    def transport(self) -> str:
        """How data moves between ranks: "mpi" (through MPI, staged through pinned host
        memory; device buffers with CUDA_SHARDED_JIT_MPI_CUDA_AWARE=1) or "nccl"."""
        return self._transport

    def _transport_text(self) -> str:
        return {"nccl": "'nccl'", "device": "'mpi' (CUDA-aware)", "staged": "'mpi' (host staged)"}[self._exchange_how]

    @property
    def comm(self):
        """The group's communicator: the library's own duplicate of the one from_mpi took."""
        return self._comm

    def __len__(self) -> int:
        return len(self._owners)

    @property
    def devices(self) -> tuple[int, ...]:
        """The CUDA device id of every place (of every rank), on its rank's host."""
        return self._all_devices

    @property
    def locality_domains(self) -> tuple[int, ...]:
        """The host NUMA domain of every place's device (of every rank)."""
        return self._all_domains

    @property
    def archs(self) -> tuple[str, ...]:
        """The SASS architecture of each of this rank's places (the kernels it loads)."""
        return self._local.archs

    def _local_index(self, place: int) -> int:
        """The index among this rank's places of global place `place`; ValueError when another
        rank holds it."""
        place = operator.index(place)
        index = self._local_index_of.get(place)
        if index is None:
            if not 0 <= place < len(self):
                raise IndexError(f"place: {place} out of range for {len(self)} places")
            raise ValueError(f"place: {place} lives on rank {self._owners[place]}; rank {self.rank} holds "
                             f"places {self._local_places}")
        return index

    def stream(self, place: int) -> int:
        """The cudaStream_t (an int) of global place `place`, which this rank must hold."""
        return self._impl.stream(self._local_index(place))

    def _repr_html_(self) -> str:
        """A notebook's view: every place with its rank and device; this rank's marked."""
        rows = "".join(
            f"<tr><td>{place}{' *' if place in self._local_index_of else ''}</td><td>{owner}</td>"
            f"<td>cuda:{device}</td><td>{domain}</td></tr>"
            for place, (owner, device, domain) in enumerate(zip(self._owners, self._all_devices, self._all_domains)))
        return (f"<b>PlaceGroup.from_mpi</b>: rank {self.rank} of {self.nranks}, {len(self)} places, "
                f"transport {self._transport_text()} (* this rank's)"
                f"<table><tr><th>place</th><th>rank</th><th>device</th><th>NUMA domain</th></tr>{rows}</table>")

    def __repr__(self) -> str:
        shown = 16
        places = ", ".join(f"{place}: rank {owner} cuda:{device}"
                           for place, (owner, device) in enumerate(zip(self._owners[:shown], self._all_devices)))
        more = f", ... {len(self) - shown} more" if len(self) > shown else ""
        return (f"PlaceGroup.from_mpi(rank {self.rank} of {self.nranks}, transport {self._transport_text()}, "
                f"places [{places}{more}])")


def _local_devices(devices, local_rank: int) -> list[int]:
    """This rank's devices: the given list (checked as by_devices checks it), else one place
    on device local_rank % (visible devices), which needs a GPU (RuntimeError otherwise)."""
    if devices is None:
        return [local_rank % _shim.visible_device_count()]
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise TypeError(f"devices: expected a list of device ids, got {type(devices).__name__}")
    devices = list(devices)
    if not devices:
        raise ValueError("devices: every rank needs at least one place; got an empty list")
    for index, device in enumerate(devices):
        if isinstance(device, bool) or not isinstance(device, int):
            raise TypeError(f"devices[{index}]: expected an int device id, got {type(device).__name__}")
    return devices


def from_mpi(comm=None, devices=None, transport: str = "auto") -> DistributedPlaceGroup:
    """PlaceGroup.from_mpi (see there). A collective of `comm`."""
    MPI = mpi()
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise TypeError(f"comm: expected an mpi4py intracommunicator (MPI.COMM_WORLD, or one split "
                        f"from it), got {type(comm).__name__}")
    comm = comm.Dup()
    try:
        return _make(MPI, comm, devices, transport)
    except BaseException:
        comm.Free()  # every rank raises the same (agreed) error, so every rank frees it
        raise


def _make(MPI, comm, devices, transport) -> DistributedPlaceGroup:
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks of this host: local_rank
    local_rank = node.Get_rank()
    node.Free()
    error, impl, loads, aware, identities = None, None, False, False, []
    try:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport: expected one of {', '.join(map(repr, TRANSPORTS))}, got {transport!r}")
        impl = _shim.PlaceGroup.by_devices(_local_devices(devices, local_rank))
        # a device's UUID: the same GPU under two ordinals, or two GPUs both seen as 0, told apart
        identities = [device_identity(device) for device in impl.devices]
        loads = transport != "mpi" and nccl_loads()
        aware = transport != "nccl" and cuda_aware()
    except Exception as failure:  # noqa: BLE001 - every rank raises it (agree)
        error = failure
    agree(comm, error, ("from_mpi", ("transport", transport)))
    host = MPI.Get_processor_name()
    gathered = comm.allgather((list(impl.devices), list(impl.locality_domains), host, loads, aware, identities))
    owners, _ = place_layout([len(devices) for devices, *_ in gathered])
    all_devices = [device for devices, *_ in gathered for device in devices]
    all_domains = [domain for _, domains, *_ in gathered for domain in domains]
    placed = [(host, identity) for _, _, host, _, _, mine in gathered for identity in mine]
    chosen = choose_transport(transport, all(loads for _, _, _, loads, _, _ in gathered),
                              len(set(placed)) == len(placed))
    how = "nccl" if chosen == "nccl" else "device" if all(aware for *_, aware, _ in gathered) else "staged"
    group = DistributedPlaceGroup(impl, comm, owners, all_devices, all_domains, chosen, how)
    if chosen == "nccl":
        error = None
        try:
            set_devices(list(impl.devices))
        except Exception as failure:  # noqa: BLE001 - every rank raises it (agree)
            error = failure
        agree(comm, error, ("from_mpi: the NCCL devices",))
        group._nccl = Communicators(comm, len(owners), group.local_places, list(impl.devices))
        weakref.finalize(group, group._nccl.close)
    return group


def device_identity(device: int) -> str:
    """The UUID of CUDA device `device` of this process (what tells GPUs apart across the
    ranks of a host, whatever CUDA_VISIBLE_DEVICES each sees)."""
    from cuda.bindings import runtime

    status, properties = runtime.cudaGetDeviceProperties(device)
    if status != runtime.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaGetDeviceProperties({device}) failed: {status}")
    return bytes(properties.uuid.bytes).hex()


def _pinned(nbytes: int):
    """(address, free) of `nbytes` of page-locked host memory."""
    address, free = _shim.pinned_host_alloc(nbytes), _shim.pinned_host_free
    return address, lambda: free(address)
