"""A stand-in for libnccl on the CPU, for the host-backed tests: the calls the NCCL transport
makes (communicators per place, grouped ncclSend / ncclRecv) carried out by MPI between the
processes, on the host buffers of host_shim's arrays. It checks what a real NCCL requires of
the calls (sends and receives only inside a group, one communicator per NCCL rank, a
matching receive for every send: sizes compared) so that the transport's bookkeeping, which
place sends what to which, runs against numpy without GPUs."""

from __future__ import annotations

import ctypes

from mpi4py import MPI


class FakeNccl:
    def __init__(self):
        self._comm = MPI.COMM_WORLD.Dup()
        self._depth = 0
        self._queued = []      # ("send" | "recv", address, nbytes, my place, peer place)
        self._inits = []       # (handle object, place)
        self._rank_of = None   # place -> MPI rank, learnt when the communicators are made
        self._place_of = {}    # handle value -> place
        self.exchanges = 0     # NCCL groups that moved data
        self.destroyed = []

    # -- what _nccl declares prototypes for
    def ncclGetVersion(self, out):
        out._obj.value = 23009
        return 0

    # as a real id: a socket address after a magic number, NULs in between
    IDENTITY = bytes(range(7)) + b"\0\0" + bytes(range(200, 255)) + b"\0" * 60 + b"\x02\x00\x7f\x01"

    def ncclGetUniqueId(self, out):
        ctypes.memmove(ctypes.addressof(out._obj), self.IDENTITY, len(self.IDENTITY))
        return 0

    def ncclCommInitRank(self, handle, nranks, identity, place):
        assert self._depth > 0, "the communicators are made inside a group"
        assert bytes(identity) == self.IDENTITY, "the unique id did not reach this rank whole"
        self._inits.append((handle._obj, place))
        self._nranks = nranks
        return 0

    def ncclGroupStart(self):
        self._depth += 1
        return 0

    def ncclGroupEnd(self):
        self._depth -= 1
        assert self._depth >= 0, "ncclGroupEnd without ncclGroupStart"
        if self._depth:
            return 0
        if self._inits:
            for handle, place in self._inits:
                handle.value = 1000 + place
                self._place_of[handle.value] = place
            everyone = self._comm.allgather([place for _, place in self._inits])
            self._rank_of = {place: rank for rank, places in enumerate(everyone) for place in places}
            assert sorted(self._rank_of) == list(range(self._nranks))
            self._inits = []
        if self._queued:
            self._run(self._queued)
            self._queued = []
            self.exchanges += 1
        return 0

    def _queue(self, kind, address, nbytes, datatype, peer, comm, stream):
        assert self._depth > 0, f"nccl{kind.title()} outside a group"
        assert datatype == 1 and nbytes > 0 and 0 <= peer < self._nranks
        self._queued.append((kind, address, nbytes, self._place_of[comm.value], peer))
        return 0

    def ncclSend(self, address, nbytes, datatype, peer, comm, stream):
        return self._queue("send", address, nbytes, datatype, peer, comm, stream)

    def ncclRecv(self, address, nbytes, datatype, peer, comm, stream):
        return self._queue("recv", address, nbytes, datatype, peer, comm, stream)

    def _run(self, queued):
        """NCCL matches the k-th send from place a to place b with the k-th receive on b from a."""
        requests, counter = [], {}
        for kind, address, nbytes, mine, peer in queued:
            pair = (mine, peer) if kind == "send" else (peer, mine)
            k = counter[(kind, pair)] = counter.get((kind, pair), -1) + 1
            tag = (pair[0] * 64 + pair[1]) * 64 + k
            buffer = MPI.buffer.fromaddress(address, nbytes)
            if kind == "send":
                requests.append(self._comm.Isend([buffer, MPI.BYTE], dest=self._rank_of[peer], tag=tag))
            else:
                requests.append(self._comm.Irecv([buffer, MPI.BYTE], source=self._rank_of[peer], tag=tag))
        statuses = [MPI.Status() for _ in requests]
        MPI.Request.Waitall(requests, statuses)
        for (kind, _, nbytes, _, _), status in zip(queued, statuses):
            if kind == "recv":
                assert status.Get_count(MPI.BYTE) == nbytes, "a receive of another size than its send"

    def ncclCommGetAsyncError(self, comm, out):
        out._obj.value = 0
        return 0

    def ncclCommAbort(self, comm):
        self.destroyed.append(comm.value)
        return 0

    def ncclGetErrorString(self, status):
        return b"fake error"

    def ncclGetLastError(self, comm):
        return b""


def install(monkeypatch) -> FakeNccl:
    """The stand-in as the loaded NCCL (and cudaSetDevice a no-op), for one test."""
    from cuda_sharded_jit.distributed import _group, _nccl

    fake = FakeNccl()
    monkeypatch.setattr(_nccl, "load_nccl", lambda: fake)
    monkeypatch.setattr(_nccl, "_set_device", lambda device: None)
    monkeypatch.setattr(_group, "nccl_loads", lambda: True)
    return fake
