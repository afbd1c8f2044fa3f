"""Operator identity: what a kernel bakes in is part of its key, so a changed value never
gets the old kernel back, in this process or from disk; what cannot be described soundly is
refused. Most tests compile for sm_90 with no GPU and compare the cubin after the change
with a clean build of the changed operator; the gpu tests check the values too."""

from __future__ import annotations

import collections
import hashlib
import importlib
import math
import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _jit, _link

from helpers import config, device_helpers

op_module = importlib.import_module("cuda_sharded_jit.op")  # the package's `op` is the decorator

ARCH = "sm_90"


def _build(function, dtypes=(np.float64,)):
    return sharded.compile(function, "transform", dtypes, arch=ARCH)


def _clean_build(function, dtypes=(np.float64,)):
    """The kernel a process with empty caches builds for the operator as it is now."""
    sharded.clear_cache(memory=True, disk=True)
    return _build(function, dtypes)


def _assert_rebuilt(function, before, dtypes=(np.float64,)):
    """The kernel after a change has a new key and is the one a clean build gives, not the old."""
    after = _build(function, dtypes)
    assert after.cache_key != before.cache_key
    assert after.cubin != before.cubin
    assert after.cubin == _clean_build(function, dtypes).cubin
    return after


# ---- named tuples: class and field order are part of the value ----------------------------

XY = collections.namedtuple("Point", "x y")
YX = collections.namedtuple("Point", "y x")  # same name, the other field order
POINT = XY(1.0, 2.0)


def _uses_point(a):
    return a * POINT.x


def test_named_tuple_of_another_field_order_is_another_key(fresh_cache):
    global POINT
    before = _build(_uses_point)
    POINT = YX(1.0, 2.0)  # the same values, but POINT.x is now 2.0
    try:
        _assert_rebuilt(_uses_point, before)
    finally:
        POINT = XY(1.0, 2.0)
    assert _build(_uses_point).cubin == before.cubin


def test_named_tuple_class_as_a_global_is_keyed_by_its_fields():
    global XY
    made = sharded.op(lambda a: XY(a, a).x)
    first = made.identity()
    XY = collections.namedtuple("Point", "x z")
    try:
        assert made.identity() != first
    finally:
        XY = collections.namedtuple("Point", "x y")


# ---- modules: through a local alias, and helpers inside them -------------------------------

def _alias_reader(a):
    m = config
    return a * m.SCALE


def test_module_read_through_a_local_alias_follows_its_attributes(fresh_cache, monkeypatch):
    before = _build(_alias_reader)
    monkeypatch.setattr(config, "SCALE", 5.0)
    _assert_rebuilt(_alias_reader, before)


def _getattr_reader(a):
    return a * getattr(config, "SCALE")


def test_module_read_with_getattr_follows_its_attribute(monkeypatch):
    first = sharded.op(_getattr_reader).identity()
    monkeypatch.setattr(config, "SCALE", 7.0)
    assert sharded.op(_getattr_reader).identity() != first


def _module_helper(a):
    return device_helpers.scaled(a)


def test_device_helper_reached_through_a_module_is_rebuilt(fresh_cache, monkeypatch):
    before = _build(_module_helper)
    with monkeypatch.context() as changed:
        changed.setattr(device_helpers, "FACTOR", 3.0)
        _assert_rebuilt(_module_helper, before)
    assert _build(_module_helper).cubin == before.cubin


# ---- a rebuilt helper keeps its settings ---------------------------------------------------

def _declared_helper():
    """A helper declared with a signature (compiled at once, as numba does: for sm_90 here)."""
    from numba import cuda

    _jit._load_numba()
    with _jit._TargetCC((9, 0)):
        return cuda.jit("float32(float32)", device=True)(lambda x: x * 2)


def test_helper_declared_with_a_signature_keeps_it(fresh_cache):
    helper = _declared_helper()
    kernel = _build(lambda x: helper(x), (np.float64,))
    assert kernel.out_dtype == np.float32  # the helper's declared result, not float64


def _fast_divide(x, y):
    return x / y


def test_helper_declared_fastmath_keeps_it(fresh_cache):
    from numba import cuda

    fast = cuda.jit(device=True, fastmath=True)(_fast_divide)
    precise = cuda.jit(device=True)(_fast_divide)
    fast_kernel = _build(lambda x, y: fast(x, y), (np.float32, np.float32))
    precise_kernel = _build(lambda x, y: precise(x, y), (np.float32, np.float32))
    assert fast_kernel.cache_key != precise_kernel.cache_key  # settings are part of the key
    # IEEE division checks its operands (FCHK) and has a slow path; fastmath's does not
    assert "FCHK" in precise_kernel.sass()
    assert "FCHK" not in fast_kernel.sass()


# ---- the toolchain part of the key ---------------------------------------------------------

def test_toolchain_key_holds_a_digest_of_the_package_sources():
    from pathlib import Path

    root = Path(sharded.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    assert _link.package_digest() == digest.hexdigest()
    assert digest.hexdigest() in _link.toolchain_fingerprint()


def test_numba_settings_are_part_of_the_disk_key(fresh_cache, monkeypatch):
    kernel = _build(lambda x: x * 3.5)
    monkeypatch.setenv("NUMBA_OPT", "0")
    sharded.clear_cache(memory=True, disk=False)
    other = _build(lambda x: x * 3.5)
    assert other.cache_key != kernel.cache_key and not other.cache_hit


_CHILD = textwrap.dedent("""
    import numpy as np, cuda_sharded_jit as sharded
    k = sharded.compile(lambda x: x * 4.25, "transform", (np.float64,), arch="sm_90")
    print(k.cache_key, k.cache_hit)
""")


def test_numba_opt_in_a_new_process_is_a_miss(fresh_cache):
    def child(**env):
        # cwd: not the source tree, whose package (no built extension) would shadow the installed one
        result = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True,
                                env=dict(os.environ, CUDA_SHARDED_JIT_CACHE_DIR=str(fresh_cache), **env),
                                cwd=fresh_cache.parent)
        key, hit = result.stdout.split()
        return key, hit == "True"

    first = child()
    assert child() == (first[0], True)
    optimised_less = child(NUMBA_OPT="0")
    assert optimised_less[0] != first[0] and not optimised_less[1]


# ---- values no key can describe are refused ------------------------------------------------

class _Settings:
    scale = 2.0


SETTINGS = _Settings()
TABLE_LIST = [1.0, 2.0]


def test_an_object_global_is_refused_with_what_to_pass_instead():
    with pytest.raises(TypeError) as info:
        sharded.compile(lambda x: x * SETTINGS.scale, "transform", (np.float64,), arch=ARCH)
    message = str(info.value)  # refused before numba runs (numba's message quotes this source)
    assert "numba says" not in message
    assert " reads SETTINGS: a test_op_identity._Settings object" in message and "scalar arguments" in message


def test_a_list_is_refused_with_a_tuple_suggested():
    with pytest.raises(TypeError, match=r"reads TABLE_LIST: a list.*use a tuple"):
        sharded.compile(lambda x: x * TABLE_LIST[0], "transform", (np.float64,), arch=ARCH)


def test_a_closure_object_is_refused_by_name():
    settings = _Settings()
    with pytest.raises(TypeError, match=r"reads settings: "):
        sharded.op(lambda x: x * settings.scale).identity()


def test_a_default_that_cannot_be_described_is_refused():
    def scaled(x, settings=_Settings()):
        return x * settings.scale

    with pytest.raises(TypeError, match=r"reads the default of settings"):
        sharded.op(scaled).identity()


def test_numba_types_and_math_are_described():
    from numba import float32

    identity = sharded.op(lambda x: float32(x) + math.pi).identity()
    assert op_module.disk_cacheable(identity)


# ---- captured arrays -----------------------------------------------------------------------

SMALL_TABLE = np.linspace(0.0, 1.0, 64)


def _reads_small_table(x):
    return x * SMALL_TABLE[3]


def test_captured_array_is_hashed_once_per_array(monkeypatch):
    calls = []
    real = hashlib.sha256

    def counting(data=b"", *args, **kwargs):
        if isinstance(data, bytes) and len(data) == SMALL_TABLE.nbytes:
            calls.append(1)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(op_module.hashlib, "sha256", counting)
    made = sharded.op(_reads_small_table)
    identities = {made.identity() for _ in range(5)}
    assert len(identities) == 1 and len(calls) <= 1
    global SMALL_TABLE
    previous = SMALL_TABLE
    SMALL_TABLE = previous * 2.0  # a new array: a new key
    try:
        assert made.identity() not in identities
    finally:
        SMALL_TABLE = previous


def test_captured_array_contents_are_keyed(fresh_cache):
    global SMALL_TABLE
    before = _build(_reads_small_table)
    previous = SMALL_TABLE
    SMALL_TABLE = previous + 1.0
    try:
        _assert_rebuilt(_reads_small_table, before)
    finally:
        SMALL_TABLE = previous


def test_large_captured_array_is_refused_before_it_is_hashed(monkeypatch):
    table = np.zeros(op_module.MAX_CAPTURED_ARRAY_BYTES // 8 + 1)

    real = hashlib.sha256

    def no_hashing(data=b"", *args, **kwargs):
        if len(data) >= table.nbytes:
            raise AssertionError("a refused array was hashed")
        return real(data, *args, **kwargs)

    monkeypatch.setattr(op_module.hashlib, "sha256", no_hashing)
    with pytest.raises(TypeError, match=rf"reads table: a numpy array of {table.nbytes} bytes.*at most|up to"):
        sharded.op(lambda x: x * table[0]).identity()


# ---- errors at decoration --------------------------------------------------------------

def test_generators_and_async_functions_are_not_operators():
    def generator(x):
        yield x

    async def coroutine(x):
        return x

    async def async_generator(x):
        yield x

    with pytest.raises(TypeError, match=r"^op: .*generator is a generator function"):
        sharded.op(generator)
    for function in (coroutine, async_generator):
        with pytest.raises(TypeError, match=r"^op: .* is an async function"):
            sharded.op(function)
    with pytest.raises(TypeError, match=r"^map_op: .*generator function"):
        sharded.compile(lambda a, b: a + b, "reduce", (np.float32,), arch=ARCH, map_op=generator)


def test_no_doubled_prefix_in_operator_errors():
    with pytest.raises(TypeError) as info:
        sharded.compile(abs, "transform", (np.float32,), arch=ARCH)
    assert str(info.value).startswith("op: expected a Python function")
    assert "op: op:" not in str(info.value)


# ---- GPU: the rebuilt kernels compute the changed values -------------------------------------

@pytest.mark.gpu
def test_changed_values_reach_the_results(one_place, fresh_cache, monkeypatch):
    host = np.arange(1, 65, dtype=np.float64)
    a = sharded.ShardedArray.from_numpy(one_place, host)
    np.testing.assert_array_equal(sharded.transform(_uses_point, a).to_numpy(), host * 1.0)
    monkeypatch.setitem(globals(), "POINT", YX(1.0, 2.0))
    np.testing.assert_array_equal(sharded.transform(_uses_point, a).to_numpy(), host * 2.0)
    np.testing.assert_array_equal(sharded.transform(_module_helper, a).to_numpy(), host * 2.0)
    monkeypatch.setattr(device_helpers, "FACTOR", 3.0)
    np.testing.assert_array_equal(sharded.transform(_module_helper, a).to_numpy(), host * 3.0)
    monkeypatch.setitem(globals(), "SMALL_TABLE", SMALL_TABLE + 1.0)
    np.testing.assert_array_equal(sharded.transform(_reads_small_table, a).to_numpy(), host * SMALL_TABLE[3])


# ---- operators made again and again: as_op reuses one only for the same code, globals and
# defaults, and never for a closure ------------------------------------------------------------

def test_a_function_given_new_code_is_rebuilt(fresh_cache):
    def grow(x):
        return x + 1.0

    before = _build(grow)
    grow.__code__ = (lambda x: x * 3.0).__code__
    _assert_rebuilt(grow, before)


def test_a_function_of_code_another_has_since_replaced_gets_that_code(fresh_cache):
    def make():
        def grow(x):
            return x + 1.0

        return grow

    first = make()
    before = _build(first)
    first.__code__ = (lambda x: x * 3.0).__code__  # the operator made for `first` reads it live
    assert _build(make()).cubin == before.cubin  # a new grow: x + 1.0 still


def test_one_code_with_other_globals_is_rebuilt(fresh_cache):
    namespace = {"SCALE": 2.0}
    exec("def scale(x):\n    return x * SCALE\n", namespace)
    before = _build(namespace["scale"])
    _assert_rebuilt(types.FunctionType(namespace["scale"].__code__, {"SCALE": 3.0}, "scale"), before)


@pytest.mark.gpu
def test_operators_made_in_a_loop_give_their_own_results(one_place):
    host = np.arange(1, 65, dtype=np.float64)
    a = sharded.ShardedArray.from_numpy(one_place, host)
    def scaled(factor):
        return lambda x: x * factor

    for factor in (2.0, 5.0):  # one code, another closure each time
        np.testing.assert_array_equal(sharded.transform(scaled(factor), a).to_numpy(), host * factor)
    for _ in range(2):  # one code, no default, no closure: the same operator again
        np.testing.assert_array_equal(sharded.transform(lambda x: x - 1.0, a).to_numpy(), host - 1.0)


BIG_TUPLE = tuple(float(index) for index in range(8000))


def test_a_big_tuple_is_refused_with_an_array_suggested(fresh_cache):
    with pytest.raises(TypeError, match=r"reads BIG_TUPLE: a tuple of 8000 items.*up to 256.*numpy array"):
        sharded.compile(lambda x: x + BIG_TUPLE[int(x) % 8000], "transform", (np.float64,), arch=ARCH)
    table = np.asarray(BIG_TUPLE)
    kernel = sharded.compile(lambda x: x + table[int(x) % 8000], "transform", (np.float64,), arch=ARCH)
    assert kernel.out_dtype == np.float64
