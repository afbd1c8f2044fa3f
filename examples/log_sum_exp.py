"""A numerically stable log-sum-exp across GPUs in one pass: the accumulator carries the
running maximum and the sum of exp(x - maximum), rescaled whenever the maximum moves.

    python examples/log_sum_exp.py
"""

import math
import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit


def start(x):
    return np.float64(x), 1.0


def combine(p, q):
    if p[0] >= q[0]:
        return p[0], p[1] + q[1] * math.exp(q[0] - p[0])
    return q[0], q[1] + p[1] * math.exp(p[0] - q[0])


def main() -> int:
    group = group_or_exit("log_sum_exp")
    host = np.random.default_rng(12).standard_normal(10_000_000) * 300  # exp() alone overflows
    x = sharded.ShardedArray.from_numpy(group, host)

    top, scaled = sharded.transform_reduce(x, start, combine, None)
    result = top + math.log(scaled)
    expected = host.max() + np.log(np.sum(np.exp(host - host.max())))
    np.testing.assert_allclose(result, expected, rtol=1e-12)
    print(f"log(sum(exp(x))) = {result:.6f}: matches numpy's shifted computation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
