"""Sort: sharded.sort on 1, 2, 4 ... places vs cupy.sort, torch.sort and cuda.compute
radix_sort of the same keys on one GPU.

Sizes are the total number of keys, split evenly over the places (not per GPU): the targets
compare sorting the same 2^28 keys on one GPU and on several. Keys are random from a fixed
seed; the reference is cupy.sort of all of them on the first GPU. A sort overwrites its input,
so the input is refilled from a pristine copy before every call, outside the timed region
(cuda.compute and torch write to a separate output and need no refill).
"""

from __future__ import annotations

import numpy as np

from common import Block, log2_label, place_devices, where
from sweep import (Case, Data, Impl, assert_equal, cccl_impl, copy_to_device, cuda_compute, measure_task,
                   ours_teardown, peer_teardown, place_group, release_shared_after, shard_view, template,
                   use_peer_stream)


def random_keys(cp, size: int, dtype: np.dtype, seed: int):
    """Keys over (most of) the dtype's range, on the current device."""
    uniform = cp.random.RandomState(seed).random_sample(size, dtype=cp.float64)
    if dtype.kind == "f":
        return (uniform * 2.0 - 1.0).astype(dtype)
    bits = dtype.itemsize * 8
    if dtype.kind == "i":
        return ((uniform - 0.5) * 2.0 ** bits).astype(dtype)
    return (uniform * 2.0 ** bits).astype(dtype)


def two_place_input(cp, sharded, keys: int, devices=(0, 1), seed: int = 0):
    """`keys` random int32 keys in a ShardedArray split evenly over `devices`, and a refill()
    that puts the same keys back and leaves every device idle: the input of the scripts that
    time one sort after another of the same keys. Returns (group, array, pristine, refill),
    `pristine` holding each shard's keys on its device."""
    group = sharded.PlaceGroup.by_devices(list(devices))
    array = sharded.ShardedArray.allocate(group, keys, np.int32)
    pristine = []
    for place, device in enumerate(devices):
        with cp.cuda.Device(device):
            pristine.append(random_keys(cp, array.shard_sizes[place], np.dtype(np.int32), seed + place))

    def refill() -> None:
        group.sync()  # the previous sort's merges may still run on the places' streams
        for place, device in enumerate(devices):
            with cp.cuda.Device(device):
                shard_view(cp, array, place)[...] = pristine[place]
                cp.cuda.Device(device).synchronize()

    return group, array, pristine, refill


def _check(data, value) -> None:
    cp, reference = data.cp, data.context["reference"]
    if not data.is_ours:
        assert_equal(cp, cp.asarray(value), reference, "sorted keys")
        return
    for place, (offset, keys) in enumerate(zip(data.context["offsets"], data.x)):
        expected = copy_to_device(cp, reference[offset:offset + keys.size], data.devices[place])
        with cp.cuda.Device(data.devices[place]):
            assert_equal(cp, keys, expected, f"sorted keys, shard {place}")


def _ours(data) -> Impl:
    import cuda_sharded_jit as sharded

    cp, keys = data.cp, data.arrays["keys"]
    shards = list(zip(data.devices, data.x, data.context["pristine"]))

    def refill():
        # the previous call's merges may still run on the places' streams, which CuPy's
        # stream does not wait for: writing the input under them would corrupt the sort
        data.settle()
        for device, shard, pristine in shards:
            with cp.cuda.Device(device):
                cp.copyto(shard, pristine)
        data.settle()

    return Impl(lambda: sharded.sort(keys), prepare=refill)


def _cupy(data) -> Impl:
    work, keys, stream = data.x[0], data.context["keys"], data.stream

    def refill():
        data.cp.copyto(work, keys)
        stream.synchronize()

    return Impl(work.sort, prepare=refill, result=lambda: work)


def _torch(data) -> Impl:
    import torch

    keys, values, indices = data.tensors["keys"], data.tensors["out"], data.tensors["indices"]
    return Impl(lambda: torch.sort(keys, out=(values, indices)), result=lambda: data.out[0])


def _cccl(data) -> Impl:
    keys, out, cc = data.context["keys"], data.out[0], cuda_compute()
    build = cc.make_radix_sort(d_in_keys=keys, d_out_keys=out, d_in_values=None, d_out_values=None,
                               order=cc.SortOrder.ASCENDING)
    return cccl_impl(data, build, lambda: out, d_in_keys=keys, d_out_keys=out, d_in_values=None,
                     d_out_values=None, num_items=int(keys.size))


SORT = Case("sort", 0, ours={"ours": _ours}, peers={"cupy": _cupy, "torch": _torch, "cuda.compute": _cccl},
            check=_check, note="keys per second; total keys split over the places; in place (refilled untimed)")


def blocks(cp, sharded, options, size: int, dtypes: list, groups: dict) -> list[Block]:
    """Per dtype: the peers on the first GPU, then ours on each place count, all sorting the
    same `size` keys."""
    device = options.devices[0]
    reps = max(5, options.reps // 2)
    result = []
    for dtype in dtypes:
        shared = {}
        size_label = f"{log2_label(size)} keys"

        def sort_input(dtype=dtype, shared=shared) -> dict:
            """The pristine keys and their reference sort, on the first GPU, made once."""
            if not shared:
                with cp.cuda.Device(device):
                    keys = random_keys(cp, size, dtype, options.seed)
                    shared.update(keys=keys, reference=cp.sort(keys))
                    cp.cuda.Device(device).synchronize()
            return shared

        def peer_setup(dtype=dtype, sort_input=sort_input) -> Data:
            shared = sort_input()
            cp.cuda.Device(device).use()  # the peers' calls run on the current device
            stream = cp.cuda.Stream(non_blocking=True)
            work, out = shared["keys"].copy(), cp.empty_like(shared["keys"])
            # torch.sort's indices (int64), made as CuPy memory like everything else here
            indices = cp.empty(size, cp.int64)
            cp.cuda.Device(device).synchronize()
            data = Data(cp, dtype, [device], [work], out=[out], stream=stream, context=dict(shared))
            use_peer_stream(cp, options, data, {"keys": shared["keys"], "out": out, "indices": indices})
            return data

        def ours_setup(devices, dtype=dtype, sort_input=sort_input) -> Data:
            shared = sort_input()
            group = place_group(sharded, devices, groups)
            keys = sharded.ShardedArray.allocate(group, size, dtype)
            views = [shard_view(cp, keys, place) for place in range(len(devices))]
            pristine = [copy_to_device(cp, shared["keys"][offset:offset + view.size], place_device)
                        for offset, view, place_device in zip(keys.shard_offsets, views, devices)]
            return Data(cp, dtype, list(devices), views, gpus=len(set(devices)), group=group,
                        arrays={"keys": keys},
                        context=dict(shared, pristine=pristine, offsets=keys.shard_offsets))

        dtype_blocks = []
        tasks = [measure_task(SORT, impl, maker, template(SORT, impl, dtype, size, 1, 1, size_label), reps,
                              options.warmup)
                 for impl, maker in SORT.peers.items() if impl in options.peers]
        if tasks:
            dtype_blocks.append(Block(f"sort {dtype.name} {size_label} peers", tasks, peer_setup,
                                      lambda data: peer_teardown(cp, data)))
        for places in options.places:
            devices = place_devices(places, options.devices)
            gpus = len(set(devices))
            row = template(SORT, "ours", dtype, size, places, gpus, size_label)
            dtype_blocks.append(Block(
                f"sort {dtype.name} {size_label} ours, {where(places, gpus)}",
                [measure_task(SORT, "ours", _ours, row, reps, options.warmup)],
                lambda devices=devices, ours_setup=ours_setup: ours_setup(devices),
                lambda data: ours_teardown(cp, data)))
        if dtype_blocks:
            # the last block of this dtype lets the pristine keys and the reference go
            release_shared_after(dtype_blocks[-1], cp, device, shared)
        result += dtype_blocks
    return result
