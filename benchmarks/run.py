"""One command for the benchmark suite (needs a GPU, CuPy; cuda.compute when importable):

    python benchmarks/run.py [--only transform,reduce,compile] [--log2n 28] [--reps 20]

Prints a markdown table and writes it, with every raw figure and the environment, to
benchmarks/results/ (results.md, results.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

SUITES = ("transform", "reduce", "compile")


def environment(cp) -> dict:
    import numba
    import numpy

    import cuda_sharded_jit as sharded

    info = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "numba": numba.__version__,
        "cupy": cp.__version__,
        "cuda_sharded_jit": sharded.__version__,
    }
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                               "--format=csv,noheader"], capture_output=True, text=True).stdout
        info["gpus"] = [line.strip() for line in gpus.strip().splitlines()]
    except OSError:
        pass
    for module in ("numba_cuda", "cuda.bindings", "cuda.compute", "torch"):
        try:
            info[module] = __import__(module, fromlist=["_"]).__version__
        except Exception:
            info[module] = None
    return info


def table(measures) -> str:
    lines = ["| measure | median | GB/s | spread | note |", "| --- | ---: | ---: | ---: | --- |"]
    for m in measures:
        median = f"{m.median * 1e3:.3f} ms" if m.median >= 1e-3 else f"{m.median * 1e6:.2f} µs"
        gbps = f"{m.gbps:.0f}" if m.bytes_moved else ""
        lines.append(f"| {m.name} | {median} | {gbps} | {m.spread:.1%} | {m.note} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SUITES), help=f"comma-separated subset of {SUITES}")
    parser.add_argument("--log2n", type=int, default=28, help="elements per GPU, as a power of two")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    try:
        import cupy as cp
    except ImportError:
        print("the benchmarks need CuPy and a GPU (pip install cupy-cuda13x)", file=sys.stderr)
        return 2
    devices = list(range(cp.cuda.runtime.getDeviceCount()))
    if not devices:
        print("the benchmarks need a CUDA GPU", file=sys.stderr)
        return 2
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    measures = []
    for suite in chosen:
        print(f"[{time.strftime('%H:%M:%S')}] {suite} ...", flush=True)
        if suite == "transform":
            import bench_transform

            measures += bench_transform.run(cp, args.log2n, args.reps, devices)
        elif suite == "reduce":
            import bench_reduce

            measures += bench_reduce.run(cp, args.log2n, args.reps, devices)
        elif suite == "compile":
            import bench_compile

            measures += bench_compile.run(max(5, args.reps // 2))
        else:
            parser.error(f"unknown suite {suite!r}")
    env = environment(cp)
    text = f"Benchmarks, {env['date']}, {', '.join(env.get('gpus', []))}\n\n" + table(measures)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text + "\n")
    (args.out / "results.json").write_text(json.dumps(
        {"environment": env, "log2n": args.log2n, "measures": [m.as_dict() for m in measures]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
