"""Where a single call's time goes before, between and after its kernels: the CUDA API calls
the host makes (runtime and driver, as CUPTI records them through torch.profiler) and the
kernels, copies and memsets the GPU runs, each as an offset from the call's start. The
host-time findings of docs/performance.md (a check's cudaMemGetInfo, reduce_by_key's wait
for its count of runs, the host time before a pass's launch) come from these timelines.

    python benchmarks/timeline.py [--only reduce_by_key,select] [--repeats 3] [--trace t.json.gz]

Every call runs on an idle GPU (synchronised before and after), as the suite times it; the
profiler adds a few µs to each API call, so the offsets are for comparing calls and builds
in one run, not absolute host costs. Needs a GPU and torch.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile

import numpy as np

N = 1 << 28
KINDS = ("cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset")


def _add(a, b):
    return a + b


def _half(x):
    return x < np.float32(0.5)


def calls(sharded) -> dict:
    """The calls, on one place: the selection family's benchmark inputs at 2^28, and a small
    user-operator transform (the host suite's)."""
    group = sharded.PlaceGroup.by_devices([0])
    rng = np.random.default_rng(1)
    keys = sharded.ShardedArray.from_numpy(group, (np.arange(N, dtype=np.int64) // 64).astype(np.int32))
    values = sharded.ShardedArray.from_numpy(group, np.ones(N, np.int32))
    x = sharded.ShardedArray.from_numpy(group, rng.random(N, dtype=np.float32))
    offsets = sharded.ShardedArray.from_numpy(group, np.arange(0, N + 1, 1 << 12, dtype=np.int64))
    a, b, c = (sharded.ShardedArray.from_numpy(group, rng.random(1024, dtype=np.float32)) for _ in range(3))
    add = sharded.op(_add)
    return {
        "reduce_by_key": lambda: sharded.reduce_by_key(keys, values, _add),
        "segmented_reduce": lambda: sharded.segmented_reduce(x, offsets, _add, np.float32(0)),
        "reduce": lambda: sharded.reduce(x, _add, np.float32(0)),
        "select": lambda: sharded.select(x, _half),
        "transform_small": lambda: sharded.transform(add, a, b, out=c),
    }


def record(chosen: dict, repeats: int, path: str) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    for call in chosen.values():  # compiled, cached and warm before the trace
        for _ in range(3):
            result = call()
        torch.cuda.synchronize()
        del result
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
        for name, call in chosen.items():
            for repeat in range(repeats):
                torch.cuda.synchronize()
                with record_function(f"{name}#{repeat}"):
                    result = call()
                torch.cuda.synchronize()
                del result
    trace.export_chrome_trace(path)


def timelines(events: list, last_only: bool = True) -> str:
    """Each call's host API calls and device work, by offset from the call's start (µs); the
    device work of a call is what starts before the next call does."""
    spans = [e for e in events if e.get("ph") == "X"]
    regions = sorted((e for e in spans if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    starts = [r["ts"] for r in regions] + [float("inf")]  # every call's, repeats included
    if last_only:  # the last repeat of each call: caches and pools as a loop finds them
        last = {}
        for region in regions:
            last[region["name"].split("#")[0]] = region
        regions = sorted(last.values(), key=lambda e: e["ts"])
    lines = []
    for region in regions:
        begin, end = region["ts"], region["ts"] + region["dur"]
        following = min(s for s in starts if s > begin)
        lines.append(f"== {region['name']}: {region['dur']:.1f} us on the host")
        rows = []
        for e in spans:
            kind = e.get("cat")
            if kind not in KINDS:
                continue
            host = kind.startswith("cuda_")
            if (host and begin <= e["ts"] <= end) or (not host and begin <= e["ts"] < following):
                rows.append((e["ts"] - begin, e["dur"], "host" if host else "gpu ", e["name"][:60]))
        for offset, duration, side, name in sorted(rows):
            lines.append(f"  {offset:9.1f} +{duration:8.1f}  {side}  {name}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated call names (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trace", default="", help="also keep the trace, gzipped, here")
    arguments = parser.parse_args()
    import cuda_sharded_jit as sharded
    from cuda_sharded_jit import _shim

    try:
        visible = _shim.visible_device_count()
    except RuntimeError:
        visible = 0
    if visible == 0:
        sys.exit("timeline: no GPU is visible")
    chosen = calls(sharded)
    if arguments.only:
        names = arguments.only.split(",")
        unknown = sorted(set(names) - set(chosen))
        if unknown:
            sys.exit(f"--only: unknown {', '.join(unknown)}; expected some of {', '.join(chosen)}")
        chosen = {name: chosen[name] for name in names}
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "trace.json")
        record(chosen, arguments.repeats, path)
        with open(path, "rb") as source:
            raw = source.read()
    if arguments.trace:
        with gzip.open(arguments.trace, "wb") as kept:
            kept.write(raw)
    print(timelines(json.loads(raw)["traceEvents"]))


if __name__ == "__main__":
    main()
