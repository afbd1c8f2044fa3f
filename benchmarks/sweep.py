"""The per-algorithm sweep: every case (an algorithm with its implementations: ours on 1, 2, 4
... places, and the peers CuPy, torch and cuda.compute on one GPU) at every size and dtype.

A `Case` says how to make each implementation's call from a `Data` (the arrays of one
configuration) and how to check a result; `measure` checks the result, then times the call
by CUDA events on every place's stream and by the host clock. Data is made on the GPUs by
CuPy (host-side generation of 2^28 values would take longer than timing them) and shared by
every case of its block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from common import (Block, Measure, Task, host_times_per_call, log2_label, place_devices,
                    time_events_places, time_wall, where)

PEERS = ("cupy", "torch", "cuda.compute")
INT_RANGE = 1000  # integer data is uniform in [0, INT_RANGE): sums and squares never overflow int64


class NotApplicable(Exception):
    """This implementation has no such call for this dtype (e.g. torch.histc on integers)."""


@dataclass
class Impl:
    """One implementation's call on one configuration.

    `run()` is what is timed. `result()` gives what the check reads (default: run's return
    value). `prepare()` runs before every call, outside the timed region, and leaves the
    devices idle (a sort refills its input).
    """

    run: Callable[[], object]
    result: Callable[[], object] | None = None
    prepare: Callable[[], None] | None = None


@dataclass
class Case:
    """An algorithm: its implementations (name -> maker(Data) -> Impl) and its check.

    `traffic`: elements read + written per element, so bytes = traffic * elements * itemsize;
    0 where bandwidth means nothing (sort: keys per second instead).
    `check(data, value)` raises AssertionError when a result is wrong.
    """

    algorithm: str
    traffic: int
    ours: dict
    peers: dict
    check: Callable
    note: str = ""


@dataclass
class Data:
    """The arrays of one configuration, as per-shard CuPy arrays (one shard for the peers).

    Ours: `group` and `arrays` (ShardedArrays "x", "y", "out"; x, y, out are CuPy views of
    their shards). Peers: `stream` (the CuPy stream they all run on, made current) and
    `tensors` (torch views of x, y, out). `context` holds what a case keeps beside (sort's
    pristine keys and reference). cuda.compute caches its builds by dtype and operator, so
    making them anew for each size costs nothing after the first.
    """

    cp: object
    dtype: np.dtype
    devices: list
    x: list
    y: list = field(default_factory=list)
    out: list = field(default_factory=list)
    gpus: int = 1
    group: object = None
    arrays: dict = field(default_factory=dict)
    stream: object = None
    tensors: dict = field(default_factory=dict)
    context: dict = field(default_factory=dict)

    @property
    def is_ours(self) -> bool:
        return self.group is not None

    def streams(self) -> list:
        if self.is_ours:
            return [(device, self.group.stream(place)) for place, device in enumerate(self.devices)]
        return [(self.devices[0], self.stream.ptr)]

    def sync(self) -> None:
        """Wait for the work queued by the implementations."""
        if self.is_ours:
            self.group.sync()
        else:
            self.stream.synchronize()

    def settle(self) -> None:
        """Wait for everything on every device of the configuration (CuPy's checks too)."""
        for device in sorted(set(self.devices)):
            self.cp.cuda.Device(device).synchronize()

    def release(self) -> None:
        """Drop the references to the arrays and hand CuPy's cached blocks back to the driver
        on every device of the configuration (its pool is per device)."""
        for arrays in (self.x, self.y, self.out):
            arrays.clear()
        self.tensors.clear()
        self.context.clear()
        for device in sorted(set(self.devices)):
            with self.cp.cuda.Device(device):
                self.cp.get_default_memory_pool().free_all_blocks()


# ---- data -----------------------------------------------------------------------------------

def random_values(cp, size: int, dtype: np.dtype, seed: int):
    """Uniform data on the current device: floats in [0, 1), integers in [0, INT_RANGE)."""
    generator = cp.random.RandomState(seed)
    if dtype.kind == "f":
        return generator.random_sample(size, dtype=dtype)
    return (generator.random_sample(size, dtype=cp.float64) * INT_RANGE).astype(dtype)


def shard_view(cp, array, place: int):
    """A CuPy array over shard `place` of a ShardedArray (zero copy, on the shard's device)."""
    with cp.cuda.Device(array.group.devices[place]):
        return cp.asarray(array.shard(place))


def fill_random(cp, views, devices, dtype: np.dtype, seed: int) -> None:
    """Shard 0 gets the values the peers get from `seed` (same size on one GPU: same data)."""
    for place, (view, device) in enumerate(zip(views, devices)):
        with cp.cuda.Device(device):
            cp.copyto(view, random_values(cp, view.size, dtype, seed + 1000 * place))


def copy_to_device(cp, array, device: int):
    """`array` on `device` (itself when it is there already), through cudaMemcpyPeer."""
    if array.device.id == device:
        return array
    with cp.cuda.Device(device):
        copy = cp.empty(array.shape, array.dtype)
    array.device.synchronize()
    cp.cuda.runtime.memcpyPeer(copy.data.ptr, device, array.data.ptr, array.device.id, array.nbytes)
    return copy


# ---- checks ---------------------------------------------------------------------------------

def assert_equal(cp, actual, expected, what: str) -> None:
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {actual.shape}, expected {expected.shape}")
    bad = actual != expected
    if bool(bad.any()):
        index = int(cp.flatnonzero(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} elements differ, first at {index}: "
                             f"{actual[index].item()!r}, expected {expected[index].item()!r}")


def check_each_shard(data: Data, expected: Callable, what: str) -> None:
    """Every shard's output equals `expected(x, y)` of its inputs (y is None without one)."""
    for place, out in enumerate(data.out):
        with data.cp.cuda.Device(data.devices[place]):
            y = data.y[place] if data.y else None
            assert_equal(data.cp, out, expected(data.x[place], y), f"{what}, shard {place}")


def assert_close(cp, actual, expected, what: str, rtol: float = 1e-3, atol: float = 1e-2) -> None:
    """Floating results of a different association (reductions, scans) than the reference."""
    actual = actual.astype(cp.float64)
    bad = cp.abs(actual - expected) > atol + rtol * cp.abs(expected)
    if bool(bad.any()):
        index = int(cp.flatnonzero(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} elements off, first at {index}: "
                             f"{actual[index].item()!r}, expected {expected[index].item()!r}")


def wrap(value: int, dtype: np.dtype) -> int:
    """An integer modulo 2^bits of `dtype`, as its fixed-width arithmetic gives it."""
    bits = dtype.itemsize * 8
    value %= 1 << bits
    if dtype.kind == "i" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def assert_scalar(value, expected, dtype: np.dtype, what: str) -> None:
    """A reduction's result: exact for integers (modulo 2^bits: a peer may widen the sum),
    within a relative 1e-3 for floats (another association)."""
    if dtype.kind in "iu":
        if wrap(int(value), dtype) != wrap(int(expected), dtype):
            raise AssertionError(f"{what}: {int(value)}, expected {int(expected)}")
    elif not abs(float(value) - expected) <= 1e-3 * abs(expected) + 1e-3:
        raise AssertionError(f"{what}: {float(value)!r}, expected {expected!r}")


def accumulator(cp, dtype: np.dtype):
    """The type references are computed in: float64 for floats, 64-bit for integers."""
    return {"f": cp.float64, "i": cp.int64, "u": cp.uint64}[dtype.kind]


# ---- measurement ----------------------------------------------------------------------------

def template(case: Case, impl: str, dtype: np.dtype, elements: int, places: int, gpus: int,
             size_label: str, timer: str = "") -> Measure:
    """The keys of one measurement (also its error row when it fails)."""
    return Measure(
        name=f"{case.algorithm} {dtype.name} {size_label} {impl} ({where(places, gpus)})",
        seconds=[], bytes_moved=case.traffic * elements * dtype.itemsize, note=case.note,
        algorithm=case.algorithm, impl=impl, dtype=dtype.name, elements=elements,
        places=places, gpus=gpus, timer=timer or ("events" if places == 1 else "wall"))


def checked_impl(case: Case, maker, data: Data):
    """The implementation, its result checked once; None when it does not apply."""
    try:
        impl = maker(data)
    except NotApplicable:
        return None
    if impl.prepare is not None:
        impl.prepare()
    value = impl.run()
    data.sync()
    case.check(data, impl.result() if impl.result is not None else value)
    data.settle()
    return impl


def measure(case: Case, maker, data: Data, row: Measure, reps: int, warmup: int) -> list[Measure]:
    """Check one implementation's result, then time it by events and by the host clock."""
    impl = checked_impl(case, maker, data)
    if impl is None:
        return []
    events = time_events_places(data.cp, data.streams(), impl.run, reps, warmup, impl.prepare)
    wall = time_wall(impl.run, data.sync, reps, warmup, impl.prepare)
    row.seconds = events if row.timer == "events" else wall
    row.extra = {"events": events, "wall": wall}
    if row.places == 1:  # the GPU's side alone: where a by-size ratio is lost, kernels or host
        row.extra["gpu"] = time_events_places(data.cp, data.streams(), impl.run, reps, warmup,
                                              impl.prepare, hold=True)
    return [row]


def measure_host(case: Case, maker, data: Data, row: Measure) -> list[Measure]:
    """Host seconds per call (batches of calls, one wait per batch), result checked first."""
    impl = checked_impl(case, maker, data)
    if impl is None:
        return []
    row.seconds = host_times_per_call(impl.run, data.sync)
    return [row]


# ---- configurations -------------------------------------------------------------------------

@dataclass
class Options:
    """What the sweep covers (from the command line)."""

    sizes: list            # elements per GPU
    dtypes: list           # numpy dtypes
    places: list           # place counts
    devices: list          # visible device ids
    peers: tuple = PEERS   # peers that can be imported (and were not left out)
    reps: int = 20
    warmup: int = 3
    seed: int = 0


def use_peer_stream(cp, options: Options, data: Data, tensors: dict) -> None:
    """Make the peers' stream current for CuPy and torch, once, so that no call pays for a
    context manager inside the timed region; `data.tensors` gets torch views of the CuPy
    arrays in `tensors` (when torch is measured)."""
    data.stream.use()
    if "torch" in options.peers:
        import torch

        torch_device = torch.device("cuda", data.devices[0])
        data.tensors = {name: torch.as_tensor(array, device=torch_device) for name, array in tensors.items()}
        torch.cuda.set_stream(torch.cuda.ExternalStream(data.stream.ptr, device=torch_device))


def peer_library(impl: str) -> str:
    """The library a peer implementation belongs to: "cupy .item()" is CuPy's."""
    return impl.split(" ")[0]


def peer_setup(cp, options: Options, dtype: np.dtype, size: int) -> Data:
    """x, y (random) and out on the first GPU, which the peers' calls run on (it is made the
    current device)."""
    device = options.devices[0]
    cp.cuda.Device(device).use()
    stream = cp.cuda.Stream(non_blocking=True)
    x = random_values(cp, size, dtype, options.seed)
    y = random_values(cp, size, dtype, options.seed + 1)
    out = cp.empty_like(x)
    cp.cuda.Device(device).synchronize()
    data = Data(cp, dtype, [device], [x], [y], [out], stream=stream)
    use_peer_stream(cp, options, data, {"x": x, "y": y, "out": out})
    return data


def peer_teardown(cp, data: Data) -> None:
    data.stream.synchronize()
    cp.cuda.Stream.null.use()
    had_torch = bool(data.tensors)
    data.release()
    if had_torch:
        import torch

        torch.cuda.set_stream(torch.cuda.default_stream(torch.device("cuda", data.devices[0])))
        torch.cuda.empty_cache()


def place_group(sharded, devices: list, groups: dict):
    """One PlaceGroup per device list for the whole run (a group owns its streams)."""
    key = tuple(devices)
    if key not in groups:
        groups[key] = sharded.PlaceGroup.by_devices(list(devices))
    return groups[key]


def ours_setup(cp, sharded, options: Options, dtype: np.dtype, size: int, devices: list,
               groups: dict) -> Data:
    """ShardedArrays x, y (random) and out of `size` elements per GPU over places on `devices`."""
    group = place_group(sharded, devices, groups)
    gpus = len(set(devices))
    arrays = {name: sharded.ShardedArray.allocate(group, size * gpus, dtype) for name in ("x", "y", "out")}
    views = {name: [shard_view(cp, array, place) for place in range(len(devices))]
             for name, array in arrays.items()}
    fill_random(cp, views["x"], devices, dtype, options.seed)
    fill_random(cp, views["y"], devices, dtype, options.seed + 1)
    data = Data(cp, dtype, list(devices), views["x"], views["y"], views["out"], gpus=gpus,
                group=group, arrays=arrays)
    data.settle()
    return data


def ours_teardown(cp, data: Data) -> None:
    data.settle()
    data.release()
    for array in data.arrays.values():
        array.free()
    data.group.release_cached_memory()


def release_shared_after(block: Block, cp, device: int, shared) -> None:
    """Makes `block` (the last one that uses them) let go of what its blocks shared after its
    own teardown: `shared` cleared, then `device`'s CuPy pool emptied."""
    teardown = block.teardown

    def release(data):
        try:
            teardown(data)
        finally:
            shared.clear()
            with cp.cuda.Device(device):
                cp.get_default_memory_pool().free_all_blocks()

    block.teardown = release


# ---- blocks ---------------------------------------------------------------------------------

def measure_task(case: Case, impl: str, maker, row: Measure, reps: int, warmup: int) -> Task:
    return Task(f"{case.algorithm} {impl}", lambda data: measure(case, maker, data, row, reps, warmup), row)


def blocks(cp, sharded, cases: list, options: Options, size: int, groups: dict) -> list[Block]:
    """Every block of one size (elements per GPU): per dtype, the peers on the first GPU, then
    ours on each place count."""
    result = []
    for dtype in options.dtypes:
        size_label = f"{log2_label(size)}/GPU"
        tasks = [measure_task(case, impl, maker, template(case, impl, dtype, size, 1, 1, size_label),
                       options.reps, options.warmup)
                 for case in cases for impl, maker in case.peers.items()
                 if peer_library(impl) in options.peers or impl == "copy"]
        if tasks:
            result.append(Block(f"{dtype.name} {size_label} peers", tasks,
                                lambda dtype=dtype: peer_setup(cp, options, dtype, size),
                                lambda data: peer_teardown(cp, data)))
        for places in options.places:
            devices = place_devices(places, options.devices)
            gpus = len(set(devices))
            tasks = [measure_task(case, impl, maker, template(case, impl, dtype, size * gpus, places, gpus, size_label),
                           options.reps, options.warmup)
                     for case in cases for impl, maker in case.ours.items()
                     if not (impl == "copy" and places == 1)]  # the peers' block has the 1-GPU copy
            if tasks:
                result.append(Block(
                    f"{dtype.name} {size_label} ours, {where(places, gpus)}", tasks,
                    lambda dtype=dtype, devices=devices: ours_setup(cp, sharded, options, dtype, size, devices, groups),
                    lambda data: ours_teardown(cp, data)))
    return result


HOST_ELEMENTS = 1024


def host_blocks(cp, sharded, selections: list, options: Options, groups: dict) -> list[Block]:
    """Host time per call at HOST_ELEMENTS elements per GPU, float32: `selections` is a list
    of (case, implementation names); ours on every place count, the peers on one GPU."""
    dtype = np.dtype(np.float32)
    result = []
    label = f"{HOST_ELEMENTS} elements"

    def host_task(case, impl, maker, row):
        row.note = "host time per call" + ("; returns a host value, so it waits for the GPU"
                                           if case.algorithm == "reduce" else "")
        return Task(f"host time, {case.algorithm} {impl}", lambda data: measure_host(case, maker, data, row), row)

    tasks = [host_task(case, impl, case.peers[impl],
                       template(case, impl, dtype, HOST_ELEMENTS, 1, 1, label, timer="host"))
             for case, impls in selections for impl in impls
             if impl in case.peers and peer_library(impl) in options.peers]
    if tasks:
        result.append(Block("host time per call, peers", tasks,
                            lambda: peer_setup(cp, options, dtype, HOST_ELEMENTS),
                            lambda data: peer_teardown(cp, data)))
    for places in options.places:
        devices = place_devices(places, options.devices)
        gpus = len(set(devices))
        tasks = [host_task(case, impl, case.ours[impl],
                           template(case, impl, dtype, HOST_ELEMENTS * gpus, places, gpus, label, timer="host"))
                 for case, impls in selections for impl in impls if impl in case.ours]
        result.append(Block(f"host time per call, ours, {where(places, gpus)}", tasks,
                            lambda devices=devices: ours_setup(cp, sharded, options, dtype, HOST_ELEMENTS,
                                                               devices, groups),
                            lambda data: ours_teardown(cp, data)))
    return result


# ---- the copy limit ---------------------------------------------------------------------------

def _copy_peer(data: Data) -> Impl:
    cp = data.cp
    x, out = data.x[0], data.out[0]
    kind, pointer = cp.cuda.runtime.memcpyDeviceToDevice, data.stream.ptr
    return Impl(lambda: cp.cuda.runtime.memcpyAsync(out.data.ptr, x.data.ptr, x.nbytes, kind, pointer))


def _copy_ours(data: Data) -> Impl:
    """The same copy on every place's stream at once: the limit for several GPUs."""
    cp = data.cp
    kind = cp.cuda.runtime.memcpyDeviceToDevice
    copies = [(device, out.data.ptr, x.data.ptr, x.nbytes, stream)
              for (device, stream), x, out in zip(data.streams(), data.x, data.out)]

    def run():
        for device, destination, source, size, stream in copies:
            with cp.cuda.Device(device):
                cp.cuda.runtime.memcpyAsync(destination, source, size, kind, stream)

    return Impl(run)


COPY = Case("copy", 2, ours={"copy": _copy_ours}, peers={"copy": _copy_peer},
            check=lambda data, value: check_each_shard(data, lambda x, y: x, "copy"),
            note="device copy: the practical limit, read + write")


def cccl_impl(data: Data, build, result: Callable | None = None, **arguments) -> Impl:
    """A cuda.compute algorithm's call on the peers' stream: `build(temp_storage=None, ...)`
    gives the temporary storage's size, allocated once, outside the timed call."""
    scratch, stream = data.cp.empty(build(temp_storage=None, **arguments), data.cp.uint8), data.stream
    return Impl(lambda: build(temp_storage=scratch, stream=stream, **arguments), result=result)


def cuda_compute():
    """cuda.compute, imported at first use (its import loads numba and the CCCL C library)."""
    import cuda.compute

    return cuda.compute
