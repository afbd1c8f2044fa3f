"""Mean and variance in one pass over every GPU: Welford's (count, mean, M2) accumulator,
combined pairwise (Chan et al.), so shards fold in any grouping without losing precision.

    python examples/welford.py
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit


def one(x):
    return 1.0, np.float64(x), 0.0  # count, mean, M2 of a single value, in float64


def combine(p, q):
    count = p[0] + q[0]
    if count == 0.0:
        return p
    delta = q[1] - p[1]
    mean = p[1] + delta * (q[0] / count)
    return count, mean, p[2] + q[2] + delta * delta * (p[0] * q[0] / count)


def main() -> int:
    group = group_or_exit("welford")
    host = (np.random.default_rng(11).standard_normal(20_000_000) * 0.01 + 1e4).astype(np.float32)
    x = sharded.ShardedArray.from_numpy(group, host)

    count, mean, m2 = sharded.transform_reduce(x, one, combine, (0.0, 0.0, 0.0))
    np.testing.assert_allclose(mean, np.mean(host, dtype=np.float64), rtol=1e-12)
    np.testing.assert_allclose(m2 / count, np.var(host, dtype=np.float64), rtol=1e-6)
    print(f"n = {count:.0f}, mean = {mean:.6f}, variance = {m2 / count:.6e}: match numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
