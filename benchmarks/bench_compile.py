"""Compile latency: first call of a new operator in a warm process, first call in a new
process with a cold and with a warm disk cache; cuda.compute's first call of the same
operator, in a new process and in a warm one. Then the first call of a new reduce operator,
of a new scan operator on one place and on two, and of a new reduce_by_key operator (each
links its own kernel module), in the warm process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

import cuda_sharded_jit as sharded

from common import Block, Measure, Task

_OURS = textwrap.dedent("""
    import json, time
    import numpy as np
    import cuda_sharded_jit as sharded
    g = sharded.PlaceGroup.by_devices([0])
    x = sharded.ShardedArray.from_numpy(g, np.arange(1024, dtype=np.float32))
    y = sharded.ShardedArray.from_numpy(g, np.ones(1024, dtype=np.float32))
    started = time.perf_counter()
    z = sharded.transform(lambda a, b: a * b + 0.5, x, y)
    g.sync()
    first = time.perf_counter() - started
    assert z.to_numpy()[3] == 3.5
    print(json.dumps({"first_call": first}))
""")

_CCCL = textwrap.dedent("""
    import json, time
    import cupy as cp
    import cuda.compute as cc
    x = cp.arange(1024, dtype=cp.float32); y = cp.ones(1024, dtype=cp.float32); z = cp.empty_like(x)
    def op(a, b):
        return a * b + 0.5
    cp.cuda.Device().synchronize()
    started = time.perf_counter()
    cc.binary_transform(d_in1=x, d_in2=y, d_out=z, op=op, num_items=1024)
    cp.cuda.Device().synchronize()
    first = time.perf_counter() - started
    assert float(z[3]) == 3.5
    print(json.dumps({"first_call": first}))
""")


def _child(code: str, env: dict) -> float:
    result = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                            env=env, cwd=tempfile.gettempdir(), timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"child process failed: {result.stderr.strip()[-400:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["first_call"]


def _new_operator(rep: int, arity: int):
    """A plain function (as cuda.compute's examples write them) with constants no earlier
    cache key has seen."""
    namespace = {}
    arguments = ", ".join("ab"[:arity])
    exec(f"def op({arguments}):\n    return a * {rep + 0.123456} + {time.time_ns() % 1000003}.0", namespace)
    return namespace["op"]


def _ours_warm_process(state: dict, row: Measure, reps: int) -> Measure:
    group, x = state["group"], state["x"]
    times = []
    for rep in range(reps):
        op = _new_operator(rep, 1)
        started = time.perf_counter()
        sharded.transform(op, x)
        group.sync()
        times.append(time.perf_counter() - started)
    row.seconds = times
    return row


def _ours_warm_algorithm(state: dict, row: Measure, reps: int, call) -> Measure:
    """First calls of `call(state, op)` with new binary operators, each until its result is
    on the host."""
    times = []
    for rep in range(reps):
        op = _new_operator(rep, 2)
        started = time.perf_counter()
        call(state, op)
        times.append(time.perf_counter() - started)
    row.seconds = times
    return row


def _reduce(state: dict, op) -> None:
    sharded.reduce(state["x"], op)  # a host value: returns once the GPU is done


def _scan_one_place(state: dict, op) -> None:
    sharded.inclusive_scan(state["x"], op)
    state["group"].sync()


def _scan_two_places(state: dict, op) -> None:
    sharded.inclusive_scan(state["x2"], op)
    state["group2"].sync()


def _reduce_by_key(state: dict, op) -> None:
    keys, reduced = sharded.reduce_by_key(state["keys"], state["x"], op)
    reduced.to_numpy()


def _ours_new_process(state: dict, row: Measure, runs: int, cold: bool) -> Measure:
    if not cold and not state.get("cold_done"):
        raise RuntimeError("the cold-cache run failed, so the disk cache is not warm")
    row.seconds = [_child(_OURS, state["env"]) for _ in range(runs)]
    state["cold_done"] = state.get("cold_done") or cold
    return row


def _cccl_warm_process(row: Measure, reps: int) -> Measure:
    import cupy as cp
    import cuda.compute as cc

    x, y = cp.arange(1024, dtype=cp.float32), cp.ones(1024, dtype=cp.float32)
    z = cp.empty_like(x)

    def first_call(op) -> float:
        cp.cuda.Device().synchronize()
        started = time.perf_counter()
        cc.binary_transform(d_in1=x, d_in2=y, d_out=z, op=op, num_items=1024)
        cp.cuda.Device().synchronize()
        return time.perf_counter() - started

    first_call(_new_operator(-1, 2))  # numba and CCCL's compiler loaded, as in a warm process
    row.seconds = [first_call(_new_operator(rep, 2)) for rep in range(reps)]
    return row


def blocks(reps: int, cccl: bool) -> list[Block]:
    """One block: our compile latencies, then cuda.compute's where it is importable."""

    def row(impl: str, variant: str, note: str = "") -> Measure:
        who = "ours" if impl == "ours" else impl
        return Measure(f"{who}: first call, {variant}", [], note=note, algorithm="compile", impl=impl,
                       variant=variant, timer="process", places=1, gpus=1)

    warm = row("ours", "warm process", "a new operator (new constants) after numba is loaded")
    cold = row("ours", "new process, cold disk cache", "includes importing numba")
    warm_disk = row("ours", "new process, warm disk cache")
    tasks = [
        Task("ours, warm process", lambda state: _ours_warm_process(state, warm, reps), warm),
        Task("ours, new process, cold disk cache", lambda state: _ours_new_process(state, cold, 1, True), cold),
        Task("ours, new process, warm disk cache",
             lambda state: _ours_new_process(state, warm_disk, max(3, reps // 2), False), warm_disk),
    ]
    for variant, call in (("warm process, reduce", _reduce), ("warm process, inclusive_scan", _scan_one_place),
                          ("warm process, inclusive_scan on two places", _scan_two_places),
                          ("warm process, reduce_by_key", _reduce_by_key)):
        measure = row("ours", variant, "a new binary operator, 1024 float32 (two places: of one GPU)")
        tasks.append(Task(f"ours, {variant}",
                          lambda state, measure=measure, call=call: _ours_warm_algorithm(state, measure, reps, call),
                          measure))
    if cccl:
        cccl_new = row("cuda.compute", "new process", "includes importing numba; it has no disk cache")
        cccl_warm = row("cuda.compute", "warm process", "a new operator after a first one was compiled")
        tasks += [
            Task("cuda.compute, new process", lambda state: _set(cccl_new, [_child(_CCCL, dict(os.environ))]),
                 cccl_new),
            Task("cuda.compute, warm process", lambda state: _cccl_warm_process(cccl_warm, 2), cccl_warm),
        ]

    def setup() -> dict:
        group = sharded.PlaceGroup.by_devices([0])
        x = sharded.ShardedArray.from_numpy(group, np.arange(1024, dtype=np.float32))
        sharded.transform(lambda a: a + 1, x)  # numba loaded, JIT warm
        group.sync()
        group2 = sharded.PlaceGroup.by_devices([0, 0])
        x2 = sharded.ShardedArray.from_numpy(group2, np.arange(1024, dtype=np.float32))
        cache = tempfile.mkdtemp(prefix="csj-bench-cache-")
        keys = sharded.ShardedArray.from_numpy(group, np.arange(1024, dtype=np.int32) // 8)
        return {"group": group, "x": x, "keys": keys, "group2": group2, "x2": x2, "cache": cache,
                "env": dict(os.environ, CUDA_SHARDED_JIT_CACHE_DIR=cache)}

    def teardown(state: dict) -> None:
        shutil.rmtree(state["cache"], ignore_errors=True)

    return [Block("compile latency", tasks, setup, teardown)]


def _set(row: Measure, seconds: list) -> Measure:
    row.seconds = seconds
    return row
