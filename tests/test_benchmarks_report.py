"""The benchmark suite's pure-Python parts, with fake measurements (no GPU): size and place
parsing, error isolation and the time budget, the performance targets, the markdown, JSON and plots."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import report  # noqa: E402
import targets  # noqa: E402
from common import (Block, Measure, Progress, Task, parse_places, parse_sizes, place_devices,  # noqa: E402
                    run_blocks)

GB = 1e9


# ---- command line ------------------------------------------------------------------------------

def test_parse_sizes_ranges_lists_and_repeats():
    assert parse_sizes("16:28:4") == [1 << 16, 1 << 20, 1 << 24, 1 << 28]
    assert parse_sizes("20,24") == [1 << 20, 1 << 24]
    assert parse_sizes("28") == [1 << 28]
    assert parse_sizes("16:18") == [1 << 16, 1 << 17, 1 << 18]
    assert parse_sizes("24, 16:24:8") == [1 << 16, 1 << 24]


@pytest.mark.parametrize("text", ["", "abc", "28:16", "16:28:0", "2", "40", "16:20:4:1"])
def test_parse_sizes_rejects(text):
    with pytest.raises(ValueError, match="sizes"):
        parse_sizes(text)


def test_parse_places_and_devices():
    assert parse_places("1,2,4,all", 2) == [1, 2, 4]
    assert parse_places("1,2,4,all", 8) == [1, 2, 4, 8]
    assert parse_places("all", 1) == [1]
    with pytest.raises(ValueError, match="places"):
        parse_places("0", 2)
    with pytest.raises(ValueError, match="places"):
        parse_places("two", 2)
    assert place_devices(4, [0, 1]) == [0, 1, 0, 1]
    assert place_devices(2, [0, 1, 2, 3]) == [0, 1]
    assert place_devices(3, [0]) == [0, 0, 0]


def test_run_selection():
    import run

    assert run.selection("all", "") == set(run.ALGORITHMS + run.SUITES)
    assert run.selection("transform,compile", "") == {"transform_unary", "transform_binary", "compile"}
    assert "compile" not in run.selection("all", "compile")
    with pytest.raises(ValueError, match="unknown name"):
        run.selection("transfrom", "")


# ---- measures and the block runner ----------------------------------------------------------------

def test_measure_statistics():
    m = Measure("x", [1e-3, 2e-3, 4e-3], bytes_moved=int(8e9), elements=1000, gpus=2, timer="events",
                extra={"wall": [5e-3, 6e-3, 7e-3]})
    assert m.median == 2e-3 and m.spread == pytest.approx(1.5)
    assert m.gbps == pytest.approx(4000) and m.rate == pytest.approx(5e5)
    assert m.elements_per_gpu == 500
    assert m.median_by("wall") == 6e-3 and m.median_by("events") == 2e-3
    assert math.isnan(m.median_by("host"))
    empty = Measure("y", [], error="boom")
    assert not empty.ok and math.isnan(empty.median) and math.isnan(empty.gbps)


def test_run_blocks_isolates_failures_and_respects_the_budget(capsys):
    torn_down = []

    def fails(data):
        raise RuntimeError("kernel exploded")

    def broken_setup():
        raise MemoryError("out of device memory")

    blocks = [
        Block("good", [Task("a", lambda data: Measure("a", [data]), Measure("a", [])),
                       Task("b", fails, Measure("b", [], algorithm="reduce")),
                       Task("c", lambda data: [Measure("c", [1.0]), Measure("c2", [2.0])], Measure("c", []))],
              setup=lambda: 0.5, teardown=torn_down.append),
        Block("bad setup", [Task("d", lambda data: Measure("d", [1.0]), Measure("d", []))], setup=broken_setup),
    ]
    progress = Progress(total=4)
    measures = run_blocks(blocks, progress)
    assert [m.name for m in measures] == ["a", "b", "c", "c2", "d"]
    assert measures[0].seconds == [0.5] and torn_down == [0.5]
    assert measures[1].error.startswith("RuntimeError: kernel exploded") and measures[1].algorithm == "reduce"
    assert measures[4].error.startswith("MemoryError")
    assert progress.done == 4
    assert "kernel exploded" in capsys.readouterr().err

    skipped = run_blocks(blocks[:1], Progress(total=3), deadline=0.0)
    assert [m.error for m in skipped] == ["skipped: over the time budget"] * 3


def test_run_blocks_stops_measuring_once_the_cuda_context_is_lost():
    def faults(data):
        raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")

    ran = []
    blocks = [
        Block("first", [Task("a", faults, Measure("a", [])),
                        Task("b", lambda data: Measure("b", [1.0]), Measure("b", []))], setup=lambda: 0),
        Block("later", [Task("c", lambda data: ran.append("c") or Measure("c", [1.0]), Measure("c", []))],
              setup=lambda: ran.append("setup") or 0),
    ]
    measures = run_blocks(blocks, Progress(total=3))
    assert [m.name for m in measures] == ["a", "b", "c"]
    assert measures[0].error.startswith("RuntimeError: cudaErrorIllegalAddress")
    assert measures[1].ok  # the rest of the failing block still ran (its own errors would show)
    assert ran == [] and measures[2].error.startswith("not measured: the CUDA context was lost earlier")


# ---- the sweep's helpers, with numpy standing in for CuPy ---------------------------------------

class _FakeCupy:
    """numpy, plus the cuda.Device context CuPy code enters."""

    def __init__(self):
        import contextlib
        import types

        import numpy

        self.numpy = numpy
        self.cuda = types.SimpleNamespace(Device=lambda device: contextlib.nullcontext())

    def __getattr__(self, name):
        return getattr(self.numpy, name)


def test_check_each_shard_names_the_shard_that_differs():
    import numpy as np
    from sweep import Data, check_each_shard

    x = [np.arange(4.0), np.arange(4.0, 8.0)]
    y = [np.ones(4), np.ones(4)]
    data = Data(_FakeCupy(), np.dtype(np.float64), [0, 1], x, y, [x[0] + 1, x[1] + 1])
    check_each_shard(data, lambda a, b: a + b, "a + b")
    data.out[1][2] = 0.0
    with pytest.raises(AssertionError, match=r"a \+ b, shard 1: 1 elements differ, first at 2"):
        check_each_shard(data, lambda a, b: a + b, "a + b")


def test_cccl_impl_sizes_the_storage_once_and_passes_the_stream():
    import numpy as np
    from sweep import Data, cccl_impl

    calls = []

    def build(temp_storage, stream=None, **arguments):
        calls.append((None if temp_storage is None else temp_storage.nbytes, stream, arguments))
        return 96

    data = Data(_FakeCupy(), np.dtype(np.float32), [0], [np.zeros(3, np.float32)], stream="the stream")
    impl = cccl_impl(data, build, lambda: "result", d_in="x", num_items=3)
    impl.run()
    impl.run()
    assert calls == [(None, None, {"d_in": "x", "num_items": 3})] + [(96, "the stream", {"d_in": "x", "num_items": 3})] * 2
    assert impl.result() == "result"


# ---- fake run: every target's inputs ------------------------------------------------------------------

N = 1 << 28


def _row(algorithm, impl, seconds, dtype="float32", places=1, gpus=1, traffic=1, elements=None,
         timer=None, variant="", wall=None):
    elements = elements or N * gpus
    itemsize = {"float32": 4, "int32": 4, "int64": 8}[dtype]
    timer = timer or ("events" if places == 1 else "wall")
    extra = {"events": [seconds] * 3, "wall": [wall or seconds * 1.01] * 3}
    if timer == "wall":
        extra = {"events": [seconds * 0.99] * 3, "wall": [seconds] * 3}
    return Measure(f"{algorithm} {impl} {places}/{gpus}", [seconds] * 3 if timer != "wall" else extra["wall"],
                   bytes_moved=traffic * elements * itemsize, algorithm=algorithm, impl=impl, dtype=dtype,
                   elements=elements, places=places, gpus=gpus, timer=timer, variant=variant, extra=extra)


def fake_measures() -> list[Measure]:
    t = 3 * N * 4 / (4000 * GB)  # a binary transform at 4000 GB/s
    r = N * 4 / (4000 * GB)
    rows = [
        _row("copy", "copy", 2 * N * 4 / (4100 * GB), traffic=2),
        _row("copy", "copy", 2 * N * 4 / (4100 * GB), traffic=2, places=2, gpus=2),
        _row("transform_binary", "ours", t, traffic=3, wall=t * 1.02),
        _row("transform_binary", "ours built-in", t * 0.99, traffic=3),
        _row("transform_binary", "cuda.compute", t * 0.98, traffic=3),
        _row("transform_binary", "cupy", t * 1.6, traffic=3),
        _row("transform_binary", "ours", t * 1.04, traffic=3, places=2, gpus=2),
        _row("transform_binary", "ours", t * 2.1, traffic=3, places=4, gpus=2),
        _row("reduce", "ours", r * 1.08, wall=r * 1.1),
        _row("reduce", "ours built-in", r * 1.08),
        _row("reduce", "cupy", r),
        _row("reduce", "ours", r * 1.2, places=2, gpus=2),
        _row("inclusive_scan", "ours", 3.5 * r, traffic=2, wall=3.6 * r),
        _row("inclusive_scan", "ours built-in", 3.5 * r, traffic=2),
        _row("inclusive_scan", "torch", 3.3 * r, traffic=2),
        _row("inclusive_scan", "ours", 4.5 * r, traffic=2, places=2, gpus=2),
        _row("count", "ours", r * 1.05),
        _row("histogram_even", "ours", r * 1.4),
        _row("histogram_even", "cupy", r * 9),
        _row("sort", "ours", 5e-3, dtype="int32", traffic=0, elements=N),
        _row("sort", "cupy", 6.7e-3, dtype="int32", traffic=0, elements=N, wall=6.8e-3),
        _row("sort", "ours", 3.9e-3, dtype="int32", traffic=0, elements=N, places=2, gpus=2),
        _row("sort", "cupy", 0.2e-3, dtype="int32", traffic=0, elements=1 << 20),
        _row("reduce", "ours", 2e-5, elements=1 << 20),
        _row("reduce", "cupy", 1e-5, elements=1 << 20),
        _row("reduce", "torch", 1.2e-5, elements=1 << 20),
        Measure("host", [9e-6, 9.5e-6], algorithm="transform_binary", impl="ours", dtype="float32",
                elements=1024, places=1, gpus=1, timer="host"),
        Measure("host 2", [14e-6], algorithm="transform_binary", impl="ours", dtype="float32",
                elements=2048, places=2, gpus=2, timer="host"),
        Measure("host 4", [20e-6], algorithm="transform_binary", impl="ours", dtype="float32",
                elements=4096, places=4, gpus=1, timer="host"),
        Measure("torch host", [8e-6], algorithm="transform_binary", impl="torch", dtype="float32",
                elements=1024, places=1, gpus=1, timer="host"),
        Measure("reduce host", [12e-6], algorithm="reduce", impl="ours", dtype="float32",
                elements=1024, places=1, gpus=1, timer="host"),
        Measure("a + b", [12e-6, 12.4e-6], algorithm="transform_binary", impl="ours a + b", dtype="float32",
                elements=1024, places=1, gpus=1, timer="host"),
        Measure("ops.add", [10e-6], algorithm="transform_binary", impl="ours built-in, new array",
                dtype="float32", elements=1024, places=1, gpus=1, timer="host"),
        Measure("warm", [0.07, 0.08], algorithm="compile", impl="ours", variant="warm process", timer="process",
                places=1, gpus=1),
        Measure("disk", [], algorithm="compile", impl="ours", variant="new process, warm disk cache",
                timer="process", places=1, gpus=1, error="RuntimeError: child process failed"),
        Measure("adjacent", [], algorithm="adjacent_difference", impl="ours", dtype="float32", elements=N,
                places=1, gpus=1, timer="events", error="skipped: over the time budget"),
    ]
    return rows


def _target(results, text):
    return next(result for result in results if result.target.text.startswith(text))


def test_targets_read_both_figures_from_the_same_run():
    results = targets.evaluate(fake_measures())
    assert len(results) == len(targets.TARGETS)

    versus_cccl = _target(results, "binary transform, user lambda ≥ 0.95 × cuda.compute")
    assert versus_cccl.unit == "GB/s" and versus_cccl.ours == pytest.approx(4000)
    assert versus_cccl.ratio == pytest.approx(0.98) and versus_cccl.status == "pass"
    assert versus_cccl.elements == N

    # wall clock on both sides: 2 GPUs move twice the bytes in 1.04 t against the 1-GPU wall of 1.02 t
    scaling = _target(results, "binary transform on 2 GPUs")
    assert scaling.ratio == pytest.approx(2 * 1.02 / 1.04) and scaling.status == "pass"

    reduce_two = _target(results, "reduce on 2 GPUs")
    assert reduce_two.unit == "s" and reduce_two.ratio == pytest.approx(1.2 / 1.1)
    assert reduce_two.status == "FAIL"

    scan_two = _target(results, "inclusive scan on 2 GPUs")
    assert scan_two.reference == pytest.approx(1.1 * (N * 4 / (4000 * GB)) + 3.6 * (N * 4 / (4000 * GB)))
    assert scan_two.status == "pass"

    torch_scan = _target(results, "inclusive scan, user add ≥ 1.0 × torch")
    assert torch_scan.ratio == pytest.approx(3.3 / 3.5) and torch_scan.status == "FAIL"

    sort_two = _target(results, "sort of 2^28 int32 keys on 2 GPUs")
    assert sort_two.unit == "elements/s" and sort_two.ratio == pytest.approx(6.8 / 3.9)
    assert sort_two.status == "pass" and sort_two.elements == N
    assert _target(results, "sort of 2^28 int32 keys on 4 GPUs").status.startswith("not measured")
    assert _target(results, "sort of 2^28 int32 keys, one place").ratio == pytest.approx(6.7 / 5)

    assert _target(results, "count").ratio == pytest.approx(1 / 1.05)
    assert _target(results, "histogram_even faster").ratio == pytest.approx(9 / 1.4)

    host = _target(results, "host time per call of a user-operator transform, 1024 elements")
    assert host.ours == pytest.approx(9.25e-6) and host.status == "FAIL" and host.elements is None
    below_torch = _target(results, "host time per call of a user-operator transform ≤ 1.0 × torch")
    assert below_torch.ratio == pytest.approx(9.25 / 8) and below_torch.status == "FAIL"
    four_places = _target(results, "host time per call of a user-operator transform on 4 places")
    assert four_places.ratio == pytest.approx(20 / 9.25) and four_places.status == "pass"
    reduce_host = _target(results, "host time per call of a reduce to a host value")
    assert reduce_host.ours == pytest.approx(12e-6) and reduce_host.status == "FAIL"
    operator = _target(results, "a + b host time")
    assert operator.ratio == pytest.approx(12.2 / 10) and operator.status == "pass"
    assert _target(results, "first call of a new operator").status == "pass"
    assert "child process failed" in _target(results, "first call in a new process").status
    assert _target(results, "argmin ≥ 1.0").status.startswith("not measured")


def test_targets_fall_back_to_the_largest_size_measured():
    rows = [_row("reduce", "ours", 2e-5, elements=1 << 20), _row("reduce", "cupy", 1e-5, elements=1 << 20)]
    result = _target(targets.evaluate(rows), "reduce, user add")
    assert result.elements == 1 << 20 and result.ratio == pytest.approx(0.5) and result.status == "FAIL"


# ---- the report ----------------------------------------------------------------------------------

ENV = {"date": "2026-11-30 10:00 UTC", "gpu_names": ["NVIDIA H200", "NVIDIA H200"], "link": "GPU0-GPU1: NV18",
       "driver": "580.159.04", "cuda_runtime": "13.0", "cuda_sharded_jit": "0.1.0", "cupy": "14.2.0"}
OPTIONS = {"reps": 20, "warmup": 3, "sort_reps": 10}


def test_markdown_has_every_section_and_lists_errors():
    printed, text = report.markdown(fake_measures(), ENV, OPTIONS)
    assert text.startswith(printed)
    assert "2× NVIDIA H200 (GPU0-GPU1: NV18), driver 580.159.04" in printed
    for title in ("### Performance targets", "### float32, 2^28 elements per GPU", "### float32, ours on one place by size",
                  "### Sort", "### Host time per call", "### Compile latency", "### Errors (1)"):
        assert title in printed, title
    assert "child process failed" in printed and "1 measures skipped" in printed
    assert "<details>" in text and "<details>" not in printed
    targets_section = printed.split("### Performance targets")[1].split("###")[0]
    assert targets_section.count("| pass |") + targets_section.count("| FAIL |") >= 10
    assert "| binary transform, user lambda ≥ 0.95 × cuda.compute binary_transform (2^28/GPU) | 4000 GB/s | " \
           "4082 GB/s (cuda.compute binary_transform) | 0.980 | ≥ 0.95 | pass |" in targets_section
    assert "| host time per call of a user-operator transform, 1024 elements, 1 place ≤ 5 µs | 9.25 µs | — |  " \
           "| ≤ 5 µs | FAIL |" in targets_section
    assert "issue" not in printed.lower()
    # several places: aggregate GB/s and the speed-up over one place, by wall clock
    throughput = printed.split("### float32, 2^28 elements per GPU")[1].split("###")[0]
    assert "ours, 2 GPUs" in throughput and "ours, 4 places on 2 GPUs" in throughput
    transform_line = next(line for line in throughput.splitlines() if line.startswith("| transform_binary"))
    assert "7692 (1.96×)" in transform_line
    assert "| 9.25 µs | 14 µs |" in printed


def test_json_keeps_every_repetition_and_no_nan(tmp_path):
    measures = fake_measures()
    results = targets.evaluate(measures)
    path = tmp_path / "results.json"
    path.write_text(report.to_json(measures, ENV, OPTIONS, results))
    data = json.loads(path.read_text())  # strict JSON: NaN would have been written as NaN
    assert data["environment"]["driver"] == "580.159.04"
    assert len(data["measures"]) == len(measures) and len(data["targets"]) == len(targets.TARGETS)
    first = data["measures"][2]
    assert first["seconds"] == measures[2].seconds and first["extra"]["wall"] == measures[2].extra["wall"]
    assert data["measures"][-1]["median"] is None
    assert "NaN" not in path.read_text()


def test_write_without_plots(tmp_path):
    printed = report.write(tmp_path, fake_measures(), ENV, OPTIONS, plots=False)
    assert (tmp_path / "results.md").read_text().startswith("## Benchmark results")
    assert (tmp_path / "results.json").exists() and "results.md" in printed


def test_plots(tmp_path):
    pytest.importorskip("matplotlib")
    measures = fake_measures()
    # a size sweep for the bandwidth plot
    for size in (1 << 16, 1 << 20, 1 << 24):
        for impl, speed in (("ours", 1.0), ("cupy", 1.2), ("copy", 0.9)):
            algorithm = "copy" if impl == "copy" else "transform_binary"
            measures.append(_row(algorithm, impl, 1e-5 * speed * size / (1 << 16), elements=size, traffic=3))
    files = report.plot(measures, tmp_path)
    names = {path.name for path in files}
    assert {"bandwidth_float32.png", "sort.png", "scaling.png"} <= names
    for path in files:
        assert path.stat().st_size > 1000


# ---- docs/performance.md ---------------------------------------------------------------------------

def test_performance_doc_lists_every_target_as_defined():
    assert targets.main(["--check"]) == 0, "docs/performance.md is stale: run python benchmarks/targets.py"
    text = targets.PERFORMANCE_DOC.read_text()
    listed = text.split(targets.BEGIN)[1].split(targets.END)[0]
    for target in targets.TARGETS:
        assert f"| {target.text} | " in listed, target.text
    assert "| reduce on 2 GPUs ≤ 1.05 × one-GPU reduce time (same size per GPU) | ours / reference ≤ 1.05 | " \
           "2^28 per GPU | host wall clock |" in listed
    assert "| first call in a new process, warm disk cache ≤ 50 ms | ours ≤ 50 ms | — |" in listed


def test_by_size_table_marks_the_cells_under_the_by_size_target():
    assert [targets.by_size_threshold(1 << e) for e in (18, 20, 21, 22, 26, 28, 29)] == \
        [None, 0.9, 0.9, 1.0, 1.0, 1.0, None]
    table = report.sweep_table(fake_measures(), "float32")
    lines = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    reduce_cells = [cell.strip() for cell in lines["reduce"].split("|")[2:-1]]
    assert reduce_cells[0].endswith("(0.50×) **miss**")   # 2^20: half of cupy, under 0.9
    assert reduce_cells[1].endswith("(0.93×) **miss**")   # 2^28: under 1.0
    assert "**miss**" not in lines["histogram_even"]       # 6.43× cupy
    assert lines["transform_binary"].count("**miss**") == 1  # 0.98× cuda.compute at 2^28


def test_by_size_table_gives_a_third_decimal_where_two_would_hide_a_miss():
    r = N * 4 / (4000 * GB)
    rows = [_row("reduce", "ours", r / 0.996), _row("reduce", "cupy", r),
            _row("count", "ours", r), _row("count", "cupy", r),
            _row("argmin", "ours", r / 0.97), _row("argmin", "cupy", r)]
    table = report.sweep_table(rows, "float32")
    lines = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "(0.996×) **miss**" in lines["reduce"]   # under 1.0, which two decimals would show
    assert "(1.00×)" in lines["count"] and "**miss**" not in lines["count"]
    assert "(0.97×) **miss**" in lines["argmin"]


def test_gpu_side_table_compares_the_held_timings_and_shows_what_the_idle_gpu_adds():
    def row(impl, idle, held):
        return Measure(name=impl, seconds=[idle] * 3, bytes_moved=12 << 20, algorithm="transform_binary",
                       impl=impl, dtype="float32", elements=1 << 20, places=1, gpus=1, timer="events",
                       extra={"gpu": [held] * 3})

    measures = [row("ours", 10e-6, 4e-6), row("torch", 8e-6, 5e-6), row("cupy", 9e-6, 4.4e-6)]
    table = report.gpu_side_table(measures, "float32")
    cell = [line for line in table.splitlines() if line.startswith("| transform_binary")][0].split("|")[2].strip()
    # the fastest peer held is cupy (4.4 us): 4.4 / 4.0 = 1.10; idle adds 6.0 us to ours, 4.6 to cupy
    assert cell == "1.10× · +6.0 / +4.6 µs"
    assert report.gpu_side_table([row("ours", 10e-6, 4e-6)], "float32").count("×") == 0  # no peer
    without = [Measure(name="ours", seconds=[1e-5], algorithm="transform_binary", impl="ours", dtype="float32",
                       elements=1 << 20, places=1, gpus=1, timer="events")]
    assert report.gpu_side_table(without, "float32") == ""
