"""Index-aware reductions: argmin and argmax across GPUs, and the same by hand with a tuple
accumulator (value, global index).

    python examples/argmin.py
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit


def first_smallest(p, q):
    """(value, index) pairs; p covers earlier elements than q, so ties keep the first index."""
    return q if q[0] < p[0] else p


def main() -> int:
    group = group_or_exit("argmin")
    host = np.random.default_rng(3).integers(0, 1000, 10_000_000).astype(np.float32)
    x = sharded.ShardedArray.from_numpy(group, host)

    assert sharded.argmin(x) == np.argmin(host) and sharded.argmax(x) == np.argmax(host)
    print(f"argmin {sharded.argmin(x)}, argmax {sharded.argmax(x)}: match numpy (first index on ties)")

    value, index = sharded.transform_reduce(x, lambda v, i: (v, i), first_smallest, None, with_index=True)
    assert index == np.argmin(host) and value == host.min()
    print(f"by hand: smallest {value} first at global index {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
