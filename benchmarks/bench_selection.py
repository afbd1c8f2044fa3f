"""Selections, segments, runs of equal keys and resharding, each at its target's size, against
the peers that have the same call on one GPU and the device copy of the same bytes:

  select            2^28 float32, half kept (x < 0.5): cuda.compute select; the copy of the
                    bytes read and written (n read, n / 2 written); ours' two passes, the
                    single pass's fallback (variant "two passes")
  segmented_reduce  2^28 float32 in 2^16 equal segments, user add: cuda.compute
                    segmented_reduce; ours' reduce of the same array (variant "reduce").
                    Ours takes the offsets as cuda.compute does, on the device (an int64
                    ShardedArray); variant "host offsets" passes the same numpy array
  unique_by_key     2^28 sorted int32 keys (runs of ~16) + int32 values: cuda.compute
                    unique_by_key
  reduce_by_key     2^28 int32 keys in runs of 64 + int32 values, user add: torch
                    unique_consecutive + index_add_; the copy of the keys and values;
                    variant "one run": every key equal (the look-back far behind)
  scan_by_key       the same keys and values, inclusive_scan_by_key: the copy of the keys,
                    values and result; variant "one run" as reduce_by_key's
  resharded         2^28 float32 on two places (shards of 1/4 and 3/4) to an even split: the
                    copy of the array

Every result is checked once against CuPy before it is timed.
"""

from __future__ import annotations

import numpy as np

import families
from families import Family, Spec, gathered
from sweep import Impl, NotApplicable, assert_close, assert_equal, cccl_impl, cuda_compute

N = 1 << 28
SEGMENT = 1 << 12  # 2^16 segments of 2^28
RUN = 64


def _half(x):
    return x < np.float32(0.5)


def _add(a, b):
    return a + b


def _equal(a, b):
    return a == b


# ---- inputs and references (on the first GPU) -------------------------------------------------

def _inputs(cp, algorithm: str, seed: int) -> dict:
    state = cp.random.RandomState(seed)
    if algorithm in ("select", "segmented_reduce", "resharded"):
        return {"x": state.random_sample(N, dtype=cp.float32)}
    if algorithm == "unique_by_key":
        keys = cp.sort(state.randint(0, N // 16, N, dtype=cp.int64).astype(cp.int32))
        return {"keys": keys, "values": cp.arange(N, dtype=cp.int32)}
    if algorithm in ("reduce_by_key", "scan_by_key"):
        return {"keys": (cp.arange(N, dtype=cp.int64) // RUN).astype(cp.int32),
                "values": state.randint(0, 100, N, dtype=cp.int64).astype(cp.int32)}
    raise ValueError(algorithm)


def _reference(cp, algorithm: str, inputs: dict) -> dict:
    if algorithm == "select":
        x = inputs["x"]
        return {"kept": x[x < 0.5]}
    if algorithm == "segmented_reduce":
        return {"sums": inputs["x"].reshape(-1, SEGMENT).astype(cp.float64).sum(axis=1)}
    if algorithm == "unique_by_key":
        keys = inputs["keys"]
        heads = cp.concatenate([cp.ones(1, cp.bool_), keys[1:] != keys[:-1]])
        return {"unique_keys": keys[heads], "unique_values": inputs["values"][heads]}
    if algorithm == "reduce_by_key":
        return {"unique_keys": inputs["keys"][::RUN],
                "reduced": inputs["values"].reshape(-1, RUN).sum(axis=1, dtype=cp.int32)}
    if algorithm == "scan_by_key":
        return {"scanned": inputs["values"].reshape(-1, RUN).cumsum(axis=1, dtype=cp.int32).reshape(-1)}
    if algorithm == "resharded":
        return {"moved": inputs["x"]}
    raise ValueError(algorithm)


def _check(data, value) -> None:
    cp, reference, algorithm = data.cp, data.context["reference"], data.context["algorithm"]
    if value is None:  # the device copy: nothing to check but its bytes
        return
    close = algorithm == "segmented_reduce"
    for name, expected in reference.items():
        if data.is_ours:
            actual = gathered(data, name)
        else:
            actual = cp.asarray(value[name] if isinstance(value, dict) else value)
        if close:
            assert_close(cp, actual.astype(cp.float64), expected, name, rtol=1e-4, atol=1e-3)
        else:
            assert_equal(cp, actual, expected, name)
        if not data.is_ours:
            return  # the peers give the first output only


# ---- ours -------------------------------------------------------------------------------------

def _keep(arrays: dict, **results) -> None:
    """Replace the previous call's results (freed) with this call's."""
    for name, array in results.items():
        if name in arrays:
            arrays.pop(name).free()
        arrays[name] = array


def _ours(data) -> Impl:
    import cuda_sharded_jit as sharded

    algorithm, arrays = data.context["algorithm"], data.arrays
    if algorithm == "select":
        return Impl(lambda: _keep(arrays, kept=sharded.select(arrays["x"], _half)))
    if algorithm == "segmented_reduce":  # the offsets on the device, made once, as the peer's
        offsets = sharded.ShardedArray.from_numpy(arrays["x"].group, _segment_offsets())
        return Impl(lambda: _keep(arrays, sums=sharded.segmented_reduce(arrays["x"], offsets, _add,
                                                                         np.float32(0))))
    if algorithm == "unique_by_key":
        def unique():
            keys, values = sharded.unique_by_key(arrays["keys"], arrays["values"])
            _keep(arrays, unique_keys=keys, unique_values=values)
        return Impl(unique)
    if algorithm == "reduce_by_key":
        def reduce():
            keys, reduced = sharded.reduce_by_key(arrays["keys"], arrays["values"], _add)
            _keep(arrays, unique_keys=keys, reduced=reduced)
        return Impl(reduce)
    if algorithm == "scan_by_key":
        return Impl(lambda: _keep(arrays, scanned=sharded.inclusive_scan_by_key(arrays["keys"], arrays["values"],
                                                                                 _add)))
    if algorithm == "resharded":
        return Impl(lambda: _keep(arrays, moved=arrays["x"].resharded()))
    raise ValueError(algorithm)


def _segment_offsets() -> np.ndarray:
    return np.arange(0, N + 1, SEGMENT, dtype=np.int64)


def _ours_host_offsets(data) -> Impl:
    """segmented_reduce with the same offsets as a numpy array (the host route)."""
    import cuda_sharded_jit as sharded

    if data.context["algorithm"] != "segmented_reduce":
        raise NotApplicable
    arrays, offsets = data.arrays, _segment_offsets()
    return Impl(lambda: _keep(arrays, sums=sharded.segmented_reduce(arrays["x"], offsets, _add, np.float32(0))))


def _ours_reduce(data) -> Impl:
    """segmented_reduce's second reference: our reduce of the same array (its bandwidth)."""
    import cuda_sharded_jit as sharded

    if data.context["algorithm"] != "segmented_reduce":
        raise NotApplicable
    x = data.arrays["x"]
    return Impl(lambda: sharded.reduce(x, _add, np.float32(0)), result=lambda: None)  # checked by its own tests


def _ours_two_passes(data) -> Impl:
    """select's A/B row: the two passes the single pass falls back to (the engine's internal
    switch, set for the call only)."""
    import cuda_sharded_jit as sharded
    from cuda_sharded_jit.algorithms import select as engine

    if data.context["algorithm"] != "select":
        raise NotApplicable
    arrays = data.arrays

    def two_passes():
        engine._SINGLE_PASS = False
        try:
            _keep(arrays, kept=sharded.select(arrays["x"], _half))
        finally:
            engine._SINGLE_PASS = True
    return Impl(two_passes)


def _ours_one_run(data) -> Impl:
    """reduce_by_key's and the scan by key's second row: every key equal, one run over all N
    elements, so no tile after the first holds a run head and each look-back reaches far back
    (the slow case the performance docs describe). Checked against CuPy's int32 sum and
    cumsum of the same values (both wrap in int32, as ours does)."""
    import cuda_sharded_jit as sharded

    algorithm, arrays, cp = data.context["algorithm"], data.arrays, data.cp
    if algorithm not in ("reduce_by_key", "scan_by_key"):
        raise NotApplicable
    values = arrays["values"]
    if "one_run" not in arrays:  # freed with the block's other arrays
        arrays["one_run"] = sharded.ShardedArray.from_numpy(values.group, np.zeros(N, np.int32),
                                                             sizes=list(values.shard_sizes))
    keys, source = arrays["one_run"], data.context["inputs"]["values"]
    if algorithm == "reduce_by_key":
        def run():
            unique_keys, reduced = sharded.reduce_by_key(keys, values, _add)
            _keep(arrays, one_run_keys=unique_keys, one_run_sums=reduced)

        def result():
            with cp.cuda.Device(data.devices[0]):
                assert_equal(cp, gathered(data, "one_run_keys"), cp.zeros(1, cp.int32), "unique_keys (one run)")
                assert_equal(cp, gathered(data, "one_run_sums"), source.sum(dtype=cp.int32).reshape(1),
                             "reduced (one run)")
            return None  # checked here: the family's check compares with the runs of 64
        return Impl(run, result=result)

    def scan():
        _keep(arrays, one_run_scan=sharded.inclusive_scan_by_key(keys, values, _add))

    def scanned():
        with cp.cuda.Device(data.devices[0]):
            assert_equal(cp, gathered(data, "one_run_scan"), cp.cumsum(source, dtype=cp.int32), "scanned (one run)")
        return None
    return Impl(scan, result=scanned)


# ---- peers ------------------------------------------------------------------------------------

def _copy(data) -> Impl:
    """The device copy of the bytes the algorithm reads and writes (its row counts them)."""
    cp = data.cp
    source, target = data.context["copy_source"], data.context["copy_target"]
    return Impl(lambda: cp.copyto(target, source), result=lambda: None)


def _cccl(data) -> Impl:
    cc, algorithm, inputs, context = cuda_compute(), data.context["algorithm"], data.context["inputs"], data.context
    if algorithm == "select":
        x, out, count = inputs["x"], context["out"], context["count"]
        build = cc.make_select(d_in=x, d_out=out, d_num_selected_out=count, cond=_half)
        return cccl_impl(data, build, lambda: out[:int(count.get()[0])], d_in=x, d_out=out,
                         d_num_selected_out=count, cond=_half, num_items=N)
    if algorithm == "segmented_reduce":
        x, out = inputs["x"], context["out"]
        starts, ends = context["starts"], context["ends"]
        init = np.zeros(1, np.float32)
        build = cc.make_segmented_reduce(d_in=x, d_out=out, start_offsets_in=starts, end_offsets_in=ends, op=_add,
                                         h_init=init)
        return cccl_impl(data, build, lambda: out, d_in=x, d_out=out, num_segments=int(out.size),
                         start_offsets_in=starts, end_offsets_in=ends, op=_add, h_init=init)
    if algorithm == "unique_by_key":
        keys, values = inputs["keys"], inputs["values"]
        out_keys, out_values, count = context["out"], context["out_values"], context["count"]
        build = cc.make_unique_by_key(d_in_keys=keys, d_in_items=values, d_out_keys=out_keys, d_out_items=out_values,
                                      d_out_num_selected=count, op=_equal)
        return cccl_impl(data, build, lambda: out_keys[:int(count.get()[0])], d_in_keys=keys, d_in_items=values,
                         d_out_keys=out_keys, d_out_items=out_values, d_out_num_selected=count, op=_equal,
                         num_items=N)
    raise NotApplicable


def _torch(data) -> Impl:
    import torch

    if data.context["algorithm"] != "reduce_by_key":
        raise NotApplicable
    keys, values = data.tensors["keys"], data.tensors["values"]

    def reduce():
        unique_keys, inverse = torch.unique_consecutive(keys, return_inverse=True)
        return unique_keys, torch.zeros(unique_keys.numel(), dtype=values.dtype, device=values.device).index_add_(
            0, inverse, values)

    return Impl(reduce, result=lambda: None)


def _peer_outputs(cp, algorithm: str, inputs: dict):
    """The peers' output buffers, and the copy's source and target of the algorithm's bytes."""
    outputs = {}
    if algorithm == "select":
        x = inputs["x"]
        outputs.update(out=cp.empty_like(x), count=cp.zeros(1, cp.int64),
                       copy_source=x[: N * 3 // 4], copy_target=cp.empty(N * 3 // 4, cp.float32))
    elif algorithm == "segmented_reduce":
        offsets = cp.arange(0, N + 1, SEGMENT, dtype=cp.int64)
        outputs.update(out=cp.empty(N // SEGMENT, cp.float32), starts=offsets[:-1], ends=offsets[1:])
    elif algorithm == "unique_by_key":
        outputs.update(out=cp.empty_like(inputs["keys"]), out_values=cp.empty_like(inputs["values"]),
                       count=cp.zeros(1, cp.int64))
    elif algorithm in ("reduce_by_key", "scan_by_key", "resharded"):
        # a copy that reads and writes as many bytes as the algorithm's row counts: half of
        # them copied (reduce_by_key: keys and values read; the scan: a result written too)
        source = cp.empty(_BYTES[algorithm] // 16, cp.int64)
        outputs.update(copy_source=source, copy_target=cp.empty_like(source))
    return outputs, {}


_BYTES = {"select": 6 * N, "segmented_reduce": 4 * N, "reduce_by_key": 8 * N, "scan_by_key": 12 * N,
          "resharded": 8 * N}  # read + written by the algorithm, as its target counts them

FAMILY = Family(
    specs={
        "select": Spec(np.float32, N, "elements per second; half kept; bytes: n read, n / 2 written",
                       {"cuda.compute": _cccl, "copy": _copy},
                       bytes_moved=dict.fromkeys(("ours", "cuda.compute", "copy"), _BYTES["select"]),
                       extra=(("two passes", "two passes (the fallback)", _ours_two_passes),)),
        "segmented_reduce": Spec(np.float32, N, "elements per second; 2^16 equal segments, user add",
                                 {"cuda.compute": _cccl},
                                 bytes_moved=dict.fromkeys(("ours", "cuda.compute"), _BYTES["segmented_reduce"]),
                                 extra=(("reduce", "reduce of the same array", _ours_reduce),
                                        ("host offsets", "host offsets", _ours_host_offsets))),
        "unique_by_key": Spec(np.int32, N, "elements per second; sorted keys in runs of ~16 + int32 values",
                              {"cuda.compute": _cccl}),
        "reduce_by_key": Spec(np.int32, N, "elements per second; runs of 64, user add",
                              {"torch": _torch, "copy": _copy},
                              bytes_moved=dict.fromkeys(("ours", "torch", "copy"), _BYTES["reduce_by_key"]),
                              extra=(("one run", "every key equal (one run)", _ours_one_run),)),
        "scan_by_key": Spec(np.int32, N, "elements per second; runs of 64, user add", {"copy": _copy},
                            bytes_moved=dict.fromkeys(("ours", "copy"), _BYTES["scan_by_key"]),
                            extra=(("one run", "every key equal (one run)", _ours_one_run),)),
        "resharded": Spec(np.float32, N, "elements per second; shards of 1/4 and 3/4 to an even split",
                          {"copy": _copy}, place_counts=(2,), sizes={"x": [N // 4, N - N // 4]},
                          bytes_moved=dict.fromkeys(("ours", "copy"), _BYTES["resharded"])),
    },
    inputs=_inputs, reference=_reference, ours=_ours, check=_check, peer_outputs=_peer_outputs)
ALGORITHMS = tuple(FAMILY.specs)


def blocks(cp, sharded, options, chosen, groups: dict):
    """Per algorithm: the peers and the device copy on the first GPU, then ours."""
    return families.blocks(cp, sharded, options, chosen, groups, FAMILY)
