import sys, faulthandler
faulthandler.enable()
import numpy as np, cuda_sharded_jit as sharded
from cuda.bindings import runtime
def say(*a): print(*a, flush=True)
group = sharded.PlaceGroup.by_devices([0, 0])
a = sharded.ShardedArray.from_numpy(group, np.arange(1000, dtype=np.float64))
say("before reset", float(sharded.sum(a)))
say("reset", runtime.cudaDeviceReset())
for name, call in [("sum", lambda: sharded.sum(a)),
                   ("fill", lambda: (sharded.fill(a, 1.0), group.sync())),
                   ("to_numpy", lambda: a.to_numpy()),
                   ("allocate", lambda: sharded.ShardedArray.allocate(group, 10, np.float32))]:
    say("calling", name)
    try:
        call(); say(name, "ok")
    except (RuntimeError, ValueError, MemoryError) as error:
        say(name, type(error).__name__, str(error)[:200])
say("del"); del a; say("del group"); del group
fresh = sharded.PlaceGroup.by_devices([0]); say("fresh group")
b = sharded.ShardedArray.from_numpy(fresh, np.arange(10.0)); say("fresh array")
say("fresh sum", float(sharded.sum(b)))
