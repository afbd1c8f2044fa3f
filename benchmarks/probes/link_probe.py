"""Is the first peer copy after a local sort slow, and why? (probe, two GPUs, CuPy only.)
Each GPU sorts 2^27 int32 keys, then a quarter of the keys (four chunks of 2^24) crosses the
link each way, chunk after chunk, timed by events on the pulling GPU. Variants: the chunks
read the sorted keys (just written), a buffer the sort never touched, or follow a 4 KB
warm-up copy issued right after the sort."""
import numpy as np
import cupy as cp

devices = (0, 1)
n, chunk = 1 << 27, 1 << 24
keys, spare, landing, streams = {}, {}, {}, {}
for d in devices:
    with cp.cuda.Device(d):
        keys[d] = cp.random.randint(-2**31, 2**31 - 1, size=n, dtype=np.int64).astype(np.int32)
        spare[d] = cp.ones(n, np.int32)
        landing[d] = cp.empty(n, np.int32)
        streams[d] = cp.cuda.Stream(non_blocking=True)
        cp.cuda.Device(d).synchronize()
pristine = {d: keys[d].copy() for d in devices}


def run(source, warm):
    for d in devices:
        with cp.cuda.Device(d):
            keys[d][...] = pristine[d]
            cp.cuda.Device(d).synchronize()
    done = {}
    for d in devices:
        with cp.cuda.Device(d):
            keys[d].sort()  # on the null stream
            done[d] = cp.cuda.Event(); done[d].record()
    for d in devices:
        with cp.cuda.Device(d):
            for e in devices:
                streams[d].wait_event(done[e])
    marks = {}
    for d in devices:
        other = 1 - d
        with cp.cuda.Device(d):
            src = (keys if source == "sorted" else spare)[other]
            if warm:
                cp.cuda.runtime.memcpyPeerAsync(landing[d].data.ptr, d, src.data.ptr, other, 4096, streams[d].ptr)
            events = [cp.cuda.Event() for _ in range(5)]
            events[0].record(streams[d])
            for j in range(4):
                cp.cuda.runtime.memcpyPeerAsync(landing[d].data.ptr + j * chunk * 4, d, src.data.ptr + j * chunk * 4,
                                                other, chunk * 4, streams[d].ptr)
                events[j + 1].record(streams[d])
            marks[d] = events
    for d in devices:
        streams[d].synchronize()
    return {d: [cp.cuda.get_elapsed_time(marks[d][j], marks[d][j + 1]) for j in range(4)] for d in devices}


for source, warm in (("sorted", False), ("untouched", False), ("sorted", True)):
    rows = [run(source, warm) for _ in range(6)][1:]
    for d in devices:
        per = np.median([r[d] for r in rows], axis=0)
        print(f"{source:9s} warm-up {str(warm):5s} GPU {d} pulls: chunks " +
              " ".join(f"{t * 1e3:6.1f}" for t in per) + " us", flush=True)
