"""One call each of the argmin, user-add reduce and count kernels on 2^28 float32 (and
cupy.argmin's for comparison) between cudaProfilerStart/Stop, for Nsight Compute:
    ncu --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats python3 kernel_profile.py"""
import numpy as np
import cupy as cp
import cuda_sharded_jit as sharded

n = 1 << 28
g = sharded.PlaceGroup.by_devices([0])
x = sharded.ShardedArray.allocate(g, n, np.float32)
cp.asarray(x.shard(0))[...] = cp.random.random(n, dtype=cp.float32)
add = sharded.op(lambda a, b: a + b)
calls = [lambda: sharded.argmin(x), lambda: sharded.reduce(x, add), lambda: cp.asarray(x.shard(0)).argmin()]
for call in calls:  # compile and warm up outside the profiled range
    call()
cp.cuda.Device(0).synchronize()
cp.cuda.runtime.profilerStart()
for call in calls:
    call()
cp.cuda.Device(0).synchronize()
cp.cuda.runtime.profilerStop()
