"""Where the two-GPU sort's time goes (docs/limits.md, "sort, two GPUs": of
3.56 ms for 2^28 int32 keys, 2.68 are each GPU's local sort of its half and 0.70 the quarter
of the keys that crosses NVLink each way at ~380 GB/s per direction; the rest is the splitter
search, the copies' fixed costs and the last chunk's merge). Needs GPUs 0 and 1 and CuPy.

    python benchmarks/sort_two_gpu_breakdown.py               # 2^28 keys
    python benchmarks/sort_two_gpu_breakdown.py 26 --timeline # 2^26 keys, and one sort's timeline

Prints, wall clock, median of 8 after 2 warm-ups: sharded.sort over both GPUs, CuPy's sort of
one half on each GPU, and peer copies of a quarter of the keys both ways at once (one copy
stream per GPU, as the sort's). --timeline adds the kernels and copies of one sort on both
GPUs and the host's CUDA calls, from torch's profiler (CUPTI; needs torch).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from bench_sort import two_place_input  # noqa: E402
from common import time_wall  # noqa: E402

DEVICES = (0, 1)


def median_ms(seconds: list) -> float:
    return statistics.median(seconds) * 1e3


def timeline(cp, sharded, group, array, refill) -> None:
    """One sort under torch's profiler: every GPU kernel and copy, and the host's cu* calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    refill()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        started = time.perf_counter()
        sharded.sort(array)
        group.sync()
        wall = time.perf_counter() - started
    print(f"profiled sort: {wall * 1e3:.3f} ms wall")
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = sorted((e for e in profiler.events()
                     if e.device_type == cuda or (e.device_type == cpu and e.name.startswith("cu"))),
                    key=lambda e: e.time_range.start)
    origin = events[0].time_range.start if events else 0
    for e in events:
        where = f"dev {e.device_index}" if e.device_type == cuda else "host "
        print(f"  {where}  +{(e.time_range.start - origin) / 1e3:8.3f} ms  "
              f"{(e.time_range.end - e.time_range.start) / 1e3:8.3f} ms  {e.name[:90]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log2_keys", nargs="?", type=int, default=28, help="keys in total, as a power of two")
    parser.add_argument("--timeline", action="store_true", help="also print one sort's profiled timeline")
    arguments = parser.parse_args(argv)

    import cupy as cp

    import cuda_sharded_jit as sharded

    keys = 1 << arguments.log2_keys
    group, array, pristine, refill = two_place_input(cp, sharded, keys, DEVICES)
    seconds = time_wall(lambda: sharded.sort(array), group.sync, reps=8, warmup=2, prepare=refill)
    host = array.to_numpy()
    print(f"sharded.sort, 2 GPUs, 2^{arguments.log2_keys} int32 (sorted: {bool((host[1:] >= host[:-1]).all())}): "
          f"median {median_ms(seconds):.3f} ms, best {min(seconds) * 1e3:.3f} ms", flush=True)

    for device, keys_here in zip(DEVICES, pristine):
        with cp.cuda.Device(device):
            work = cp.empty_like(keys_here)
            synchronize = cp.cuda.Device(device).synchronize
            seconds = time_wall(work.sort, synchronize, reps=6, warmup=2,
                                prepare=lambda: cp.copyto(work, keys_here))
        print(f"cupy sort of one half on GPU {device}: {median_ms(seconds):.3f} ms", flush=True)

    quarter = keys // 4
    sources, landings, streams = {}, {}, {}
    for device in DEVICES:
        with cp.cuda.Device(device):
            sources[device], landings[device] = cp.ones(quarter, np.int32), cp.empty(quarter, np.int32)
            streams[device] = cp.cuda.Stream(non_blocking=True)

    def both_ways() -> None:  # each GPU pulls a quarter of the keys from the other
        for device in DEVICES:
            other = 1 - device
            with cp.cuda.Device(device):
                cp.cuda.runtime.memcpyPeerAsync(landings[device].data.ptr, device, sources[other].data.ptr, other,
                                                quarter * 4, streams[device].ptr)

    seconds = time_wall(both_ways, lambda: [streams[device].synchronize() for device in DEVICES], reps=6, warmup=2)
    print(f"peer copies of 2^{quarter.bit_length() - 1} int32 both ways at once: {median_ms(seconds):.3f} ms "
          f"({quarter * 4 / statistics.median(seconds) / 1e9:.0f} GB/s each way)", flush=True)

    if arguments.timeline:
        timeline(cp, sharded, group, array, refill)
    return 0


if __name__ == "__main__":
    sys.exit(main())
