"""What a device reset does to the primary context's handle and id (cuCtxGetId), and to
cuDevicePrimaryCtxGetState, as seen through cuda.bindings (probe)."""
from cuda.bindings import driver as cu, runtime as rt
print("free0", rt.cudaFree(0))
err, ctx = cu.cuCtxGetCurrent(); print("ctx", err, int(ctx), cu.cuCtxGetId(ctx))
print("state", cu.cuDevicePrimaryCtxGetState(0))
print("reset", rt.cudaDeviceReset())
print("after reset: id of old handle", cu.cuCtxGetId(ctx), "state", cu.cuDevicePrimaryCtxGetState(0))
err, cur = cu.cuCtxGetCurrent(); print("current after reset", err, int(cur) if cur is not None else None)
print("setdevice", rt.cudaSetDevice(0))
err, cur = cu.cuCtxGetCurrent(); print("current after setdevice", err, int(cur), "id", cu.cuCtxGetId(cur) if int(cur) else None, "state", cu.cuDevicePrimaryCtxGetState(0))
print("free0", rt.cudaFree(0))
err, cur = cu.cuCtxGetCurrent(); print("current after free0", err, int(cur), "id", cu.cuCtxGetId(cur), "old handle id", cu.cuCtxGetId(ctx))
print("driver", rt.cudaDriverGetVersion(), rt.cudaRuntimeGetVersion())

# What one liveness check costs the driver: cuCtxGetId (the check every call makes) against
# cuCtxGetCurrent (a thread-local read), both through the same Python binding, so that the
# difference is the driver's own work.
import time
err, ctx = cu.cuCtxGetCurrent()
for name, call in (("cuCtxGetCurrent", lambda: cu.cuCtxGetCurrent()), ("cuCtxGetId", lambda: cu.cuCtxGetId(ctx))):
    for _ in range(1000):
        call()
    start = time.perf_counter()
    for _ in range(100000):
        call()
    print(f"{name}: {(time.perf_counter() - start) * 10:.3f} us per call (through cuda.bindings)")
