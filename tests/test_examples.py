"""Every example runs and checks itself against numpy (GPU examples need a GPU)."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True,
                          cwd=EXAMPLES, timeout=600)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["quickstart.py", "black_scholes.py", "reductions.py", "scans.py",
                                  "sort_and_histogram.py", "interop.py", "argmin.py", "welford.py",
                                  "log_sum_exp.py", "sorting_records.py", "filter_and_rebalance.py",
                                  "group_by.py", "segment_statistics.py", "notebook_tour.py",
                                  "captured_loop.py"])
def test_gpu_example(name):
    result = _run(name)
    assert result.returncode == 0, result.stderr


def test_inspect_operator_runs_without_a_gpu():
    result = _run("inspect_operator.py")
    assert result.returncode == 0, result.stderr
    assert "inlined: yes" in result.stdout
    fused = [line for line in result.stdout.splitlines() if "FFMA R" in line]
    assert len(fused) == 4  # alpha * x + y on the four elements of a vectorised load


def test_gpu_examples_explain_a_missing_gpu():
    from conftest import DEVICE_COUNT

    if DEVICE_COUNT:
        pytest.skip("a GPU is visible")
    result = _run("reductions.py")
    assert result.returncode == 2 and "needs a CUDA GPU" in result.stderr


def test_notebook_tour_explains_a_missing_gpu_and_succeeds():
    """A notebook's cells stop quietly where there is no GPU: status 0, and why on stdout."""
    from conftest import DEVICE_COUNT

    if DEVICE_COUNT:
        pytest.skip("a GPU is visible")
    result = _run("notebook_tour.py")
    assert result.returncode == 0, result.stderr
    assert "no CUDA GPU is visible, so there is nothing to run" in result.stdout
