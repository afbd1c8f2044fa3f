"""Probe (recorded in docs/results/runs.md, then removed): does a peer library's release of a
large memory pool (CuPy's free_all_blocks, torch's empty_cache) change the idle-GPU time of
our next 2^26 float32 unary transform? Prints, per state, the call timed from an idle stream
(events), the GPU side (queued behind a holding kernel), the host time per enqueue, and the
same for CuPy's add. Run from the repository root on a GPU with CuPy and torch."""
import sys, time, statistics as st
sys.path.insert(0, "benchmarks")
import numpy as np, cupy as cp, torch
import cuda_sharded_jit as sharded
from common import time_events_places, host_times_per_call
N26, N28 = 1 << 26, 1 << 28
g = sharded.PlaceGroup.by_devices([0])
op = sharded.op(lambda a: a + a)
add = sharded.op(lambda a, b: a + b)
s = cp.cuda.Stream(non_blocking=True)

def ours():
    x = sharded.ShardedArray.allocate(g, N26, np.float32); out = sharded.ShardedArray.allocate(g, N26, np.float32)
    run = lambda: sharded.transform(op, x, out=out)
    return x, out, run

def timeit(label):
    x, out, run = ours()
    sync = lambda: g.sync()
    run(); sync()
    streams = [(0, g.stream(0))]
    idle = st.median(time_events_places(cp, streams, run, 20, 3)) * 1e6
    gpu = st.median(time_events_places(cp, streams, run, 20, 3, hold=True)) * 1e6
    host = st.median(host_times_per_call(run, sync, 400, 50)) * 1e6
    with cp.cuda.Device(0):
        y = cp.empty(N26, cp.float32); z = cp.empty_like(y)
        crun = lambda: cp.add(y, y, out=z)
        cidle = st.median(time_events_places(cp, [(0, cp.cuda.Stream.null.ptr)], crun, 20, 3)) * 1e6
        cgpu = st.median(time_events_places(cp, [(0, cp.cuda.Stream.null.ptr)], crun, 20, 3, hold=True)) * 1e6
        del y, z
    free, total = cp.cuda.runtime.memGetInfo()
    print(f"{label:34s} ours idle {idle:7.1f} gpu {gpu:7.1f} (+{idle-gpu:5.1f}) host {host:5.1f} | cupy idle {cidle:7.1f} gpu {cgpu:7.1f} (+{cidle-cgpu:5.1f}) | free {free/2**30:.1f} GiB", flush=True)
    x.free(); out.free(); g.release_cached_memory()

timeit("fresh")
timeit("fresh again")
a = cp.random.random(N28, dtype=cp.float32); b = cp.empty_like(a)
for _ in range(5): cp.cumsum(a, dtype=a.dtype, out=b)
r = cp.cumsum(a, dtype=cp.float64); cp.cuda.Device(0).synchronize(); del r
timeit("after cupy cumsum (pool kept)")
del a, b; cp.get_default_memory_pool().free_all_blocks()
timeit("after cupy pool freed")
t = torch.rand(N28, device="cuda"); u = torch.empty_like(t)
for _ in range(5): torch.cumsum(t, 0, out=u)
torch.cuda.synchronize()
timeit("after torch cumsum (cache kept)")
del t, u; torch.cuda.empty_cache()
timeit("after torch empty_cache")
xs = sharded.ShardedArray.allocate(g, N28, np.float32); os_ = sharded.ShardedArray.allocate(g, N28, np.float32)
for _ in range(5): sharded.inclusive_scan(xs, add, out=os_)
g.sync()
timeit("after ours scan (kept)")
xs.free(); os_.free(); g.release_cached_memory()
timeit("after ours scan freed")
t = torch.rand(N28, device="cuda"); v = (t * t).sum().item(); del t; torch.cuda.empty_cache()
timeit("after torch (x*x).sum + empty_cache")
