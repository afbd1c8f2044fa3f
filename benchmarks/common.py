"""Shared by the benchmarks: one `Measure` per timed thing, the timers (CUDA events on every
place's stream, host wall clock, host time per call), error isolation, the progress line and
the command-line parsing of sizes and place counts.

Nothing here imports CuPy or a GPU library: the CPU tests use it with fake measurements.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Callable


@dataclass
class Measure:
    """Repeated timings of one call, with the keys the report, the targets and the plots look up.

    `seconds` holds the primary timer's repetitions (`timer`: "events" on one place, "wall"
    on several, "host" for host time per call, "process" for compile latency); `extra` may
    hold the other timer's repetitions under "events" / "wall". An `error` row has no timings.
    """

    name: str
    seconds: list[float]
    bytes_moved: int = 0
    note: str = ""
    extra: dict = field(default_factory=dict)
    algorithm: str = ""       # "transform_binary", "sort", "copy", "compile", ...
    impl: str = ""            # "ours", "ours built-in", "cupy", "torch", "cuda.compute", "copy"
    variant: str = ""         # a qualifier where algorithm and impl are not enough (compile rows)
    dtype: str = ""
    elements: int = 0         # elements processed in total (over every GPU)
    places: int = 0
    gpus: int = 0
    timer: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else math.nan

    @property
    def spread(self) -> float:
        """(max - min) / median over the timed repetitions."""
        if not self.seconds:
            return math.nan
        return (max(self.seconds) - min(self.seconds)) / self.median if self.median else 0.0

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.median / 1e9 if self.bytes_moved and self.ok else math.nan

    @property
    def rate(self) -> float:
        """Elements per second (keys/s for sort)."""
        return self.elements / self.median if self.elements and self.ok else math.nan

    @property
    def elements_per_gpu(self) -> int:
        return self.elements // max(self.gpus, 1)

    def seconds_by(self, timer: str) -> list[float]:
        """Repetitions by `timer` ("events" or "wall"): the primary list or the one in extra."""
        if timer == self.timer:
            return self.seconds
        return list(self.extra.get(timer, []))

    def median_by(self, timer: str) -> float:
        seconds = self.seconds_by(timer)
        return statistics.median(seconds) if seconds else math.nan

    def as_dict(self) -> dict:
        return dict(asdict(self), median=self.median, spread=self.spread, gbps=self.gbps, rate=self.rate)



# ---- timers ----------------------------------------------------------------------------------

_HOLD_SOURCE = r"""
extern "C" __global__ void csj_bench_hold(unsigned long long nanoseconds) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}
"""
_hold_kernels = {}
HOLD_SECONDS = 300e-6  # longer than any call's host time before its last launch

# After a block's teardown hands gigabytes back to the driver (CuPy's pool, torch's cache), a
# launch from an idle stream starts 25-40 us later than usual for 2-10 ms (measured on an H100
# after CuPy freed 1 and 3 GiB). After each teardown the run waits five times the longest of
# those windows, so that no implementation is timed inside one another left.
SETTLE_AFTER_TEARDOWN = 0.05


def hold_stream(cp, device: int, stream, seconds: float = HOLD_SECONDS) -> None:
    """Queue a kernel that keeps `stream` busy for `seconds`: the calls queued behind it then
    start as soon as it ends, so events around them time the GPU's side alone (the kernels and
    the gaps between them), not the host's time before the first launch."""
    with cp.cuda.Device(device):
        kernel = _hold_kernels.get(device)
        if kernel is None:
            kernel = _hold_kernels[device] = cp.RawKernel(_HOLD_SOURCE, "csj_bench_hold")
        kernel((1,), (1,), (cp.uint64(int(seconds * 1e9)),), stream=stream)


def time_events_places(cp, streams, run, reps: int, warmup: int = 3, prepare=None,
                       hold: bool = False) -> list[float]:
    """Seconds per call of `run()`, by CUDA events recorded on each (device, stream pointer)
    of `streams`; per repetition the slowest place counts (events of different devices cannot
    be compared with each other, so each place is timed from its own start event).

    `prepare()` runs before every call, outside the timed region, and must leave the devices
    idle (e.g. refill a sort's input, then synchronise). With `hold`, each start event is
    queued behind `hold_stream`'s kernel, so that the figure is the GPU's side of the call.
    """
    places = []
    for device, pointer in streams:
        with cp.cuda.Device(device):
            places.append((device, cp.cuda.ExternalStream(pointer, device), cp.cuda.Event(), cp.cuda.Event()))
    for _ in range(warmup):
        if prepare is not None:
            prepare()
        run()
    for device, stream, _, _ in places:
        with cp.cuda.Device(device):
            stream.synchronize()
    times = []
    for _ in range(reps):
        if prepare is not None:
            prepare()
        for device, stream, start, _ in places:
            if hold:
                hold_stream(cp, device, stream)
            with cp.cuda.Device(device):
                start.record(stream)
        run()
        for device, stream, _, stop in places:
            with cp.cuda.Device(device):
                stop.record(stream)
        slowest = 0.0
        for device, _, start, stop in places:
            with cp.cuda.Device(device):
                stop.synchronize()
                slowest = max(slowest, cp.cuda.get_elapsed_time(start, stop) / 1e3)
        times.append(slowest)
    return times


def time_wall(run, sync, reps: int, warmup: int = 3, prepare=None) -> list[float]:
    """Seconds per call of `run(); sync()` by the host clock (multi-place calls)."""
    for _ in range(warmup):
        if prepare is not None:
            prepare()
        run()
    sync()
    times = []
    for _ in range(reps):
        if prepare is not None:
            prepare()
            sync()
        started = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - started)
    return times


def host_times_per_call(run, sync, calls: int = 2000, batch: int = 100) -> list[float]:
    """Host seconds per enqueue, one figure per batch of calls; batches are small enough not
    to fill the launch queue, and each ends with a wait outside the clock."""
    for _ in range(batch):
        run()
    sync()
    per_call = []
    for _ in range(calls // batch):
        started = time.perf_counter()
        for _ in range(batch):
            run()
        per_call.append((time.perf_counter() - started) / batch)
        sync()
    return per_call


# ---- error isolation -------------------------------------------------------------------------

def error_text(error: BaseException) -> str:
    """One line: the exception's type and message, and where in the benchmarks it came from."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if "benchmarks" in frame.filename]
    where = f" ({frames[-1].name}:{frames[-1].lineno})" if frames else ""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message[:300]}{where}"


def error_row(template: Measure, error: str) -> Measure:
    """A row with `template`'s keys, no timings and `error` (a failure, a skip)."""
    return Measure(**{**asdict(template), "seconds": [], "extra": {}, "error": error})


def failed(template: Measure, error: BaseException) -> Measure:
    """An error row with `template`'s keys: the suite goes on, the report lists it."""
    row = error_row(template, error_text(error))
    print(f"  error: {row.name}: {row.error}", file=sys.stderr, flush=True)
    return row


@dataclass
class Task:
    """One measurement of a block: `run(data)` returns its Measure(s); `template` names the
    error row when it raises."""

    label: str
    run: Callable
    template: Measure


@dataclass
class Block:
    """Tasks that share data: `setup()` builds it once (arrays, streams), `teardown(data)`
    frees it, so the largest arrays are never held longer than their block."""

    label: str
    tasks: list[Task]
    setup: Callable = lambda: None
    teardown: Callable = lambda data: None


class Progress:
    """One line of progress: an updating line on a terminal, a line every few seconds in a log."""

    def __init__(self, total: int = 0, stream=None, every_s: float = 5.0):
        self.total = total
        self.done = 0
        self.stream = stream or sys.stdout
        self.every_s = every_s
        self.started = time.perf_counter()
        self._last = -math.inf
        self.current = ""  # what runs now (a watchdog names it if it never returns)
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def line(self, label: str) -> str:
        elapsed = self.elapsed()
        minutes, seconds = divmod(int(elapsed), 60)
        total = max(self.total, self.done)
        return f"[{minutes:02d}:{seconds:02d}] {self.done}/{total} {label}"

    def step(self, label: str, count: int = 1) -> None:
        self.done += count
        self.current = label
        now = time.perf_counter()
        if self._tty:
            self.stream.write("\r\033[K" + self.line(label)[:160])
            self.stream.flush()
        elif now - self._last >= self.every_s or self.done >= self.total:
            self._last = now
            print(self.line(label), file=self.stream, flush=True)

    def finish(self) -> None:
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()


def _skipped(task: Task, reason: str = "skipped: over the time budget") -> Measure:
    return error_row(task.template, reason)


# CUDA errors that leave the process's context unusable: every later call fails with them, so
# the rest of the run is reported as not measured instead of as hundreds of errors.
STICKY_CUDA_ERRORS = ("IllegalAddress", "illegal memory access", "LaunchFailure", "unspecified launch failure",
                      "MisalignedAddress", "IllegalInstruction", "HardwareStackError", "InvalidPc")


def is_sticky(error_text_: str) -> bool:
    return any(marker in error_text_ for marker in STICKY_CUDA_ERRORS)


def run_blocks(blocks: list[Block], progress: Progress, deadline: float = math.inf,
               measures: list | None = None) -> list[Measure]:
    """Run every block's tasks, each isolated: a failing setup or task becomes error rows and
    the rest goes on — unless the error broke the CUDA context (an illegal address, say):
    then the remaining blocks are reported as not measured, naming that first error. Past
    `deadline` (time.perf_counter()) the remaining tasks are skipped and reported as skipped
    rows. Rows are appended to `measures` as they come (a watchdog
    can write what was measured if a call never returns)."""
    measures = [] if measures is None else measures
    lost = None  # the first error that broke the CUDA context, once one did
    for block in blocks:
        lost = lost or next((m.error for m in measures if m.error and is_sticky(m.error)), None)
        if lost:
            measures += [_skipped(task, f"not measured: the CUDA context was lost earlier ({lost})")
                         for task in block.tasks]
            progress.step(f"{block.label}: not measured (CUDA context lost)", len(block.tasks))
            continue
        if time.perf_counter() > deadline:
            measures += [_skipped(task) for task in block.tasks]
            progress.step(f"{block.label}: skipped (time budget)", len(block.tasks))
            continue
        progress.current = f"{block.label}: setup"
        try:
            data = block.setup()
        except Exception as error:  # noqa: BLE001 - every failure is reported, none stops the suite
            measures += [failed(task.template, error) for task in block.tasks]
            progress.step(f"{block.label}: setup failed", len(block.tasks))
            continue
        try:
            for task in block.tasks:
                if time.perf_counter() > deadline:
                    measures.append(_skipped(task))
                    progress.step(f"{block.label}: {task.label} skipped (time budget)")
                    continue
                progress.step(f"{block.label}: {task.label}")
                try:
                    result = task.run(data)
                except Exception as error:  # noqa: BLE001
                    measures.append(failed(task.template, error))
                    continue
                measures += result if isinstance(result, list) else [result]
        finally:
            progress.current = f"{block.label}: teardown"
            try:
                block.teardown(data)
            except Exception as error:  # noqa: BLE001
                print(f"  error: {block.label} teardown: {error_text(error)}", file=sys.stderr, flush=True)
            time.sleep(SETTLE_AFTER_TEARDOWN)
    return measures


# ---- command line ----------------------------------------------------------------------------

def parse_sizes(text: str) -> list[int]:
    """Element counts from powers of two: "16:28:4" (first:last:step, inclusive), "20,24",
    "28" or a mix ("16,20:28:4"). Sorted, without repeats.

    >>> parse_sizes("16:28:4")
    [65536, 1048576, 16777216, 268435456]
    """
    exponents = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.split(":")
        try:
            numbers = [int(part) for part in parts]
        except ValueError:
            raise ValueError(f"sizes: {item!r} is not an exponent or first:last[:step] of exponents") from None
        if len(numbers) == 1:
            numbers = [numbers[0], numbers[0], 1]
        elif len(numbers) == 2:
            numbers.append(1)
        if len(numbers) != 3 or numbers[2] <= 0 or numbers[0] > numbers[1]:
            raise ValueError(f"sizes: {item!r} is not first:last[:step] with first <= last and step > 0")
        exponents.update(range(numbers[0], numbers[1] + 1, numbers[2]))
    if not exponents:
        raise ValueError("sizes: no size given")
    if min(exponents) < 4 or max(exponents) > 34:
        raise ValueError("sizes: exponents must lie in 4..34 (2^4 to 2^34 elements)")
    return [1 << exponent for exponent in sorted(exponents)]


def parse_places(text: str, visible: int) -> list[int]:
    """Place counts: "1,2,4,all" ("all" is one place per visible GPU). Sorted, no repeats."""
    counts = set()
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        if item == "all":
            counts.add(visible)
            continue
        try:
            count = int(item)
        except ValueError:
            raise ValueError(f"places: {item!r} is neither a count nor 'all'") from None
        if count <= 0:
            raise ValueError(f"places: {count} is not a positive count")
        counts.add(count)
    if not counts:
        raise ValueError("places: no place count given")
    return sorted(counts)


def place_devices(places: int, devices: list[int]) -> list[int]:
    """The device of each place: one GPU per place while GPUs last, then round robin, so
    4 places on 2 GPUs are [0, 1, 0, 1]."""
    return [devices[place % len(devices)] for place in range(places)]


def where(places: int, gpus: int) -> str:
    """"1 GPU", "2 GPUs", or "4 places on 2 GPUs"."""
    on = f"{gpus} GPU{'s' if gpus > 1 else ''}"
    return on if places == gpus else f"{places} places on {on}"


def log2_label(count: int) -> str:
    """2^k when `count` is a power of two, else the number."""
    if count > 0 and count & (count - 1) == 0:
        return f"2^{count.bit_length() - 1}"
    return str(count)


def fmt_seconds(seconds: float) -> str:
    """Three significant digits in s, ms or µs; "" for NaN or None."""
    if seconds is None or math.isnan(seconds):
        return ""
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"
