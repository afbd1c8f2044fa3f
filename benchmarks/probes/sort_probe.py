"""Where a two-place sort of 2^28 int32 keys spends its time: the call by wall clock, its
kernels and copies on both GPUs by torch's profiler (CUPTI) as a timeline, and the parts
alone: cupy.sort of one GPU's half, a peer copy of a quarter of the keys each way."""
import sys, time
import numpy as np
import cupy as cp
import torch
from torch.profiler import profile, ProfilerActivity
import cuda_sharded_jit as sharded

n = 1 << int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 28
devices = [0, 1]
g = sharded.PlaceGroup.by_devices(devices)
a = sharded.ShardedArray.allocate(g, n, np.int32)
rng = cp.random.RandomState(0)
pristine = []
for p, d in enumerate(devices):
    with cp.cuda.Device(d):
        k = rng.randint(-2**31, 2**31 - 1, size=a.shard_sizes[p], dtype=np.int64).astype(np.int32)
        pristine.append(k)
        cp.cuda.Device(d).synchronize()

def refill():
    g.sync()
    for p, d in enumerate(devices):
        with cp.cuda.Device(d):
            cp.asarray(a.shard(p))[...] = pristine[p]
            cp.cuda.Device(d).synchronize()

def timed(fn, prepare, reps=8):
    t = []
    for i in range(reps + 2):
        prepare()
        t0 = time.perf_counter(); fn(); g.sync(); t1 = time.perf_counter()
        if i >= 2: t.append((t1 - t0) * 1e3)
    return np.median(t), min(t)

med, best = timed(lambda: sharded.sort(a), refill)
print(f"sharded.sort 2 places (sorted: {bool((lambda h: (h[1:] >= h[:-1]).all())(a.to_numpy()))}), 2^{n.bit_length()-1} int32: median {med:.3f} ms, best {best:.3f} ms", flush=True)

# the parts alone
for d in devices:
    with cp.cuda.Device(d):
        work = cp.empty_like(pristine[d])
        def s(): work[...] = pristine[d]; cp.cuda.Device(d).synchronize()
        def f(): work.sort(); cp.cuda.Device(d).synchronize()
        tt = []
        for i in range(8):
            s(); t0 = time.perf_counter(); f(); tt.append(time.perf_counter() - t0)
        print(f"cupy sort of one half on GPU {d}: {np.median(tt[2:])*1e3:.3f} ms", flush=True)
quarter = n // 4
bufs = {}
for d in devices:
    with cp.cuda.Device(d):
        bufs[d] = (cp.ones(quarter, np.int32), cp.empty(quarter, np.int32))
streams = {}
for d in devices:
    with cp.cuda.Device(d):
        streams[d] = cp.cuda.Stream(non_blocking=True)
def both_ways():
    for d in devices:
        o = 1 - d
        with cp.cuda.Device(d):
            cp.cuda.runtime.memcpyPeerAsync(bufs[d][1].data.ptr, d, bufs[o][0].data.ptr, o, quarter * 4, streams[d].ptr)
    for d in devices:
        streams[d].synchronize()
tt = []
for i in range(8):
    t0 = time.perf_counter(); both_ways(); tt.append(time.perf_counter() - t0)
print(f"peer copies of 2^{quarter.bit_length()-1} int32 both ways at once: {np.median(tt[2:])*1e3:.3f} ms "
      f"({quarter*4/np.median(tt[2:])/1e9:.0f} GB/s each way)", flush=True)

# the same copies after the links have idled as long as a local sort takes
def idle_then_both_ways():
    for d in devices:
        cp.cuda.Device(d).synchronize()
    time.sleep(0.003)
    t0 = time.perf_counter(); both_ways(); return time.perf_counter() - t0
tt = [idle_then_both_ways() for _ in range(8)]
print(f"same, after 3 ms idle: {np.median(tt[2:])*1e3:.3f} ms ({quarter*4/np.median(tt[2:])/1e9:.0f} GB/s each way)",
      flush=True)

streams2 = {}
for d in devices:
    with cp.cuda.Device(d):
        streams2[d] = cp.cuda.Stream(non_blocking=True)
def both_ways_two_streams():
    half = quarter // 2
    for d in devices:
        o = 1 - d
        with cp.cuda.Device(d):
            for k, st in enumerate((streams[d], streams2[d])):
                cp.cuda.runtime.memcpyPeerAsync(bufs[d][1].data.ptr + k * half * 4, d, bufs[o][0].data.ptr + k * half * 4,
                                                o, half * 4, st.ptr)
    for d in devices:
        streams[d].synchronize(); streams2[d].synchronize()
tt = []
for i in range(8):
    t0 = time.perf_counter(); both_ways_two_streams(); tt.append(time.perf_counter() - t0)
print(f"same, split over two streams per GPU: {np.median(tt[2:])*1e3:.3f} ms "
      f"({quarter*4/np.median(tt[2:])/1e9:.0f} GB/s each way)", flush=True)

# timeline of one sort: the GPUs' kernels and copies, and the host's CUDA runtime calls
refill()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    t0 = time.perf_counter(); sharded.sort(a); g.sync(); t1 = time.perf_counter()
print(f"profiled sort wall {1e3*(t1-t0):.3f} ms")
evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA or
       (e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("cu"))]
evs.sort(key=lambda e: e.time_range.start)
start = evs[0].time_range.start if evs else 0
for e in evs:
    where = f"dev {e.device_index}" if e.device_type == torch.autograd.DeviceType.CUDA else "host "
    print(f"  {where}  +{(e.time_range.start-start)/1e3:8.3f} ms  {(e.time_range.end-e.time_range.start)/1e3:8.3f} ms  {e.name[:90]}")
