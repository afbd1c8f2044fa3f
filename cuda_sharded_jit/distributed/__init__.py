"""The multi-process layer: PlaceGroup.from_mpi groups span the ranks of an MPI job (one or
more places per rank), and every algorithm on their arrays is a collective.

mpi4py starts the job and carries the control messages; in this version the "mpi" transport
also carries the data, staged through host memory (docs/distributed.md: launching, the
collective contract, what each algorithm moves). Nothing here is imported by
`import cuda_sharded_jit`, and mpi4py only at the first use of a from_mpi group.

Modules: _group (the group), _arrays (its arrays, data in and out, resharding), _algorithms
(the cross-rank steps of reductions, scans and counts), _sorting (sorts, selections,
top_k, searchsorted), _runs (the algorithms by key), _agreement (the contract: agreement
and abort), _plans (the host-side logic as pure functions), _nccl (finding NCCL), _mpi.
"""

from ._agreement import agree
from ._nccl import load_nccl, nccl_version

__all__ = ["agree", "load_nccl", "nccl_version"]
