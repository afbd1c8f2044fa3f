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
out = sharded.ShardedArray.allocate(g, n, np.float32)
a0 = arrays["allocated"]
cases["inclusive_scan user add"] = (lambda: sharded.inclusive_scan(a0, add, out=out), stream)
cases["inclusive_scan 'sum'"] = (lambda: sharded.inclusive_scan(a0, "sum", out=out), stream)
t_x = torch.as_tensor(x_cp, device="cuda:0")
t_out = torch.empty_like(t_x)
def torch_cumsum():
    with torch.cuda.stream(torch.cuda.ExternalStream(s_cp.ptr)):
        torch.cumsum(t_x, 0, out=t_out)
cases["torch cumsum"] = (torch_cumsum, s_cp)
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

# argmin: ours (a (value, index) tuple reduce) against CuPy's, per call and per kernel
x_arg = arrays["allocated"]
def cupy_argmin():
    with s_cp: return x_cp.argmin()
for rep in range(2):
    print(f"{'argmin ours':32s} events {events(lambda: sharded.argmin(x_arg), stream):7.1f} us")
    print(f"{'argmin cupy':32s} events {events(cupy_argmin, s_cp):7.1f} us")
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(10): sharded.argmin(x_arg)
    for _ in range(10): cupy_argmin()
    s_cp.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6, max_name_column_width=70))
