"""One command for the benchmark suite (needs a GPU and CuPy; torch and cuda.compute are
measured where importable):

    python benchmarks/run.py                                  # everything, defaults
    python benchmarks/run.py --only reduce,inclusive_scan --sizes 24:28:4 --places 1,2
    python benchmarks/run.py --sizes 16:20:4 --reps 5 --skip compile   # a quick smoke run

Per algorithm, dtype and size: ours on 1, 2, 4 (and all) places against the device copy limit,
CuPy, torch and cuda.compute; host time per small call; compile latency. Every result is
checked against CuPy before it is timed; a failing measurement becomes an error row and the
suite goes on. Writes to --out (benchmarks/results/): results.md (the performance targets,
summary tables, every figure; paste-ready for docs/performance.md), results.json (every
repetition and the environment) and PNG plots (matplotlib, the `bench` extra).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from common import Measure, Progress, parse_places, parse_sizes, run_blocks  # noqa: E402

ALGORITHMS = ("transform_unary", "transform_binary", "reduce", "transform_reduce", "inclusive_scan",
              "exclusive_scan", "sort", "histogram_even", "count", "adjacent_difference", "argmin",
              "sort_by_key", "argsort", "sort_compare", "sort_key", "searchsorted", "top_k",
              "select", "segmented_reduce", "unique_by_key", "reduce_by_key", "scan_by_key", "resharded")
SUITES = ("host", "compile")
WATCHDOG_GRACE_S = 45  # past the budget, a call still running is taken for a hang
ALIASES = {"transform": ("transform_unary", "transform_binary"), "scan": ("inclusive_scan", "exclusive_scan"),
           "sort_family": ("sort_by_key", "argsort", "sort_compare", "sort_key", "searchsorted", "top_k"),
           "selection": ("select", "segmented_reduce", "unique_by_key", "reduce_by_key", "scan_by_key", "resharded"),
           "all": ALGORITHMS + SUITES}


def selection(only: str, skip: str) -> set:
    """The algorithms and suites to run, from --only and --skip (names or aliases)."""

    def names(text: str) -> set:
        chosen = set()
        for name in (item.strip() for item in text.split(",")):
            if not name:
                continue
            if name not in ALIASES and name not in ALGORITHMS + SUITES:
                raise ValueError(f"unknown name {name!r}: expected one of {', '.join(ALGORITHMS + SUITES)} "
                                 f"or {', '.join(ALIASES)}")
            chosen.update(ALIASES.get(name, (name,)))
        return chosen

    return names(only) - names(skip)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="all",
                        help=f"comma-separated: {', '.join(ALGORITHMS + SUITES)}, or {', '.join(ALIASES)}")
    parser.add_argument("--skip", default="", help="comma-separated names to leave out (as --only)")
    parser.add_argument("--sizes", default="16:28:4",
                        help="elements per GPU (sort: keys in total) as powers of two: first:last:step, or a "
                             "list (default 16:28:4 = 2^16, 2^20, 2^24, 2^28)")
    parser.add_argument("--places", default="1,2,4,all",
                        help="place counts; places beyond the GPUs share them round robin (default 1,2,4,all)")
    parser.add_argument("--dtypes", default="float32,int64", help="element types (sort adds int32)")
    parser.add_argument("--peers", default="cupy,torch,cuda.compute", help="peers to compare with")
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions (sort: half, at least 5)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget", type=float, default=540,
                        help="seconds; past it the remaining measurements are skipped (default 540)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--no-plots", action="store_true")
    return parser


def available_peers(requested: str) -> tuple[tuple, dict]:
    """The peers that import here, and why the others were left out."""
    peers, missing = [], {}
    for name in (item.strip() for item in requested.split(",") if item.strip()):
        try:
            if name == "torch":
                import torch

                if not torch.cuda.is_available():
                    raise RuntimeError("torch sees no CUDA device")
            elif name == "cuda.compute":
                import cuda.compute

                if not hasattr(cuda.compute, "make_binary_transform"):
                    raise RuntimeError("cuda.compute has no CUDA bindings here")
            elif name != "cupy":
                raise ValueError(f"unknown peer {name!r}")
            peers.append(name)
        except Exception as error:  # noqa: BLE001 - a missing peer is reported, not fatal
            missing[name] = f"{type(error).__name__}: {error}"
            print(f"not measured: {name} ({missing[name]})", file=sys.stderr)
    return tuple(peers), missing


def _version(distribution: str):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(cp, devices: list, missing_peers: dict) -> dict:
    import cuda_sharded_jit as sharded

    info = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "host": platform.node(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cupy": cp.__version__,
        "cuda_sharded_jit": sharded.__version__,
        "command": " ".join(sys.argv),
        "missing_peers": missing_peers,
    }
    for distribution in ("numba", "numba-cuda", "torch", "cuda-cccl", "cuda-bindings", "nvidia-nvjitlink",
                         "matplotlib"):
        info[distribution] = _version(distribution)
    try:
        info["cuda_runtime"] = _cuda_version(cp.cuda.runtime.runtimeGetVersion())
        info["cuda_driver_api"] = _cuda_version(cp.cuda.runtime.driverGetVersion())
        info["gpu_names"] = [cp.cuda.runtime.getDeviceProperties(d)["name"].decode() for d in devices]
        info["peer_access"] = [[d == e or bool(cp.cuda.runtime.deviceCanAccessPeer(d, e)) for e in devices]
                               for d in devices]
    except Exception as error:  # noqa: BLE001
        info["cuda_error"] = str(error)
    info["gpus"] = _command(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                             "--format=csv,noheader"]).splitlines()
    if info["gpus"]:
        info["driver"] = info["gpus"][0].split(",")[1].strip() if "," in info["gpus"][0] else None
    topology = _command(["nvidia-smi", "topo", "-m"])
    info["topology"] = topology
    match = re.search(r"^\S*GPU0\s+X\s+(\S+)", topology, re.MULTILINE)
    if match and len(devices) > 1:
        info["link"] = f"GPU0-GPU1: {match.group(1)}"
    return info


def _cuda_version(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"


def _command(arguments: list) -> str:
    try:
        return subprocess.run(arguments, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv=None) -> int:
    arguments = parser().parse_args(argv)
    try:
        chosen = selection(arguments.only, arguments.skip)
        sizes = parse_sizes(arguments.sizes)
        dtypes = [np.dtype(name.strip()) for name in arguments.dtypes.split(",") if name.strip()]
    except (ValueError, TypeError) as error:
        parser().error(str(error))
    try:
        import cupy as cp
    except ImportError:
        print("the benchmarks need CuPy and a GPU (pip install cupy-cuda13x)", file=sys.stderr)
        return 2
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver
        count = 0
    if not count:
        print("the benchmarks need a CUDA GPU", file=sys.stderr)
        return 2
    devices = list(range(count))
    try:
        places = parse_places(arguments.places, count)
    except ValueError as error:
        parser().error(str(error))
    peers, missing = available_peers(arguments.peers)

    import bench_compile
    import bench_reduce
    import bench_selection
    import bench_sort
    import bench_sort_family
    import bench_transform
    import cuda_sharded_jit as sharded
    import sweep

    options = sweep.Options(sizes, dtypes, places, devices, peers, arguments.reps, arguments.warmup, arguments.seed)
    cases = [case for case in bench_transform.CASES + bench_reduce.CASES if case.algorithm in chosen]
    groups = {}  # one PlaceGroup per device list, for the whole run
    blocks = []
    if "host" in chosen:
        selections = [(bench_transform.TRANSFORM_BINARY, ("ours", "ours built-in") + sweep.PEERS),
                      (bench_transform.TRANSFORM_BINARY_NEW_ARRAY, ("ours a + b", "ours built-in, new array")),
                      (bench_reduce.INCLUSIVE_SCAN, ("ours",)), (bench_reduce.REDUCE, ("ours",))]
        blocks += sweep.host_blocks(cp, sharded, selections, options, groups)
    if "compile" in chosen:
        blocks += bench_compile.blocks(max(5, arguments.reps // 2), "cuda.compute" in peers)
    blocks += bench_sort_family.blocks(cp, sharded, options, chosen, groups)  # each at its target's size
    blocks += bench_selection.blocks(cp, sharded, options, chosen, groups)
    sort_dtypes = list(dict.fromkeys([np.dtype(np.int32)] + dtypes))
    for size in reversed(sizes):  # the largest first: the targets are measured there
        if cases:
            blocks += sweep.blocks(cp, sharded, [sweep.COPY] + cases, options, size, groups)
        if "sort" in chosen:
            blocks += bench_sort.blocks(cp, sharded, options, size, sort_dtypes, groups)

    progress = Progress(sum(len(block.tasks) for block in blocks))
    print(f"{progress.total} measurements on {count} GPU(s), places {places}, sizes "
          f"{', '.join(f'2^{size.bit_length() - 1}' for size in sizes)}, dtypes {', '.join(d.name for d in dtypes)}; "
          f"peers: {', '.join(peers)}; budget {arguments.budget:.0f} s", flush=True)

    def finish(measures: list) -> None:
        import report

        recorded = {"sizes": sizes, "places": places, "dtypes": [d.name for d in dtypes], "peers": list(peers),
                    "reps": arguments.reps, "sort_reps": max(5, arguments.reps // 2), "warmup": arguments.warmup,
                    "budget_s": arguments.budget, "seed": arguments.seed, "selected": sorted(chosen),
                    "elapsed_s": round(progress.elapsed(), 1)}
        env = environment(cp, devices, missing)
        print(report.write(arguments.out, measures, env, recorded, plots=not arguments.no_plots))
        print(f"{len(measures)} measures in {progress.elapsed():.0f} s", flush=True)

    measures = []
    finished = threading.Event()

    def watchdog() -> None:
        """A call that never returns (a hang) must not lose what was measured before it."""
        if finished.wait(arguments.budget + WATCHDOG_GRACE_S):
            return
        print(f"\nstill running {WATCHDOG_GRACE_S} s past the budget, in {progress.current!r}: "
              f"writing what was measured and stopping", file=sys.stderr, flush=True)
        finish(list(measures) + [Measure(progress.current, [], error="hung: still running past the time budget; "
                                                                      "the run was stopped")])
        os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    try:
        run_blocks(blocks, progress, time.perf_counter() + arguments.budget, measures)
    except KeyboardInterrupt:
        print("\ninterrupted: writing what was measured", file=sys.stderr, flush=True)
    finished.set()
    progress.finish()
    finish(measures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
