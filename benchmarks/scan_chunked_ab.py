"""The A/B behind the scan in L2-resident chunks (CSJ_X_SCAN, CSJ_X_SCAN_CHUNK_MIB, CSJ_X_SCAN_STREAMING;
docs/performance.md, "Environment switches for A/B runs"): one place's inclusive scan of 2^N
float32 (user add) under every variant and chunk size, alternating setting by setting in each
round in one process so that drift hits all alike, beside torch.cumsum when torch imports.
CUDA events, median over the rounds after the warm-up ones. Before timing, each setting's
int32 scan must equal the base scan's and its float32 scan must repeat bitwise. Needs GPU 0
and CuPy.

    python benchmarks/scan_chunked_ab.py 28                  # 2^28 float32
    python benchmarks/scan_chunked_ab.py 28 --chunks 4,8,16 --variants fused,fused-pdl/streaming

Goes when a variant is kept (or none), with the switches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from common import time_events_places  # noqa: E402

ROUNDS, WARMUP_ROUNDS, REPS = 12, 2, 5


def _set(variant: str, chunk_mib: str | None) -> None:
    """variant: a CSJ_X_SCAN value, "/streaming" appended for CSJ_X_SCAN_STREAMING=1."""
    name, _, streaming = variant.partition("/")
    os.environ["CSJ_X_SCAN"] = name  # the shim reads the three on every single-place scan
    os.environ["CSJ_X_SCAN_STREAMING"] = "1" if streaming else "0"
    if chunk_mib is None:
        os.environ.pop("CSJ_X_SCAN_CHUNK_MIB", None)
    else:
        os.environ["CSJ_X_SCAN_CHUNK_MIB"] = chunk_mib


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log2_n", nargs="?", type=int, default=28)
    parser.add_argument("--variants", help="CSJ_X_SCAN values, /streaming appended for CSJ_X_SCAN_STREAMING=1",
                        default="chunked,fused,chunked-pdl,fused-pdl,persistent,chunked/streaming,"
                                "fused/streaming,chunked-pdl/streaming,fused-pdl/streaming,persistent/streaming")
    parser.add_argument("--chunks", default="4,8,16,32", help="MiB of input per chunk")
    arguments = parser.parse_args(argv)

    import cupy as cp

    import cuda_sharded_jit as sharded

    n = 1 << arguments.log2_n
    group = sharded.PlaceGroup.by_devices([0])
    rng = np.random.default_rng(0)
    values = sharded.ShardedArray.from_numpy(group, rng.standard_normal(n).astype(np.float32))
    out = sharded.ShardedArray.allocate(group, n, np.float32)
    integers = sharded.ShardedArray.from_numpy(group, rng.integers(-1000, 1000, min(n, 1 << 26)).astype(np.int32))

    def add(x, y):
        return x + y

    settings = [("base", None)] + [(variant, chunk) for variant in arguments.variants.split(",")
                                   for chunk in arguments.chunks.split(",")]
    def on_device(array):  # a copy of the one shard, compared on the device
        return cp.asarray(array.shard(0)).view(cp.uint32).copy()

    _set("base", None)
    reference = on_device(sharded.inclusive_scan(integers, add))
    for variant, chunk in settings:
        _set(variant, chunk)
        assert bool(cp.array_equal(on_device(sharded.inclusive_scan(integers, add)), reference)), (variant, chunk)
        first = on_device(sharded.inclusive_scan(values, add, out=out))
        second = on_device(sharded.inclusive_scan(values, add, out=out))
        assert bool(cp.array_equal(first, second)), (variant, chunk)
    print("int32 equal to base, float32 repeats bitwise: every setting")

    streams = [(0, group.stream(0))]
    times = {setting: [] for setting in settings}
    torch_times = []
    try:
        import torch

        tensor = torch.as_tensor(cp.asarray(values.shard(0)), device="cuda:0")
        torch_out = torch.empty_like(tensor)
        torch_stream = torch.cuda.current_stream(0).cuda_stream
    except Exception:  # noqa: BLE001 (torch is optional)
        torch = None
    for round_ in range(ROUNDS):
        for variant, chunk in settings:
            _set(variant, chunk)
            seconds = time_events_places(cp, streams, lambda: sharded.inclusive_scan(values, add, out=out),
                                         reps=REPS, warmup=1)
            if round_ >= WARMUP_ROUNDS:
                times[(variant, chunk)] += seconds
        if torch is not None:
            seconds = time_events_places(cp, [(0, torch_stream)],
                                         lambda: torch.cumsum(tensor, 0, out=torch_out), reps=REPS, warmup=1)
            if round_ >= WARMUP_ROUNDS:
                torch_times += seconds
    torch_median = statistics.median(torch_times) if torch_times else float("nan")
    print(f"2^{arguments.log2_n} float32, inclusive scan (user add), median of "
          f"{(ROUNDS - WARMUP_ROUNDS) * REPS} (µs; torch.cumsum {torch_median * 1e6:.0f})")
    print("| CSJ_X_SCAN[/streaming] | chunk MiB | µs | min µs | torch.cumsum / this |")
    print("| --- | --- | --- | --- | --- |")
    for (variant, chunk), seconds in times.items():
        median = statistics.median(seconds)
        print(f"| {variant} | {chunk or '-'} | {median * 1e6:.0f} | {min(seconds) * 1e6:.0f} | "
              f"{torch_median / median:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
