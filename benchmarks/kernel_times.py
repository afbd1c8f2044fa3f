"""Where each implementation's time goes in the by-size table: every GPU activity (kernels,
copies, memsets) of one call with its duration, the span from the first to the last, when the
first began after the call did, and the host's time in the call, as CUPTI records them through
torch.profiler (which adds to the host figures: compare them within one run). The calls are
the suite's own (its data and the cases' makers, float32, one place on GPU 0), each on an idle
GPU; the median call by span is printed. The per-cell limits of docs/performance.md's by-size
section come from it.

    python benchmarks/kernel_times.py [--only histogram_even,reduce] [--sizes 20,24] [--repeats 5]

Needs a GPU, CuPy and torch (cuda.compute where it imports).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GPU_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--sizes", default="20,22,24")
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args()
    import cupy as cp
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    import bench_reduce
    import bench_transform
    import cuda_sharded_jit as sharded
    import sweep

    cases = bench_transform.CASES + bench_reduce.CASES
    if arguments.only:
        cases = [case for case in cases if case.algorithm in arguments.only.split(",")]
    options = sweep.Options([], [np.dtype(np.float32)], [1], [0], sweep.PEERS)
    groups = {}
    for log2 in (int(s) for s in arguments.sizes.split(",")):
        size = 1 << log2
        ours = sweep.ours_setup(cp, sharded, options, np.dtype(np.float32), size, [0], groups)
        peers = sweep.peer_setup(cp, options, np.dtype(np.float32), size)
        calls = []  # (label, impl, data) of this size
        for case in cases:
            for name, maker in list(case.ours.items()) + list(case.peers.items()):
                if name not in ("ours",) + sweep.PEERS:
                    continue
                data = ours if name == "ours" else peers
                try:
                    impl = sweep.checked_impl(case, maker, data)
                except Exception as error:  # noqa: BLE001
                    print(f"{case.algorithm} {name} 2^{log2}: {type(error).__name__}: {error}")
                    continue
                if impl is not None:
                    calls.append((f"{case.algorithm}|{name}|2^{log2}", impl, data))
        for label, impl, data in calls:
            for _ in range(3):
                impl.run()
            data.settle()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
            for label, impl, data in calls:
                for repeat in range(arguments.repeats):
                    data.settle()
                    with record_function(f"{label}#{repeat}"):
                        impl.run()
                    data.settle()
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "t.json")
            trace.export_chrome_trace(path)
            with open(path) as source:
                events = json.load(source)["traceEvents"]
        report(events)


def report(events: list) -> None:
    spans = [e for e in events if e.get("ph") == "X"]
    regions = sorted((e for e in spans if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    starts = [r["ts"] for r in regions] + [float("inf")]
    gpu = sorted((e for e in spans if e.get("cat") in GPU_KINDS), key=lambda e: e["ts"])
    by_label = {}
    for region in regions:
        begin = region["ts"]
        following = min(s for s in starts if s > begin)
        work = [e for e in gpu if begin <= e["ts"] < following]
        if not work:
            continue
        first = work[0]["ts"]
        last = max(e["ts"] + e["dur"] for e in work)
        label = region["name"].split("#")[0]
        by_label.setdefault(label, []).append(
            (region["dur"], first - begin, last - first, sum(e["dur"] for e in work),
             [(e["name"][:48], e["dur"]) for e in work]))
    for label, rows in by_label.items():
        rows.sort(key=lambda r: r[2])
        host, lead, span, busy, items = rows[len(rows) // 2]  # the median call by span
        detail = "; ".join(f"{name} {dur:.1f}" for name, dur in items)
        print(f"{label:40s} host {host:7.1f}  first gpu at {lead:6.1f}  span {span:7.1f}  busy {busy:7.1f}  | {detail}")


if __name__ == "__main__":
    main()
