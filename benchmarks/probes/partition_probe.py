"""Would a partition-first two-GPU sort beat sort-then-exchange? A CuPy-only model of it:
sample splitters, partition every key once into buckets (each destination place's key range
cut into sub-ranges, plus a small bucket around the shard boundary), send the other place's
buckets while sorting one's own sub-ranges (own keys + received keys together, no merge),
and split the sorted boundary bucket between the places. Prints wall time against
cupy.sort of all keys on one GPU and checks the result against it."""
import sys, time
import numpy as np
import cupy as cp
import ctypes, os, subprocess

_here = os.path.dirname(os.path.abspath(__file__))
_lib_path = "/tmp/cub_sort_probe.so"
if not os.path.exists(_lib_path):
    subprocess.check_call(["nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90", "-o", _lib_path,
                           os.path.join(_here, "cub_sort.cu")])
_lib = ctypes.CDLL(_lib_path)
_lib.cub_sort_into.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_longlong, ctypes.c_void_p]
_temp = {}

def sort_into(src, dst, count, stream, device):
    """CUB radix sort of `count` int32 keys from src (left as is) into dst, on `stream`; no host sync."""
    if count == 0:
        return
    need = ctypes.c_size_t(0)
    assert _lib.cub_sort_into(None, ctypes.byref(need), src, dst, count, stream.ptr) == 0
    t = _temp.get(device)
    if t is None or t.size < need.value:
        with cp.cuda.Device(device if isinstance(device, int) else device[0]):
            t = _temp[device] = cp.empty(max(need.value * 2, 1 << 29), np.uint8)
    got = ctypes.c_size_t(t.size)
    assert _lib.cub_sort_into(t.data.ptr, ctypes.byref(got), src, dst, count, stream.ptr) == 0

LOG_N = int(sys.argv[1]) if len(sys.argv) > 1 else 28
FRACS = [float(f) for f in (sys.argv[2] if len(sys.argv) > 2 else "0.25,0.25,0.25,0.25").split(",")]
LOG_S = int(sys.argv[3]) if len(sys.argv) > 3 else 18
SIGMAS = float(sys.argv[4]) if len(sys.argv) > 4 else 5.0
LANES = int(sys.argv[5]) if len(sys.argv) > 5 else 1  # streams the sub-range sorts alternate over
n = 1 << LOG_N
devices = [0, 1]
P = 2
ng = n // P
k = len(FRACS)
S = 1 << LOG_S  # samples over both places

src = r'''
// One tile of 2048 keys per block: every key's bucket (a branch-free binary search over the
// splitters, padded to 2^m - 1), its slot among the tile's keys of that bucket (a shared
// atomic), the tile staged in shared memory bucket by bucket, then written out: each
// bucket's keys of the tile go to one contiguous run at a cursor taken with one global
// atomic per (tile, bucket).
extern "C" __global__ void __launch_bounds__(256) partition(
    const int* __restrict__ keys, long long n, const int* __restrict__ splitters, int nsplit,
    const unsigned long long* __restrict__ dests, const long long* __restrict__ caps,
    unsigned long long* cursors, int* overflow)
{
  constexpr int T = 256, V = 2, I = 8, TILE = T * I;
  __shared__ int s_split[32];
  __shared__ unsigned s_hist[32];
  __shared__ unsigned s_start[32];
  __shared__ long long s_off[32];
  __shared__ int* s_dst[32];
  __shared__ long long s_cap[32];
  __shared__ int s_keys[TILE];
  __shared__ unsigned char s_b[TILE];
  const int tid = threadIdx.x;
  const int nb = nsplit + 1;
  int span = 1; while (span < nb) span <<= 1;  // search over span - 1 splitters
  if (tid < 32) { s_split[tid] = tid < nsplit ? splitters[tid] : 0x7fffffff; s_hist[tid] = 0; }
  const long long tile0 = (long long)blockIdx.x * TILE;
  const bool full = tile0 + TILE <= n;
  int key[I];
  if (full) {
    const int4* src4 = reinterpret_cast<const int4*>(keys + tile0);
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int4 q = src4[v * T + tid];
      key[v * 4 + 0] = q.x; key[v * 4 + 1] = q.y; key[v * 4 + 2] = q.z; key[v * 4 + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < I; ++i) {
      const long long idx = tile0 + (long long)((i / 4) * T + tid) * 4 + (i % 4);
      key[i] = idx < n ? keys[idx] : 0;
    }
  }
  __syncthreads();
  unsigned char b[I]; unsigned r[I];
#pragma unroll
  for (int i = 0; i < I; ++i) {
    const long long idx = tile0 + (long long)((i / 4) * T + tid) * 4 + (i % 4);
    int lo = 0;
    for (int step = span >> 1; step > 0; step >>= 1) lo += (s_split[lo + step - 1] <= key[i]) ? step : 0;
    lo = min(lo, nsplit);
    const bool valid = full || idx < n;
    b[i] = valid ? (unsigned char)lo : (unsigned char)255;
    r[i] = valid ? atomicAdd(&s_hist[lo], 1u) : 0u;
  }
  __syncthreads();
  if (tid == 0) { unsigned acc = 0; for (int j = 0; j < nb; ++j) { s_start[j] = acc; acc += s_hist[j]; } }
  __syncthreads();
  if (tid < nb) {
    const unsigned long long base = atomicAdd(&cursors[tid], (unsigned long long)s_hist[tid]);
    s_off[tid] = (long long)base - (long long)s_start[tid];
    s_dst[tid] = (int*)dests[tid];
    s_cap[tid] = caps[tid];
  }
#pragma unroll
  for (int i = 0; i < I; ++i) if (b[i] != 255) { const unsigned pos = s_start[b[i]] + r[i]; s_keys[pos] = key[i]; s_b[pos] = b[i]; }
  __syncthreads();
  const unsigned total = s_start[nb - 1] + s_hist[nb - 1];
#pragma unroll
  for (int i = 0; i < I; ++i) {
    const unsigned pos = i * T + tid;
    if (pos < total) {
      const int bb = s_b[pos];
      const long long dst = s_off[bb] + pos;
      if (dst < s_cap[bb]) s_dst[bb][dst] = s_keys[pos];
      else *overflow = 1;
    }
  }
}
'''

for d in devices:
    with cp.cuda.Device(d):
        for o in devices:
            if o != d:
                try:
                    cp.cuda.runtime.deviceEnablePeerAccess(o)
                except cp.cuda.runtime.CUDARuntimeError:
                    pass

rng = np.random.default_rng(0)
pristine, work, kern, cs, ts = {}, {}, {}, {}, {}
for d in devices:
    with cp.cuda.Device(d):
        pristine[d] = cp.asarray(rng.integers(-2**31, 2**31 - 1, size=ng, dtype=np.int64).astype(np.int32))
        work[d] = cp.empty_like(pristine[d])
        kern[d] = cp.RawKernel(src, "partition", options=("-std=c++17",))
        cs[d] = cp.cuda.Stream(non_blocking=True)
        ts[d] = cp.cuda.Stream(non_blocking=True)
        cs[(d, "lanes")] = [cp.cuda.Stream(non_blocking=True) for _ in range(LANES - 1)]

# buckets in key order: place 0's sub-ranges, the boundary bucket, place 1's sub-ranges
nb = 2 * k + 1
w = int(SIGMAS * 0.5 * np.sqrt(S))  # sample ranks either side of the boundary
per = S // P
cum = np.cumsum(FRACS)[:-1]
lo_edge, hi_edge = S // 2 - w, S // 2 + w
split_ranks = [int(lo_edge * c) for c in cum] + [lo_edge, hi_edge] + [int(hi_edge + (S - hi_edge) * c) for c in cum]
assert len(split_ranks) == nb - 1
bucket_of = lambda g, j: j if g == 0 else k + 1 + j
BOUND = k

def expected(b):
    lo = 0 if b == 0 else split_ranks[b - 1]
    hi = S if b == nb - 1 else split_ranks[b]
    return (hi - lo) * (n // S)

buf = {}
for d in devices:
    with cp.cuda.Device(d):
        own = [bucket_of(d, j) for j in range(k)]
        caps_region = [int(expected(b) * 1.03) + 65536 for b in own]
        R = cp.empty(sum(caps_region), np.int32)
        starts = [int(x) for x in np.concatenate([[0], np.cumsum(caps_region)[:-1]])]
        send = [bucket_of(1 - d, j) for j in range(k)]
        caps_send = [int(expected(b) / 2 * 1.03) + 65536 for b in send]
        Sd = cp.empty(sum(caps_send), np.int32)
        sstarts = [int(x) for x in np.concatenate([[0], np.cumsum(caps_send)[:-1]])]
        cap_b = int(expected(BOUND) * 1.1) + 65536
        Bn = cp.empty(cap_b, np.int32)
        Ball = cp.empty(4 * cap_b, np.int32) if d == 0 else None
        dests = np.zeros(nb, np.uint64); caps = np.zeros(nb, np.int64)
        for j, b in enumerate(own):
            dests[b] = R.data.ptr + 4 * starts[j]; caps[b] = caps_region[j]  # own keys only; capacity checked later
        for j, b in enumerate(send):
            dests[b] = Sd.data.ptr + 4 * sstarts[j]; caps[b] = caps_send[j]
        dests[BOUND] = Bn.data.ptr; caps[BOUND] = cap_b
        idx = cp.asarray(np.sort(rng.choice(ng, per, replace=False)).astype(np.int64))
        buf[d] = dict(R=R, starts=starts, caps_region=caps_region, Sd=Sd, sstarts=sstarts, Bn=Bn, Ball=Ball,
                      dests=cp.asarray(dests), caps=cp.asarray(caps), cursors=cp.zeros(nb, np.uint64),
                      overflow=cp.zeros(1, np.int32), idx=idx, samp=cp.empty(per, np.int32),
                      sall=cp.empty(S, np.int32), sall2=cp.empty(S, np.int32), sranks=cp.asarray(np.array(split_ranks, np.int64)),
                      out=cp.empty(ng, np.int32), host=cp.cuda.alloc_pinned_memory(nb * 8))

def refill():
    for d in devices:
        with cp.cuda.Device(d):
            work[d][...] = pristine[d]
            cp.cuda.Device(d).synchronize()

def run(record=None):
    marks = {d: [] for d in devices}
    def mark(d, name):
        if record is not None:
            e = cp.cuda.Event(); e.record(cs[d]); marks[d].append((name, e))
    ev_samp = {}
    for d in devices:
        with cp.cuda.Device(d), cs[d]:
            b = buf[d]
            mark(d, "start")
            cp.take(work[d], b["idx"], out=b["samp"])
            b["cursors"].fill(0)
            ev_samp[d] = cp.cuda.Event(); ev_samp[d].record(cs[d])
    for d in devices:
        with cp.cuda.Device(d), cs[d]:
            b = buf[d]
            for o in devices:
                if o != d: cs[d].wait_event(ev_samp[o])
                cp.cuda.runtime.memcpyPeerAsync(b["sall"].data.ptr + 4 * o * per, d, buf[o]["samp"].data.ptr, o, 4 * per, cs[d].ptr)
            sort_into(b["sall"].data.ptr, b["sall2"].data.ptr, S, cs[d], (d, 0))
            b["sall"], b["sall2"] = b["sall2"], b["sall"]
            spl = cp.take(b["sall"], b["sranks"])
            mark(d, "splitters")
            grid = (ng + 2047) // 2048
            kern[d]((grid,), (256,), (work[d], np.int64(ng), spl, np.int32(nb - 1), b["dests"], b["caps"],
                                      b["cursors"], b["overflow"]))
            mark(d, "partition")
            cp.cuda.runtime.memcpyAsync(b["host"].ptr, b["cursors"].data.ptr, nb * 8, cp.cuda.runtime.memcpyDeviceToHost, cs[d].ptr)
    counts = {}
    for d in devices:
        cs[d].synchronize()
        counts[d] = [int(c) for c in np.frombuffer(buf[d]["host"], np.uint64, nb)]
    cb = [counts[d][BOUND] for d in devices]
    totals = {d: [counts[d][bucket_of(d, j)] + counts[1 - d][bucket_of(d, j)] for j in range(k)] for d in devices}
    head = ng - sum(totals[0])
    assert 0 <= head <= cb[0] + cb[1], (head, cb)
    arrived = {}
    for d in devices:  # receiving side queues its copies
        o = 1 - d
        with cp.cuda.Device(d):
            b, ob = buf[d], buf[o]
            if d == 0:
                cp.cuda.runtime.memcpyPeerAsync(b["Ball"].data.ptr + 4 * cb[0], 0, ob["Bn"].data.ptr, 1, 4 * cb[1], ts[0].ptr)
                arrived["bound"] = cp.cuda.Event(); arrived["bound"].record(ts[0])
            for j in range(k):
                sb = bucket_of(d, j)
                own = counts[d][sb]; recv = counts[o][sb]
                assert own + recv <= b["caps_region"][j]
                cp.cuda.runtime.memcpyPeerAsync(b["R"].data.ptr + 4 * (b["starts"][j] + own), d,
                                                ob["Sd"].data.ptr + 4 * ob["sstarts"][j], o, 4 * recv, ts[d].ptr)
                e = cp.cuda.Event(); e.record(ts[d]); arrived[(d, j)] = e
    bdone = None
    for d in devices:
        with cp.cuda.Device(d), cs[d]:
            b = buf[d]
            at = 0
            if d == 0:
                cp.cuda.runtime.memcpyAsync(b["Ball"].data.ptr, b["Bn"].data.ptr, 4 * cb[0], cp.cuda.runtime.memcpyDeviceToDevice, cs[0].ptr)
                cs[0].wait_event(arrived["bound"])
                nball = cb[0] + cb[1]
                sort_into(b["Ball"].data.ptr, b["Ball"].data.ptr + 4 * nball, nball, cs[0], (0, 0))
                sorted_b = b["Ball"].data.ptr + 4 * nball
                cp.cuda.runtime.memcpyAsync(b["out"].data.ptr + 4 * (ng - head), sorted_b, 4 * head,
                                            cp.cuda.runtime.memcpyDeviceToDevice, cs[0].ptr)
                cp.cuda.runtime.memcpyPeerAsync(buf[1]["out"].data.ptr, 1, sorted_b + 4 * head, 0,
                                                4 * (nball - head), cs[0].ptr)
                bdone = cp.cuda.Event(); bdone.record(cs[0])
                mark(d, "boundary")
            else:
                at = cb[0] + cb[1] - head
            lanes = [cs[d]] + cs[(d, "lanes")]
            go = cp.cuda.Event(); go.record(cs[d])
            for lane in lanes[1:]: lane.wait_event(go)
            for j in range(k):
                lane = lanes[j % len(lanes)]
                lane.wait_event(arrived[(d, j)])
                t = totals[d][j]
                sort_into(b["R"].data.ptr + 4 * int(b["starts"][j]), b["out"].data.ptr + 4 * at, t, lane, (d, j % len(lanes)))
                mark(d, f"sort {j}")
                b.setdefault("where", {})[j] = (at, t)
                at += t
            for lane in lanes[1:]:
                e = cp.cuda.Event(); e.record(lane); cs[d].wait_event(e)
            mark(d, "all sorts")
            if d == 1:
                cs[1].wait_event(bdone)
    for d in devices:
        cs[d].synchronize()
    if record is not None:
        for d in devices:
            t0 = marks[d][0][1]
            print(f"  GPU {d}: " + ", ".join(f"{nm} {cp.cuda.get_elapsed_time(t0, e):.3f}" for nm, e in marks[d][1:]))
    return totals

def timed(reps=8):
    t = []
    for i in range(reps + 2):
        refill()
        t0 = time.perf_counter(); run(); t1 = time.perf_counter()
        if i >= 2: t.append((t1 - t0) * 1e3)
    return np.median(t), min(t)

with cp.cuda.Device(0):
    full = cp.concatenate([pristine[0], cp.asarray(pristine[1].get())])
    tt = []
    for i in range(6):
        x = full.copy(); cp.cuda.Device(0).synchronize()
        t0 = time.perf_counter(); x.sort(); cp.cuda.Device(0).synchronize(); tt.append(time.perf_counter() - t0)
    ref_ms = np.median(tt[2:]) * 1e3
    reference = x
print(f"cupy.sort 2^{LOG_N} int32 on one GPU: {ref_ms:.3f} ms; 1.5x target {ref_ms/1.5:.3f} ms", flush=True)
for lg in range(LOG_N - 4, LOG_N):
    with cp.cuda.Device(0):
        x0 = pristine[0][: 1 << lg].copy(); tt = []
        for i in range(6):
            x = x0.copy(); cp.cuda.Device(0).synchronize()
            t0 = time.perf_counter(); x.sort(); cp.cuda.Device(0).synchronize(); tt.append(time.perf_counter() - t0)
        y = cp.empty_like(x0); tc = []
        for i in range(6):
            cp.cuda.Device(0).synchronize(); t0 = time.perf_counter()
            sort_into(x0.data.ptr, y.data.ptr, x0.size, cs[0], 0); cs[0].synchronize(); tc.append(time.perf_counter() - t0)
        print(f"  cupy.sort 2^{lg}: {np.median(tt[2:])*1e3:.3f} ms; CUB sort_into {np.median(tc[2:])*1e3:.3f} ms", flush=True)

for parts in (2, 4):
    with cp.cuda.Device(0):
        m = (1 << (LOG_N - 1)) // parts
        x0 = pristine[0][: m * parts].copy(); y = cp.empty_like(x0)
        lanes = [cp.cuda.Stream(non_blocking=True) for _ in range(parts)]
        tc = []
        for i in range(6):
            cp.cuda.Device(0).synchronize(); t0 = time.perf_counter()
            for j, st in enumerate(lanes):
                sort_into(x0.data.ptr + 4 * j * m, y.data.ptr + 4 * j * m, m, st, (0, "conc", j))
            for st in lanes: st.synchronize()
            tc.append(time.perf_counter() - t0)
        print(f"  {parts} concurrent CUB sorts of 2^{m.bit_length()-1} on {parts} streams: {np.median(tc[2:])*1e3:.3f} ms", flush=True)
with cp.cuda.Device(0):
    x0 = pristine[0].copy(); cp.cuda.Device(0).synchronize()
    buf0 = buf[0]
    spl = cp.asarray(np.sort(rng.integers(-2**31, 2**31 - 1, size=nb - 1)).astype(np.int32))
    big = cp.empty(ng + (1 << 20) * nb, np.int32)
    dd = np.array([big.data.ptr + 4 * i * (ng // nb + (1 << 20)) for i in range(nb)], np.uint64)
    cc = np.full(nb, ng // nb + (1 << 20), np.int64)
    dd, cc = cp.asarray(dd), cp.asarray(cc)
    cur = cp.zeros(nb, np.uint64); ov = cp.zeros(1, np.int32)
    tc = []
    for i in range(8):
        cur.fill(0); cp.cuda.Device(0).synchronize(); t0 = time.perf_counter()
        kern[0](((ng + 2047) // 2048,), (256,), (x0, np.int64(ng), spl, np.int32(nb - 1), dd, cc, cur, ov))
        cp.cuda.Device(0).synchronize(); tc.append(time.perf_counter() - t0)
    print(f"  partition kernel alone, 2^{ng.bit_length()-1} keys into {nb} buckets: {np.median(tc[2:])*1e3:.3f} ms "
          f"({8 * ng / np.median(tc[2:]) / 1e9:.0f} GB/s)", flush=True)
med, best = timed()
print(f"partition-first model, fracs {FRACS}, samples 2^{LOG_S}, {SIGMAS} sigma, {LANES} sort streams: median {med:.3f} ms, best {best:.3f} ms "
      f"-> {ref_ms/med:.3f}x cupy.sort", flush=True)
refill(); totals = run(record=True)
# check: assemble each place's output and compare with the one-GPU sort
for d in devices:
    with cp.cuda.Device(d):
        b = buf[d]
        cp.cuda.Device(d).synchronize()
got = np.concatenate([buf[0]["out"].get(), buf[1]["out"].get()])
print("matches cupy.sort:", bool((got == reference.get()).all()),
      "| overflow flags:", [int(buf[d]["overflow"].get()[0]) for d in devices], flush=True)
