"""Who holds a ShardedArray's native object after the wrapper is deleted (probe)."""
import gc, sys
import numpy as np, cuda_sharded_jit as s
g = s.PlaceGroup.by_devices([0, 0])
for how in ("allocate", "from_numpy", "from_numpy+sum"):
    a = s.ShardedArray.allocate(g, 100, np.float64) if how == "allocate" else s.ShardedArray.from_numpy(g, np.arange(100.0))
    if how.endswith("sum"): s.sum(a)
    impl = a._impl
    del a; gc.collect()
    refs = [type(r).__name__ + (":" + str(getattr(r, "f_code", ""))[:80] if hasattr(r, "f_code") else "") for r in gc.get_referrers(impl) if r is not globals()]
    print(how, "refcount", sys.getrefcount(impl) - 2, "referrers", refs, flush=True)
    del impl
