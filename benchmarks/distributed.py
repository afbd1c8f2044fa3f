"""The cost of crossing processes: a reduce of 2^28 float32 on a PlaceGroup.from_mpi group
of R ranks against the same reduce in one rank, every rank's place on the same GPUs as the
one rank's (by default all on device 0: what one GPU shows is the MPI transport's own
overhead, the agreement and the allgather of the places' partials, since the GPU's work is
the same 2^28 elements either way). Target: R = 2 within 1.2x the one-rank time.

    python benchmarks/distributed.py [--ranks 1 2] [--n 268435456] [--repeats 30]

It runs itself under mpiexec once per rank count (the mpiexec beside this Python, as the
mpich wheel installs it, else the one on PATH, else --mpiexec) and prints, per count, the
median over the repeats of the slowest rank's time per call (each call starts after a
barrier, and returns the sum on every rank), and each count's ratio to the first. Beside it,
what the call is made of: every rank's one-process sum of its own part at the same time (the
GPU's work with no MPI: ranks on one GPU share it), and a sum of one element a rank (the
agreements, the allgather of the partials and a launch), and the MPI part of that alone (two
agreements and an allgather, no GPU work).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TARGET = 1.2


def _timed(comm, call, repeats: int) -> list[float]:
    """The slowest rank's seconds per call, each call after a barrier."""
    from mpi4py import MPI

    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        call()
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return times


def worker(n: int, repeats: int) -> None:
    import numpy as np
    from mpi4py import MPI

    import cuda_sharded_jit as sharded
    from cuda_sharded_jit.distributed._agreement import agree
    from cuda_sharded_jit.distributed._sorting import local

    comm = MPI.COMM_WORLD
    group = sharded.PlaceGroup.from_mpi(devices=[0], transport="mpi")
    sizes = [n // comm.size + (1 if rank < n % comm.size else 0) for rank in range(comm.size)]
    a = sharded.ShardedArray.allocate(group, sizes, np.float32)
    sharded.fill(a, 1.0)
    tiny = sharded.ShardedArray.allocate(group, [1] * comm.size, np.float32)
    sharded.fill(tiny, 1.0)
    mine = local(a)  # this rank's part as a one-process array: its GPU work alone, no MPI
    for _ in range(3):
        sharded.sum(a), sharded.sum(tiny), sharded.sum(mine)
    total = sharded.sum(a)
    if abs(float(total) - n) > 1e-3 * n:  # ones: float32 partial sums round only past 2^24
        raise SystemExit(f"the sum is {total}, not {n}")
    rows = {"whole": _timed(comm, lambda: sharded.sum(a), repeats),
            "local": _timed(comm, lambda: sharded.sum(mine), repeats),
            "control": _timed(comm, lambda: sharded.sum(tiny), repeats),
            "mpi": _timed(comm, lambda: (agree(group.comm, None, ("a",)), group.comm.allgather(b"12345678"),
                                         agree(group.comm, None, ("b",))), repeats)}
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, **{f"{name}_ms": float(np.median(times)) * 1e3
                                                 for name, times in rows.items()},
                          "best_ms": float(np.min(rows["whole"])) * 1e3}), flush=True)


def find_mpiexec(given: str | None) -> str:
    for candidate in (given, str(Path(sys.executable).parent / "mpiexec"), shutil.which("mpiexec")):
        if candidate and Path(candidate).exists():
            return candidate
    raise SystemExit("no mpiexec: pip install mpich (or pass --mpiexec)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--n", type=int, default=1 << 28)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--mpiexec", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        worker(arguments.n, arguments.repeats)
        return 0
    mpiexec = find_mpiexec(arguments.mpiexec)
    rows = []
    for ranks in arguments.ranks:
        command = [mpiexec, "-n", str(ranks), sys.executable, __file__, "--worker", "--n", str(arguments.n),
                   "--repeats", str(arguments.repeats)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ))
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
            return 1
        rows.append(json.loads(lines[-1]))
    base = rows[0]["whole_ms"]
    print(f"reduce (sum) of {arguments.n} float32, one place a rank, transport 'mpi'")
    print("| ranks | median ms | best ms | × first | this rank's part alone, ms | one element a rank, ms "
          "| MPI alone, ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['ranks']} | {row['whole_ms']:.3f} | {row['best_ms']:.3f} | {row['whole_ms'] / base:.2f} "
              f"| {row['local_ms']:.3f} | {row['control_ms']:.3f} | {row['mpi_ms']:.4f} |")
    for row in rows[1:]:
        if row["ranks"] == 2:
            ratio = row["whole_ms"] / base
            print(f"target: 2 ranks ≤ {TARGET} × 1 rank: {ratio:.2f} ({'pass' if ratio <= TARGET else 'miss'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
