"""top_k and searchsorted on one place against their peers, side by side in one process:

  - sharded.top_k(a, k) against torch.topk(a, k) (the same 2^N float32 on the GPU), each timed
    with the host waiting for the result (ours hands back numpy arrays, so a torch call is
    followed by a synchronize), and torch's GPU time by CUDA events beside it;
  - sharded.searchsorted(sorted_a, queries) with ShardedArray queries against
    cupy.searchsorted of the same sorted array and queries, CUDA events on each one's stream.

Results are checked against the peer's before anything is timed. Median of --reps after
--warmup calls. Needs one GPU, CuPy, and torch for top_k (skipped without it).

    python benchmarks/search_vs_peers.py                                  # the targets' sizes
    python benchmarks/search_vs_peers.py --log2-n 24 --log2-queries 20    # a quick run

The targets: top_k with k = 1024 of 2^28 float32 >= 1.0x torch.topk;
2^24 random float32 queries into 2^28 sorted float32 >= 1.0x cupy.searchsorted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from common import time_events_places  # noqa: E402


def wall(run, reps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times


def report(name: str, ours: list[float], peer: list[float], peer_name: str) -> None:
    mine, theirs = statistics.median(ours), statistics.median(peer)
    print(f"{name:40s} ours {mine * 1e3:9.3f} ms   {peer_name} {theirs * 1e3:9.3f} ms   "
          f"ratio (peer time / ours) {theirs / mine:5.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log2-n", type=int, default=28, help="elements of the array, as a power of two")
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--log2-queries", type=int, default=24)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    arguments = parser.parse_args(argv)

    import cupy as cp

    import cuda_sharded_jit as sharded

    n, k, count = 1 << arguments.log2_n, arguments.k, 1 << arguments.log2_queries
    group = sharded.PlaceGroup.by_devices([0])
    stream = (0, group.stream(0))
    with cp.cuda.Device(0):
        data = cp.random.RandomState(0).standard_normal(n, dtype=cp.float32)
        array = sharded.ShardedArray.allocate(group, n, np.float32)
        cp.copyto(cp.asarray(array.shard(0)), data)
        cp.cuda.Device(0).synchronize()

    # ---- top_k ----
    try:
        import torch
    except ImportError:
        print("top_k: torch is not installed, skipped")
    else:
        tensor = torch.from_dlpack(data)
        values, _ = sharded.top_k(array, k)
        expected = torch.topk(tensor, k).values.cpu().numpy()
        assert np.array_equal(values, expected), "top_k differs from torch.topk"

        def torch_topk():
            torch.topk(tensor, k)
            torch.cuda.synchronize()

        ours = wall(lambda: sharded.top_k(array, k), arguments.reps, arguments.warmup)
        peer = wall(torch_topk, arguments.reps, arguments.warmup)
        report(f"top_k k={k} of 2^{arguments.log2_n} float32", ours, peer, "torch.topk")
        events = time_events_places(cp, [(0, torch.cuda.current_stream().cuda_stream)],
                                    lambda: torch.topk(tensor, k), arguments.reps, arguments.warmup)
        print(f"{'':40s} torch.topk by CUDA events {statistics.median(events) * 1e3:9.3f} ms")

    # ---- searchsorted ----
    with cp.cuda.Device(0):
        ordered = cp.sort(data)
        cp.copyto(cp.asarray(array.shard(0)), ordered)
        queries = cp.random.RandomState(1).standard_normal(count, dtype=cp.float32)
        query_array = sharded.ShardedArray.allocate(group, count, np.float32)
        cp.copyto(cp.asarray(query_array.shard(0)), queries)
        cp.cuda.Device(0).synchronize()
        positions = sharded.searchsorted(array, query_array)
        expected = cp.searchsorted(ordered, queries)
        assert bool((cp.asarray(positions.shard(0)) == expected).all()), "searchsorted differs from cupy's"
        ours = time_events_places(cp, [stream], lambda: sharded.searchsorted(array, query_array),
                                  arguments.reps, arguments.warmup)
        peer = time_events_places(cp, [(0, cp.cuda.get_current_stream().ptr)],
                                  lambda: cp.searchsorted(ordered, queries), arguments.reps, arguments.warmup)
    report(f"searchsorted 2^{arguments.log2_queries} into 2^{arguments.log2_n} float32", ours, peer,
           "cupy.searchsorted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
