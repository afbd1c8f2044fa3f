"""Custom reductions: an L2 norm through transform_reduce, and the largest magnitude.

    python examples/reductions.py
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit


def main() -> int:
    group = group_or_exit("reductions")
    host = np.random.default_rng(1).standard_normal(10_000_000)
    x = sharded.ShardedArray.from_numpy(group, host)

    norm = np.sqrt(sharded.transform_reduce(x, lambda v: v * v, lambda a, b: a + b, 0.0))
    np.testing.assert_allclose(norm, np.linalg.norm(host), rtol=1e-12)
    print(f"L2 norm: {norm:.6f} (numpy {np.linalg.norm(host):.6f})")

    largest = sharded.reduce(x, lambda a, b: max(abs(a), abs(b)))
    assert largest == np.abs(host).max()
    print(f"max |x|: {largest:.6f}")

    again = np.sqrt(sharded.transform_reduce(x, lambda v: v * v, lambda a, b: a + b, 0.0))
    assert again == norm  # bitwise deterministic, run after run
    return 0


if __name__ == "__main__":
    sys.exit(main())
