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

With --gpu-per-rank (a machine of several GPUs: every rank on a GPU of its own, the
transport --transport, "auto" taking NCCL where it loads) it measures the multi-GPU rows
instead, each count against one rank: a reduce of --n float32 a rank (target at 2 ranks
≤ 1.1× one), a transform of --n float32 a rank (its throughput, target ≥ 1.9× one), and a
sort of --sort-n int32 in all (target ≥ 1.4× cupy.sort of the same keys on one GPU, timed
in the one-rank run).

    python benchmarks/distributed.py --gpu-per-rank --ranks 1 2 [--transport nccl]
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
TARGETS_BY_GPU = {"reduce": 1.1, "transform": 1.9, "sort": 1.4}  # at 2 ranks, a GPU each


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


def worker_per_gpu(n: int, sort_n: int, repeats: int, transport: str) -> None:
    """The multi-GPU rows: every rank on a GPU of its own (from_mpi's default device)."""
    import numpy as np
    from mpi4py import MPI

    import cuda_sharded_jit as sharded

    comm = MPI.COMM_WORLD
    group = sharded.PlaceGroup.from_mpi(transport=transport)
    ranks = comm.size
    a = sharded.ShardedArray.allocate(group, [n] * ranks, np.float32)
    b = sharded.ShardedArray.allocate(group, [n] * ranks, np.float32)
    c = sharded.ShardedArray.allocate(group, [n] * ranks, np.float32)
    sharded.fill(a, 1.0)
    sharded.fill(b, 2.0)
    add = sharded.op(lambda x, y: x + y)
    share = [sort_n // ranks + (1 if rank < sort_n % ranks else 0) for rank in range(ranks)]
    part = np.random.default_rng(comm.rank).integers(-(1 << 31), 1 << 31, share[comm.rank], dtype=np.int64)
    keys = sharded.ShardedArray.from_local(group, [part.astype(np.int32)])
    into = sharded.ShardedArray.allocate(group, share, np.int32)

    def synced(call):
        def run():
            call()
            group.sync()
        return run

    calls = {"reduce": lambda: sharded.sum(a), "transform": synced(lambda: sharded.transform(add, a, b, out=c)),
             "sort": synced(lambda: sharded.sort(keys, out=into))}
    for call in calls.values():
        call()
    row = {"ranks": ranks, "transport": group.transport}
    for name, call in calls.items():
        row[f"{name}_ms"] = float(np.median(_timed(comm, call, repeats))) * 1e3
    if ranks == 1:  # the reference: cupy.sort of the same number of keys on this GPU
        import cupy

        with cupy.cuda.Device(group.devices[0]):
            reference = cupy.random.default_rng(0).integers(-(1 << 31), 1 << 31, sort_n, dtype=cupy.int64)
            reference = reference.astype(cupy.int32)
            cupy.sort(reference)
            cupy.cuda.Device().synchronize()
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                cupy.sort(reference)
                cupy.cuda.Device().synchronize()
                times.append(time.perf_counter() - start)
            row["cupy_sort_ms"] = float(np.median(times)) * 1e3
    if comm.rank == 0:
        print(json.dumps(row), flush=True)


def report_per_gpu(rows, n: int, sort_n: int) -> None:
    one = rows[0]
    print(f"every rank on a GPU of its own, transport {one['transport']!r}: reduce and transform of {n} "
          f"float32 a rank, sort of {sort_n} int32 in all (median ms, the slowest rank)")
    print("| ranks | reduce | × one | transform | throughput × one | sort | cupy.sort on one GPU ÷ sort |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    cupy_ms = one.get("cupy_sort_ms", float("nan"))
    for row in rows:
        print(f"| {row['ranks']} | {row['reduce_ms']:.3f} | {row['reduce_ms'] / one['reduce_ms']:.2f} "
              f"| {row['transform_ms']:.3f} | {row['ranks'] * one['transform_ms'] / row['transform_ms']:.2f} "
              f"| {row['sort_ms']:.2f} | {cupy_ms / row['sort_ms']:.2f} |")
    for row in rows:
        if row["ranks"] != 2:
            continue
        ratios = {"reduce": row["reduce_ms"] / one["reduce_ms"],
                  "transform": 2 * one["transform_ms"] / row["transform_ms"], "sort": cupy_ms / row["sort_ms"]}
        for name, ratio in ratios.items():
            bound = TARGETS_BY_GPU[name]
            met = ratio <= bound if name == "reduce" else ratio >= bound
            print(f"target: {name} at 2 ranks {'≤' if name == 'reduce' else '≥'} {bound}: {ratio:.2f} "
                  f"({'pass' if met else 'miss'})")


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
    parser.add_argument("--gpu-per-rank", action="store_true",
                        help="every rank on a GPU of its own: the multi-GPU rows (reduce, transform, sort)")
    parser.add_argument("--transport", default="auto", choices=["auto", "nccl", "mpi"],
                        help="with --gpu-per-rank: the group's transport")
    parser.add_argument("--sort-n", type=int, default=1 << 28, help="with --gpu-per-rank: int32 keys in all")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        if arguments.gpu_per_rank:
            worker_per_gpu(arguments.n, arguments.sort_n, arguments.repeats, arguments.transport)
        else:
            worker(arguments.n, arguments.repeats)
        return 0
    mpiexec = find_mpiexec(arguments.mpiexec)
    rows = []
    extra = (["--gpu-per-rank", "--transport", arguments.transport, "--sort-n", str(arguments.sort_n)]
             if arguments.gpu_per_rank else [])
    for ranks in arguments.ranks:
        command = [mpiexec, "-n", str(ranks), sys.executable, __file__, "--worker", "--n", str(arguments.n),
                   "--repeats", str(arguments.repeats), *extra]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ))
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
            return 1
        rows.append(json.loads(lines[-1]))
    if arguments.gpu_per_rank:
        report_per_gpu(rows, arguments.n, arguments.sort_n)
        return 0
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
