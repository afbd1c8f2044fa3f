"""The two-GPU reduce bar against each GPU alone: a 2^28 float32 user-add reduce on GPU 0,
on GPU 1, and over both (2^28 per GPU), timed call by call on the host (the result is a
host value, so each call ends when the answer is known), interleaved so that clock drift
hits all three alike."""
import time
import numpy as np
import cupy as cp
import cuda_sharded_jit as sharded

n = 1 << 28
add = sharded.op(lambda a, b: a + b)
cases = {}
for devices in ([0], [1], [0, 1]):
    g = sharded.PlaceGroup.by_devices(devices)
    a = sharded.ShardedArray.allocate(g, n * len(devices), np.float32)
    for p, d in enumerate(devices):
        with cp.cuda.Device(d):
            cp.asarray(a.shard(p))[...] = cp.random.random(n, dtype=cp.float32)
            cp.cuda.Device(d).synchronize()
    cases[str(devices)] = (g, a)
times = {k: [] for k in cases}
for rep in range(40):
    for k, (g, a) in cases.items():
        t0 = time.perf_counter(); sharded.reduce(a, add); times[k].append(time.perf_counter() - t0)
for k, t in times.items():
    t = np.array(t[5:]) * 1e6
    print(f"reduce on {k:7s}: median {np.median(t):7.1f} us  min {t.min():7.1f}  p90 {np.percentile(t, 90):7.1f}")
