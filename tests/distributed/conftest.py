"""The distributed tests run under mpiexec: `python tests/distributed/run.py -n 4`, or
`mpiexec -n 4 python -m pytest tests/distributed -q`. Outside mpiexec (the plain suite) they
run as one rank. Without mpi4py they are not collected.

Every rank runs every test, in the same order, so the collectives inside meet. Only rank 0
prints: the other ranks' terminal reporters are removed, their failures are sent to rank 0
at the end and printed there with their rank, and every rank exits with the worst status of
all (a failure on any rank fails the run on every rank, so mpiexec reports it whichever rank
it reads). A test that fails on one rank alone may leave the others waiting in a collective
(MPI has no timeouts): run.py bounds every run with a timeout.

Tests compute every collective first and assert after, so that an assertion failing on one
rank never skips a collective the other ranks still make.
"""

from __future__ import annotations

import os

import pytest

try:
    from mpi4py import MPI
except ImportError:  # the layer is optional: nothing here runs without mpi4py
    MPI = None
    collect_ignore_glob = ["test_*.py"]

WORLD = MPI.COMM_WORLD if MPI is not None else None
RANK = WORLD.Get_rank() if WORLD is not None else 0
SIZE = WORLD.Get_size() if WORLD is not None else 1

_failures: list[tuple[str, str, str]] = []


def _launched_ranks() -> int:
    """How many ranks the launcher started, by its environment (1 where it says nothing)."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):  # MPICH's hydra; Open MPI's mpirun
        text = os.environ.get(name, "")
        if text.isdigit():
            return int(text)
    return 1


@pytest.hookimpl(trylast=True)  # after the terminal plugin has made its reporter
def pytest_configure(config):
    if WORLD is not None and SIZE == 1 and _launched_ranks() > 1:
        # mpi4py loaded another MPI than the launcher's: every rank would run alone and pass
        pytest.exit(f"mpiexec started {_launched_ranks()} ranks, but each sees a world of one: mpi4py "
                    f"loaded {MPI.Get_library_version().splitlines()[0]!r}, not the launcher's MPI "
                    "(set MPI4PY_MPIABI, and make that library findable; docs/distributed.md)", returncode=4)
    if SIZE > 1 and RANK != 0:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


def pytest_runtest_logreport(report):
    if report.failed:
        _failures.append((report.nodeid, report.when, report.longreprtext[-4000:]))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if WORLD is None or SIZE == 1:
        return
    gathered = WORLD.gather(_failures, root=0)
    failed = 0 if exitstatus in (0, 5) else 1  # 5: nothing collected (the same on every rank)
    if WORLD.allreduce(failed, op=MPI.MAX):
        session.exitstatus = 1
    if RANK != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    write = reporter.write_line if reporter is not None else print
    if reporter is not None:
        reporter.write_sep("-", f"the other {SIZE - 1} ranks")
    for rank, failures in enumerate(gathered[1:], 1):
        for nodeid, when, text in failures:
            write(f"rank {rank} of {SIZE}: FAILED {nodeid} ({when})")
            for line in text.splitlines():
                write(f"  [rank {rank}] {line}")
    others = sum(len(failures) for failures in gathered[1:])
    write(f"failures on the other ranks: {others}" if others else "no failures on the other ranks")


@pytest.fixture(scope="session")
def world():
    """MPI.COMM_WORLD."""
    return WORLD


def allgather(value):
    """Every rank's `value`, in rank order (for assertions that compare ranks)."""
    return WORLD.allgather(value)


def outcome_of(call):
    """(exception type name, message) of what `call()` raised, or None: what ranks compare."""
    try:
        call()
    except Exception as error:  # noqa: BLE001
        return type(error).__name__, str(error)
    return None


def ties_and_nans(dtype, n, seed, span=20, infinities=3):
    """Few distinct values (integers in [-span, span): many ties), and for floats NaNs, -0.0
    and `infinities` of each sign."""
    import numpy as np

    rng = np.random.default_rng(seed)
    host = rng.integers(-span, span, n).astype(dtype)
    if np.dtype(dtype).kind == "f":
        host[rng.integers(0, n, n // 10)] = np.nan
        host[rng.integers(0, n, n // 20)] = -0.0
        host[rng.integers(0, n, infinities)] = np.inf
        host[rng.integers(0, n, infinities)] = -np.inf
    return host

