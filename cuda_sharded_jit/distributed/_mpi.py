"""mpi4py, imported at its first use: the package imports, and runs on one process, without
it (mpi4py 4 ships no MPI library: the site's, or the `mpich` wheel's, with its mpiexec)."""

from __future__ import annotations

INSTALL_HINT = ("pip install 'cuda-sharded-jit[mpi]' (mpi4py), with an MPI library: the site's, "
                "or pip install mpich, which brings mpiexec")


def mpi():
    """The mpi4py.MPI module; ModuleNotFoundError that says what to install otherwise."""
    try:
        from mpi4py import MPI
    except ImportError as error:
        raise ModuleNotFoundError(f"PlaceGroup.from_mpi needs mpi4py and an MPI library: "
                                  f"{INSTALL_HINT} ({error})") from error
    return MPI
