"""Who holds a ShardedArray after `del` (probe for nanobind's exit report, which appears only
under compute-sanitizer): the native object's and the wrapper's referrers, two levels up.
    python3 leak_probe2.py; compute-sanitizer --tool memcheck python3 leak_probe2.py"""
import gc, sys, weakref
import numpy as np, cuda_sharded_jit as s


def describe(obj):
    kind = type(obj).__name__
    if hasattr(obj, "f_code"):
        return f"frame {obj.f_code.co_name} ({obj.f_code.co_filename.rsplit('/', 1)[-1]}:{obj.f_lineno})"
    if isinstance(obj, dict):
        return f"dict keys {sorted(map(str, obj))[:8]}"
    if isinstance(obj, (list, tuple)):
        return f"{kind} of {len(obj)}"
    if kind == "cell":
        return "cell"
    if hasattr(obj, "tb_frame"):
        return f"traceback at {describe(obj.tb_frame)}"
    return kind


g = s.PlaceGroup.by_devices([0, 0])
for how in ("allocate", "from_numpy", "from_numpy+sum"):
    a = s.ShardedArray.allocate(g, 100, np.float64) if how == "allocate" else s.ShardedArray.from_numpy(g, np.arange(100.0))
    if how.endswith("sum"):
        s.sum(a)
    impl, alive = a._impl, weakref.ref(a)
    del a
    gc.collect()
    here = sys._getframe()
    print(how, "native refcount", sys.getrefcount(impl) - 2, "wrapper alive", alive() is not None, flush=True)
    wrapper = alive()
    if wrapper is not None:
        for first in gc.get_referrers(wrapper):
            if first is here:
                continue
            up = [describe(r) for r in gc.get_referrers(first) if r is not here][:6]
            print("   wrapper held by", describe(first), "<- held by", up, flush=True)
        print("   wrapper refcount", sys.getrefcount(wrapper) - 2, flush=True)
    del wrapper, impl
print("exc info", sys.exc_info(), "last", getattr(sys, "last_value", None), flush=True)
