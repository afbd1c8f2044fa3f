"""A group-by on every GPU: sort the rows by key (values moved with them), so that each group
is one run of equal keys, then fold every run with `reduce_by_key` (sums, counts) and list the
distinct keys with `unique`.

    python examples/group_by.py
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit


def main() -> int:
    group = group_or_exit("group_by")
    n = 4_000_000
    rng = np.random.default_rng(9)
    keys_host = rng.integers(0, 5000, n).astype(np.int32)
    amounts_host = rng.integers(1, 100, n).astype(np.int64)  # integers: exact sums in any order

    keys = sharded.ShardedArray.from_numpy(group, keys_host)
    amounts = sharded.ShardedArray.from_numpy(group, amounts_host)
    sharded.sort_by_key(keys, amounts)  # stable: each group keeps its rows' order
    group_keys, totals = sharded.reduce_by_key(keys, amounts, lambda a, b: a + b)

    expected_keys, inverse = np.unique(keys_host, return_inverse=True)
    np.testing.assert_array_equal(group_keys.to_numpy(), expected_keys)
    np.testing.assert_array_equal(totals.to_numpy(), np.bincount(inverse, weights=amounts_host).astype(np.int64))
    print(f"reduce_by_key: {len(group_keys)} groups, totals match np.bincount")

    ones = sharded.transform(lambda k: np.int64(1), keys)
    _, counts = sharded.reduce_by_key(keys, ones, lambda a, b: a + b)
    np.testing.assert_array_equal(counts.to_numpy(), np.bincount(inverse))
    print(f"group sizes: smallest {counts.to_numpy().min()}, largest {counts.to_numpy().max()}")

    distinct = sharded.unique(sharded.ShardedArray.from_numpy(group, keys_host))
    np.testing.assert_array_equal(distinct.to_numpy(), expected_keys)
    print("unique: matches np.unique")
    return 0


if __name__ == "__main__":
    sys.exit(main())
