"""Compile latency: first call of a new operator in a warm process, first call in a new
process with a cold and with a warm disk cache; cuda.compute's first call of the same op."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

import cuda_sharded_jit as sharded

from common import Measure

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
                            env=env, check=True, cwd=tempfile.gettempdir())
    return json.loads(result.stdout.strip().splitlines()[-1])["first_call"]


def run(reps: int) -> list[Measure]:
    results = []
    group = sharded.PlaceGroup.by_devices([0])
    x = sharded.ShardedArray.from_numpy(group, np.arange(1024, dtype=np.float32))
    sharded.transform(lambda a: a + 1, x)  # numba loaded, JIT warm
    group.sync()
    warm = []
    for rep in range(reps):
        # a new operator each time: a constant no earlier key has seen
        namespace = {}
        exec(f"op = lambda a: a * {rep + 0.123456} + {time.time_ns() % 1000003}.0", namespace)
        started = time.perf_counter()
        sharded.transform(namespace["op"], x)
        group.sync()
        warm.append(time.perf_counter() - started)
    results.append(Measure("ours: first call of a new operator, warm process", warm))

    cache = tempfile.mkdtemp(prefix="csj-bench-cache-")
    env = dict(os.environ, CUDA_SHARDED_JIT_CACHE_DIR=cache)
    cold = [_child(_OURS, env)]
    warm_disk = [_child(_OURS, env) for _ in range(max(3, reps // 4))]
    results.append(Measure("ours: first call in a new process, cold disk cache", cold,
                           note="includes importing numba"))
    results.append(Measure("ours: first call in a new process, warm disk cache", warm_disk))
    try:
        import cuda.compute  # noqa: F401
    except Exception:
        return results  # measured only where it is importable
    results.append(Measure("cuda.compute: first call in a new process", [_child(_CCCL, dict(os.environ))],
                           note="includes importing numba"))
    return results
