"""The project's performance targets, read off one run's measures: each target's two
figures, their ratio and pass / fail. Pure Python (the CPU tests evaluate fake measures).

Both figures of a ratio come from the same run and the same timer: CUDA events where both
sides run on one place, host wall clock where either side spans several.

    python benchmarks/targets.py           # rewrite the list of targets in docs/performance.md
    python benchmarks/targets.py --check   # exit 1 when that list is stale (a CPU test runs it)
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from common import Measure, fmt_seconds, log2_label

TARGET_ELEMENTS = 1 << 28  # the targets' size: elements per GPU (sort: keys in total)


def by_size_threshold(elements: int) -> float | None:
    """The by-size target for ours on one place against the fastest peer at that size: at
    least 1.0× from 2^22 to 2^28 elements, 0.9× from 2^20; no target at other sizes."""
    if (1 << 22) <= elements <= (1 << 28):
        return 1.0
    if (1 << 20) <= elements < (1 << 22):
        return 0.9
    return None


@dataclass(frozen=True)
class Ref:
    """Which measure a figure comes from, and by which timer."""

    label: str
    algorithm: str
    impl: str
    dtype: str = "float32"
    places: int = 1
    gpus: int = 1
    timer: str = "events"
    variant: str = ""
    size: str = "per_gpu"   # the target's size is elements per GPU ("per_gpu"), in total ("total"), or none

    def matches(self, measure: Measure, elements: int | None) -> bool:
        if (measure.algorithm, measure.impl, measure.variant) != (self.algorithm, self.impl, self.variant):
            return False
        if self.size == "none":
            return measure.places == self.places and measure.timer == self.timer
        if (measure.dtype, measure.places, measure.gpus) != (self.dtype, self.places, self.gpus):
            return False
        if measure.timer not in ("events", "wall"):  # host-time and compile rows have no size to compare
            return False
        size = measure.elements_per_gpu if self.size == "per_gpu" else measure.elements
        return elements is None or size == elements


@dataclass(frozen=True)
class Target:
    """ours / reference (or ours alone when there is no reference) against `threshold`.

    metric "rate": throughput (GB/s where both count bytes, else elements/s); passes when
    ours / reference >= threshold. metric "time": seconds (the references' times add up);
    passes when ours / reference <= threshold, or ours <= threshold without a reference.
    """

    text: str
    ours: Ref
    reference: tuple = ()
    threshold: float = 1.0
    metric: str = "rate"
    elements: int = TARGET_ELEMENTS  # the size it is stated at (per GPU, or in total)


def _transform(label="sharded.transform(lambda a, b: a + b)", **keys) -> Ref:
    return Ref(label, "transform_binary", "ours", **keys)


_HOST_TRANSFORM = Ref("transform(lambda a, b: a + b, out=c)", "transform_binary", "ours", timer="host", size="none")
_WALL2 = dict(places=2, gpus=2, timer="wall")
_WALL4 = dict(places=4, gpus=4, timer="wall")

TARGETS = (
    Target("binary transform, user lambda ≥ 0.95 × cuda.compute binary_transform",
        _transform(), (Ref("cuda.compute binary_transform", "transform_binary", "cuda.compute"),), 0.95),
    Target("binary transform, user lambda ≥ 0.97 × built-in sharded.ops.add",
        _transform(), (Ref("transform(sharded.ops.add)", "transform_binary", "ours built-in"),), 0.97),
    Target("binary transform on 2 GPUs ≥ 1.9 × one GPU (same size per GPU)",
        _transform("2 GPUs", **_WALL2), (_transform("1 GPU", timer="wall"),), 1.9),
    Target("first call of a new operator, warm process ≤ 0.3 s",
        Ref("first call", "compile", "ours", variant="warm process", timer="process", size="none"),
        (), 0.3, "time"),
    Target("first call in a new process, warm disk cache ≤ 50 ms",
        Ref("first call", "compile", "ours", variant="new process, warm disk cache", timer="process",
            size="none"), (), 0.05, "time"),
    Target("host time per call of a user-operator transform, 1024 elements, 1 place ≤ 5 µs",
        _HOST_TRANSFORM, (), 5e-6, "time"),
    Target("host time per call of a user-operator transform ≤ 1.0 × torch.add's, 1024 elements, 1 place",
        _HOST_TRANSFORM, (Ref("torch.add(a, b, out=c)", "transform_binary", "torch", timer="host", size="none"),),
        1.0, "time"),
    Target("host time per call of a user-operator transform on 4 places of one GPU ≤ 2.5 × on 1 place",
        Ref("transform(lambda a, b: a + b), 4 places", "transform_binary", "ours", places=4, timer="host",
            size="none"), (_HOST_TRANSFORM,), 2.5, "time"),
    Target("host time per call of a reduce to a host value, user add, 1024 elements, 1 place ≤ 10 µs",
        Ref("reduce(a, lambda a, b: a + b)", "reduce", "ours", timer="host", size="none"), (), 10e-6, "time"),
    Target("a + b host time ≤ 1.5 × transform(sharded.ops.add, a, b), both allocating, 1024 elements, 1 place",
        Ref("a + b", "transform_binary", "ours a + b", timer="host", size="none"),
        (Ref("transform(sharded.ops.add, a, b)", "transform_binary", "ours built-in, new array", timer="host",
             size="none"),), 1.5, "time"),
    Target("reduce, user add ≥ 0.95 × cupy sum",
        Ref("sharded.reduce(a, lambda a, b: a + b)", "reduce", "ours"), (Ref("cupy sum", "reduce", "cupy"),), 0.95),
    Target("inclusive scan, user add ≥ 1.0 × torch.cumsum",
        Ref("sharded.inclusive_scan(a, add)", "inclusive_scan", "ours"),
        (Ref("torch.cumsum", "inclusive_scan", "torch"),), 1.0),
    Target("inclusive scan, user add ≥ 0.95 × built-in \"sum\" scan",
        Ref("sharded.inclusive_scan(a, add)", "inclusive_scan", "ours"),
        (Ref("inclusive_scan(a, \"sum\")", "inclusive_scan", "ours built-in"),), 0.95),
    Target("reduce on 2 GPUs ≤ 1.05 × one-GPU reduce time (same size per GPU)",
        Ref("reduce, 2 GPUs", "reduce", "ours", **_WALL2),
        (Ref("reduce, 1 GPU", "reduce", "ours", timer="wall"),), 1.05, "time"),
    Target("inclusive scan on 2 GPUs ≤ 1.10 × (one-GPU reduce + one-GPU scan time)",
        Ref("scan, 2 GPUs", "inclusive_scan", "ours", **_WALL2),
        (Ref("reduce, 1 GPU", "reduce", "ours", timer="wall"),
         Ref("scan, 1 GPU", "inclusive_scan", "ours", timer="wall")), 1.10, "time"),
    Target("sort of 2^28 int32 keys on 2 GPUs ≥ 1.5 × cupy.sort on one GPU",
        Ref("sharded.sort, 2 GPUs", "sort", "ours", "int32", size="total", **_WALL2),
        (Ref("cupy.sort, 1 GPU", "sort", "cupy", "int32", timer="wall", size="total"),), 1.5),
    Target("sort of 2^28 int32 keys on 4 GPUs ≥ 2.5 × cupy.sort on one GPU",
        Ref("sharded.sort, 4 GPUs", "sort", "ours", "int32", size="total", **_WALL4),
        (Ref("cupy.sort, 1 GPU", "sort", "cupy", "int32", timer="wall", size="total"),), 2.5),
    Target("sort of 2^28 int32 keys, one place ≥ 0.95 × cupy.sort",
        Ref("sharded.sort, 1 place", "sort", "ours", "int32", size="total"),
        (Ref("cupy.sort", "sort", "cupy", "int32", size="total"),), 0.95),
    Target("count ≥ 0.9 × cupy sum bandwidth (same data)",
        Ref("sharded.count", "count", "ours"), (Ref("cupy sum", "reduce", "cupy"),), 0.9),
    Target("histogram_even, 64 bins, uniform float32 ≥ 0.6 × cupy sum bandwidth",
        Ref("sharded.histogram_even", "histogram_even", "ours"), (Ref("cupy sum", "reduce", "cupy"),), 0.6),
    Target("histogram_even faster than cupy.histogram",
        Ref("sharded.histogram_even", "histogram_even", "ours"),
        (Ref("cupy.histogram", "histogram_even", "cupy"),), 1.0),
    Target("argmin ≥ 0.8 × user-add reduce",
        Ref("sharded.argmin", "argmin", "ours"), (Ref("reduce, user add", "reduce", "ours"),), 0.8),
    Target("argmin ≥ 1.0 × cupy.argmin",
        Ref("sharded.argmin", "argmin", "ours"), (Ref("cupy.argmin", "argmin", "cupy"),), 1.0),
    Target("sort_by_key of 2^28 int32 keys + int32 values, one place ≥ 1.0 × cuda.compute radix_sort with values",
        Ref("sharded.sort_by_key", "sort_by_key", "ours", "int32"),
        (Ref("cuda.compute radix_sort", "sort_by_key", "cuda.compute", "int32"),), 1.0),
    Target("sort_by_key of 2^28 int32 keys + int32 values, one place ≥ 1.0 × torch.sort(stable=True) with indices",
        Ref("sharded.sort_by_key", "sort_by_key", "ours", "int32"),
        (Ref("torch.sort", "sort_by_key", "torch", "int32"),), 1.0),
    Target("sort_by_key of 2^28 int32 keys + values on 2 GPUs ≥ 1.4 × cuda.compute radix_sort on one",
        Ref("sharded.sort_by_key, 2 GPUs", "sort_by_key", "ours", "int32", size="total", **_WALL2),
        (Ref("cuda.compute radix_sort, 1 GPU", "sort_by_key", "cuda.compute", "int32", timer="wall",
             size="total"),), 1.4),
    Target("argsort of 2^28 float32, one place ≥ 1.0 × cupy.argsort",
        Ref("sharded.argsort", "argsort", "ours"), (Ref("cupy.argsort", "argsort", "cupy"),), 1.0),
    Target("argsort of 2^28 float32, one place ≥ 1.0 × torch.argsort(stable=True)",
        Ref("sharded.argsort", "argsort", "ours"), (Ref("torch.argsort", "argsort", "torch"),), 1.0),
    Target("sort(compare=lambda x, y: x < y) of 2^26 int64, one place ≥ 1.0 × cuda.compute merge_sort",
        Ref("sharded.sort(compare=)", "sort_compare", "ours", "int64"),
        (Ref("cuda.compute merge_sort", "sort_compare", "cuda.compute", "int64"),), 1.0, elements=1 << 26),
    Target("sort(key=) of 2^26 int64, one place ≥ 0.9 × sort_by_key of the keys computed beforehand",
        Ref("sharded.sort(key=)", "sort_key", "ours", "int64"),
        (Ref("sort_by_key, precomputed keys", "sort_key", "ours", "int64", variant="precomputed keys"),), 0.9,
        elements=1 << 26),
    Target("searchsorted, 2^24 float32 queries into 2^28 sorted, one place ≥ 1.0 × cupy.searchsorted",
        Ref("sharded.searchsorted", "searchsorted", "ours"), (Ref("cupy.searchsorted", "searchsorted", "cupy"),), 1.0,
        elements=1 << 24),
    Target("top_k, k = 1024 of 2^28 float32, one place ≥ 1.0 × torch.topk",
        Ref("sharded.top_k", "top_k", "ours"), (Ref("torch.topk", "top_k", "torch"),), 1.0),
    Target("select of 2^28 float32, half kept, one place ≥ 1.0 × cuda.compute select",
        Ref("sharded.select", "select", "ours"), (Ref("cuda.compute select", "select", "cuda.compute"),), 1.0),
    Target("select of 2^28 float32, half kept ≥ 0.7 × device copy (bytes read and written)",
        Ref("sharded.select", "select", "ours"), (Ref("device copy", "select", "copy"),), 0.7),
    Target("segmented_reduce, 2^28 float32 in 2^16 segments ≥ 1.0 × cuda.compute segmented_reduce",
        Ref("sharded.segmented_reduce", "segmented_reduce", "ours"),
        (Ref("cuda.compute segmented_reduce", "segmented_reduce", "cuda.compute"),), 1.0),
    Target("segmented_reduce, 2^28 float32 in 2^16 segments ≥ 0.9 × our reduce's bandwidth",
        Ref("sharded.segmented_reduce", "segmented_reduce", "ours"),
        (Ref("sharded.reduce", "segmented_reduce", "ours", variant="reduce"),), 0.9),
    Target("unique_by_key of 2^28 sorted int32 keys + int32 values ≥ 1.0 × cuda.compute unique_by_key",
        Ref("sharded.unique_by_key", "unique_by_key", "ours", "int32"),
        (Ref("cuda.compute unique_by_key", "unique_by_key", "cuda.compute", "int32"),), 1.0),
    Target("reduce_by_key, 2^28 int32 keys in runs of 64 ≥ 0.6 × device copy (bytes read)",
        Ref("sharded.reduce_by_key", "reduce_by_key", "ours", "int32"),
        (Ref("device copy", "reduce_by_key", "copy", "int32"),), 0.6),
    Target("inclusive_scan_by_key, 2^28 int32 keys in runs of 64 ≥ 0.6 × device copy (bytes read and written)",
        Ref("sharded.inclusive_scan_by_key", "scan_by_key", "ours", "int32"),
        (Ref("device copy", "scan_by_key", "copy", "int32"),), 0.6),
    Target("resharded, 2^28 float32 on two places of one GPU ≥ 0.8 × device copy",
        Ref("a.resharded(), 2 places", "resharded", "ours", places=2, gpus=1, timer="wall"),
        (Ref("device copy", "resharded", "copy", timer="wall"),), 0.8),
)


def threshold_text(target: Target) -> str:
    """"≥ 0.95" or "≤ 1.05" for a ratio, "≤ 50 ms" for a time that has no reference."""
    comparison = "≤" if target.metric == "time" else "≥"
    if target.metric == "time" and not target.reference:
        return f"{comparison} {fmt_seconds(target.threshold)}"
    return f"{comparison} {target.threshold:g}"


@dataclass
class TargetResult:
    target: Target
    elements: int | None          # the size both sides were measured at (None: no size)
    ours: float = math.nan        # seconds, or throughput (GB/s or elements/s)
    reference: float = math.nan
    ratio: float = math.nan
    unit: str = ""
    status: str = ""              # "pass", "FAIL", or "not measured: why"

    def as_dict(self) -> dict:
        return {"target": self.target.text, "elements": self.elements, "ours": self.ours,
                "reference": self.reference, "ratio": self.ratio, "threshold": self.target.threshold,
                "metric": self.target.metric, "unit": self.unit, "status": self.status}


def _find(measures: list, ref: Ref, elements: int | None):
    """The measure `ref` names (an error row when that is all there is), or None."""
    found = [m for m in measures if ref.matches(m, elements)]
    return next((m for m in found if m.ok), found[0] if found else None)


def _figure(measure: Measure, ref: Ref, metric: str, unit: str) -> float:
    seconds = measure.median_by(ref.timer)
    if metric == "time":
        return seconds
    amount = measure.bytes_moved / 1e9 if unit == "GB/s" else measure.elements
    return amount / seconds if seconds else math.nan


def _size(measures: list, ref: Ref) -> int | None:
    """TARGET_ELEMENTS where ours was measured there, else the largest size it was measured at."""
    if ref.size == "none":
        return None
    sizes = {m.elements_per_gpu if ref.size == "per_gpu" else m.elements
             for m in measures if ref.matches(m, None) and m.ok}
    if not sizes or TARGET_ELEMENTS in sizes:
        return TARGET_ELEMENTS
    return max(sizes)


def _missing(measure, ref: Ref, elements) -> str | None:
    if measure is None:
        where = "" if elements is None else f" at {log2_label(elements)}"
        return f"not measured: no {ref.label} ({ref.impl}, {ref.places} place(s), {ref.gpus} GPU(s)){where}"
    if not measure.ok or math.isnan(measure.median_by(ref.timer)):
        return f"not measured: {ref.label}: {measure.error or 'no ' + ref.timer + ' timing'}"
    return None


def evaluate(measures: list, targets=TARGETS) -> list[TargetResult]:
    results = []
    for target in targets:
        elements = _size(measures, target.ours)
        result = TargetResult(target, elements)
        results.append(result)
        ours = _find(measures, target.ours, elements)
        references = [_find(measures, ref, elements) for ref in target.reference]
        problems = [_missing(m, ref, elements) for m, ref in zip([ours] + references, (target.ours,) + target.reference)]
        problems = [problem for problem in problems if problem]
        if problems:
            result.status = problems[0]
            continue
        if target.metric == "time":
            result.unit = "s"
        elif all(m.bytes_moved for m in [ours] + references):
            result.unit = "GB/s"
        else:
            result.unit = "elements/s"
        result.ours = _figure(ours, target.ours, target.metric, result.unit)
        figures = [_figure(m, ref, target.metric, result.unit) for m, ref in zip(references, target.reference)]
        if not references:
            passed = result.ours <= target.threshold
        else:
            result.reference = sum(figures)
            result.ratio = result.ours / result.reference if result.reference else math.nan
            passed = result.ratio <= target.threshold if target.metric == "time" else result.ratio >= target.threshold
        result.status = "pass" if passed else "FAIL"
    return results


# ---- the list in docs/performance.md ---------------------------------------------------------------

PERFORMANCE_DOC = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
BEGIN = "<!-- targets: written by `python benchmarks/targets.py` from benchmarks/targets.py; do not edit -->"
END = "<!-- end of targets -->"
TIMERS = {"events": "CUDA events", "wall": "host wall clock", "host": "host time per call",
          "process": "host clock around the first call"}
SIZES = {"per_gpu": f"{log2_label(TARGET_ELEMENTS)} per GPU", "total": f"{log2_label(TARGET_ELEMENTS)} keys in total",
         "none": "—"}


def targets_markdown(targets=TARGETS) -> str:
    """The targets as a markdown table: text, when each passes, size and timer."""
    rows = ["| target | passes when | size | timer |", "| --- | --- | --- | --- |"]
    for target in targets:
        passes = ("ours / reference " if target.reference else "ours ") + threshold_text(target)
        size = SIZES[target.ours.size]
        if target.elements != TARGET_ELEMENTS and target.ours.size != "none":
            size = size.replace(log2_label(TARGET_ELEMENTS), log2_label(target.elements))
        rows.append(f"| {target.text} | {passes} | {size} | {TIMERS[target.ours.timer]} |")
    return "\n".join(rows)


def _with_current_list(text: str) -> str:
    before, found, rest = text.partition(BEGIN)
    _, ended, after = rest.partition(END)
    if not found or not ended:
        raise ValueError(f"{PERFORMANCE_DOC} has no {BEGIN!r} ... {END!r} section")
    return f"{before}{BEGIN}\n{targets_markdown()}\n{END}{after}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the list of targets into docs/performance.md.")
    parser.add_argument("--check", action="store_true", help="exit 1 when the list there is stale")
    arguments = parser.parse_args(argv)
    text = PERFORMANCE_DOC.read_text()
    current = _with_current_list(text)
    if arguments.check:
        if current != text:
            print(f"{PERFORMANCE_DOC} is stale: run python benchmarks/targets.py", file=sys.stderr)
            return 1
        return 0
    PERFORMANCE_DOC.write_text(current)
    return 0


if __name__ == "__main__":
    sys.exit(main())
