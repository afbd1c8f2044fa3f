"""CPU tests of the collective contract (distributed/_agreement.py) under mpiexec: an error
that one rank hits alone is raised on every rank with the same class and text, and ranks
that make different calls get a ValueError, never a hang. No GPU involved."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest

from .conftest import RANK, SIZE, WORLD, allgather

from cuda_sharded_jit.distributed import _agreement
from cuda_sharded_jit.distributed._agreement import agree, begin, gather, is_agreed, run


class CustomError(Exception):
    """Defined at module level: picklable by reference, rebuilt as itself on every rank."""


def _group():
    """What the agreement needs of a group: its communicator and its lock."""
    return types.SimpleNamespace(comm=WORLD.Dup(), _lock=threading.RLock())


def _outcome(call):
    """(class name, text) of what `call` raised, or None; always returns, so that every rank
    reaches the assertions (and the next test's collectives)."""
    try:
        call()
    except Exception as error:  # noqa: BLE001
        return type(error).__name__, str(error), is_agreed(error)
    return None


def test_agree_returns_when_every_rank_is_well():
    assert _outcome(lambda: agree(WORLD, None, ("reduce", ("shard sizes", (4, 4))))) is None


@pytest.mark.parametrize("failing", sorted({0, SIZE - 1}))
def test_one_rank_s_error_is_raised_on_every_rank(failing):
    def call():
        error = None
        if RANK == failing:
            try:
                raise TypeError("op: takes 1 argument, but reduce passes 2")
            except TypeError as caught:
                error = caught
        agree(WORLD, error, ("reduce",))

    outcomes = allgather(_outcome(call))
    assert outcomes == [("TypeError", "op: takes 1 argument, but reduce passes 2", True)] * SIZE


def test_the_lowest_failing_rank_s_error_wins():
    error = ValueError(f"sizes: rank {RANK} is wrong") if RANK > 0 or SIZE == 1 else None
    outcomes = allgather(_outcome(lambda: agree(WORLD, error, ("allocate",))))
    first = 1 if SIZE > 1 else 0
    assert outcomes == [("ValueError", f"sizes: rank {first} is wrong", True)] * SIZE


def test_error_classes_travel_by_reference_with_their_text():
    def call():
        agree(WORLD, CustomError("from the last rank") if RANK == SIZE - 1 else None, ("x",))

    assert allgather(_outcome(call)) == [("CustomError", "from the last rank", True)] * SIZE
    memory = MemoryError("out of memory on device 0: 2.0 GiB asked")
    assert allgather(_outcome(lambda: agree(WORLD, memory if RANK == 0 else None, ("x",)))) == \
        [("MemoryError", "out of memory on device 0: 2.0 GiB asked", True)] * SIZE


def test_an_exception_that_cannot_travel_becomes_a_runtime_error_naming_it():
    class Local(Exception):  # not importable by name: cannot be pickled by reference
        pass

    def call():
        agree(WORLD, Local("a local error") if RANK == 0 else None, ("x",))

    outcomes = allgather(_outcome(call))
    if SIZE == 1:
        assert outcomes == [("Local", "a local error", True)]  # the failing rank raises its own
    else:
        text = f"{__name__}.test_an_exception_that_cannot_travel_becomes_a_runtime_error_naming_it.<locals>.Local: a local error"
        assert outcomes[1:] == [("RuntimeError", text, True)] * (SIZE - 1)
        assert outcomes[0] == ("Local", "a local error", True)


def test_different_calls_are_a_value_error_naming_the_difference():
    sizes = (500, 500) if RANK == 0 else (500, 600)
    outcomes = allgather(_outcome(lambda: agree(WORLD, None, ("reduce", ("shard sizes", sizes), ("dtype", "<f4")))))
    if SIZE == 1:
        assert outcomes == [None]
        return
    assert len(set(outcomes)) == 1
    kind, text, agreed = outcomes[0]
    assert kind == "ValueError" and agreed
    assert text.startswith("reduce: called with shard sizes (500, 600) on rank 1, (500, 500) on rank 0")
    assert "same collective calls, in the same order" in text
    names = ["reduce" if RANK == 0 else "inclusive_scan"]
    outcomes = allgather(_outcome(lambda: agree(WORLD, None, (names[0],))))
    assert outcomes == [("ValueError", "collective: rank 1 is at inclusive_scan where rank 0 is at reduce: "
                         "every rank must make the same collective calls, in the same order, on arrays of "
                         "the same shard sizes", True)] * SIZE


def test_a_collective_agrees_on_an_error_raised_before_its_data_moves():
    group = _group()

    def body():
        if RANK == SIZE - 1:
            raise TypeError("op: numba cannot type it")
        return gather(group, RANK, ("reduce",))

    outcomes = allgather(_outcome(lambda: run(group, "reduce", body)))
    assert outcomes == [("TypeError", "op: numba cannot type it", True)] * SIZE


def test_a_collective_agrees_on_an_error_after_an_inner_collective_finished():
    group = _group()

    def inner():
        return gather(group, RANK, ("inner",))

    def outer():
        ranks = run(group, "inner", inner)
        if RANK == 0:
            raise ValueError("out: shard sizes differ")  # after the inner call agreed and ended
        begin(group, ("outer",))
        return ranks

    outcomes = allgather(_outcome(lambda: run(group, "outer", outer)))
    assert outcomes == [("ValueError", "out: shard sizes differ", True)] * SIZE


def test_a_collective_that_succeeds_returns_on_every_rank():
    group = _group()
    result = run(group, "gather", lambda: gather(group, RANK * 10, ("gather",)))
    assert result == [rank * 10 for rank in range(SIZE)]
    assert allgather(result) == [result] * SIZE


def test_an_error_after_the_data_moved_on_every_rank_alike_is_agreed_not_aborted():
    group = _group()

    def body():
        values = gather(group, RANK, ("reduce",))
        raise ValueError(f"reduce: the array is empty ({len(values)} ranks)")  # deterministic

    outcomes = allgather(_outcome(lambda: run(group, "reduce", body)))
    assert outcomes == [("ValueError", f"reduce: the array is empty ({SIZE} ranks)", True)] * SIZE


def test_an_error_while_data_moves_aborts(monkeypatch):
    # The abort itself would end the job: here it is recorded instead.
    group = _group()
    aborted = []
    monkeypatch.setattr(_agreement, "abort", lambda comm, name, error: aborted.append((name, str(error))))

    def body():
        begin(group, ("to_numpy",))
        with _agreement.moving(group):
            raise OSError("the link went down")

    outcome = _outcome(lambda: run(group, "to_numpy", body))
    # after the (recorded) abort, run agrees on the error: every rank raised the same here
    assert aborted == [("to_numpy", "the link went down")]
    assert allgather(outcome) == [("OSError", "the link went down", True)] * SIZE


def test_agreement_statuses_are_one_allreduce_of_three_int64():
    code = _agreement.signature_code(("reduce", ("shard sizes", (1, 2))))
    assert code == _agreement.signature_code(("reduce", ("shard sizes", (1, 2))))
    assert 0 <= code < 1 << 61
    assert allgather(code) == [code] * SIZE  # the same in every process (not Python's salted hash)
    assert np.int64(-code) == -code


_ABORTING_JOB = '''
import threading, types
from mpi4py import MPI
from cuda_sharded_jit.distributed._agreement import begin, moving, run
comm = MPI.COMM_WORLD
group = types.SimpleNamespace(comm=comm.Dup(), _lock=threading.RLock())
def body():
    begin(group, ("to_numpy",))
    with moving(group):
        if comm.Get_rank() == 1:
            raise OSError("the link went down")
        group.comm.recv(source=1)  # rank 0 waits for data that never comes
run(group, "to_numpy", body)
'''


def test_an_error_while_data_moves_ends_the_job_rather_than_hangs(tmp_path):
    # A job of its own (two ranks under the mpiexec beside this Python), started by rank 0.
    import os
    import subprocess
    import sys
    from pathlib import Path

    mpiexec = Path(sys.executable).parent / "mpiexec"
    if RANK != 0 or not mpiexec.exists():
        return
    script = tmp_path / "aborting_job.py"
    script.write_text(_ABORTING_JOB)
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPICH_"))}
    result = subprocess.run([str(mpiexec), "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                            env=environment, timeout=120)
    assert result.returncode != 0
    assert "rank 1 of 2: to_numpy failed while data moved between the ranks" in result.stderr
    assert "OSError: the link went down" in result.stderr
