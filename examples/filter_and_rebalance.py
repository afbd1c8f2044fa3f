"""Filter rows on every GPU, then rebalance: a selection keeps each shard's survivors where
they are (no data crosses GPUs), so shard sizes follow the data; `resharded()` moves them back
to an even split in global order for the next step.

    python examples/filter_and_rebalance.py
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit


def main() -> int:
    group = group_or_exit("filter_and_rebalance")
    n = 6_000_000
    rng = np.random.default_rng(5)
    # a drift, so that later shards keep more than earlier ones
    host = (rng.standard_normal(n) + np.linspace(-2.0, 2.0, n)).astype(np.float32)
    x = sharded.ShardedArray.from_numpy(group, host)

    kept = sharded.select(x, lambda v: v > 1.0)
    expected = host[host > 1.0]
    np.testing.assert_array_equal(kept.to_numpy(), expected)
    print(f"select(v > 1): {len(kept)} of {n} kept, shard sizes {kept.shard_sizes}")

    balanced = kept.resharded()
    places = len(group)
    even = tuple(len(kept) // places + (1 if place < len(kept) % places else 0) for place in range(places))
    assert balanced.shard_sizes == even
    np.testing.assert_array_equal(balanced.to_numpy(), expected)
    print(f"resharded(): shard sizes {balanced.shard_sizes}, same elements in the same order")

    # every element goes one way or the other, each side in global order
    outliers, inliers = sharded.partition(x, lambda v: abs(v) > 2.5)
    np.testing.assert_array_equal(outliers.to_numpy(), host[np.abs(host) > 2.5])
    np.testing.assert_array_equal(inliers.to_numpy(), host[np.abs(host) <= 2.5])
    print(f"partition(|v| > 2.5): {len(outliers)} outliers, {len(inliers)} inliers")

    # with the global index: every third element of the positive ones
    thinned = sharded.select(x, lambda v, i: v > 0 and i % 3 == 0, with_index=True)
    index = np.arange(n)
    np.testing.assert_array_equal(thinned.to_numpy(), host[(host > 0) & (index % 3 == 0)])
    print(f"select(v > 0 and i % 3 == 0, with_index=True): {len(thinned)} kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
