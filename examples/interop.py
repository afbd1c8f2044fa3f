"""Per-shard interop: a CuPy kernel and a numba @cuda.jit kernel on each shard, then our
algorithms on the result, and torch reading the same memory without a copy.

    python examples/interop.py

`x.shard(i)` is a zero-copy view with `__cuda_array_interface__` (v3) whose stream is place
i's stream: running foreign work on that stream keeps it ordered with ours. A library that
is not installed is skipped, with a line saying so.
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit


def cupy_square(x: sharded.ShardedArray) -> bool:
    try:
        import cupy as cp
    except ImportError:
        print("cupy: not installed, skipped")
        return False
    square = cp.ElementwiseKernel("float64 v", "float64 out", "out = v * v", "csj_example_square")
    for place in range(x.num_shards):
        view = x.shard(place)
        with cp.cuda.Device(view.device), cp.cuda.ExternalStream(x.group.stream(place), view.device):
            shard = cp.asarray(view)
            square(shard, shard)  # in place, on the place's stream
    return True


def numba_add_index(x: sharded.ShardedArray) -> bool:
    try:
        from numba import cuda
    except ImportError:
        print("numba: not installed, skipped")
        return False

    @cuda.jit
    def add_index(values, offset):
        i = cuda.grid(1)
        if i < values.size:
            values[i] += offset + i  # the element's global index

    for place in range(x.num_shards):
        view = x.shard(place)
        with cuda.gpus[view.device]:
            shard = cuda.as_cuda_array(view)
            stream = cuda.external_stream(x.group.stream(place))
            blocks = (len(view) + 255) // 256
            if blocks:
                add_index[blocks, 256, stream](shard, x.shard_offsets[place])
    return True


def torch_sum(x: sharded.ShardedArray):
    try:
        import torch
    except ImportError:
        print("torch: not installed, skipped")
        return None
    total = 0.0
    for place in range(x.num_shards):
        view = x.shard(place)
        device = torch.device("cuda", view.device)
        with torch.cuda.stream(torch.cuda.ExternalStream(x.group.stream(place), device=device)):
            tensor = torch.as_tensor(view, device=device)  # zero copy through the interface
            total += float(tensor.sum())
    return total


def main() -> int:
    group = group_or_exit("interop")
    host = np.random.default_rng(4).standard_normal(3_000_001)
    x = sharded.ShardedArray.from_numpy(group, host)
    expected = host.copy()

    if cupy_square(x):
        expected = expected * expected
        print("cupy: squared every shard in place")
    if numba_add_index(x):
        expected = expected + np.arange(host.size)
        print("numba: added each element's global index")

    np.testing.assert_allclose(x.to_numpy(), expected, rtol=1e-12)
    total = float(sharded.reduce(x, lambda a, b: a + b))
    np.testing.assert_allclose(total, expected.sum(), rtol=1e-9)
    print(f"sharded.reduce of the result: {total:.6g}, matches numpy")

    torch_total = torch_sum(x)
    if torch_total is not None:
        np.testing.assert_allclose(torch_total, expected.sum(), rtol=1e-9)
        print(f"torch, reading the shards in place: {torch_total:.6g}, matches numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
