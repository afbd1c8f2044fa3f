"""The A/B behind the sort's sampling threshold (CSJ_SORT_SAMPLE_MIN_KEYS, default 2^25 keys
per shard; docs/performance.md, "Environment switches for A/B runs"): the two-place sort with
sampled bounds and with the first search round's bounds (CSJ_SORT_SAMPLE_SIGMAS=off),
alternating call by call in one process so that drift hits both alike. 2^N int32 keys in
total over GPUs 0 and 1, the same keys refilled before each call (untimed), wall clock,
median of 40 after 4 warm-up rounds. Needs GPUs 0 and 1 and CuPy.

    python benchmarks/sort_sampled_bounds_ab.py 23                           # 2^23 keys in total
    CSJ_SORT_SAMPLE_MIN_KEYS=0 python benchmarks/sort_sampled_bounds_ab.py 23  # sample at any size

Below the threshold both modes take the first round's bounds unless CSJ_SORT_SAMPLE_MIN_KEYS
is lowered.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_sort import two_place_input  # noqa: E402
from common import time_wall  # noqa: E402

MODES = {"sampled": None, "first round": "off"}  # CSJ_SORT_SAMPLE_SIGMAS: unset, or "off"
ROUNDS, WARMUP_ROUNDS = 44, 4


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log2_keys", nargs="?", type=int, default=28, help="keys in total, as a power of two")
    arguments = parser.parse_args(argv)

    import cupy as cp

    import cuda_sharded_jit as sharded

    group, array, _, refill = two_place_input(cp, sharded, 1 << arguments.log2_keys)
    times = {mode: [] for mode in MODES}
    for round_ in range(ROUNDS):
        for mode, sigmas in MODES.items():
            if sigmas is None:
                os.environ.pop("CSJ_SORT_SAMPLE_SIGMAS", None)
            else:
                os.environ["CSJ_SORT_SAMPLE_SIGMAS"] = sigmas  # the shim reads it once per sort
            seconds = time_wall(lambda: sharded.sort(array), group.sync, reps=1, warmup=0, prepare=refill)
            if round_ >= WARMUP_ROUNDS:
                times[mode] += seconds
    host = array.to_numpy()
    print("sorted:", bool((host[1:] >= host[:-1]).all()))
    for mode, seconds in times.items():
        print(f"2^{arguments.log2_keys} {mode:12s} median {statistics.median(seconds) * 1e3:.3f} ms  "
              f"min {min(seconds) * 1e3:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
