"""The two-place sort with and without sampled bounds (CSJ_SORT_SAMPLE_SIGMAS unset or "off"),
alternating in one process: 2^N int32 keys over GPUs 0 and 1 (N from argv, default 28), the
same keys refilled before each call (untimed), wall clock, median of 40. Set
CSJ_SORT_SAMPLE_MIN_KEYS=0 to sample at every size. 2x H200, 2026-11-30, sampled against off:
2^23 0.546 / 0.423 ms, 2^24 0.807 / 0.633, 2^25 0.726 / 0.742, 2^26 1.109 / 1.123, 2^28
3.560 / 3.601."""
import os
import sys
import time

import cupy as cp
import numpy as np

import cuda_sharded_jit as sharded

n = 1 << (int(sys.argv[1]) if len(sys.argv) > 1 else 28)
devices = [0, 1]
group = sharded.PlaceGroup.by_devices(devices)
a = sharded.ShardedArray.allocate(group, n, np.int32)
rng = cp.random.RandomState(0)
pristine = []
for p, d in enumerate(devices):
    with cp.cuda.Device(d):
        pristine.append(rng.randint(-2**31, 2**31 - 1, size=a.shard_sizes[p], dtype=np.int64).astype(np.int32))


def refill():
    group.sync()
    for p, d in enumerate(devices):
        with cp.cuda.Device(d):
            cp.asarray(a.shard(p))[...] = pristine[p]
            cp.cuda.Device(d).synchronize()


modes = {"sampled": None, "first round": "off"}
times = {mode: [] for mode in modes}
for round_ in range(44):
    for mode, value in modes.items():
        if value is None:
            os.environ.pop("CSJ_SORT_SAMPLE_SIGMAS", None)
        else:
            os.environ["CSJ_SORT_SAMPLE_SIGMAS"] = value
        refill()
        t0 = time.perf_counter()
        sharded.sort(a)
        group.sync()
        if round_ >= 4:
            times[mode].append((time.perf_counter() - t0) * 1e3)
host = a.to_numpy()
print("sorted:", bool((host[1:] >= host[:-1]).all()))
for mode in modes:
    print(f"2^{n.bit_length() - 1} {mode:12s} median {np.median(times[mode]):.3f} ms  min {min(times[mode]):.3f}")
