"""Runs the distributed tests under mpiexec, once per rank count, each run bounded by a
timeout (MPI has none: a rank that never reaches a collective leaves the others waiting).
Exits non-zero when any run fails or times out; prints each run's time.

    python tests/distributed/run.py                      # 1, 2 and 4 ranks
    python tests/distributed/run.py -n 2 -n 4 --timeout 600 -- -k scan -m gpu

mpiexec is the one beside this Python (the mpich wheel's, in a virtual environment), else the
one on PATH, else --mpiexec. Arguments after `--` go to pytest.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def find_mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


def run(mpiexec: str, ranks: int, timeout: float, pytest_args: list[str]) -> tuple[str, float]:
    """('passed' | 'failed (status N)' | 'timed out', seconds) of one mpiexec run."""
    # -P: the checkout is not put on sys.path, so the installed package is the one imported
    command = [mpiexec, "-n", str(ranks), sys.executable, "-P", "-m", "pytest", str(HERE), "-q",
               "-p", "no:cacheprovider", *pytest_args]
    start = time.monotonic()
    process = subprocess.Popen(command, start_new_session=True)  # its own group: killed whole
    try:
        status = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return "timed out", time.monotonic() - start
    return ("passed" if status == 0 else f"failed (status {status})"), time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = []
    if "--" in argv:
        at = argv.index("--")
        argv, pytest_args = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", dest="ranks", type=int, action="append", help="ranks (repeatable; 1, 2, 4 if none)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run (default 300)")
    parser.add_argument("--mpiexec", default=None, help="the mpiexec to use")
    options = parser.parse_args(argv)
    mpiexec = options.mpiexec or find_mpiexec()
    if mpiexec is None:
        print("no mpiexec found: pip install mpich (it brings one), or pass --mpiexec", file=sys.stderr)
        return 2
    results = []
    for ranks in options.ranks or [1, 2, 4]:
        outcome, seconds = run(mpiexec, ranks, options.timeout, pytest_args)
        results.append(outcome)
        print(f"distributed tests, {ranks} rank{'s' if ranks > 1 else ''}: {outcome} in {seconds:.1f} s",
              flush=True)
    return 0 if all(outcome == "passed" for outcome in results) else 1


if __name__ == "__main__":
    sys.exit(main())
