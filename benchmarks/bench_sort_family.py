"""The sorts with user operators and the searches beside them, each at its target's size,
against the peers that have the same call on one GPU:

  sort_by_key   2^28 int32 keys + int32 values: cuda.compute radix_sort with values,
                torch.sort(stable=True) returning indices; ours also on 2 places
  argsort       2^28 float32: cupy.argsort, torch.argsort(stable=True)
  sort_compare  2^26 int64, compare=lambda x, y: x < y: cuda.compute merge_sort, same op
  sort_key      2^26 int64, key=lambda x: x ^ 0x5555: ours, against ours sort_by_key of the
                same keys computed beforehand (variant "precomputed keys")
  searchsorted  2^24 random float32 queries into 2^28 sorted float32: cupy.searchsorted
  top_k         k = 1024 of 2^28 float32: torch.topk(sorted=True)

Sorts in place are refilled from a pristine copy before every call, outside the timed
region. Every result is checked once against CuPy (or torch) before it is timed.
"""

from __future__ import annotations

import numpy as np

from common import Block, log2_label, place_devices, where
from sweep import (Case, Data, Impl, NotApplicable, assert_equal, cccl_impl, copy_to_device, cuda_compute,
                   measure_task, ours_teardown, peer_teardown, place_group, shard_view, template, use_peer_stream)

TOP_K = 1024
KEY_MASK = 0x5555  # sort_key's key: an order that is neither the elements' nor its reverse


def _less(x, y):
    return x < y


def _key(x):
    return x ^ KEY_MASK


# ---- inputs (made once per algorithm on the first GPU, shared by every implementation) ----

def _inputs(cp, algorithm: str, seed: int) -> dict:
    state = cp.random.RandomState(seed)
    if algorithm == "sort_by_key":
        n = 1 << 28
        keys = state.randint(-2 ** 31, 2 ** 31 - 1, n, dtype=cp.int64).astype(cp.int32)
        return {"keys": keys, "values": cp.arange(n, dtype=cp.int32)}
    if algorithm == "argsort":
        return {"x": state.random_sample(1 << 28, dtype=cp.float32)}
    if algorithm in ("sort_compare", "sort_key"):
        return {"x": state.randint(-2 ** 62, 2 ** 62, 1 << 26, dtype=cp.int64)}
    if algorithm == "searchsorted":
        return {"sorted": cp.sort(state.random_sample(1 << 28, dtype=cp.float32)),
                "queries": state.random_sample(1 << 24, dtype=cp.float32)}
    if algorithm == "top_k":
        return {"x": state.random_sample(1 << 28, dtype=cp.float32)}
    raise ValueError(algorithm)


def _reference(cp, algorithm: str, inputs: dict) -> dict:
    if algorithm == "sort_by_key":
        order = cp.argsort(inputs["keys"])  # CuPy's argsort is stable
        return {"keys": inputs["keys"][order], "values": inputs["values"][order]}
    if algorithm == "argsort":
        return {"indices": cp.argsort(inputs["x"])}
    if algorithm == "sort_compare":
        return {"x": cp.sort(inputs["x"])}
    if algorithm == "sort_key":
        x = inputs["x"]
        return {"x": x[cp.argsort(x ^ KEY_MASK)]}
    if algorithm == "searchsorted":
        return {"positions": cp.searchsorted(inputs["sorted"], inputs["queries"])}
    if algorithm == "top_k":
        order = cp.argsort(-inputs["x"])
        return {"values": inputs["x"][order[:TOP_K]], "indices": order[:TOP_K]}
    raise ValueError(algorithm)


# ---- checks ---------------------------------------------------------------------------------

def _gathered(data, name: str):
    """A ShardedArray's shards (ours) concatenated on the first GPU."""
    cp = data.cp
    array = data.arrays[name]
    with cp.cuda.Device(data.devices[0]):
        return cp.concatenate([copy_to_device(cp, shard_view(cp, array, place), data.devices[0])
                               for place in range(len(data.devices))])


def _check(data, value) -> None:
    cp, reference, algorithm = data.cp, data.context["reference"], data.context["algorithm"]
    if algorithm == "top_k":
        values, indices = value
        assert_equal(cp, cp.asarray(values), reference["values"], "top_k values")
        if data.is_ours:  # ties (many: 2^28 draws of float32) go to the lower index; torch's in any order
            assert_equal(cp, cp.asarray(indices), reference["indices"], "top_k indices")
        return
    if algorithm == "searchsorted" and not data.is_ours:
        assert_equal(cp, cp.asarray(value), reference["positions"], "positions")
        return
    if data.is_ours:
        for name, expected in reference.items():
            assert_equal(cp, _gathered(data, name), expected, name)
        return
    for name, actual in zip(reference, value if isinstance(value, tuple) else (value,)):
        assert_equal(cp, cp.asarray(actual), reference[name], name)


# ---- ours -----------------------------------------------------------------------------------

def _refill(data, names) -> None:
    """The in-place inputs back to their pristine values, the devices idle after."""
    data.settle()
    cp = data.cp
    for name in names:
        array = data.arrays[name]
        for place, device in enumerate(data.devices):
            with cp.cuda.Device(device):
                cp.copyto(shard_view(cp, array, place), data.context["pristine"][name][place])
    data.settle()


def _ours(data) -> Impl:
    import cuda_sharded_jit as sharded

    algorithm, arrays = data.context["algorithm"], data.arrays
    if algorithm == "sort_by_key":
        return Impl(lambda: sharded.sort_by_key(arrays["keys"], arrays["values"]),
                    prepare=lambda: _refill(data, ("keys", "values")))
    if algorithm == "argsort":
        def argsort():
            if "indices" in arrays:
                arrays.pop("indices").free()
            arrays["indices"] = sharded.argsort(arrays["x"])
        return Impl(argsort)
    if algorithm == "sort_compare":
        return Impl(lambda: sharded.sort(arrays["x"], compare=_less), prepare=lambda: _refill(data, ("x",)))
    if algorithm == "sort_key":
        return Impl(lambda: sharded.sort(arrays["x"], key=_key), prepare=lambda: _refill(data, ("x",)))
    if algorithm == "searchsorted":
        def search():
            if "positions" in arrays:
                arrays.pop("positions").free()
            arrays["positions"] = sharded.searchsorted(arrays["sorted"], arrays["queries"])
        return Impl(search)
    if algorithm == "top_k":
        return Impl(lambda: sharded.top_k(arrays["x"], TOP_K))
    raise ValueError(algorithm)


def _ours_precomputed(data) -> Impl:
    """sort_key's reference: sort_by_key of keys computed before the timed call."""
    import cuda_sharded_jit as sharded

    if data.context["algorithm"] != "sort_key":
        raise NotApplicable
    arrays = data.arrays
    if "keys" not in arrays:
        _refill(data, ("x",))  # the task before left x sorted
        arrays["keys"] = sharded.transform(_key, arrays["x"])
        data.context["pristine"]["keys"] = [shard_view(data.cp, arrays["keys"], place).copy()
                                            for place in range(len(data.devices))]
    return Impl(lambda: sharded.sort_by_key(arrays["keys"], arrays["x"]), prepare=lambda: _refill(data, ("keys", "x")))


# ---- peers ----------------------------------------------------------------------------------

def _cupy(data) -> Impl:
    cp, inputs, algorithm = data.cp, data.context["inputs"], data.context["algorithm"]
    if algorithm == "argsort":
        return Impl(lambda: cp.argsort(inputs["x"]))
    if algorithm == "searchsorted":
        return Impl(lambda: cp.searchsorted(inputs["sorted"], inputs["queries"]))
    raise NotApplicable


def _torch(data) -> Impl:
    import torch

    algorithm, tensors = data.context["algorithm"], data.tensors
    if algorithm == "sort_by_key":
        keys, out, indices = tensors["keys"], tensors["out_keys"], tensors["indices"]
        # the sorted keys and the int64 indices of a stable sort: what sort_by_key moves
        return Impl(lambda: torch.sort(keys, stable=True, out=(out, indices)),
                    result=lambda: (data.context["out_keys"], data.context["inputs"]["values"][
                        data.cp.asarray(indices)]))
    if algorithm == "argsort":
        x = tensors["x"]
        return Impl(lambda: torch.argsort(x, stable=True))
    if algorithm == "top_k":
        x = tensors["x"]
        return Impl(lambda: torch.topk(x, TOP_K, sorted=True))
    raise NotApplicable


def _cccl(data) -> Impl:
    cc, algorithm, inputs = cuda_compute(), data.context["algorithm"], data.context["inputs"]
    if algorithm == "sort_by_key":
        keys, values = inputs["keys"], inputs["values"]
        out_keys, out_values = data.context["out_keys"], data.context["out_values"]
        build = cc.make_radix_sort(d_in_keys=keys, d_out_keys=out_keys, d_in_values=values, d_out_values=out_values,
                                   order=cc.SortOrder.ASCENDING)
        return cccl_impl(data, build, lambda: (out_keys, out_values), d_in_keys=keys, d_out_keys=out_keys,
                         d_in_values=values, d_out_values=out_values, num_items=int(keys.size))
    if algorithm == "sort_compare":
        x, out = inputs["x"], data.context["out_keys"]
        build = cc.make_merge_sort(d_in_keys=x, d_in_values=None, d_out_keys=out, d_out_values=None, op=_less)
        return cccl_impl(data, build, lambda: out, d_in_keys=x, d_in_values=None, d_out_keys=out, d_out_values=None,
                         num_items=int(x.size), op=_less)
    raise NotApplicable


# algorithm -> (dtype, elements counted, note, peers)
SPECS = {
    "sort_by_key": (np.int32, 1 << 28, "keys per second; int32 keys + int32 values, in place (refilled untimed)",
                    {"cuda.compute": _cccl, "torch": _torch}),
    "argsort": (np.float32, 1 << 28, "elements per second; int64 indices of a stable sort",
                {"cupy": _cupy, "torch": _torch}),
    "sort_compare": (np.int64, 1 << 26, "elements per second; compare=lambda x, y: x < y", {"cuda.compute": _cccl}),
    "sort_key": (np.int64, 1 << 26, "elements per second; key=lambda x: x ^ 0x5555, in place", {}),
    "searchsorted": (np.float32, 1 << 24, "queries per second into 2^28 sorted float32", {"cupy": _cupy}),
    "top_k": (np.float32, 1 << 28, "elements per second; k = 1024, sorted", {"torch": _torch}),
}
ALGORITHMS = tuple(SPECS)


def blocks(cp, sharded, options, chosen, groups: dict) -> list[Block]:
    """Per algorithm: the peers on the first GPU, then ours on one place (sort_by_key also on
    every place count asked for), all on the same inputs."""
    device = options.devices[0]
    result = []
    for algorithm in ALGORITHMS:
        if algorithm not in chosen:
            continue
        dtype, elements, note, peers = SPECS[algorithm]
        dtype = np.dtype(dtype)
        case = Case(algorithm, 0, ours={"ours": _ours}, peers=peers, check=_check, note=note)
        shared = {}
        label = f"{log2_label(elements)}"

        def inputs(algorithm=algorithm, shared=shared) -> dict:
            if not shared:
                with cp.cuda.Device(device):
                    shared["inputs"] = _inputs(cp, algorithm, options.seed)
                    shared["reference"] = _reference(cp, algorithm, shared["inputs"])
                    cp.cuda.Device(device).synchronize()
            return shared

        def peers_setup(algorithm=algorithm, inputs=inputs, dtype=dtype) -> Data:
            made = inputs()
            cp.cuda.Device(device).use()
            stream = cp.cuda.Stream(non_blocking=True)
            context = dict(made, algorithm=algorithm)
            first = next(iter(made["inputs"].values()))
            context["out_keys"] = cp.empty_like(first)
            if algorithm == "sort_by_key":
                context["out_values"] = cp.empty_like(made["inputs"]["values"])
            tensors = dict(made["inputs"], out_keys=context["out_keys"])
            if algorithm == "sort_by_key":
                tensors["indices"] = cp.empty(first.size, cp.int64)
            cp.cuda.Device(device).synchronize()
            data = Data(cp, dtype, [device], [first], stream=stream, context=context)
            use_peer_stream(cp, options, data, tensors)
            return data

        def ours_setup(devices, algorithm=algorithm, inputs=inputs, dtype=dtype) -> Data:
            made = inputs()
            group = place_group(sharded, devices, groups)
            arrays, pristine = {}, {}
            for name, source in made["inputs"].items():
                array = sharded.ShardedArray.allocate(group, int(source.size), source.dtype)
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
        tasks = [measure_task(case, impl, maker, template(case, impl, dtype, elements, 1, 1, label), reps,
                              options.warmup)
                 for impl, maker in peers.items() if impl in options.peers]
        if tasks:
            result.append(Block(f"{algorithm} {label} peers", tasks, peers_setup,
                                lambda data: peer_teardown(cp, data)))
        place_counts = options.places if algorithm == "sort_by_key" else [1]
        for places in place_counts:
            devices = place_devices(places, options.devices)
            gpus = len(set(devices))
            ours = [measure_task(case, "ours", _ours, template(case, "ours", dtype, elements, places, gpus, label),
                                 reps, options.warmup)]
            if algorithm == "sort_key":
                row = template(case, "ours", dtype, elements, places, gpus, label)
                row.variant = "precomputed keys"
                row.name += " sort_by_key of precomputed keys"
                ours.append(measure_task(case, "ours", _ours_precomputed, row, reps, options.warmup))
            result.append(Block(f"{algorithm} {label} ours, {where(places, gpus)}", ours,
                                lambda devices=devices, ours_setup=ours_setup: ours_setup(devices),
                                lambda data: ours_teardown(cp, data)))
        last = result[-1]

        def release(data, teardown=last.teardown, shared=shared):
            try:
                teardown(data)
            finally:
                shared.clear()
                with cp.cuda.Device(device):
                    cp.get_default_memory_pool().free_all_blocks()

        last.teardown = release
    return result
