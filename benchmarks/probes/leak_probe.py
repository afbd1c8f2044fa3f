"""Does an array outlive `del` after each kind of call? (probe; run plain and under
compute-sanitizer.) Under `compute-sanitizer --tool memcheck` with its default host
backtraces, the frame that called a reduction stays referenced, and with it the arrays it
held, so nanobind reports "leaked instances" at exit; with `--show-backtrace no`, or without
the sanitizer, every array goes at `del` (2x H200, 2026-11-30): the references are the
sanitizer's backtrace capture, not the library's.
    python3 leak_probe.py
    compute-sanitizer --tool memcheck [--show-backtrace no] python3 leak_probe.py"""
import gc, sys, weakref
import numpy as np
import cuda_sharded_jit as s
from cuda_sharded_jit import _shim

g = s.PlaceGroup.by_devices([0, 0])
kept = []


def probe(label, call):
    a = s.ShardedArray.from_numpy(g, np.arange(100.0))
    alive = weakref.ref(a)
    call(a)
    del a
    gc.collect()
    wrapper = alive()
    print(f"{label}: alive after del {wrapper is not None}", flush=True)
    if wrapper is None:
        return
    for frame in gc.get_referrers(wrapper):
        if not hasattr(frame, "f_code") or frame is sys._getframe():
            continue
        print(f"   frame {frame.f_code.co_name}:{frame.f_lineno} refcount {sys.getrefcount(frame) - 2} "
              f"tracked {gc.is_tracked(frame)} back {frame.f_back and frame.f_back.f_code.co_name} "
              f"referrers {[type(r).__name__ for r in gc.get_referrers(frame)]}", flush=True)
    kept.append(alive)


def through_python(a):
    return _shim.reduce_builtin(_shim.BuiltinReduction.sum, a._impl, np.float64(0).tobytes())


from cuda_sharded_jit.algorithms import reduce as R


def empty_init(a):
    return _shim.reduce_builtin(_shim.BuiltinReduction.sum, a._impl, b"")


def with_result(a):
    valid, raw = _shim.reduce_builtin(_shim.BuiltinReduction.sum, a._impl, b"")
    return R._result(valid, raw, a.dtype, "sum", "reduce")


def checks_only(a):
    R.check_array(a)
    acc = R._accumulator(a.dtype, None)
    return R._pack(None, acc), a.dtype, a.group.archs


def module_reduce(a):
    return R.reduce(a, "sum")


probe("shim, empty init", empty_init)
probe("shim + _result", with_result)
probe("python checks only", checks_only)
probe("algorithms.reduce.reduce", module_reduce)
probe("shim reduce_builtin from a function", through_python)
probe("shim reduce_builtin, lambda", lambda a: _shim.reduce_builtin(_shim.BuiltinReduction.sum, a._impl,
                                                                       np.float64(0).tobytes()))
probe("to_numpy", lambda a: a.to_numpy())
probe("sharded.sum", s.sum)
probe("sharded.sum again", s.sum)
probe("sharded.max", s.max)
probe("user reduce", lambda a: s.reduce(a, lambda x, y: x + y))
gc.collect()
print("kept ones still alive after later calls:", [k() is not None for k in kept], flush=True)
print("sys.last_value", getattr(sys, "last_value", None), "exc", sys.exc_info(), flush=True)
