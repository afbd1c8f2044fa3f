#!/usr/bin/env bash
# Which objects nanobind reports alive at exit under compute-sanitizer, and why (probe).
MIN='import numpy as np, cuda_sharded_jit as s; g=s.PlaceGroup.by_devices([0,0]); a=s.ShardedArray.from_numpy(g, np.arange(100.0)); print(s.sum(a))'
echo "== plain, minimal"; python3 -P -c "$MIN" 2>&1 | head -3
echo "== memcheck, minimal"; compute-sanitizer --tool memcheck python3 -P -c "$MIN" 2>&1 | head -3
echo "== memcheck, minimal, del at end"; compute-sanitizer --tool memcheck python3 -P -c "$MIN; del a, g" 2>&1 | head -3
echo "== memcheck, import only"; compute-sanitizer --tool memcheck python3 -P -c "import cuda_sharded_jit" 2>&1 | head -3
echo "== memcheck, group only"; compute-sanitizer --tool memcheck python3 -P -c "import cuda_sharded_jit as s; g=s.PlaceGroup.by_devices([0])" 2>&1 | head -3
echo "== memcheck, atexit + weakref trace"; compute-sanitizer --tool memcheck python3 -P -c "
import atexit, sys, weakref
$MIN
atexit.register(lambda: print('atexit ran', flush=True))
weakref.finalize(g, lambda: print('group wrapper finalized', flush=True))
print('main done', flush=True)" 2>&1 | head -8
echo "== memcheck, PYTHONDEVMODE"; PYTHONDEVMODE=1 compute-sanitizer --tool memcheck python3 -P -c "$MIN" 2>&1 | head -6
echo "== env under sanitizer"; compute-sanitizer --tool memcheck python3 -c "import os,sys; print({k:v for k,v in os.environ.items() if 'SANITIZER' in k or 'PRELOAD' in k or 'PYTHON' in k}); print(sys.flags)" 2>&1 | head -4
