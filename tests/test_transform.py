"""GPU tests of sharded.transform against numpy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import compiler

from conftest import ALL_DTYPES, cupy_or_skip, sample

pytestmark = pytest.mark.gpu


def _arrays(group, dtypes, n=2003, sizes=None, contiguous=False):
    hosts = [sample(dtype, n, seed) for seed, dtype in enumerate(dtypes)]
    arrays = [sharded.ShardedArray.from_numpy(group, host, sizes=sizes, contiguous=contiguous)
              for host in hosts]
    return hosts, arrays


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_unary_every_dtype(group, dtype):
    (host,), (array,) = _arrays(group, [dtype])
    result = sharded.transform(lambda x: x * 3 + 1, array)
    # the result type follows numba's typing (an int literal is int64), not numpy's
    np.testing.assert_allclose(result.to_numpy(), host.astype(np.float64) * 3 + 1, rtol=1e-6)


# numba's typing: float32 stays float32, 32-bit integers widen to 64 bits.
_NUMBA_BINARY = {np.int32: np.int64, np.uint32: np.uint64}


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_binary_same_dtype(group, dtype):
    (a, b), (x, y) = _arrays(group, [dtype, dtype])
    result = sharded.transform(lambda p, q: p * q - q, x, y)
    expected_dtype = np.dtype(_NUMBA_BINARY.get(dtype, dtype))
    assert result.dtype == expected_dtype
    a, b = a.astype(expected_dtype), b.astype(expected_dtype)
    with np.errstate(over="ignore"):
        expected = a * b - b
    if expected_dtype.kind == "f":
        # the device contracts p * q - q into one fused multiply-add
        np.testing.assert_allclose(result.to_numpy(), expected, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(result.to_numpy(), expected)


@pytest.mark.parametrize("arity", [1, 2, 3, 4])
def test_arities_with_mixed_dtypes(three_places, arity):
    dtypes = [np.float32, np.int64, np.uint32, np.float64][:arity]
    hosts, arrays = _arrays(three_places, dtypes, n=4099)
    ops = [None, lambda a: a + 0.5, lambda a, b: a * b, lambda a, b, c: a + b * c,
           lambda a, b, c, d: (a - b) * c + d]
    result = sharded.transform(ops[arity], *arrays)
    expected = ops[arity](*[host.astype(np.float64) for host in hosts])
    assert result.dtype == np.float64
    np.testing.assert_allclose(result.to_numpy(), expected, rtol=1e-6)


def test_every_size_signature_links(one_place):
    for dtypes in itertools.product([np.float32, np.float64], repeat=3):
        hosts, arrays = _arrays(one_place, dtypes, n=77)
        result = sharded.transform(lambda a, b, c: a + b + c, *arrays, out=None)
        np.testing.assert_allclose(result.to_numpy(), hosts[0] + hosts[1] + hosts[2], rtol=1e-6)


def test_scalar_arguments_are_runtime_values(three_places):
    (a, b), (x, y) = _arrays(three_places, [np.float32, np.float32])

    @sharded.op
    def saxpy(p, q, alpha):
        return alpha * p + q

    first = sharded.transform(saxpy, x, y, np.float32(2.0))
    entries = len(compiler._kernels)
    second = sharded.transform(saxpy, x, y, np.float32(-3.5))
    assert len(compiler._kernels) == entries  # no recompilation for a new value
    np.testing.assert_allclose(first.to_numpy(), np.float32(2.0) * a + b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(second.to_numpy(), np.float32(-3.5) * a + b, rtol=1e-6, atol=1e-6)
    # Python float is float64, int is int64; scalars may sit anywhere among the arguments
    mixed = sharded.transform(lambda s, p, t, q: s * p + t * q, 0.25, x, 3, y)
    np.testing.assert_allclose(mixed.to_numpy(), 0.25 * a.astype(np.float64) + 3 * b, rtol=1e-6)


def test_out_casts_and_may_alias(three_places):
    (a, b), (x, y) = _arrays(three_places, [np.float64, np.float64])
    out = sharded.ShardedArray.allocate(three_places, x.size, np.int32)
    sharded.transform(lambda p: p * 100.0, x, out=out)
    np.testing.assert_array_equal(out.to_numpy(), (a * 100.0).astype(np.int32))
    returned = sharded.transform(lambda p, q: p + 2 * q, x, y, out=x)
    assert returned is x
    np.testing.assert_allclose(x.to_numpy(), a + 2 * b)


@pytest.mark.parametrize("sizes", [[0, 2003, 0], [1, 0, 2002], [1000, 3, 1000]])
def test_uneven_and_empty_shards(three_places, sizes):
    (a, b), (x, y) = _arrays(three_places, [np.int32, np.int32], sizes=sizes)
    result = sharded.transform(lambda p, q: p - q, x, y)
    assert result.shard_sizes == tuple(sizes)
    np.testing.assert_array_equal(result.to_numpy(), a - b)


def test_contiguous_arrays_and_unaligned_shards(three_places):
    # shard starts at odd offsets are not 16-byte aligned: the kernel takes its word path
    sizes = [1001, 999, 1003]
    (a, b), (x, y) = _arrays(three_places, [np.float32, np.float32], n=sum(sizes), sizes=sizes,
                             contiguous=True)
    out = sharded.ShardedArray.allocate_contiguous(three_places, sizes, np.float32)
    sharded.transform(lambda p, q: p * q, x, y, out=out)
    np.testing.assert_allclose(out.to_numpy(), a * b, rtol=1e-6)


def test_adopted_arrays(three_places):
    cp = cupy_or_skip()
    host = sample(np.float64, 30)
    buffers = [cp.asarray(part) for part in np.split(host, [10, 20])]
    array = sharded.ShardedArray.adopt(three_places, buffers)
    sharded.transform(lambda v: v * v, array, out=array)
    np.testing.assert_allclose(cp.asnumpy(cp.concatenate(buffers)), host * host)


def test_closure_and_global_changes_take_effect(one_place):
    (a,), (x,) = _arrays(one_place, [np.float64])
    for k in (2.0, 3.0):
        np.testing.assert_allclose(sharded.transform(lambda v: v * k, x).to_numpy(), a * k)
    global OFFSET
    for value in (1.0, 10.0):
        OFFSET = value
        np.testing.assert_allclose(sharded.transform(_add_offset, x).to_numpy(), a + value)


OFFSET = 0.0


def _add_offset(v):
    return v + OFFSET


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_descriptor_ops(three_places, dtype):
    (a, b), (x, y) = _arrays(three_places, [dtype, dtype])
    two = np.dtype(dtype).type(2)
    with np.errstate(over="ignore"):
        cases = [
            (sharded.ops.negate, (x,), -a),
            (sharded.ops.scale(2), (x,), two * a),
            (sharded.ops.add_scalar(2), (x,), a + two),
            (sharded.ops.add, (x, y), a + b),
            (sharded.ops.mul, (x, y), a * b),
            (sharded.ops.axpy(2), (x, y), two * a + b),
        ]
    for descriptor, args, expected in cases:
        result = sharded.transform(descriptor, *args)
        assert result.dtype == np.dtype(dtype)
        np.testing.assert_allclose(result.to_numpy(), expected.astype(dtype), rtol=1e-6,
                                   err_msg=repr(descriptor))


def test_user_lambda_matches_descriptor(three_places):
    (a, b), (x, y) = _arrays(three_places, [np.float32, np.float32])
    np.testing.assert_array_equal(sharded.transform(lambda p, q: p + q, x, y).to_numpy(),
                                  sharded.transform(sharded.ops.add, x, y).to_numpy())


def test_errors(three_places, one_place):
    (_, _), (x, y) = _arrays(three_places, [np.float32, np.float32])
    other_sizes = sharded.ShardedArray.allocate(three_places, [1, 1, x.size - 2], np.float32)
    with pytest.raises(ValueError, match="shard sizes"):
        sharded.transform(lambda p, q: p + q, x, other_sizes)
    elsewhere = sharded.ShardedArray.allocate(one_place, x.size, np.float32)
    with pytest.raises(ValueError, match="another PlaceGroup"):
        sharded.transform(lambda p, q: p + q, x, elsewhere)
    with pytest.raises(ValueError, match="out: shard sizes"):
        sharded.transform(lambda p: p, x, out=other_sizes)
    with pytest.raises(TypeError, match="takes 2 arguments, but transform passes 1"):
        sharded.transform(lambda p, q: p + q, x)
    with pytest.raises(TypeError, match="at least one argument must be a ShardedArray"):
        sharded.transform(lambda p: p, 1.0)
    with pytest.raises(TypeError, match=r"args\[1\]: expected a ShardedArray or a scalar"):
        sharded.transform(lambda p, q: p + q, x, "two")
    with pytest.raises(TypeError, match="cannot be compiled"):
        sharded.transform(lambda p: p.shape, x)
    with pytest.raises(TypeError, match="differs"):
        sharded.transform(sharded.ops.add, x,
                          sharded.ShardedArray.allocate(three_places, x.size, np.float64))
    with pytest.raises(ValueError, match="at most 4 array arguments"):
        sharded.transform(lambda a, b, c, d, e: a, x, x, x, x, x)
    x.free()
    with pytest.raises(ValueError, match="freed"):
        sharded.transform(lambda p: p, x)


def test_results_are_stream_ordered_for_cupy(three_places):
    cp = cupy_or_skip()
    (a,), (x,) = _arrays(three_places, [np.float32], n=1 << 20)
    result = sharded.transform(lambda v: v + 1.0, x)
    # CuPy consumes the view on our stream (CAI v3), so no explicit sync is needed
    head = cp.asarray(result.shard(0))
    np.testing.assert_allclose(cp.asnumpy(head), (a + 1.0)[: result.shard_sizes[0]])
