"""The report of one run: markdown (the performance targets, summary tables a person reads at a glance,
every figure), JSON (every raw repetition and the environment) and PNG plots (bandwidth vs
size with the copy limit; scaling vs number of GPUs). Pure Python apart from matplotlib,
imported only to plot; the CPU tests feed it fake measures.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from common import Measure, fmt_seconds, log2_label, where
from targets import TargetResult, by_size_threshold, evaluate, threshold_text

# Row order of the tables and plots; anything else follows in order of appearance.
ALGORITHMS = ("copy", "transform_unary", "transform_binary", "reduce", "transform_reduce", "inclusive_scan",
              "exclusive_scan", "histogram_even", "count", "adjacent_difference", "argmin", "sort")
PEERS = ("cupy", "torch", "cuda.compute")


# ---- formatting ------------------------------------------------------------------------------

def throughput(measure: Measure) -> float:
    """GB/s where the measure counts bytes, else G elements/s (sort: Gkeys/s)."""
    return measure.gbps if measure.bytes_moved else measure.rate / 1e9


def fmt_throughput(value: float, bytes_counted: bool = True) -> str:
    """GB/s as a whole number (a decimal or two below 100 and 1); Gkeys/s with two decimals."""
    if value is None or math.isnan(value):
        return ""
    if not bytes_counted or value < 1:
        return f"{value:.2f}"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def cell(measure: Measure | None) -> str:
    if measure is None:
        return ""
    if not measure.ok:
        return "skipped" if measure.error.startswith("skipped") else "error"
    return fmt_throughput(throughput(measure), bool(measure.bytes_moved))


def _ordered(names) -> list:
    names = list(dict.fromkeys(names))
    return sorted(names, key=lambda name: (ALGORITHMS.index(name) if name in ALGORITHMS else len(ALGORITHMS)))


def _table(header: list, rows: list, text_columns=(0,)) -> str:
    """A markdown table; numbers right-aligned, the columns in `text_columns` left-aligned."""
    align = ["---" if column in text_columns else "---:" for column in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


class _Index:
    """Measures by (algorithm, impl, dtype, places, gpus, size), size per GPU (sort: total)."""

    def __init__(self, measures: list):
        self.rows = {}
        for m in measures:
            if m.timer in ("events", "wall"):
                self.rows.setdefault(self.key(m), m)

    @staticmethod
    def size(m: Measure) -> int:
        return m.elements if m.algorithm == "sort" else m.elements_per_gpu

    def key(self, m: Measure) -> tuple:
        return (m.algorithm, m.impl, m.dtype, m.places, m.gpus, self.size(m))

    def get(self, algorithm, impl, dtype, places, gpus, size):
        return self.rows.get((algorithm, impl, dtype, places, gpus, size))


# ---- markdown ----------------------------------------------------------------------------------

def header(env: dict, options: dict) -> str:
    gpus = env.get("gpu_names") or []
    names = ", ".join(f"{gpus.count(name)}× {name}" for name in dict.fromkeys(gpus)) or "no GPU listed"
    link = f" ({env['link']})" if env.get("link") else ""
    versions = ", ".join(f"{name} {env[key]}" for name, key in
                         (("cuda_sharded_jit", "cuda_sharded_jit"), ("CuPy", "cupy"), ("torch", "torch"),
                          ("cuda-cccl", "cuda-cccl"), ("numba-cuda", "numba-cuda")) if env.get(key))
    driver = f", driver {env['driver']}" if env.get("driver") else ""
    cuda = f", CUDA runtime {env['cuda_runtime']}" if env.get("cuda_runtime") else ""
    return (f"{env.get('date', '')}, {names}{link}{driver}{cuda}; {versions}. "
            f"CUDA events on each place's stream (host wall clock for rows of several places), "
            f"median of {options.get('reps', '?')} after {options.get('warmup', '?')} warm-ups (sort: "
            f"{options.get('sort_reps', '?')}); every result checked against CuPy before it was timed. "
            f"GB/s counts bytes read + written; sizes are elements per GPU (sort: keys in total).")


def targets_table(results: list[TargetResult]) -> str:
    """Each target's text, both figures, their ratio, the threshold and pass / FAIL."""
    rows = []
    for result in results:
        target = result.target
        size = ""
        if result.elements is not None:
            size = f" ({log2_label(result.elements)}{' keys' if target.ours.algorithm == 'sort' else '/GPU'})"

        def figure(value: float) -> str:
            if math.isnan(value):
                return ""
            if result.unit == "s":
                return fmt_seconds(value)
            if result.unit == "GB/s":
                return f"{value:.0f} GB/s"
            return f"{value / 1e9:.2f} G/s"

        reference = " + ".join(ref.label for ref in target.reference)
        ratio = "" if math.isnan(result.ratio) else f"{result.ratio:.3f}"
        rows.append([target.text + size, figure(result.ours),
                     f"{figure(result.reference)} ({reference})" if target.reference else "—", ratio,
                     threshold_text(target), result.status])
    return _table(["target", "ours", "reference", "ratio", "threshold", "result"], rows, (0, 2, 5))


def _configs(measures: list) -> list:
    """(places, gpus) of ours' rows with several places, in order."""
    return sorted({(m.places, m.gpus) for m in measures
                   if m.impl in ("ours", "copy") and m.places > 1 and m.timer in ("events", "wall")})


def throughput_table(measures: list, dtype: str, size: int) -> str:
    """Algorithms × implementations at one size: GB/s (aggregate over GPUs for several places,
    with the speed-up over one place)."""
    index = _Index(measures)
    algorithms = _ordered(m.algorithm for m in measures
                          if m.dtype == dtype and m.algorithm != "sort" and index.size(m) == size
                          and m.timer in ("events", "wall"))
    configs = _configs(measures)
    header = ["algorithm", "copy (limit)", "ours", "ours built-in"] + \
             [f"ours, {where(places, gpus)}" for places, gpus in configs] + list(PEERS)
    rows = []
    for algorithm in algorithms:
        ours_impl = "copy" if algorithm == "copy" else "ours"
        one = index.get(algorithm, ours_impl, dtype, 1, 1, size)
        row = [algorithm, cell(index.get("copy", "copy", dtype, 1, 1, size)) if algorithm == "copy" else "",
               "" if algorithm == "copy" else cell(one), cell(index.get(algorithm, "ours built-in", dtype, 1, 1, size))]
        for places, gpus in configs:
            several = index.get(algorithm, ours_impl, dtype, places, gpus, size)
            text = cell(several)
            if several is not None and several.ok and one is not None and one.ok:
                text += f" ({several.rate / (one.elements / one.median_by('wall')):.2f}×)"
            row.append(text)
        row += [cell(index.get(algorithm, peer, dtype, 1, 1, size)) for peer in PEERS]
        rows.append(row)
    return _table(header, rows)


def sweep_table(measures: list, dtype: str) -> str:
    """Ours on one place at every size: GB/s and the ratio to the fastest peer there, marked
    **miss** where the ratio is under the by-size target (targets.by_size_threshold)."""
    index = _Index(measures)
    rows_of = [m for m in measures if m.dtype == dtype and m.algorithm != "sort" and m.timer in ("events", "wall")]
    sizes = sorted({index.size(m) for m in rows_of})
    rows = []
    for algorithm in _ordered(m.algorithm for m in rows_of):
        row = [algorithm]
        for size in sizes:
            impl = "copy" if algorithm == "copy" else "ours"
            ours = index.get(algorithm, impl, dtype, 1, 1, size)
            text = cell(ours)
            peers = [index.get(algorithm, peer, dtype, 1, 1, size) for peer in PEERS]
            peers = [throughput(m) for m in peers if m is not None and m.ok]
            if text and ours.ok and peers and algorithm != "copy":
                ratio = throughput(ours) / max(peers)
                threshold = by_size_threshold(size)
                missed = threshold is not None and ratio < threshold
                # a third decimal where two would round a miss up to its threshold
                digits = 3 if missed and round(ratio, 2) >= threshold else 2
                text += f" ({ratio:.{digits}f}×)" + (" **miss**" if missed else "")
            row.append(text)
        rows.append(row)
    return _table(["algorithm"] + [log2_label(size) for size in sizes], rows)


def gpu_side_table(measures: list, dtype: str) -> str:
    """Where each by-size ratio is lost: ours × the fastest peer timed with every call queued
    behind a held stream (the GPU's side alone), and the µs by which the idle-GPU events
    exceed that for ours and for that peer (the host's time before its first launch, and any
    wait). Empty when no measure has the GPU-side timings."""
    index = _Index(measures)
    rows_of = [m for m in measures if m.dtype == dtype and m.algorithm not in ("sort", "copy")
               and m.timer == "events" and m.extra.get("gpu")]
    sizes = sorted({index.size(m) for m in rows_of})
    if not sizes:
        return ""

    def gpu_median(m: Measure) -> float:
        return statistics.median(m.extra["gpu"])

    rows = []
    for algorithm in _ordered(m.algorithm for m in rows_of):
        row = [algorithm]
        for size in sizes:
            ours = index.get(algorithm, "ours", dtype, 1, 1, size)
            peers = [index.get(algorithm, peer, dtype, 1, 1, size) for peer in PEERS]
            peers = [m for m in peers if m is not None and m.ok and m.extra.get("gpu")]
            if ours is None or not ours.ok or not ours.extra.get("gpu") or not peers:
                row.append("")
                continue
            fastest = min(peers, key=gpu_median)
            ratio = gpu_median(fastest) / gpu_median(ours)
            ours_host = (ours.median - gpu_median(ours)) * 1e6
            peer_host = (fastest.median - gpu_median(fastest)) * 1e6
            row.append(f"{ratio:.2f}× · {ours_host:+.1f} / {peer_host:+.1f} µs")
        rows.append(row)
    return _table(["algorithm"] + [log2_label(size) for size in sizes], rows)


def sort_table(measures: list) -> str:
    """Gkeys/s of every sort row: implementations (and place counts) × sizes."""
    sorts = [m for m in measures if m.algorithm == "sort" and m.timer in ("events", "wall")]
    sizes = sorted({m.elements for m in sorts})
    lines = list(dict.fromkeys((m.dtype, m.impl, m.places, m.gpus) for m in sorts))
    lines.sort(key=lambda line: (line[0], line[1] != "ours", line[1], line[2]))
    index = _Index(sorts)
    rows = [[dtype, impl if impl != "ours" else f"ours, {where(places, gpus)}"] +
            [cell(index.get("sort", impl, dtype, places, gpus, size)) for size in sizes]
            for dtype, impl, places, gpus in lines]
    return _table(["dtype", "implementation"] + [f"{log2_label(size)} keys" for size in sizes], rows, (0, 1))


def host_table(measures: list) -> str:
    hosts = [m for m in measures if m.timer == "host"]
    configs = sorted({(m.places, m.gpus) for m in hosts})
    lines = list(dict.fromkeys((m.algorithm, m.impl) for m in hosts))
    lines.sort(key=lambda line: not line[1].startswith("ours"))  # ours first, then the peers
    rows = []
    for algorithm, impl in lines:
        row = [f"{algorithm}, {impl}"]
        for places, gpus in configs:
            found = [m for m in hosts if (m.algorithm, m.impl, m.places, m.gpus) == (algorithm, impl, places, gpus)]
            row.append(("error" if not found[0].ok else fmt_seconds(found[0].median)) if found else "")
        rows.append(row)
    elements = hosts[0].elements_per_gpu if hosts else 0
    return _table([f"call ({elements} elements per GPU)"] +
                  [where(places, gpus) for places, gpus in configs], rows)


def compile_table(measures: list) -> str:
    rows = [[m.impl, m.variant, "error" if not m.ok else fmt_seconds(m.median),
             "" if not m.ok else f"{m.spread:.0%}", len(m.seconds), m.note]
            for m in measures if m.algorithm == "compile"]
    return _table(["who", "first call", "median", "spread", "runs", "note"], rows, (0, 1, 5))


def full_table(measures: list) -> str:
    rows = []
    for m in measures:
        if not m.ok:
            rows.append([m.name, "", "", "", "", m.timer, m.error])
            continue
        rate = f"{m.rate / 1e9:.3g} G/s" if m.elements and m.timer in ("events", "wall") else ""
        gbps = f"{m.gbps:.0f}" if m.bytes_moved else ""
        rows.append([m.name, fmt_seconds(m.median), gbps, rate, f"{m.spread:.1%}", m.timer, m.note])
    return _table(["measure", "median", "GB/s", "elements/s", "spread", "timer", "note"], rows, (0, 5, 6))


def markdown(measures: list, env: dict, options: dict, results: list[TargetResult] | None = None) -> tuple[str, str]:
    """(the text to print, the text of results.md): the same, results.md adds every figure."""
    results = evaluate(measures) if results is None else results
    sections = [f"## Benchmark results\n\n{header(env, options)}",
                "### Performance targets\n\n" + targets_table(results)]
    sweep_rows = [m for m in measures if m.algorithm not in ("sort", "compile") and m.timer in ("events", "wall")]
    for dtype in dict.fromkeys(m.dtype for m in sweep_rows):
        sizes = [m.elements_per_gpu for m in sweep_rows if m.dtype == dtype]
        size = max(sizes)
        sections.append(f"### {dtype}, {log2_label(size)} elements per GPU (GB/s; several places: all GPUs "
                        f"together, wall clock, × one place)\n\n" + throughput_table(measures, dtype, size))
        sections.append(f"### {dtype}, ours on one place by size (GB/s, × the fastest of CuPy, torch, "
                        f"cuda.compute; **miss**: under 1.0× from 2^22 to 2^28, 0.9× at 2^20)\n\n" +
                        sweep_table(measures, dtype))
        gpu_side = gpu_side_table(measures, dtype)
        if gpu_side:
            sections.append(f"### {dtype}, the GPU's side alone by size (× the fastest peer, each call queued "
                            f"behind a held stream; then the µs the idle-GPU time adds, ours / that peer's)\n\n"
                            + gpu_side)
    if any(m.algorithm == "sort" for m in measures):
        sections.append("### Sort (Gkeys/s; keys in total, split over the places)\n\n" + sort_table(measures))
    if any(m.timer == "host" for m in measures):
        sections.append("### Host time per call\n\n" + host_table(measures))
    if any(m.algorithm == "compile" for m in measures):
        sections.append("### Compile latency\n\n" + compile_table(measures))
    errors = [m for m in measures if m.error and not m.error.startswith("skipped")]
    skipped = [m for m in measures if m.error.startswith("skipped")]
    if errors or skipped:
        lines = [f"- {m.name}: {m.error}" for m in errors]
        if skipped:
            lines.append(f"- {len(skipped)} measures skipped: over the time budget (--budget)")
        sections.append(f"### Errors ({len(errors)})\n\n" + "\n".join(lines))
    printed = "\n\n".join(sections)
    every = (f"<details><summary>Every figure ({len(measures)} measures)</summary>\n\n"
             f"{full_table(measures)}\n\n</details>")
    return printed, printed + "\n\n" + every + "\n"


# ---- JSON --------------------------------------------------------------------------------------

def _finite(value):
    """JSON has no NaN: None instead, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def to_json(measures: list, env: dict, options: dict, results: list[TargetResult]) -> str:
    return json.dumps(_finite({"environment": env, "options": options,
                               "targets": [result.as_dict() for result in results],
                               "measures": [m.as_dict() for m in measures]}), indent=1)


# ---- plots -------------------------------------------------------------------------------------

_STYLE = {"copy": dict(color="black", linestyle="--"), "ours": dict(color="tab:blue", linewidth=2),
          "ours built-in": dict(color="tab:blue", linestyle=":"), "cupy": dict(color="tab:orange"),
          "torch": dict(color="tab:red"), "cuda.compute": dict(color="tab:green")}


def _grid(plt, count: int):
    columns = min(4, max(1, count))
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.3 * rows), squeeze=False)
    for axis in axes.flat[count:]:
        axis.set_visible(False)
    return figure, list(axes.flat)


def _save(plt, figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot(measures: list, out: Path) -> list[Path]:
    """bandwidth_<dtype>.png, sort.png, scaling.png; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    written = []
    good = [m for m in measures if m.ok and m.timer in ("events", "wall")]
    index = _Index(good)
    top_gpus = max((m.gpus for m in good if m.impl == "ours" and m.places == m.gpus), default=1)

    sweep = [m for m in good if m.algorithm not in ("sort", "compile")]
    for dtype in dict.fromkeys(m.dtype for m in sweep):
        rows = [m for m in sweep if m.dtype == dtype]
        algorithms = [a for a in _ordered(m.algorithm for m in rows) if a != "copy"]
        if not algorithms:
            continue
        sizes = sorted({index.size(m) for m in rows})
        figure, axes = _grid(plt, len(algorithms))
        for axis, algorithm in zip(axes, algorithms):
            lines = [("copy limit", "copy", "copy", 1, 1), ("ours", algorithm, "ours", 1, 1),
                     ("ours built-in", algorithm, "ours built-in", 1, 1)]
            if top_gpus > 1:
                lines.append((f"ours, {top_gpus} GPUs (per GPU)", algorithm, "ours", top_gpus, top_gpus))
            lines += [(peer, algorithm, peer, 1, 1) for peer in PEERS]
            for label, name, impl, places, gpus in lines:
                points = [(size, index.get(name, impl, dtype, places, gpus, size)) for size in sizes]
                points = [(size, m.gbps / gpus) for size, m in points if m is not None]
                if points:
                    style = dict(_STYLE.get(impl, {}))
                    if places > 1:
                        style.update(linestyle="-.")
                    axis.plot(*zip(*points), marker="o", markersize=3, label=label, **style)
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")  # the small sizes (launch and host overhead) stay visible
            axis.set_title(algorithm)
            axis.set_xlabel("elements per GPU")
            axis.set_ylabel("GB/s per GPU")
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=7)
        figure.suptitle(f"{dtype}: bandwidth vs size, one GPU unless marked (copy limit dashed)")
        written.append(_save(plt, figure, out / f"bandwidth_{dtype}.png"))

    sorts = [m for m in good if m.algorithm == "sort"]
    if sorts:
        dtypes = list(dict.fromkeys(m.dtype for m in sorts))
        figure, axes = _grid(plt, len(dtypes))
        for axis, dtype in zip(axes, dtypes):
            for line in dict.fromkeys((m.impl, m.places, m.gpus) for m in sorts if m.dtype == dtype):
                impl, places, gpus = line
                points = sorted((m.elements, m.rate / 1e9) for m in sorts
                                if (m.dtype, m.impl, m.places, m.gpus) == (dtype, impl, places, gpus))
                label = impl if impl != "ours" else f"ours, {where(places, gpus)}"
                style = dict(_STYLE.get(impl, {}))
                if impl == "ours" and places > 1:
                    style = dict(linestyle="-", linewidth=1 + places / 2)
                axis.plot(*zip(*points), marker="o", markersize=3, label=label, **style)
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_title(f"sort {dtype}")
            axis.set_xlabel("keys in total")
            axis.set_ylabel("Gkeys/s")
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=7)
        written.append(_save(plt, figure, out / "sort.png"))

    # scaling: ours on G places over G GPUs at the largest size, against G × one GPU and the copy limit
    scaled = [m for m in good if m.impl in ("ours", "copy") and m.places == m.gpus]
    if any(m.gpus > 1 for m in scaled):
        first_dtype = next(iter(dict.fromkeys(m.dtype for m in sweep)), None)
        panels = [(a, first_dtype) for a in _ordered(m.algorithm for m in sweep) if a != "copy"]
        panels += [("sort", d) for d in dict.fromkeys(m.dtype for m in sorts)][:1]
        figure, axes = _grid(plt, len(panels))
        for axis, (algorithm, dtype) in zip(axes, panels):
            rows = [m for m in scaled if m.algorithm == algorithm and m.dtype == dtype and m.impl == "ours"]
            if not rows:
                axis.set_visible(False)
                continue
            size = max(index.size(m) for m in rows)
            points = sorted((m.gpus, m.rate / 1e9 if algorithm == "sort" else m.bytes_moved / 1e9 / m.median_by("wall"))
                            for m in rows if index.size(m) == size)
            axis.plot(*zip(*points), marker="o", label="ours (wall clock)", **_STYLE["ours"])
            if points[0][0] == 1:
                axis.plot([g for g, _ in points], [points[0][1] * g for g, _ in points], linestyle=":",
                          color="gray", label="linear from 1 GPU")
            if algorithm == "sort":
                reference = index.get("sort", "cupy", dtype, 1, 1, size)
                if reference is not None:
                    axis.axhline(reference.rate / 1e9, label="cupy.sort, 1 GPU", **_STYLE["cupy"])
                axis.set_ylabel("Gkeys/s")
            else:
                copies = sorted((m.gpus, m.gbps) for m in good if m.algorithm == "copy" and m.places == m.gpus
                                and m.dtype == dtype and index.size(m) == size)
                if copies:
                    axis.plot(*zip(*copies), label="copy limit", **_STYLE["copy"])
                axis.set_ylabel("GB/s, all GPUs")
            label = f"{log2_label(size)} keys" if algorithm == "sort" else f"{log2_label(size)}/GPU"
            axis.set_title(f"{algorithm} {dtype}, {label}")
            axis.set_xlabel("GPUs")
            axis.set_xticks(sorted({g for g, _ in points}))
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=7)
        written.append(_save(plt, figure, out / "scaling.png"))
    return written


# ---- everything ----------------------------------------------------------------------------------

def write(out: Path, measures: list, env: dict, options: dict, plots: bool = True) -> str:
    """results.md, results.json and the plots under `out`; returns the text to print."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = evaluate(measures)
    printed, text = markdown(measures, env, options, results)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(to_json(measures, env, options, results))
    if plots:
        try:
            files = plot(measures, out)
            printed += "\n\nPlots: " + ", ".join(str(path) for path in files)
        except ImportError as error:
            printed += f"\n\nNo plots: matplotlib does not import ({error}; pip install .[bench])."
        except Exception as error:  # noqa: BLE001 - the figures are written; a plot failure must not lose them
            printed += f"\n\nPlots failed: {type(error).__name__}: {error}"
    return printed + f"\n\nWritten: {out / 'results.md'}, {out / 'results.json'}"
