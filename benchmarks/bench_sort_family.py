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

import families
from families import Family, Spec, gathered, refill
from sweep import Impl, NotApplicable, assert_equal, cccl_impl, cuda_compute, shard_view

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
            assert_equal(cp, gathered(data, name), expected, name)
        return
    for name, actual in zip(reference, value if isinstance(value, tuple) else (value,)):
        assert_equal(cp, cp.asarray(actual), reference[name], name)


# ---- ours -----------------------------------------------------------------------------------

def _ours(data) -> Impl:
    import cuda_sharded_jit as sharded

    algorithm, arrays = data.context["algorithm"], data.arrays
    if algorithm == "sort_by_key":
        return Impl(lambda: sharded.sort_by_key(arrays["keys"], arrays["values"]),
                    prepare=lambda: refill(data, ("keys", "values")))
    if algorithm == "argsort":
        def argsort():
            if "indices" in arrays:
                arrays.pop("indices").free()
            arrays["indices"] = sharded.argsort(arrays["x"])
        return Impl(argsort)
    if algorithm == "sort_compare":
        return Impl(lambda: sharded.sort(arrays["x"], compare=_less), prepare=lambda: refill(data, ("x",)))
    if algorithm == "sort_key":
        return Impl(lambda: sharded.sort(arrays["x"], key=_key), prepare=lambda: refill(data, ("x",)))
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
        refill(data, ("x",))  # the task before left x sorted
        arrays["keys"] = sharded.transform(_key, arrays["x"])
        data.context["pristine"]["keys"] = [shard_view(data.cp, arrays["keys"], place).copy()
                                            for place in range(len(data.devices))]
    return Impl(lambda: sharded.sort_by_key(arrays["keys"], arrays["x"]), prepare=lambda: refill(data, ("keys", "x")))


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


def _peer_outputs(cp, algorithm: str, inputs: dict):
    """The peers' output buffers: sorted keys (values and torch's int64 indices for sort_by_key)."""
    first = next(iter(inputs.values()))
    outputs = {"out_keys": cp.empty_like(first)}
    tensors = {"out_keys": outputs["out_keys"]}
    if algorithm == "sort_by_key":
        outputs["out_values"] = cp.empty_like(inputs["values"])
        tensors["indices"] = cp.empty(first.size, cp.int64)
    return outputs, tensors


FAMILY = Family(
    specs={
        "sort_by_key": Spec(np.int32, 1 << 28, "keys per second; int32 keys + int32 values, in place (refilled "
                            "untimed)", {"cuda.compute": _cccl, "torch": _torch}, place_counts=None),
        "argsort": Spec(np.float32, 1 << 28, "elements per second; int64 indices of a stable sort",
                        {"cupy": _cupy, "torch": _torch}),
        "sort_compare": Spec(np.int64, 1 << 26, "elements per second; compare=lambda x, y: x < y",
                             {"cuda.compute": _cccl}),
        "sort_key": Spec(np.int64, 1 << 26, "elements per second; key=lambda x: x ^ 0x5555, in place", {},
                         extra=(("precomputed keys", "sort_by_key of precomputed keys", _ours_precomputed),)),
        "searchsorted": Spec(np.float32, 1 << 24, "queries per second into 2^28 sorted float32", {"cupy": _cupy}),
        "top_k": Spec(np.float32, 1 << 28, "elements per second; k = 1024, sorted", {"torch": _torch}),
    },
    inputs=_inputs, reference=_reference, ours=_ours, check=_check, peer_outputs=_peer_outputs)
ALGORITHMS = tuple(FAMILY.specs)


def blocks(cp, sharded, options, chosen, groups: dict):
    """Per algorithm: the peers on the first GPU, then ours on one place (sort_by_key also on
    every place count asked for), all on the same inputs."""
    return families.blocks(cp, sharded, options, chosen, groups, FAMILY)
