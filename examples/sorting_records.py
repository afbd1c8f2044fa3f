"""Sorting with user operators across every GPU: records by a field, rows ranked by a computed
score, values carried with their keys, the largest entries, and lookups in a sorted table.

    python examples/sorting_records.py

`sort(key=)` orders records by whatever the key returns (here a field, then a tuple);
`argsort` gives the global order of a computed score, which numpy then applies to the rows
on the host; `sort_by_key` moves a payload with its keys; `top_k` and `searchsorted` answer
the usual questions without a full sort of the answers.
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit

ROW = np.dtype([("id", np.int64), ("price", np.float64), ("volume", np.int32)], align=True)


def main() -> int:
    group = group_or_exit("sorting_records")
    rng = np.random.default_rng(11)
    rows = np.zeros(1_000_000, ROW)
    rows["id"] = np.arange(rows.size)
    rows["price"] = np.round(rng.uniform(1.0, 100.0, rows.size), 2)
    rows["volume"] = rng.integers(1, 500, rows.size)
    table = sharded.ShardedArray.from_numpy(group, rows)
    print(table)

    # records by a field: stable, so equal prices keep their id order
    by_price = sharded.sort(table, key=lambda r: r.price, out=sharded.ShardedArray.allocate(
        group, list(table.shard_sizes), ROW))
    np.testing.assert_array_equal(by_price.to_numpy(), rows[np.argsort(rows["price"], kind="stable")])
    print("sort(key=lambda r: r.price): matches numpy's stable argsort")

    # by volume (largest first), then price: a tuple key compares lexicographically
    sharded.sort(table, key=lambda r: (-r.volume, r.price))
    order = np.lexsort((np.arange(rows.size), rows["price"], -rows["volume"]))
    np.testing.assert_array_equal(table.to_numpy(), rows[order])
    print("sort(key=lambda r: (-r.volume, r.price)): matches np.lexsort")

    # rank the rows by a score computed on the GPUs; take them back to numpy in that order
    table = sharded.ShardedArray.from_numpy(group, rows)
    turnover = sharded.transform(lambda r: r.price * r.volume, table)
    ranking = sharded.argsort(turnover, descending=True).to_numpy()
    best = rows[ranking[:3]]
    np.testing.assert_array_equal(ranking, np.lexsort((np.arange(rows.size), -(rows["price"] * rows["volume"]))))
    print("argsort(turnover, descending=True): top rows", best["id"].tolist())

    # the same question without sorting everything
    values, indices = sharded.top_k(turnover, 3)
    np.testing.assert_array_equal(indices, ranking[:3])
    print(f"top_k(turnover, 3): {values.round(2).tolist()} at {indices.tolist()}")

    # prices sorted with their ids; where would new prices go?
    prices = sharded.transform(lambda r: r.price, table)
    ids = sharded.transform(lambda r: r.id, table)
    sharded.sort_by_key(prices, ids)
    queries = np.array([1.0, 50.0, 99.99])
    positions = sharded.searchsorted(prices, queries)
    np.testing.assert_array_equal(positions, np.searchsorted(np.sort(rows["price"]), queries))
    print(f"searchsorted(prices, {queries.tolist()}): {positions.tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
