"""Where a 2^28 float32 reduce spends its time: per call by events (as the benchmark) and
per kernel by torch's profiler (CUPTI), for arrays we allocate, adopt, or lay out contiguously."""
import sys, time
import numpy as np
import cupy as cp
import torch
from torch.profiler import profile, ProfilerActivity
import cuda_sharded_jit as sharded

n = 1 << 28
add = sharded.op(lambda a, b: a + b)
g = sharded.PlaceGroup.by_devices([0])
x_cp = cp.random.random(n, dtype=cp.float32)
arrays = {
    "allocated": sharded.ShardedArray.allocate(g, n, np.float32),
    "contiguous": sharded.ShardedArray.allocate_contiguous(g, n, np.float32),
    "adopted": sharded.ShardedArray.adopt(g, [x_cp]),
}
for name, a in arrays.items():
    if a is None or name == "adopted":
        continue
    cp.asarray(a.shard(0))[...] = x_cp
cp.cuda.Device(0).synchronize()
stream = cp.cuda.ExternalStream(g.stream(0), 0)
s_cp = cp.cuda.Stream(non_blocking=True)

def events(fn, st, reps=30):
    for _ in range(3): fn()
    st.synchronize()
    t = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(st); fn(); b.record(st); b.synchronize()
        t.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
    return np.median(t)

cases = {}
for name, a in arrays.items():
    if a is None: continue
    cases[f"reduce user add, {name}"] = (lambda a=a: sharded.reduce(a, add), stream)
    cases[f"reduce 'sum', {name}"] = (lambda a=a: sharded.reduce(a, "sum"), stream)
    cases[f"count, {name}"] = (lambda a=a: sharded.count(a, 0.5), stream)
def cupy_sum():
    with s_cp: return x_cp.sum()
cases["cupy sum"] = (cupy_sum, s_cp)
for rep in range(2):
    for label, (fn, st) in cases.items():
        print(f"{label:32s} events {events(fn, st):7.1f} us", flush=True)

small = sharded.ShardedArray.allocate(g, 1024, np.float32)
sharded.fill(small, 1.0)
t0 = time.perf_counter()
for _ in range(2000): sharded.reduce(small, add)
print(f"host time per reduce, 1024 elements: {(time.perf_counter()-t0)/2000*1e6:.1f} us")

with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for label, (fn, st) in cases.items():
        for _ in range(10): fn()
        st.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=70))
