"""CPU tests of PlaceGroup.from_mpi and the layer's edges under mpiexec: clear errors where
there is no GPU (the same on every rank), argument checks, the NCCL loader failing cleanly,
and calls that refuse from_mpi arrays before anything runs. No GPU needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import RANK, SIZE, WORLD, allgather, outcome_of

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim
from cuda_sharded_jit.distributed import _nccl


def _device_count() -> int:
    try:
        return _shim.visible_device_count()
    except RuntimeError:
        return 0


NO_GPU = _device_count() == 0


@pytest.mark.skipif(not NO_GPU, reason="a GPU is visible")
def test_from_mpi_without_a_gpu_is_the_same_runtime_error_on_every_rank():
    outcomes = allgather(outcome_of(lambda: sharded.PlaceGroup.from_mpi()))
    assert len(set(outcomes)) == 1
    kind, text = outcomes[0]
    assert kind == "RuntimeError" and "GPU" in text


@pytest.mark.skipif(not NO_GPU, reason="a GPU is visible")
def test_from_mpi_with_devices_without_a_gpu_is_a_runtime_error_too():
    outcomes = allgather(outcome_of(lambda: sharded.PlaceGroup.from_mpi(devices=[0], transport="mpi")))
    assert len(set(outcomes)) == 1 and outcomes[0][0] == "RuntimeError"


def test_from_mpi_checks_its_arguments_on_every_rank():
    outcomes = allgather(outcome_of(lambda: sharded.PlaceGroup.from_mpi(transport="tcp")))
    assert outcomes == [("ValueError", "transport: expected one of 'auto', 'nccl', 'mpi', got 'tcp'")] * SIZE
    # one rank alone passes a bad device list: every rank raises its error
    devices = "0" if RANK == SIZE - 1 else [0]
    outcomes = allgather(outcome_of(lambda: sharded.PlaceGroup.from_mpi(devices=devices, transport="mpi")))
    if NO_GPU and SIZE > 1:  # the lower ranks' missing GPU comes first
        assert len(set(outcomes)) == 1 and outcomes[0][0] == "RuntimeError"
    else:
        assert outcomes == [("TypeError", "devices: expected a list of device ids, got str")] * SIZE
    assert outcome_of(lambda: sharded.PlaceGroup.from_mpi(comm=42)) == (
        "TypeError", "comm: expected an mpi4py intracommunicator (MPI.COMM_WORLD, or one split from it), got int")
    outcomes = allgather(outcome_of(lambda: sharded.PlaceGroup.from_mpi(devices=[], transport="mpi")))
    assert len(set(outcomes)) == 1
    if not NO_GPU or SIZE == 1:
        assert outcomes[0] == ("ValueError", "devices: every rank needs at least one place; got an empty list")


def test_the_package_imports_and_runs_without_mpi4py(tmp_path):
    code = ("import sys; sys.modules['mpi4py'] = None\n"  # an import of mpi4py now fails
            "import cuda_sharded_jit as sharded\n"
            "try:\n"
            "    sharded.PlaceGroup.from_mpi()\n"
            "except ModuleNotFoundError as error:\n"
            "    print('refused:', error)\n")
    if RANK != 0:
        return  # one child process is enough
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                            env=_child_environment())
    assert result.returncode == 0, result.stderr
    assert "refused: PlaceGroup.from_mpi needs mpi4py and an MPI library: pip install" in result.stdout


def _child_environment():
    """This process's environment without the MPI launcher's variables (a child is no rank)."""
    import os

    return {name: value for name, value in os.environ.items()
            if not name.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "MPICH_"))}


def test_nccl_loader_fails_cleanly_when_absent(monkeypatch, tmp_path):
    monkeypatch.setattr(_nccl, "_loaded", None)
    missing = tmp_path / "libnccl.so.2"
    monkeypatch.setenv(_nccl.ENV_NCCL, str(missing))
    with pytest.raises(RuntimeError, match=r"NCCL: libnccl.so.2 could not be loaded .*CUDA_SHARDED_JIT_NCCL=.*libnccl.so.2"):
        _nccl.load_nccl()
    assert _nccl.nccl_loads() is False
    monkeypatch.setenv(_nccl.ENV_NCCL, "libc.so.6")  # a library that loads but is not NCCL
    with pytest.raises(RuntimeError, match="ncclGetVersion"):
        _nccl.load_nccl()
    assert _nccl._loaded is None


def test_nccl_loader_reads_the_version_where_nccl_is_installed(monkeypatch):
    monkeypatch.setattr(_nccl, "_loaded", None)
    monkeypatch.delenv(_nccl.ENV_NCCL, raising=False)
    if not _nccl.nccl_loads():
        pytest.skip("no NCCL here (pip install nvidia-nccl-cu13)")
    major, minor, _ = _nccl.nccl_version()
    assert major == 2 and minor >= 18


def test_one_process_groups_take_root_0_or_none():
    from cuda_sharded_jit.array import check_one_process_root

    check_one_process_root(0)
    check_one_process_root(None)
    with pytest.raises(ValueError, match="root: a one-process group has one rank, 0; got 2"):
        check_one_process_root(2)


def test_world_is_the_launcher_s():
    assert WORLD.Get_size() == SIZE and WORLD.Get_rank() == RANK
