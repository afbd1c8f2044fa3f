"""How late does a stream see an event of another stream complete: on the same GPU and on the
other GPU, after the event has been pending a short or a long while. GPU 0 spins, stamps a
pinned host flag, records an event; the waiting stream then stamps a flag of its own. The host
polls both flags: the gap is the wait's latency (host polling resolution ~1 us).
2x H200, 2026-11-30: same GPU ~2.6 us, other GPU ~5 us (11 us when pending only 50 us), and
a 4 KB pull after the wait ~15-20 us more."""
import ctypes
import time
import numpy as np
import cupy as cp

src = r'''
extern "C" __global__ void spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
extern "C" __global__ void stamp(volatile int* flag, int value) { *flag = value; __threadfence_system(); }
'''
devices = [0, 1]
mods, streams = {}, {}
for d in devices:
    with cp.cuda.Device(d):
        cp.cuda.runtime.deviceEnablePeerAccess(1 - d)
        m = cp.RawModule(code=src)
        mods[d] = (m.get_function("spin"), m.get_function("stamp"))
        streams[d] = (cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True))
ptr = cp.cuda.runtime.hostAlloc(64, 1 | 2)  # portable | mapped
flags = np.ctypeslib.as_array((ctypes.c_int * 16).from_address(ptr))
bufs = {}
for d in devices:
    with cp.cuda.Device(d):
        bufs[d] = cp.zeros(1024, np.int32)


def trial(waiter, pending_us, copy=False):
    flags[:] = 0
    for d in devices:
        cp.cuda.Device(d).synchronize()
    s0 = streams[0][0]
    with cp.cuda.Device(0):
        spin, stamp = mods[0]
        spin((1,), (1,), (np.uint64(pending_us * 1000),), stream=s0)
        stamp((1,), (1,), (np.uint64(ptr), np.int32(1)), stream=s0)
        e = cp.cuda.Event(disable_timing=True)
        e.record(s0)
    with cp.cuda.Device(waiter):
        s1 = streams[waiter][1]
        s1.wait_event(e)
        if copy:
            cp.cuda.runtime.memcpyPeerAsync(bufs[waiter].data.ptr, waiter, bufs[1 - waiter].data.ptr, 1 - waiter, 4096, s1.ptr)
        mods[waiter][1]((1,), (1,), (np.uint64(ptr + 4), np.int32(1)), stream=s1)
    while flags[0] == 0:
        pass
    t0 = time.perf_counter_ns()
    while flags[1] == 0:
        pass
    return (time.perf_counter_ns() - t0) / 1e3


for label, waiter, copy in (("same GPU", 0, False), ("other GPU", 1, False), ("other GPU, then a 4 KB pull", 1, True),
                            ("same GPU... 4 KB pull from GPU 1", 0, True)):
    for pending in (50, 500, 3000):
        tt = [trial(waiter, pending, copy) for _ in range(15)]
        print(f"{label:34s} pending {pending:5d} us: wait seen after median {np.median(tt[3:]):7.1f} us "
              f"(min {min(tt[3:]):6.1f}, max {max(tt[3:]):6.1f})", flush=True)
