"""Per-segment mean and variance in one pass: `segmented_reduce` with Welford's (count, mean,
M2) accumulator, combined pairwise (Chan et al.; the operators of welford.py). Segments are any ranges of the global array:
empty ones, ones that span GPUs.

    python examples/segment_statistics.py
"""

import sys

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit
from welford import combine, one  # Welford's accumulator of examples/welford.py


def main() -> int:
    group = group_or_exit("segment_statistics")
    n = 5_000_000
    rng = np.random.default_rng(13)
    host = (rng.standard_normal(n) * 3.0 + 10.0).astype(np.float32)
    x = sharded.ShardedArray.from_numpy(group, host)
    # about 2000 segments of random lengths, three of them empty
    cuts = rng.integers(0, n, 1999)
    cuts = np.sort(np.concatenate([cuts, cuts[:3]]))
    offsets = np.concatenate([[0], cuts, [n]]).astype(np.int64)

    stats = sharded.segmented_reduce(x, offsets, combine, (0.0, 0.0, 0.0), map_op=one).to_numpy()
    counts, means, m2 = stats["f0"], stats["f1"], stats["f2"]
    np.testing.assert_array_equal(counts, np.diff(offsets))
    for s in range(len(offsets) - 1):
        part = host[offsets[s]:offsets[s + 1]].astype(np.float64)
        if part.size:
            np.testing.assert_allclose(means[s], part.mean(), rtol=1e-12)
            np.testing.assert_allclose(m2[s], part.var() * part.size, rtol=1e-7, atol=1e-6)
    empty = int((counts == 0).sum())
    print(f"segmented_reduce: {len(counts)} segments ({empty} empty), means and variances match numpy")
    widest = int(np.argmax(counts))
    print(f"widest segment: {int(counts[widest])} values, mean {means[widest]:.4f}, "
          f"variance {m2[widest] / counts[widest]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
