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

from conftest import ALL_DTYPES, uneven
from test_errors import stand_in_array, stand_in_group

SCALE = 2.0  # a global operators of the plan tests read (its changes change their identity)

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


def test_plans_pair_kernels_with_the_identity_they_were_looked_up_with(built):
    global SCALE
    operator = Op(lambda x: x * SCALE)
    kinds = (("array", np.dtype(np.float32)),)

    def libraries():
        return compiler.kernel_libraries(operator, "transform", kinds, None, ("sm_90",))[1]

    try:
        SCALE = 2.0
        first = libraries()
        assert compiler.libraries_made_for(operator, first) == (compiler._generation, operator.identity())
        SCALE = 3.0  # another identity: the memo now answers for another list
        second = libraries()
        assert compiler.libraries_made_for(operator, first) is None
        assert compiler.libraries_made_for(operator, second)[1] == operator.identity()
        SCALE = 2.0  # back: the lookup answers the first list again, under the first identity
        assert libraries() is first and compiler.libraries_made_for(operator, first)[1] == operator.identity()
    finally:
        SCALE = 2.0
    assert compiler.libraries_made_for(Op(lambda x: x), first) is None  # never looked up


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


# ---- transform plans: a repeated call launches from the operator's plan ---------------------
# A plan is made at the second full-path call in a row with the same kinds, and serves from the
# third on: the `prepares` fixture counts the full-path calls.

def _count_calls(monkeypatch, module, name: str, argument: int) -> list:
    """A list that gets the `argument`-th argument of every call of `module.name`."""
    calls = []
    full = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args[argument])
        return full(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.fixture
def prepares(monkeypatch):
    """How many transform calls took the full path (prepare) rather than a plan."""
    return _count_calls(monkeypatch, transform_module, "prepare", 0)


def _error_of(call):
    """(type, text) of what `call` raises."""
    with pytest.raises(Exception) as raised:
        call()
    return type(raised.value), str(raised.value)


@pytest.mark.gpu
def test_planned_transforms_give_what_numpy_gives(places, prepares):
    sizes = uneven(places, 5003)
    x_host = (np.arange(5003) % 97 - 48).astype(np.float32)  # products and sums stay exact
    y_host = (np.arange(5003) % 89).astype(np.float32)
    x = sharded.ShardedArray.from_numpy(places, x_host, sizes=sizes)
    y = sharded.ShardedArray.from_numpy(places, y_host, sizes=sizes)
    out = sharded.ShardedArray.allocate(places, sizes, np.float32)
    axpy = sharded.op(lambda x, y, a: a * x + y)

    def check(values, expected, full_calls):
        for a in values:
            sharded.transform(axpy, x, y, a, out=out)
            np.testing.assert_array_equal(out.to_numpy(), expected(a), err_msg=repr(a))
        assert len(prepares) == full_calls

    check((2.0, -0.5, 3.25, 1e3, 0.5), lambda a: (np.float64(a) * x_host + y_host).astype(np.float32), 2)
    # a NumPy float32 is another slot type: a new plan, from the second call on
    check((np.float32(1.5), np.float32(-7.0), np.float32(0.25)), lambda a: a * x_host + y_host, 4)
    check((3, -2**40, 17), lambda a: (np.int64(a) * x_host + y_host).astype(np.float32), 6)
    check((0.5, 0.25), lambda a: (np.float64(a) * x_host + y_host).astype(np.float32), 8)
    sharded.transform(axpy, x, y, 2.0, out=y)  # out aliasing an input, from the float plan
    np.testing.assert_array_equal(y.to_numpy(), (2 * x_host + y_host).astype(np.float32))
    assert len(prepares) == 8


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_planned_transforms_pack_every_scalar_type(three_places, prepares, dtype):
    dtype = np.dtype(dtype)
    host = (np.arange(301) % 5).astype(dtype)
    x = sharded.ShardedArray.from_numpy(three_places, host)
    out = sharded.ShardedArray.allocate(three_places, 301, dtype)
    plus = sharded.op(lambda x, s: x + s)
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    values = [dtype.type(2), dtype.type(info.max - 4) if info else dtype.type(0.75), dtype.type(1)]
    for value in values + values[::-1]:
        sharded.transform(plus, x, value, out=out)
        np.testing.assert_array_equal(out.to_numpy(), (host + value).astype(dtype), err_msg=str(value))
    assert len(prepares) == 2


class _Float32Telling42(np.float32):
    """A NumPy float32 subclass whose __float__ lies: its value is what numpy packs."""

    def __float__(self):
        return 42.0


@pytest.mark.gpu
def test_plans_take_exact_types_only(three_places, prepares):
    host = np.arange(30, dtype=np.float32)
    x = sharded.ShardedArray.from_numpy(three_places, host)
    out = sharded.ShardedArray.allocate(three_places, 30, np.float32)
    plus = sharded.op(lambda x, s: x + s)
    for _ in range(3):
        sharded.transform(plus, x, _Float32Telling42(1.5), out=out)
        np.testing.assert_array_equal(out.to_numpy(), host + np.float32(1.5))
    assert len(prepares) == 3 and plus._transform_plan[3] is None  # marked, no plan
    indexed = sharded.op(lambda v, i: v + i)
    for flag in (np.True_, np.True_, np.True_):  # a true value, not True: the full path each time
        sharded.transform(indexed, x, out=out, with_index=flag)
        np.testing.assert_array_equal(out.to_numpy(), host + np.arange(30))
    assert len(prepares) == 6


@pytest.mark.gpu
def test_planned_transforms_raise_what_the_full_path_raises(three_places, prepares):
    x = sharded.ShardedArray.from_numpy(three_places, np.arange(10, dtype=np.float32))
    out = sharded.ShardedArray.allocate(three_places, 10, np.float32)
    other_group = sharded.ShardedArray.from_numpy(sharded.PlaceGroup.by_devices([0, 0, 0]),
                                                  np.arange(10, dtype=np.float32))
    other_sizes = sharded.ShardedArray.from_numpy(three_places, np.arange(10, dtype=np.float32), sizes=[10, 0, 0])
    freed = sharded.ShardedArray.from_numpy(three_places, np.arange(10, dtype=np.float32))
    freed.free()
    calls = [
        lambda op: sharded.transform(op, x, other_group, 1, out=out),
        lambda op: sharded.transform(op, x, other_sizes, 1, out=out),
        lambda op: sharded.transform(op, x, x, 2**63, out=out),  # does not fit int64
        lambda op: sharded.transform(op, x, x, True, out=out),
        lambda op: sharded.transform(op, x, x, "1", out=out),
        lambda op: sharded.transform(op, x, x, out=out),
        lambda op: sharded.transform(op, x, freed, 1, out=out),
        lambda op: sharded.transform(op, x, x, 1, out=freed),
        lambda op: sharded.transform(op, x, x, 1, out=other_sizes),
        lambda op: sharded.transform(op, x, x, 1, out=np.zeros(10, np.float32)),
        lambda op: sharded.transform(op, x, x, 1, out=out, with_index="yes"),
    ]

    def fresh():
        return sharded.op(lambda a, b, s: a + b * s)

    planned = fresh()
    for scale in (1, 2, 3):  # plans (array, array, int) into float32 out at the second call
        sharded.transform(planned, x, x, scale, out=out)
    assert planned._transform_plan[3] is not None and len(prepares) == 2
    for call in calls:
        expected = _error_of(lambda: call(fresh()))
        assert _error_of(lambda: call(planned)) == expected
    served = len(prepares)
    sharded.transform(planned, x, x, 3, out=out)  # and the plan still serves
    np.testing.assert_array_equal(out.to_numpy(), np.arange(10, dtype=np.float32) * 4)
    assert len(prepares) == served


@pytest.mark.gpu
def test_a_plan_follows_the_operators_globals_closure_and_the_cache(one_place, prepares):
    global SCALE
    host = np.arange(100, dtype=np.float32)
    x = sharded.ShardedArray.from_numpy(one_place, host)
    out = sharded.ShardedArray.allocate(one_place, 100, np.float32)
    scaled = sharded.op(lambda v: SCALE * v)
    try:
        for factor in (2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 2.0):
            SCALE = factor  # read when the kernel compiles: the identity changes with it
            sharded.transform(scaled, x, out=out)
            np.testing.assert_array_equal(out.to_numpy(), host * np.float32(factor))
    finally:
        SCALE = 2.0
    by = 1.0
    shift = sharded.op(lambda v: v + by)  # a closure: its cell is read at every call
    for _ in range(3):
        sharded.transform(shift, x, out=out)
        np.testing.assert_array_equal(out.to_numpy(), host + 1)
    by = 5.0
    sharded.transform(shift, x, out=out)
    np.testing.assert_array_equal(out.to_numpy(), host + 5)

    def shifted(v):
        return v + 1.0

    code = sharded.op(shifted)
    for _ in range(3):
        sharded.transform(code, x, out=out)
    shifted.__code__ = (lambda v: v - 1.0).__code__
    sharded.transform(code, x, out=out)
    np.testing.assert_array_equal(out.to_numpy(), host - 1)
    for _ in range(3):
        sharded.transform(shift, x, out=out)
    before = len(prepares)
    sharded.clear_cache(memory=True, disk=False)  # a plan from before the clear is not used
    sharded.transform(shift, x, out=out)
    np.testing.assert_array_equal(out.to_numpy(), host + 5)
    assert len(prepares) == before + 1


@pytest.mark.gpu
def test_plans_of_records_and_the_index(three_places, prepares):
    host = np.zeros(1000, POINT)
    host["x"], host["y"] = np.arange(1000), -np.arange(1000)
    points = sharded.ShardedArray.from_numpy(three_places, host)
    norms = sharded.ShardedArray.allocate(three_places, 1000, np.float32)
    swapped = sharded.ShardedArray.allocate(three_places, 1000, POINT)
    indexed = sharded.op(lambda p, o, i: p.x * 2 + p.y + i + o)
    swap = sharded.op(lambda p: (p.y, p.x))
    for offset in (0.0, 1.0, 2.0, 3.0):
        sharded.transform(indexed, points, offset, out=norms, with_index=True)
        np.testing.assert_array_equal(norms.to_numpy(), host["x"] * 2 + host["y"] + np.arange(1000) + offset)
        sharded.transform(swap, points, out=swapped)
        result = swapped.to_numpy()
        np.testing.assert_array_equal(result["x"], host["y"])
        np.testing.assert_array_equal(result["y"], host["x"])
    assert len(prepares) == 4
    with pytest.raises(TypeError, match=r"takes 3 arguments, but transform passes 2"):
        sharded.transform(indexed, points, 0.0, out=norms)  # the plan's call passed the index


@pytest.mark.gpu
def test_a_plan_keeps_no_group_alive_and_a_new_group_is_not_the_old_one(prepares):
    import gc
    import weakref

    doubled = sharded.op(lambda v: v * 2)
    host = np.arange(64, dtype=np.float32)
    group = sharded.PlaceGroup.by_devices([0, 0])
    x = sharded.ShardedArray.from_numpy(group, host)
    for _ in range(3):
        sharded.transform(doubled, x, out=x)
    np.testing.assert_array_equal(x.to_numpy(), host * 8)
    assert doubled._transform_plan[3] is not None and len(prepares) == 2
    held = weakref.ref(group)
    del group, x
    gc.collect()
    assert held() is None
    group = sharded.PlaceGroup.by_devices([0, 0, 0])  # may take the old one's address
    x = sharded.ShardedArray.from_numpy(group, host)
    sharded.transform(doubled, x, out=x)
    np.testing.assert_array_equal(x.to_numpy(), host * 2)
    assert len(prepares) == 3


# ---- reduce plans: a repeated reduce to a host value skips the full path's steps -------------

@pytest.fixture
def reduce_lookups(monkeypatch):
    """How many reduce calls took the full path (its kernel-cache lookup) rather than a plan."""
    from cuda_sharded_jit.algorithms import reduce as reduce_module

    return _count_calls(monkeypatch, reduce_module, "kernel_libraries", 1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_planned_reduces_give_what_numpy_gives(places, reduce_lookups, dtype):
    dtype = np.dtype(dtype)
    host = (np.arange(7001) % 13).astype(dtype)
    array = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, 7001))
    add = sharded.op(lambda x, y: x + y)
    total = int(host.astype(np.int64).sum())
    for init in (None, 0, 3, 2.0 if dtype.kind == "f" else 7, None):
        result = sharded.reduce(array, add, init)
        assert type(result) is dtype.type
        assert result == dtype.type(total + (init or 0)), (dtype, init)
    assert reduce_lookups == ["reduce"]
    empty = sharded.ShardedArray.from_numpy(places, host[:0])
    assert sharded.reduce(empty, add, 5) == dtype.type(5)
    with pytest.raises(ValueError, match="the array is empty and no init was given"):
        sharded.reduce(empty, add)


@pytest.mark.gpu
def test_planned_reduces_raise_what_the_full_path_raises(three_places):
    ints = sharded.ShardedArray.from_numpy(three_places, np.arange(10, dtype=np.int32))
    floats = sharded.ShardedArray.from_numpy(three_places, np.arange(10, dtype=np.float32))
    freed = sharded.ShardedArray.from_numpy(three_places, np.arange(10, dtype=np.int32))
    freed.free()
    calls = [
        lambda op: sharded.reduce(ints, op, 1.5),  # does not fit int32
        lambda op: sharded.reduce(ints, op, 2**40),
        lambda op: sharded.reduce(ints, op, "1"),
        lambda op: sharded.reduce(freed, op),
        lambda op: sharded.capture(lambda: sharded.reduce(ints, op)),
    ]

    def fresh():
        return sharded.op(lambda x, y: x + y)

    planned = fresh()
    assert sharded.reduce(ints, planned) == 45
    assert planned._reduce_plan is not None
    for call in calls:
        expected = _error_of(lambda: call(fresh()))
        assert _error_of(lambda: call(planned)) == expected
    assert sharded.reduce(floats, planned, 0.5) == np.float32(45.5)  # another dtype: a new plan
    assert sharded.reduce(ints, planned, 1) == 46


@pytest.mark.gpu
def test_a_reduce_plan_follows_the_operator_and_the_cache_and_keeps_no_group(reduce_lookups):
    import gc
    import weakref

    global SCALE
    group = sharded.PlaceGroup.by_devices([0, 0])
    host = np.arange(100, dtype=np.float64)
    x = sharded.ShardedArray.from_numpy(group, host)
    floor = sharded.op(lambda a, b: max(a, b, SCALE))  # associative; SCALE is baked in
    try:
        for factor in (200.0, 200.0, 300.0, 300.0, 50.0, 200.0, 200.0):
            SCALE = factor
            assert sharded.reduce(x, floor) == max(host.max(), factor)
        assert len(reduce_lookups) == 4  # each change of SCALE: a new identity, the full path
        sharded.clear_cache(memory=True, disk=False)  # a plan from before the clear is not used
        assert sharded.reduce(x, floor) == 200.0
        assert len(reduce_lookups) == 5
    finally:
        SCALE = 2.0
    points = np.zeros(50, POINT)
    points["x"], points["y"] = np.arange(50), 1
    records = sharded.ShardedArray.from_numpy(group, points)
    swap_sum = sharded.op(lambda p, q: (p.x + q.x, p.y + q.y))
    for _ in range(2):
        assert sharded.reduce(records, swap_sum) == (np.float32(1225), np.float32(50))
    held = weakref.ref(group)
    del group, x, records
    gc.collect()
    assert held() is None
