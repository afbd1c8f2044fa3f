"""Timing helpers shared by the benchmarks: CUDA events on a stream, wall clock for
multi-place calls, warm-ups, median and spread."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field


@dataclass
class Measure:
    name: str
    seconds: list[float]
    bytes_moved: int = 0
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        """(max - min) / median over the timed repetitions."""
        return (max(self.seconds) - min(self.seconds)) / self.median if self.seconds else 0.0

    @property
    def gbps(self) -> float:
        return self.bytes_moved / self.median / 1e9 if self.bytes_moved else 0.0

    def as_dict(self) -> dict:
        return dict(asdict(self), median=self.median, spread=self.spread, gbps=self.gbps)


def time_events(cp, stream_ptr: int, device: int, run, reps: int, warmup: int = 3) -> list[float]:
    """Seconds per call of `run()`, timed by CUDA events recorded on `stream_ptr`."""
    with cp.cuda.Device(device):
        stream = cp.cuda.ExternalStream(stream_ptr, device)
        for _ in range(warmup):
            run()
        stream.synchronize()
        times = []
        for _ in range(reps):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            run()
            stop.record(stream)
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
        return times


def time_wall(run, sync, reps: int, warmup: int = 3) -> list[float]:
    """Seconds per call of `run(); sync()` by the host clock (multi-place calls)."""
    for _ in range(warmup):
        run()
    sync()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - started)
    return times


def host_time_per_call(run, sync, calls: int = 2000, batch: int = 100) -> float:
    """Median host seconds per enqueue, in batches small enough not to fill the launch queue."""
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
    return statistics.median(per_call)
