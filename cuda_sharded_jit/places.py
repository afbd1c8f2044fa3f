"""PlaceGroup: the ordered places (one GPU and one stream each) that arrays are sharded over."""

from __future__ import annotations

from collections.abc import Sequence

from . import _shim


class PlaceGroup:
    """An ordered list of places; place i holds shard i of every array of the group.

    The group itself lives in the C++ shim; this class is a thin, documented view of it.

    >>> g = PlaceGroup.by_devices([0, 0])       # two places on one GPU  # doctest: +SKIP
    >>> len(g), g.devices                                                # doctest: +SKIP
    (2, (0, 0))
    """

    __slots__ = ("_impl", "_archs", "__weakref__")
    _distributed = False  # a from_mpi group (distributed/_group.py) spans processes

    def __init__(self, impl: _shim.PlaceGroup):
        if not isinstance(impl, _shim.PlaceGroup):
            raise TypeError(
                "use PlaceGroup.by_devices(...) or PlaceGroup.by_locality_domains() to make a group"
            )
        self._impl = impl
        self._archs = None

    @classmethod
    def by_devices(cls, devices: Sequence[int] | None = None) -> PlaceGroup:
        """One place per listed device, in order (all visible devices when None).

        A device may appear several times: several places, each with its own stream, on one
        GPU. That is how a single-GPU machine runs every cross-place code path.

        >>> g = PlaceGroup.by_devices([0, 0, 0])                  # doctest: +SKIP
        """
        if devices is not None:
            if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
                raise TypeError(f"devices: expected a list of device ids, got {type(devices).__name__}")
            devices = list(devices)
            for index, device in enumerate(devices):
                if isinstance(device, bool) or not isinstance(device, int):
                    raise TypeError(
                        f"devices[{index}]: expected an int device id, got {type(device).__name__}"
                    )
        return cls(_shim.PlaceGroup.by_devices(devices))

    @classmethod
    def by_locality_domains(cls) -> PlaceGroup:
        """Every visible device, one place each, ordered so that the devices of one host NUMA
        domain are adjacent (then by device id). `locality_domains` gives each place's domain.

        >>> g = PlaceGroup.by_locality_domains()                  # doctest: +SKIP
        >>> g.locality_domains                                    # doctest: +SKIP
        (0, 0, 1, 1)
        """
        return cls(_shim.PlaceGroup.by_locality_domains())

    @classmethod
    def from_mpi(cls, comm=None, devices=None, transport: str = "auto") -> PlaceGroup:
        """A group over every rank of an MPI communicator (`comm`, default MPI.COMM_WORLD),
        for SPMD jobs (mpiexec -n 4 python script.py). A collective: every rank calls it.

        Places are numbered globally in rank order, then local order; shard i lives on global
        place i, as in one process. By default each rank has one place, on device
        local_rank % (its host's visible GPUs); `devices=[...]` gives a rank several places.
        `transport`: "mpi" (data between ranks through MPI, staged through pinned host
        memory; device buffers with CUDA_SHARDED_JIT_MPI_CUDA_AWARE=1), "nccl" (GPU data
        through NCCL) or "auto" (NCCL where it loads on every rank and every place's GPU is
        distinct, else MPI).
        Every algorithm on its arrays is a collective: see docs/distributed.md. Needs mpi4py.

        >>> g = sharded.PlaceGroup.from_mpi(transport="mpi")                 # doctest: +SKIP
        >>> g.rank, g.nranks, g.local_places, g.transport                   # doctest: +SKIP
        (0, 2, (0,), 'mpi')
        """
        from .distributed._group import from_mpi

        return from_mpi(comm, devices, transport)

    def __len__(self) -> int:
        return len(self._impl)

    @property
    def rank(self) -> int:
        """This process's rank: 0 on a one-process group (see from_mpi)."""
        return 0

    @property
    def nranks(self) -> int:
        """The number of processes the group spans: 1 (see from_mpi)."""
        return 1

    @property
    def local_places(self) -> tuple[int, ...]:
        """The places this process holds: all of a one-process group's (see from_mpi)."""
        return tuple(range(len(self)))

    @property
    def devices(self) -> tuple[int, ...]:
        """The CUDA device id of each place."""
        return tuple(self._impl.devices)

    @property
    def locality_domains(self) -> tuple[int, ...]:
        """The host NUMA domain of each place's device (0 where the platform reports none)."""
        return tuple(self._impl.locality_domains)

    def stream(self, place: int) -> int:
        """The place's cudaStream_t, as an int (non-blocking stream, owned by the group)."""
        return self._impl.stream(place)

    def sync(self) -> None:
        """Wait until all work queued on every place's stream has finished."""
        self._impl.sync()

    def release_cached_memory(self) -> None:
        """Wait for every place, then hand the device memory that freed arrays left cached in
        the library's stream-ordered pools on the group's devices (kept for fast reuse, and
        shared with other groups on those devices) back to the driver. The devices' default
        pools, which other libraries may use, are never touched."""
        self._impl.release_cached_memory()

    @property
    def archs(self) -> tuple[str, ...]:
        """The SASS architecture of each place's device, e.g. ("sm_90", "sm_90")."""
        if self._archs is None:
            self._archs = tuple(f"sm_{major}{minor}" for major, minor in
                                (self._impl.compute_capability(place) for place in range(len(self))))
        return self._archs

    def _repr_html_(self) -> str:
        """A notebook's view: a table of the places (device, NUMA domain, architecture)."""
        rows = "".join(f"<tr><td>{place}</td><td>cuda:{device}</td><td>{domain}</td><td>{arch}</td></tr>"
                       for place, (device, domain, arch)
                       in enumerate(zip(self.devices, self.locality_domains, self.archs)))
        return (f"<b>PlaceGroup</b> of {len(self)} place{'' if len(self) == 1 else 's'}"
                f"<table><tr><th>place</th><th>device</th><th>NUMA domain</th><th>arch</th></tr>"
                f"{rows}</table>")

    def __repr__(self) -> str:
        places = ", ".join(
            f"{place}: cuda:{device} (numa {domain})"
            for place, (device, domain) in enumerate(zip(self.devices, self.locality_domains))
        )
        return f"PlaceGroup([{places}])"
