"""A histogram and a global sort of a large array spread over every GPU.

    python examples/sort_and_histogram.py

The sort keeps each shard's size: afterwards shard 0 holds the smallest values and the last
shard the largest, so order statistics (a median, percentiles) are plain index lookups.
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit


def main() -> int:
    group = group_or_exit("sort_and_histogram")
    host = np.random.default_rng(7).standard_normal(20_000_000).astype(np.float32)
    host[::1000] = np.nan  # NaNs are ignored by the histogram and sort last
    x = sharded.ShardedArray.from_numpy(group, host)
    print(x)

    counts = sharded.histogram_even(x, num_bins=80, lower=-4.0, upper=4.0)
    expected, _ = np.histogram(host, bins=80, range=(-4.0, 4.0))
    np.testing.assert_array_equal(counts, expected)
    print(f"histogram: {counts.sum()} of {host.size} values in [-4, 4], matches np.histogram")

    sharded.sort(x)
    ordered = x.to_numpy()
    np.testing.assert_array_equal(ordered, np.sort(host))
    print(f"sort: matches np.sort; shard sizes unchanged {x.shard_sizes}")

    finite = host.size - int(np.isnan(host).sum())
    for percentile in (1, 50, 99):
        rank = (finite - 1) * percentile // 100
        print(f"  {percentile:>2}th percentile (rank {rank}): {ordered[rank]:+.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
