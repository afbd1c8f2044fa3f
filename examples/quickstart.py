"""Quickstart: shard an array over every GPU, run a Python operator on it, check the result.

    python examples/quickstart.py
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded


def main() -> int:
    try:
        group = sharded.PlaceGroup.by_devices()
    except RuntimeError as error:
        print(f"quickstart needs a CUDA GPU: {error}", file=sys.stderr)
        return 2
    print(group)

    n = 10_000_000
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal(n).astype(np.float32)
    y_host = rng.standard_normal(n).astype(np.float32)
    x = sharded.ShardedArray.from_numpy(group, x_host)
    y = sharded.ShardedArray.from_numpy(group, y_host)
    print(x)

    @sharded.op
    def saxpy(a, b, alpha):
        return alpha * a + b

    z = sharded.transform(saxpy, x, y, np.float32(2.5))  # alpha is a runtime argument
    expected = np.float32(2.5) * x_host + y_host
    # atol: the GPU fuses alpha * a + b into one rounding, numpy rounds twice
    np.testing.assert_allclose(z.to_numpy(), expected, rtol=1e-6, atol=1e-6)
    print(f"saxpy over {len(group)} place(s): matches numpy ({z.dtype}, {z.size} elements)")

    sharded.transform(sharded.ops.axpy(-1.0), x, y, out=y)  # precompiled descriptor, in place
    np.testing.assert_allclose(y.to_numpy(), y_host - x_host, rtol=1e-6)
    print("ops.axpy in place: matches numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
