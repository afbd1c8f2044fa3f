"""Probe (one-off, recorded in docs/performance.md "Measured facts" and removed after): the host's
cost of single CUDA runtime/driver calls through cuda.bindings, an empty kernel's launch by
CUfunction and by a library's CUkernel, a launch plus stream synchronisation against a launch
plus a spin on a word the kernel stores in mapped pinned memory, and our small calls made
whole and through the shim directly (1024 float32, one place). Run on the GPU machine:
    python benchmarks/probes/host_api_probe.py   (SKIP_API=1: our calls only)
"""
import sys, time, statistics
import numpy as np
from cuda.bindings import runtime as rt, driver as dr, nvrtc

def per_call(f, n=20000, batches=7):
    res = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        res.append((time.perf_counter() - t0) / n * 1e6)
    return min(res), statistics.median(res)

def show(name, f, n=20000):
    b, m = per_call(f, n)
    print(f"{name:60s} best {b:7.3f}  median {m:7.3f} us", flush=True)

def ok(r):
    if r[0] != 0 and int(r[0]) != 0:
        raise RuntimeError(r)
    return r

import os
ok(rt.cudaSetDevice(0)); ok(rt.cudaFree(0))
if os.environ.get("SKIP_API"):
    show = lambda *a, **k: None
_, stream = ok(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
_, ev = ok(rt.cudaEventCreateWithFlags(rt.cudaEventDisableTiming))
ok(rt.cudaEventRecord(ev, stream)); ok(rt.cudaEventSynchronize(ev))
_, ctx = ok(dr.cuCtxGetCurrent())

show("python baseline: rt.cudaGetDevice", lambda: rt.cudaGetDevice())
show("rt.cudaSetDevice(0)", lambda: rt.cudaSetDevice(0))
show("rt.cudaFree(0)", lambda: rt.cudaFree(0))
show("dr.cuCtxGetCurrent", lambda: dr.cuCtxGetCurrent())
show("dr.cuCtxGetId", lambda: dr.cuCtxGetId(ctx))
show("rt.cudaEventQuery (done)", lambda: rt.cudaEventQuery(ev))
show("rt.cudaStreamQuery (idle)", lambda: rt.cudaStreamQuery(stream))
def rec():
    rt.cudaEventRecord(ev, stream)
show("rt.cudaEventRecord", rec)
show("rt.cudaMemGetInfo", lambda: rt.cudaMemGetInfo(), 5000)
_, flags = ok(rt.cudaGetDeviceFlags())
show("rt.cudaGetDeviceFlags", lambda: rt.cudaGetDeviceFlags())

src = b'extern "C" __global__ void k(long long* p){ if (p) p[0] = 1; }'
_, prog = nvrtc.nvrtcCreateProgram(src, b"k.cu", 0, [], [])
r = nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90"])
_, size = nvrtc.nvrtcGetCUBINSize(prog)
cubin = b" " * size
nvrtc.nvrtcGetCUBIN(prog, cubin)
_, mod = ok(dr.cuModuleLoadData(cubin))
_, fn = ok(dr.cuModuleGetFunction(mod, b"k"))
_, lib = ok(dr.cuLibraryLoadData(cubin, None, None, 0, None, None, 0))
_, kern = ok(dr.cuLibraryGetKernel(lib, b"k"))
_, kfn = ok(dr.cuKernelGetFunction(kern))
import ctypes
arg = ctypes.c_longlong(0)
params = ((0,), (ctypes.c_void_p,))
cs = dr.CUstream(int(stream))
def L(f):
    return lambda: dr.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, cs, params, 0)
for rnd in range(2):
    show(f"cuLaunchKernel CUfunction (module)   r{rnd}", L(fn), 5000); rt.cudaStreamSynchronize(stream)
    show(f"cuLaunchKernel CUkernel (library)    r{rnd}", L(dr.CUfunction(int(kern))), 5000); rt.cudaStreamSynchronize(stream)
    show(f"cuLaunchKernel CUfunction of kernel  r{rnd}", L(kfn), 5000); rt.cudaStreamSynchronize(stream)

# round trip: launch + stream sync, against launch + spin on a word the kernel stores in mapped pinned memory
src2 = b'extern "C" __global__ void w(volatile long long* f, long long v){ if (threadIdx.x == 0) { __threadfence_system(); *f = v; } }'
_, prog2 = nvrtc.nvrtcCreateProgram(src2, b"w.cu", 0, [], [])
nvrtc.nvrtcCompileProgram(prog2, 1, [b"-arch=sm_90"])
_, size2 = nvrtc.nvrtcGetCUBINSize(prog2)
cubin2 = b" " * size2
nvrtc.nvrtcGetCUBIN(prog2, cubin2)
_, mod2 = ok(dr.cuModuleLoadData(cubin2))
_, wfn = ok(dr.cuModuleGetFunction(mod2, b"w"))
_, host = ok(rt.cudaHostAlloc(64, rt.cudaHostAllocMapped | rt.cudaHostAllocPortable))
flag = ctypes.c_longlong.from_address(int(host))
flag.value = 0
counter = [0]
def sync_trip():
    counter[0] += 1
    dr.cuLaunchKernel(wfn, 1, 1, 1, 32, 1, 1, 0, cs, ((int(host), counter[0]), (ctypes.c_void_p, ctypes.c_longlong)), 0)
    rt.cudaStreamSynchronize(stream)
def spin_trip():
    counter[0] += 1
    v = counter[0]
    dr.cuLaunchKernel(wfn, 1, 1, 1, 32, 1, 1, 0, cs, ((int(host), v), (ctypes.c_void_p, ctypes.c_longlong)), 0)
    while flag.value != v:
        pass
def launch_only():
    counter[0] += 1
    dr.cuLaunchKernel(wfn, 1, 1, 1, 32, 1, 1, 0, cs, ((int(host), counter[0]), (ctypes.c_void_p, ctypes.c_longlong)), 0)
for rnd in range(2):
    show(f"launch w (no wait) r{rnd}", launch_only, 3000); rt.cudaStreamSynchronize(stream)
    show(f"launch w + cudaStreamSynchronize r{rnd}", sync_trip, 3000)
    show(f"launch w + spin on mapped word r{rnd}", spin_trip, 3000)

import cuda_sharded_jit as sharded
def show(name, f, n=20000):
    b, m = per_call(f, n)
    print(f"{name:60s} best {b:7.3f}  median {m:7.3f} us", flush=True)
from cuda_sharded_jit import _shim
from cuda_sharded_jit.algorithms import transform as tmod
g = sharded.PlaceGroup.by_devices([0])
x = sharded.ShardedArray.from_numpy(g, np.arange(1024, dtype=np.float32))
y = sharded.ShardedArray.from_numpy(g, np.ones(1024, dtype=np.float32))
out = sharded.ShardedArray.from_numpy(g, np.zeros(1024, dtype=np.float32))
add = lambda a, b: a + b
sharded.transform(add, x, y, out=out); g.sync()
arrays, packed, odt, libs, indexed, dev = tmod.prepare(add, (x, y), out)
impls = [x._impl, y._impl]
for rnd in range(2):
    show(f"sharded.transform(user add, out=) r{rnd}", lambda: sharded.transform(add, x, y, out=out)); g.sync()
    show(f"_shim.transform direct r{rnd}", lambda: _shim.transform(libs, impls, out._impl, packed, indexed)); g.sync()
    show(f"sharded.transform(ops.add, out=) r{rnd}", lambda: sharded.transform(sharded.ops.add, x, y, out=out)); g.sync()
    show(f"_shim.transform_builtin direct r{rnd}", lambda: _shim.transform_builtin(_shim.BuiltinOp.add, impls, out._impl, b"")); g.sync()
    show(f"sharded.reduce(x, add, 0.0) host value r{rnd}", lambda: sharded.reduce(x, add, 0.0), 5000)
    offs = sharded.ShardedArray.from_numpy(g, np.arange(0, 1025, 64, dtype=np.int64))
    show(f"segmented_reduce(x, dev offsets, add, 0.0) r{rnd}", lambda: sharded.segmented_reduce(x, offs, add, 0.0), 5000); g.sync()
import torch
tx = torch.arange(1024, dtype=torch.float32, device="cuda"); ty = torch.ones_like(tx); to = torch.empty_like(tx)
show("torch.add(out=)", lambda: torch.add(tx, ty, out=to)); torch.cuda.synchronize()
