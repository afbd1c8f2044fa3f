"""What the benchmark files of algorithm families (bench_sort_family.py, bench_selection.py)
share: each algorithm measured at its target's own size, its inputs made once on the first
GPU and used by every implementation, the peers in one block on that GPU, ours on the place
counts the algorithm is measured at, every result checked against one reference before it
is timed.

A family gives, per algorithm, a Spec, and four functions: inputs(cp, algorithm, seed) and
reference(cp, algorithm, inputs) (dicts of CuPy arrays), ours(data) (an Impl over
data.arrays, ShardedArrays named as the inputs) and check(data, value); peer_outputs(cp,
algorithm, inputs) gives the peers' output buffers (context entries, and the CuPy arrays
torch should see as tensors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from common import Block, log2_label, place_devices, where
from sweep import (Case, Data, copy_to_device, measure_task, ours_teardown, peer_teardown, place_group,
                   release_shared_after, shard_view, template, use_peer_stream)


@dataclass
class Spec:
    """One algorithm of a family: its dtype and element count (the target's size), the note
    of its rows, the peers (impl -> maker), the place counts ours is measured on (None: every
    count asked for), bytes moved per row where a target counts bandwidth (impl -> bytes;
    "ours" for ours), more rows of ours on the same data: (variant, name suffix, maker), and
    ours' shard sizes per input (name -> sizes; default an even split)."""

    dtype: object
    elements: int
    note: str
    peers: dict
    place_counts: tuple | None = (1,)
    bytes_moved: dict = field(default_factory=dict)
    extra: tuple = ()
    sizes: dict = field(default_factory=dict)


@dataclass
class Family:
    specs: dict
    inputs: Callable
    reference: Callable
    ours: Callable
    check: Callable
    peer_outputs: Callable = lambda cp, algorithm, inputs: ({}, {})


def refill(data, names) -> None:
    """Ours: the arrays `names` back to their pristine values (an in-place call's input), the
    devices idle after."""
    data.settle()
    cp = data.cp
    for name in names:
        array = data.arrays[name]
        for place, device in enumerate(data.devices):
            with cp.cuda.Device(device):
                cp.copyto(shard_view(cp, array, place), data.context["pristine"][name][place])
    data.settle()


def gathered(data, name: str):
    """Ours: a ShardedArray's shards concatenated on the first GPU."""
    cp = data.cp
    array = data.arrays[name]
    with cp.cuda.Device(data.devices[0]):
        return cp.concatenate([copy_to_device(cp, shard_view(cp, array, place), data.devices[0])
                               for place in range(len(array.shard_sizes))])


def _row(case: Case, spec: Spec, impl: str, dtype, places: int, gpus: int, label: str):
    row = template(case, impl, dtype, spec.elements, places, gpus, label)
    if impl in spec.bytes_moved:
        row.bytes_moved = int(spec.bytes_moved[impl])
    return row


def blocks(cp, sharded, options, chosen, groups: dict, family: Family) -> list[Block]:
    """Per algorithm of `family` in `chosen`: the peers' block, then ours on each place count."""
    device = options.devices[0]
    result = []
    for algorithm, spec in family.specs.items():
        if algorithm not in chosen:
            continue
        dtype = np.dtype(spec.dtype)
        case = Case(algorithm, 0, ours={"ours": family.ours}, peers=spec.peers, check=family.check, note=spec.note)
        shared = {}
        label = log2_label(spec.elements)

        def inputs(algorithm=algorithm, shared=shared) -> dict:
            if not shared:
                with cp.cuda.Device(device):
                    shared["inputs"] = family.inputs(cp, algorithm, options.seed)
                    shared["reference"] = family.reference(cp, algorithm, shared["inputs"])
                    cp.cuda.Device(device).synchronize()
            return shared

        def peers_setup(algorithm=algorithm, inputs=inputs, dtype=dtype) -> Data:
            made = inputs()
            cp.cuda.Device(device).use()
            stream = cp.cuda.Stream(non_blocking=True)
            outputs, tensors = family.peer_outputs(cp, algorithm, made["inputs"])
            context = dict(made, algorithm=algorithm, **outputs)
            first = next(iter(made["inputs"].values()))
            cp.cuda.Device(device).synchronize()
            data = Data(cp, dtype, [device], [first], stream=stream, context=context)
            use_peer_stream(cp, options, data, dict(made["inputs"], **tensors))
            return data

        def ours_setup(devices, algorithm=algorithm, inputs=inputs, dtype=dtype, spec=spec) -> Data:
            made = inputs()
            group = place_group(sharded, devices, groups)
            arrays, pristine = {}, {}
            for name, source in made["inputs"].items():
                sizes = spec.sizes.get(name, int(source.size))
                array = sharded.ShardedArray.allocate(group, sizes, source.dtype)
                arrays[name] = array
                pristine[name] = [copy_to_device(cp, source[offset:offset + size], place_device)
                                  for offset, size, place_device in zip(array.shard_offsets, array.shard_sizes,
                                                                         devices)]
                for place, place_device in enumerate(devices):
                    with cp.cuda.Device(place_device):
                        cp.copyto(shard_view(cp, array, place), pristine[name][place])
            data = Data(cp, dtype, list(devices), [], gpus=len(set(devices)), group=group, arrays=arrays,
                        context=dict(made, algorithm=algorithm, pristine=pristine))
            data.settle()
            return data

        reps = max(5, options.reps // 2)
        tasks = [measure_task(case, impl, maker, _row(case, spec, impl, dtype, 1, 1, label), reps, options.warmup)
                 for impl, maker in spec.peers.items() if impl in options.peers or impl == "copy"]
        if tasks:
            result.append(Block(f"{algorithm} {label} peers", tasks, peers_setup,
                                lambda data: peer_teardown(cp, data)))
        for places in (options.places if spec.place_counts is None else spec.place_counts):
            devices = place_devices(places, options.devices)
            gpus = len(set(devices))
            ours = [measure_task(case, "ours", family.ours, _row(case, spec, "ours", dtype, places, gpus, label),
                                 reps, options.warmup)]
            for variant, suffix, maker in spec.extra:
                row = _row(case, spec, "ours", dtype, places, gpus, label)
                row.variant = variant
                row.name += f" {suffix}"
                ours.append(measure_task(case, "ours", maker, row, reps, options.warmup))
            result.append(Block(f"{algorithm} {label} ours, {where(places, gpus)}", ours,
                                lambda devices=devices, ours_setup=ours_setup: ours_setup(devices),
                                lambda data: ours_teardown(cp, data)))
        release_shared_after(result[-1], cp, device, shared)
    return result
