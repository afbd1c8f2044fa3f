"""Tuple accumulators: argmin / argmax, min-max, Welford, log-sum-exp against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import uneven


def pair(x, i):
    return x, i


def first_min(p, q):  # (value, index); p comes first: ties keep the first index
    return q if q[0] < p[0] else p


def min_max_map(x):
    return x, x


def min_max(p, q):
    return min(p[0], q[0]), max(p[1], q[1])


def welford_map(x):  # the mean and M2 in float64 whatever the input
    return 1.0, np.float64(x), 0.0


def welford(p, q):  # (count, mean, M2): Chan et al.'s pairwise update
    count = p[0] + q[0]
    if count == 0.0:
        return p
    delta = q[1] - p[1]
    mean = p[1] + delta * (q[0] / count)
    return count, mean, p[2] + q[2] + delta * delta * (p[0] * q[0] / count)


def lse_map(x):
    return float(x), 1.0


def log_sum_exp(p, q):  # (running max, sum of exp(x - max))
    if p[0] >= q[0]:
        return p[0], p[1] + q[1] * math.exp(q[0] - p[0])
    return q[0], q[1] + p[1] * math.exp(p[0] - q[0])


# ---- no GPU: the compile path down to SASS ----

def test_tuple_reductions_compile_to_records():
    kernel = sharded.compile(first_min, "reduce", np.float32, arch="sm_90", map_op=pair, with_index=True)
    assert kernel.module == "reduce_a16_i4"
    assert kernel.out_dtype == np.dtype([("f0", np.float32), ("f1", np.int64)], align=True)
    assert "CALL" not in kernel.sass()
    kernel = sharded.compile(min_max, "reduce", np.float64, arch="sm_90", map_op=min_max_map)
    assert kernel.module == "reduce_a16_i8" and "CALL" not in kernel.sass()
    kernel = sharded.compile(welford, "reduce", np.float32, arch="sm_90", map_op=welford_map)
    assert kernel.module == "reduce_a24_i4" and kernel.out_dtype.names == ("f0", "f1", "f2")
    four = sharded.compile(lambda p, q: (p[0] + q[0], p[1], p[2], q[3]), "reduce", np.int32, arch="sm_90",
                           map_op=lambda x: (x, x, np.int64(x), x))
    assert four.module == "reduce_a24_i4"  # int32, int32, int64, int32 -> 4 + 4 + 8 + 4 (+4)


def test_tuple_reduction_errors():
    with pytest.raises(TypeError, match="must return a tuple of 2"):
        sharded.compile(lambda p, q: p[0] + q[0], "reduce", np.float32, arch="sm_90", map_op=min_max_map)
    with pytest.raises(TypeError, match="must return a tuple of 2"):
        sharded.compile(lambda p, q: p[0], "scan", np.float32, arch="sm_90", map_op=min_max_map)
    with pytest.raises(TypeError, match="1 to 4 numbers"):
        sharded.compile(lambda p, q: p, "reduce", np.float32, arch="sm_90", map_op=lambda x: (x, x, x, x, x))
    with pytest.raises(ValueError, match="with_index"):
        sharded.compile(first_min, "reduce", np.float32, arch="sm_90", with_index=True)
    with pytest.raises(ValueError, match="map_op: only reductions"):
        sharded.compile(lambda x: x, "transform", np.float32, arch="sm_90", map_op=min_max_map)
    with pytest.raises(TypeError, match="arguments"):
        sharded.compile(first_min, "reduce", np.float32, arch="sm_90", map_op=pair)  # needs with_index


def test_records_round_trip_through_cache_keys():
    from cuda_sharded_jit._dtypes import record_dtype
    from cuda_sharded_jit._layout import dtype_from_key, dtype_key

    record = record_dtype([np.float32, np.int64, np.float64])
    assert dtype_from_key(dtype_key(record)) == record
    assert dtype_from_key(dtype_key(np.dtype(np.uint32))) == np.uint32


def test_tuple_init_packs_and_results_unpack_as_numpy_scalars():
    from cuda_sharded_jit._dtypes import record_dtype
    from cuda_sharded_jit._layout import layout_of
    from cuda_sharded_jit.algorithms.reduce import _result

    record = record_dtype([np.float32, np.int64])
    expected = np.zeros((), record)
    expected["f0"], expected["f1"] = np.inf, -1
    layout = layout_of(record)
    assert layout.pack_init((np.inf, -1)) == expected.tobytes() and len(expected.tobytes()) == 16
    value = _result(True, expected.tobytes(), layout, None, "transform_reduce")
    assert value == (np.float32(np.inf), np.int64(-1))
    assert [type(item) for item in value] == [np.float32, np.int64]
    with pytest.raises(ValueError, match=r"init\[1\]"):
        layout.pack_init((0.0, 2.5))  # a fraction cannot become the int64 field
    with pytest.raises(TypeError, match="tuple of 2"):
        layout.pack_init((0.0,))
    with pytest.raises(TypeError, match="transform_reduce"):
        layout_of(np.float64).pack_init((0.0, 1.0))


# ---- GPU ----

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64])
def test_argmin_argmax_first_index_on_ties(places, dtype):
    rng = np.random.default_rng(5)
    host = rng.integers(0, 50, 200_003).astype(dtype)  # many ties of the extremes
    array = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size))
    assert sharded.argmin(array) == int(np.argmin(host))
    assert sharded.argmax(array) == int(np.argmax(host))
    value, index = sharded.transform_reduce(array, pair, first_min, None, with_index=True)
    assert index == np.argmin(host) and value == host.min() and isinstance(value, np.generic)


@pytest.mark.gpu
def test_argmin_nan_and_errors(places):
    host = np.random.default_rng(6).standard_normal(100_000).astype(np.float32)
    host[[70_000, 80_000]] = np.nan
    array = sharded.ShardedArray.from_numpy(places, host)
    assert sharded.argmin(array) == int(np.argmin(host)) == 70_000
    assert sharded.argmax(array) == int(np.argmax(host))
    empty = sharded.ShardedArray.allocate(places, 0, np.float32)
    with pytest.raises(ValueError, match="empty"):
        sharded.argmin(empty)


@pytest.mark.gpu
def test_min_max_in_one_pass(places):
    host = np.random.default_rng(7).standard_normal(123_457)
    array = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size))
    low, high = sharded.transform_reduce(array, min_max_map, min_max, None)
    assert (low, high) == (host.min(), host.max())
    # init joins the fold first: a wider init range shows through
    assert sharded.transform_reduce(array, min_max_map, min_max, (-100.0, 100.0)) == (-100.0, 100.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_welford_mean_and_variance(places, dtype):
    host = (np.random.default_rng(8).standard_normal(300_001) * 3 + 10).astype(dtype)
    array = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size))
    count, mean, m2 = sharded.transform_reduce(array, welford_map, welford, (0.0, 0.0, 0.0))
    assert count == host.size
    np.testing.assert_allclose(mean, np.mean(host, dtype=np.float64), rtol=1e-10)
    np.testing.assert_allclose(m2 / count, np.var(host, dtype=np.float64), rtol=1e-9)


@pytest.mark.gpu
def test_log_sum_exp(places):
    host = np.random.default_rng(9).standard_normal(250_000) * 20
    array = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size))
    top, scaled = sharded.transform_reduce(array, lse_map, log_sum_exp, None)
    reference = host.max() + np.log(np.sum(np.exp(host - host.max())))
    np.testing.assert_allclose(top + math.log(scaled), reference, rtol=1e-12)


@pytest.mark.gpu
def test_tuple_reductions_are_deterministic(places):
    host = np.random.default_rng(10).standard_normal(400_000).astype(np.float32)
    array = sharded.ShardedArray.from_numpy(places, host)
    first = sharded.transform_reduce(array, welford_map, welford, (0.0, 0.0, 0.0))
    second = sharded.transform_reduce(array, welford_map, welford, (0.0, 0.0, 0.0))
    assert [np.asarray(v).tobytes() for v in first] == [np.asarray(v).tobytes() for v in second]


@pytest.mark.gpu
def test_tuple_init_errors(one_place):
    array = sharded.ShardedArray.from_numpy(one_place, np.arange(10, dtype=np.float32))
    with pytest.raises(TypeError, match="tuple of 2"):
        sharded.transform_reduce(array, min_max_map, min_max, (0.0, 1.0, 2.0))
    with pytest.raises(TypeError, match="transform_reduce"):
        sharded.reduce(array, min_max, init=(0.0, 1.0))
    for builtin in ("min", "sum"):  # built-in operators combine numbers, not tuples
        with pytest.raises(TypeError, match="combines single numbers"):
            sharded.transform_reduce(array, min_max_map, builtin, None)
    with pytest.raises(ValueError, match="init\\[1\\]"):
        sharded.transform_reduce(array, pair, first_min, (0.0, 2.5), with_index=True)
