"""Running maximum and a cumulative mean through scans.

    python examples/scans.py

(An exponential moving average is a scan over affine maps (a, b), which needs tuple-valued
accumulators: it comes with them.)
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit


def main() -> int:
    group = group_or_exit("scans")
    host = np.random.default_rng(2).standard_normal(5_000_000)
    x = sharded.ShardedArray.from_numpy(group, host)

    running_max = sharded.inclusive_scan(x, lambda a, b: a if a > b else b)
    np.testing.assert_array_equal(running_max.to_numpy(), np.maximum.accumulate(host))
    print("running maximum: matches np.maximum.accumulate")

    running_sum = sharded.inclusive_scan(x, lambda a, b: a + b)
    count = sharded.ShardedArray.allocate(group, list(x.shard_sizes), np.float64)
    sharded.sequence(count, start=1, step=1)
    cumulative_mean = sharded.transform(lambda s, k: s / k, running_sum, count).to_numpy()
    expected = np.cumsum(host) / np.arange(1, host.size + 1)
    np.testing.assert_allclose(cumulative_mean, expected, rtol=1e-9, atol=1e-12)
    print("cumulative mean: matches numpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
