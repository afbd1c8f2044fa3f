"""Host time per small call of two builds of the library, alternated process by process: the
A/B behind docs/performance.md's before/after host-time table (the benchmark suite's host
figure moves by several µs between runs on a shared machine, too much to compare builds).

    python benchmarks/host_time_ab.py /tmp/before /tmp/after --rounds 6   # two package dirs

Each directory holds an installed cuda_sharded_jit (pip install --target DIR wheel); every
round runs one process per directory, pinned to one core where taskset exists, and prints
the median and best of 7 batches per call, and the shim's part of a transform and a reduce
alone (their Python side done once beforehand; for the transform also its plan's launch,
which a repeated call makes). Needs a GPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

CALLS = {  # name -> (statement, calls per batch)
    "transform(op, a, b, out=c)": ("sharded.transform(add, a, b, out=c)", 20000),
    "a + b (a new array)": ("a + b", 20000),
    "transform(ops.add, a, b) (a new array)": ("sharded.transform(sharded.ops.add, a, b)", 20000),
    "reduce(a, op) -> host": ("sharded.reduce(a, add)", 5000),
    "sum(a) -> host": ("sharded.sum(a)", 5000),
    # the shim's part alone: the same calls with the Python side done once beforehand
    "_shim.transform (prepared)": ("_shim.transform(libraries, impls, c_impl, packed, indexed)", 20000),
    "plan.launch (a transform's plan)": ("plan.launch(arguments, c)", 20000),
    "_shim.reduce (prepared) -> host": ("_shim.reduce(reduce_libraries, a_impl, 4, b'')", 5000),
}


def measure() -> str:
    import numpy as np

    import cuda_sharded_jit as sharded
    from cuda_sharded_jit import _shim, compiler
    from cuda_sharded_jit.algorithms import transform as transform_module

    group = sharded.PlaceGroup.by_devices([0])
    namespace = {"sharded": sharded, "add": sharded.op(lambda x, y: x + y)}
    for name in "abc":
        namespace[name] = sharded.ShardedArray.from_numpy(group, np.ones(1024, np.float32))
    _, packed, _, libraries, indexed, _ = transform_module.prepare(namespace["add"], (namespace["a"], namespace["b"]),
                                                                   namespace["c"])
    float32 = np.dtype(np.float32)
    _, reduce_libraries = compiler.kernel_libraries(namespace["add"], "reduce", (("array", float32),), float32,
                                                    group.archs)
    for _ in range(2):  # a plan is made at the second call with the same kinds
        sharded.transform(namespace["add"], namespace["a"], namespace["b"], out=namespace["c"])
    plan = getattr(namespace["add"], "_transform_plan", None)  # builds from before plans: none
    namespace.update(plan=plan[3] if plan else None, arguments=(namespace["a"], namespace["b"]))
    namespace.update(_shim=_shim, libraries=libraries, packed=packed, indexed=indexed,
                     reduce_libraries=reduce_libraries, impls=[namespace["a"]._impl, namespace["b"]._impl],
                     a_impl=namespace["a"]._impl, c_impl=namespace["c"]._impl)
    rows = []
    for label, (statement, count) in CALLS.items():
        if "plan" in statement and namespace["plan"] is None:
            continue
        call = eval(f"lambda: {statement}", namespace)  # noqa: S307 - our own statements
        for _ in range(count // 10):
            call()
        group.sync()
        batches = []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(count):
                call()
            group.sync()
            batches.append((time.perf_counter() - start) / count * 1e6)
        batches.sort()
        rows.append(f"{label}: {batches[3]:.2f} µs (best {batches[0]:.2f})")
    return " | ".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("builds", nargs="*", help="directories holding an installed cuda_sharded_jit")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # a child process
    arguments = parser.parse_args(argv)
    if arguments.measure:
        print(measure(), flush=True)
        return 0
    pin = ["taskset", "-c", "3"] if shutil.which("taskset") else []
    for round_ in range(1, arguments.rounds + 1):
        for build in arguments.builds:
            environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [build, os.environ.get("PYTHONPATH")])))
            result = subprocess.run(pin + [sys.executable, "-W", "ignore", __file__, "--measure"], env=environment,
                                    capture_output=True, text=True, cwd="/")
            print(f"round {round_} {build}: {result.stdout.strip() or result.stderr.strip()[-300:]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
