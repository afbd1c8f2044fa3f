"""The hot path's shortcuts give what the general path gives: an init packed without numpy,
a result read back without numpy, an operator's identity reused while its code stays, and
the transform's choice of module made from the argument loop. CPU tests against numpy and
against the plain definitions; GPU tests of the same values through real calls."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim, compiler
from cuda_sharded_jit._layout import layout_of
from cuda_sharded_jit.algorithms import transform as transform_module
from cuda_sharded_jit.op import Op, as_op

from conftest import ALL_DTYPES
from test_errors import stand_in_array, stand_in_group

FLOATS = [0.0, -0.0, 1.5, 1 / 3, 5e-324, 3.4028235e38, 3.4028236e38, 1e300, -1e300,
          float("inf"), float("-inf"), float("nan")]
INTS = [0, 1, -1, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**32 - 1, 2**32, 16777217, 2**53,
        2**53 + 1, -2**53 - 1, 2**63 - 1, 2**63, -2**63, -2**63 - 1, 2**64 - 1, 2**64]


def _numpy_init(value, dtype):
    """numpy's bytes of `value` cast to `dtype`, or None where an integer dtype cannot hold
    it exactly (out of range, a fraction, NaN or an infinity)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            return None
        if not np.iinfo(dtype).min <= int(value) <= np.iinfo(dtype).max:
            return None
    with np.errstate(all="ignore"):
        return np.asarray(value).astype(dtype)[()].tobytes()


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_python_inits_pack_as_numpy_casts_them(dtype):
    layout = layout_of(np.dtype(dtype))
    for value in FLOATS + INTS:
        expected = _numpy_init(value, dtype)
        if expected is None:
            with pytest.raises(ValueError, match=rf"^init: {re.escape(repr(value))} does not fit {np.dtype(dtype).name}"):
                layout.pack_init(value)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy's cast warns nothing either (errstate)
            assert layout.pack_init(value) == expected, (dtype, value)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_results_read_back_as_numpy_reads_them(dtype):
    dtype = np.dtype(dtype)
    layout = layout_of(dtype)
    rng = np.random.default_rng(7)
    raws = [rng.integers(0, 256, dtype.itemsize, dtype=np.uint8).tobytes() for _ in range(200)]
    if dtype == np.float32:  # NaNs with payloads, signalling included: kept bit for bit
        raws += [np.uint32(bits).tobytes() for bits in (0x7FA00001, 0xFFC00000, 0x7F800001, 0x7FC00000)]
    if dtype == np.float64:
        raws += [np.uint64(bits).tobytes() for bits in (0x7FF0000000000001, 0xFFF8000000000000)]
    for raw in raws:
        value = layout.unpack(raw)
        assert type(value) is dtype.type
        assert value.tobytes() == np.frombuffer(raw, dtype)[0].tobytes()


def test_identity_follows_code_and_defaults():
    def scale(x, y):
        return x * y

    def shift(x, y):
        return x + y

    operator = Op(scale)
    first = operator.identity()
    assert operator.identity() == first == Op(scale).identity()
    scale.__code__ = shift.__code__  # the cached digest is the old code's: not reused
    assert operator.identity() != first
    assert operator.identity() == Op(shift).identity()

    def scaled(x, y, factor=2.0):
        return x * y * factor

    with_default = Op(scaled)
    before = with_default.identity()
    scaled.__defaults__ = (3.0,)
    assert with_default.identity() != before


def test_operator_checks_name_their_argument():
    def generator(x):
        yield x

    with pytest.raises(TypeError, match=r"^pred: .*generator is a generator function"):
        as_op(generator, "pred")
    with pytest.raises(TypeError, match=r"^op: .* must take plain positional parameters"):
        Op(lambda *values: 0)
    with pytest.raises(TypeError, match=r"^map_op: expected a Python function \(def or lambda\), "
                                        r"got builtin_function_or_method"):
        as_op(abs, "map_op")
    with pytest.raises(TypeError, match=r"^map_op: expected an operator \(function\), got int"):
        as_op(3, "map_op")
    made = as_op(lambda x, y: x, "op")
    assert isinstance(made, Op) and made.num_params == 2


@pytest.fixture
def built(monkeypatch):
    """The keys of the kernels a stand-in compiler makes (float64 results when inferred)."""
    keys = []

    def lookup(op, key, map_spec=compiler.VALUE_MAP):
        keys.append(key)
        out = key[4] if key[4] is not None else np.dtype(np.float64)
        return compiler.CompiledKernel(key[0], op.name, key[3], out, key[5], "stub", b"", b"", "", False, 0.0)

    monkeypatch.setattr(compiler, "_lookup", lookup)
    monkeypatch.setattr(_shim, "KernelLibrary", lambda cubin, entry_points: object())
    return keys


def test_the_last_call_memo_answers_only_the_same_call(built):
    operator = Op(lambda x, y: x + y)
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    kinds = (("array", f32), ("array", f32))

    def libraries(out_request, archs=("sm_90",), map_spec=compiler.VALUE_MAP):
        return compiler.kernel_libraries(operator, "transform", kinds, out_request, archs, map_spec)

    first = libraries(f32)
    assert libraries(f32) is first and len(built) == 1
    inferred, requested = libraries(None), libraries(f64)  # float64 == None in numpy: kept apart
    assert inferred is not requested and libraries(None) is inferred
    assert libraries(f32, ("sm_90", "sm_90")) is not first
    assert libraries(f32, map_spec=compiler.INDEX_MAP) is not first
    assert libraries(f32) is first and len(built) == 6  # ("sm_90", "sm_90") built one per place
    compiler.clear_cache(memory=True, disk=False)
    rebuilt = libraries(f32)
    assert rebuilt is not first and rebuilt[1] == first[1] and len(built) == 7


def test_operators_of_one_code_share_answers_only_with_equal_identities(built):
    def scaled(factor):
        return Op(lambda x, y: x * y * factor)  # one code, a closure per factor

    kinds = (("array", np.dtype(np.float32)),) * 2

    def libraries(operator):
        return compiler.kernel_libraries(operator, "transform", kinds, None, ("sm_90",))

    two = libraries(scaled(2.0))
    assert libraries(scaled(2.0)) is two and len(built) == 1
    three = libraries(scaled(3.0))
    assert three is not two and len(built) == 2
    assert libraries(scaled(2.0)) is two and libraries(scaled(3.0)) is three and len(built) == 2


POINT = np.dtype([("x", np.float32), ("y", np.float32)], align=True)


@pytest.fixture
def launched(monkeypatch):
    """The `indexed` flag of every transform launch; kernels come from a stand-in cache."""
    flags = []

    def libraries(op, algorithm, kinds, out_request, archs, map_spec):
        return (out_request if out_request is not None else kinds[0][1]), ["library"]

    monkeypatch.setattr(transform_module, "kernel_libraries", libraries)
    monkeypatch.setattr(_shim, "transform", lambda libs, ins, out, packed, indexed: flags.append(indexed))
    return flags


def test_transform_picks_the_indexed_module_for_records_and_the_index(launched):
    group = stand_in_group(2)
    numbers = [stand_in_array(group, (3, 3), np.float32) for _ in range(3)]
    points = stand_in_array(group, (3, 3), POINT)
    sharded.transform(lambda x, y: x + y, numbers[0], numbers[1], out=numbers[2])
    sharded.transform(lambda x, y, i: x + y, numbers[0], numbers[1], out=numbers[2], with_index=True)
    sharded.transform(lambda p, x: p.x + x, points, numbers[0], out=numbers[2])
    sharded.transform(lambda x: (x, x), numbers[0], out=points)
    sharded.transform(lambda x, a: a * x, numbers[0], 2.0, out=numbers[2])
    assert launched == [False, True, True, True, False]


def test_transform_mismatch_errors_name_the_first_array_that_differs(launched):
    group = stand_in_group(2)
    a, b = stand_in_array(group, (3, 3)), stand_in_array(group, (3, 3))
    with pytest.raises(ValueError, match=r"^args: array 2 has shard sizes \(4, 2\), array 0 has \(3, 3\)"):
        sharded.transform(lambda x, y, z: x, a, b, stand_in_array(group, (4, 2)), out=a)
    with pytest.raises(ValueError, match=r"^args: array 1 belongs to another PlaceGroup than array 0"):
        sharded.transform(lambda x, y, z: x, a, stand_in_array(stand_in_group(2), (3, 3)),
                          stand_in_array(group, (4, 2)), out=a)
    with pytest.raises(TypeError, match=r"^args\[2\]: expected a ShardedArray or a scalar, got str"):
        sharded.transform(lambda x, y, z: x, a, stand_in_array(group, (4, 2)), "3", out=a)
    assert launched == []


# ---- the same values through real calls ---------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reduce_with_python_inits(three_places, dtype):
    dtype = np.dtype(dtype)
    host = (np.arange(3001) % 7).astype(dtype)
    array = sharded.ShardedArray.from_numpy(three_places, host)
    total = int(host.astype(np.int64).sum())
    inits = [5, 0] + ([0.5, -0.0] if dtype.kind == "f" else [int(np.iinfo(dtype).max) - total])
    for init in inits:
        result = sharded.reduce(array, lambda x, y: x + y, init)
        assert type(result) is dtype.type
        assert result == dtype.type(total + init), (dtype, init)
    assert sharded.reduce(sharded.ShardedArray.from_numpy(three_places, host[:0]),
                          lambda x, y: x + y, 5) == dtype.type(5)


@pytest.mark.gpu
def test_reduce_reads_a_nan_result_bit_for_bit(one_place):
    nan = np.frombuffer(np.uint32(0x7FC00123).tobytes(), np.float32)[0]
    host = np.array([nan], np.float32)
    result = sharded.reduce(sharded.ShardedArray.from_numpy(one_place, host), lambda x, y: x + y)
    assert result.tobytes() == host.tobytes()
