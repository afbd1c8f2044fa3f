"""Does a peer copy pay a start cost when the copy engine was idle, or after heavy work?
(Profiled timelines of the two-place sort show its first chunk's copy ~0.1 ms slower than the
same-sized second one.) 2 GPUs. Each case: both GPUs idle 3 ms; on each GPU a side stream
spins 0.3 ms then queues the case's traffic, the main stream spins 0.6 ms, runs the case's own
work, then pulls 16 MB from the other GPU, timed by events around that copy. Then: copies
after both GPUs sort 2^27 keys (CuPy), on a side stream that waits for both sorts, and the
same 88 MB copy from an idle start. 2x H200, 2026-11-30: 16 MB 0.058-0.066 ms in every case
but a 64 KB copy chain beside it; 88 MB 0.240 ms after the sorts, 0.263 idle."""
import time
import numpy as np
import cupy as cp

devices = [0, 1]
size = 16 << 20
small = 64 << 10
spin_src = r'''
extern "C" __global__ void spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}'''
bufs, streams, sides, spins = {}, {}, {}, {}
for d in devices:
    with cp.cuda.Device(d):
        cp.cuda.runtime.deviceEnablePeerAccess(1 - d)
        bufs[d] = (cp.ones(size // 4, np.int32), cp.empty(size // 4, np.int32),
                   cp.ones(small // 4, np.int32), cp.empty(small // 4, np.int32))
        streams[d] = cp.cuda.Stream(non_blocking=True)
        sides[d] = cp.cuda.Stream(non_blocking=True)
        spins[d] = cp.RawKernel(spin_src, "spin")


def pull(d, stream, big=True):
    o = 1 - d
    dst, src, nbytes = (bufs[d][1], bufs[o][0], size) if big else (bufs[d][3], bufs[o][2], small)
    cp.cuda.runtime.memcpyPeerAsync(dst.data.ptr, d, src.data.ptr, o, nbytes, stream.ptr)


def spin(d, stream, us):
    spins[d]((1,), (1,), (np.uint64(us * 1000),), stream=stream)


def settle():
    """Both GPUs idle for 3 ms."""
    for d in devices:
        cp.cuda.Device(d).synchronize()
    time.sleep(0.003)


def timed_copies(stream_of, copy, before=None):
    """On each GPU in turn: `before(d)`, then `copy(d)` between two events on stream_of(d).
    Waits for them; returns the events and the slowest GPU's copy time (ms)."""
    marks = {}
    for d in devices:
        with cp.cuda.Device(d):
            if before:
                before(d)
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream_of(d))
            copy(d)
            b.record(stream_of(d))
            marks[d] = (a, b)
    for d in devices:
        marks[d][1].synchronize()
    return marks, max(cp.cuda.get_elapsed_time(*marks[d]) for d in devices)


def case(name, side=None, main=None, reps=12):
    def hooks(d):
        if side:
            side(d)
        if main:
            main(d)

    times = []
    for _ in range(reps):
        settle()
        for d in devices:
            with cp.cuda.Device(d):
                spin(d, sides[d], 300)
                spin(d, streams[d], 600)
        times.append(timed_copies(lambda d: streams[d], lambda d: pull(d, streams[d]), hooks)[1])
    med = np.median(times[2:])
    print(f"{name:64s} {med:.3f} ms ({size / med / 1e6:.0f} GB/s)", flush=True)


case("idle engine")
case("chain of 64 KB pulls on a side stream, same GPU", side=lambda d: [pull(d, sides[d], False) for _ in range(300)])
case("chain of 64 KB pulls queued ahead on the same stream", main=lambda d: [pull(d, streams[d], False) for _ in range(5)])
case("one 16 MB pull on a side stream, same GPU", side=lambda d: [pull(d, sides[d]) for _ in range(2)])
case("a local 64 KB D2D chain on a side stream",
     side=lambda d: [cp.cuda.runtime.memcpyAsync(bufs[d][3].data.ptr, bufs[d][2].data.ptr, small, 3, sides[d].ptr)
                     for _ in range(300)])
big = {}
for d in devices:
    with cp.cuda.Device(d):
        big[d] = cp.empty(1 << 27, np.int32)


def fill(d):
    with cp.cuda.Device(d), streams[d]:
        big[d].fill(7)


case("after a 512 MB fill on this GPU's stream", main=fill)
case("after 512 MB fills on both GPUs' streams", main=lambda d: (fill(d), fill(1 - d)))
waits = {}


def cross_wait(d):
    # the other GPU's stream records an event after its spin; this stream waits for it
    with cp.cuda.Device(1 - d):
        e = cp.cuda.Event(disable_timing=True)
        e.record(streams[1 - d])
    streams[d].wait_event(e)
    waits[d] = e


case("after waiting on the other GPU's event", main=cross_wait)
keys, work = {}, {}
for d in devices:
    with cp.cuda.Device(d):
        keys[d] = cp.random.randint(-2**31, 2**31 - 1, size=1 << 27, dtype=np.int64).astype(np.int32)
        work[d] = cp.empty_like(keys[d])


def sort(d):
    with cp.cuda.Device(d), streams[d]:
        work[d][...] = keys[d]
        work[d].sort()


case("after a 2^27-key cupy sort on this GPU's stream", main=sort)


def big_pull(d, stream, source, nbytes):
    cp.cuda.runtime.memcpyPeerAsync(big[d].data.ptr, d, source.data.ptr, 1 - d, nbytes, stream.ptr)


def sorts_then_pulls(reps=12, nbytes=size, source=None, label=""):
    """As a two-place sort: both GPUs sort, then each pulls on a side stream that waits for both
    sorts (events), timed from the side stream's start (its wait) and from the copy's own start."""
    def copy(d):
        if source is None:
            pull(d, sides[d])
        else:
            big_pull(d, sides[d], source(1 - d), nbytes)

    whole, own = [], []
    for _ in range(reps):
        settle()
        done = {}
        for d in devices:
            sort(d)
            with cp.cuda.Device(d):
                done[d] = cp.cuda.Event()
                done[d].record(streams[d])
        marks, slowest = timed_copies(lambda d: sides[d], copy,
                                      lambda d: (sides[d].wait_event(done[d]), sides[d].wait_event(done[1 - d])))
        own.append(slowest)
        whole.append(max(cp.cuda.get_elapsed_time(done[d], marks[d][1]) for d in devices))
    print(f"{'2^27-key sorts on both, then a pull waiting for both' + label:64s} {np.median(own[2:]):.3f} ms "
          f"(from this GPU's sort end: {np.median(whole[2:]):.3f} ms)", flush=True)


def idle_big(nbytes, source, label):
    times = []
    for _ in range(12):
        settle()
        times.append(timed_copies(lambda d: streams[d], lambda d: big_pull(d, streams[d], source(1 - d), nbytes))[1])
    print(f"{'idle, then ' + label:64s} {np.median(times[2:]):.3f} ms", flush=True)


sorts_then_pulls()
mib84 = 21 << 22
sorts_then_pulls(nbytes=mib84, source=lambda o: work[o], label=", 84 MiB of the sorted keys")
sorts_then_pulls(nbytes=mib84, source=lambda o: keys[o], label=", 84 MiB of other keys")
idle_big(mib84, lambda o: work[o], "84 MiB pull of the sorted keys")
idle_big(mib84, lambda o: keys[o], "84 MiB pull of other keys")
case("idle engine (again)")
