"""Probe (recorded in docs/results/runs.md, then removed): after CuPy frees a pool of 1 or 3 GiB,
how long does a launch of our 2^26 float32 unary transform from an idle stream stay slower,
and does a large allocation end it? Run from the repository root on a GPU with CuPy."""
import sys, time, statistics as st
import warnings; warnings.filterwarnings("ignore")
sys.path.insert(0, "benchmarks")
import numpy as np, cupy as cp
import cuda_sharded_jit as sharded
from common import time_events_places
N26, N28 = 1 << 26, 1 << 28
g = sharded.PlaceGroup.by_devices([0])
op = sharded.op(lambda a: a + a)
x = sharded.ShardedArray.allocate(g, N26, np.float32); out = sharded.ShardedArray.allocate(g, N26, np.float32)
run = lambda: sharded.transform(op, x, out=out)
streams = [(0, g.stream(0))]
run(); g.sync()
gpu = st.median(time_events_places(cp, streams, run, 20, 3, hold=True)) * 1e6
def idle(reps=5):
    return st.median(time_events_places(cp, streams, run, reps, 1)) * 1e6 - gpu
print(f"kernel {gpu:.1f} us; fresh +{idle(20):.1f}", flush=True)
for size_gib in (3, 1):
    for trial in range(2):
        n = int(size_gib * 2**30 // 4)
        a = cp.ones(n, cp.float32); cp.cuda.Device(0).synchronize(); del a
        t0 = time.perf_counter(); cp.get_default_memory_pool().free_all_blocks(); tf = (time.perf_counter() - t0) * 1e3
        marks = []
        for wait in (0, 0.002, 0.01, 0.05, 0.2, 1.0, 3.0):
            target = t0 + wait
            while time.perf_counter() < target: pass
            marks.append(f"{wait*1e3:g}ms +{idle():.1f}")
        print(f"{size_gib} GiB freed (free took {tf:.2f} ms), trial {trial}: " + ", ".join(marks), flush=True)
# a large allocation after the free
a = cp.ones(3 * 2**28, cp.float32); cp.cuda.Device(0).synchronize(); del a; cp.get_default_memory_pool().free_all_blocks()
print(f"right after 3 GiB freed: +{idle():.1f}", flush=True)
b = cp.empty(3 * 2**28, cp.float32)
print(f"after a 3 GiB cudaMalloc (untouched): +{idle():.1f}", flush=True)
c = cp.empty(2**20, cp.float32)
del b, c
