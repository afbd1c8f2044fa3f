"""How fast can 256 MB cross NVLink each way at once (two GPUs), by which engines: pulls by the
receiving GPU's copy engine (as the sort does), pushes by the sending GPU's, half and half, and
a copy engine together with a kernel that reads the peer's memory.
2x H200, 2026-11-30: pulls 380 GB/s each way, pushes 372, half and half 372, an engine with a
kernel beside it 327-347, the kernel alone 324."""
import time
import numpy as np
import cupy as cp

devices = [0, 1]
n = 1 << 26  # int32 keys each way
copy_src = r'''
extern "C" __global__ void pull_kernel(const int4* __restrict__ src, int4* __restrict__ dst, long long n4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
    dst[i] = src[i];
}'''
src, dst, st, st2, kern = {}, {}, {}, {}, {}
for d in devices:
    with cp.cuda.Device(d):
        cp.cuda.runtime.deviceEnablePeerAccess(1 - d)
        src[d] = cp.ones(n, np.int32)
        dst[d] = cp.empty(n, np.int32)
        st[d] = cp.cuda.Stream(non_blocking=True)
        st2[d] = cp.cuda.Stream(non_blocking=True)
        kern[d] = cp.RawKernel(copy_src, "pull_kernel")


def ce(into, stream_dev, stream, lo, hi):
    """a copy engine copy of keys [lo, hi) from the other GPU into `into`, queued on a stream of stream_dev"""
    o = 1 - into
    with cp.cuda.Device(stream_dev):
        cp.cuda.runtime.memcpyPeerAsync(dst[into].data.ptr + lo * 4, into, src[o].data.ptr + lo * 4, o,
                                        (hi - lo) * 4, stream.ptr)


def sm(into, lo, hi, blocks):
    o = 1 - into
    with cp.cuda.Device(into):
        kern[into]((blocks,), (512,), (np.uint64(src[o].data.ptr + lo * 4), np.uint64(dst[into].data.ptr + lo * 4), np.int64((hi - lo) // 4)), stream=st2[into])


def timed(name, queue, reps=10):
    tt = []
    for _ in range(reps):
        for d in devices:
            cp.cuda.Device(d).synchronize()
        t0 = time.perf_counter()
        queue()
        for d in devices:
            with cp.cuda.Device(d):
                st[d].synchronize(); st2[d].synchronize()
        tt.append(time.perf_counter() - t0)
    med = np.median(tt[2:])
    ok = all(bool((dst[d] == 1).all()) for d in devices)
    for d in devices:
        dst[d].fill(0)
    print(f"{name:58s} {med * 1e3:.3f} ms  {n * 4 / med / 1e9:.0f} GB/s each way  {'ok' if ok else 'WRONG'}", flush=True)


timed("pulls (receiving GPU's engine)", lambda: [ce(d, d, st[d], 0, n) for d in devices])
timed("pushes (sending GPU's engine)", lambda: [ce(d, 1 - d, st[1 - d], 0, n) for d in devices])
timed("half pulled, half pushed", lambda: [(ce(d, d, st[d], 0, n // 2), ce(d, 1 - d, st2[1 - d], n // 2, n))
                                         for d in devices])
for share, blocks in ((8, 132), (4, 132), (4, 264)):
    cut = n - n // share
    timed(f"pull 1-1/{share} by engine, 1/{share} by kernel ({blocks} blocks)",
          lambda: [(ce(d, d, st[d], 0, cut), sm(d, cut, n, blocks)) for d in devices])
timed("kernel alone (264 blocks)", lambda: [sm(d, 0, n, 264) for d in devices])
