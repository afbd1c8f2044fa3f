"""`sharded.compile` and the operators it takes: every bad input is the documented
exception naming the argument, raised before anything compiles; cache hits report
themselves honestly. None of these needs a GPU."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _link, _shim, compiler

from conftest import DEVICE_COUNT

ARCH = "sm_90"


@pytest.fixture
def no_compiles(monkeypatch):
    """Fails the test if anything reaches the compiler."""

    def refuse(*args, **kwargs):
        raise AssertionError("compiled although the input was invalid")

    monkeypatch.setattr(compiler, "_build", refuse)


@pytest.mark.parametrize("arch", ["sm_99", "sm_1000", "sm_000", "sm_\u0669\u0660", "sm_9", "90", "sm_90 ", None])
def test_bad_arch_strings(no_compiles, arch):
    if arch is None:
        pytest.skip("None means device 0's architecture")
    with pytest.raises(ValueError, match=r"^arch: "):
        sharded.compile(lambda x: x, "transform", (np.float32,), arch=arch)


def test_arch_the_toolchain_does_not_know_names_what_it_does(no_compiles):
    with pytest.raises(ValueError, match=r"arch: sm_99 is not an architecture this toolchain builds for "
                                         r"\(it knows .*sm_90"):
        sharded.compile(lambda x: x, "transform", (np.float32,), arch="sm_99")


def test_arch_older_than_the_build_is_refused_before_numba_runs(no_compiles):
    with pytest.raises(ValueError, match=r"sm_75 is older than every architecture"):
        sharded.compile(lambda x: x, "transform", (np.float32,), arch="sm_75")


def test_too_many_arrays(no_compiles):
    count = _shim.MAX_TRANSFORM_INPUTS + 1
    names = ", ".join(f"x{index}" for index in range(count))
    op = eval(f"lambda {names}: x0")  # noqa: S307 - an operator of `count` parameters
    with pytest.raises(ValueError, match=rf"dtypes: a transform takes at most {count - 1} array arguments, got {count}"):
        sharded.compile(op, "transform", (np.float32,) * count, arch=ARCH)


def test_too_many_scalars(no_compiles):
    count = _shim.MAX_TRANSFORM_SCALARS + 1
    names = ", ".join(f"s{index}" for index in range(count))
    op = eval(f"lambda x, {names}: x")  # noqa: S307
    with pytest.raises(ValueError, match=rf"scalars: a transform takes at most {count - 1} runtime scalars"):
        sharded.compile(op, "transform", (np.float32,) + (np.float64,) * count, arch=ARCH,
                        scalars=tuple(range(1, count + 1)))


@pytest.mark.parametrize("scalars, error, message", [
    ((1.0,), TypeError, r"scalars\[0\]: expected an int position, got float"),
    ((True,), TypeError, r"scalars\[0\]: expected an int position, got bool"),
    (1, TypeError, r"scalars: expected a tuple of argument positions, got int"),
    ("1", TypeError, r"scalars: expected a tuple of argument positions, got str"),
    ((5,), ValueError, r"scalars: position 5 is not an argument position"),
    ((-1,), ValueError, r"scalars: position -1 is not an argument position"),
])
def test_bad_scalar_positions(no_compiles, scalars, error, message):
    with pytest.raises(error, match=message):
        sharded.compile(lambda x, a: x * a, "transform", (np.float32, np.float32), arch=ARCH, scalars=scalars)


@pytest.mark.parametrize("dtypes, message", [
    ((None,), r"dtypes\[0\]: expected a dtype .*got None"),
    ((np.float32, None), r"dtypes\[1\]: expected a dtype"),
    (3, r"dtypes: expected a dtype or a tuple of dtypes, got int"),
])
def test_bad_dtypes(no_compiles, dtypes, message):
    arity = len(dtypes) if isinstance(dtypes, tuple) else 1
    op = (lambda x: x) if arity == 1 else (lambda x, y: x)
    with pytest.raises(TypeError, match=message):
        sharded.compile(op, "transform", dtypes, arch=ARCH)


def test_out_dtype_none_is_the_default_and_a_bad_one_is_named(no_compiles):
    with pytest.raises(TypeError, match=r"out_dtype: "):
        sharded.compile(lambda x: x, "transform", (np.float32,), arch=ARCH, out_dtype="float16")


def test_numpy_bools_are_flags_and_other_values_are_named():
    kernel = sharded.compile(lambda x, i: x + i, "transform", (np.float64,), arch=ARCH, with_index=np.bool_(True))
    assert kernel.out_dtype == np.float64
    with pytest.raises(TypeError, match=r"with_index: expected True or False, got int$"):
        sharded.compile(lambda x: x, "transform", (np.float32,), arch=ARCH, with_index=1)
    with pytest.raises(TypeError, match=r"with_index: expected True or False, got numpy.int64"):
        sharded.compile(lambda x: x, "transform", (np.float32,), arch=ARCH, with_index=np.int64(0))


def test_an_operator_that_always_raises_is_said_to_return_nothing(fresh_cache):
    def failing(x):
        raise ValueError("never")

    with pytest.raises(TypeError, match=r"operator .*failing returns no value for argument types \(float32\): "
                                        r"every path through it returns None, raises"):
        sharded.compile(failing, "transform", (np.float32,), arch=ARCH)
    with pytest.raises(TypeError, match=r"returns no value"):
        sharded.compile(failing, "transform", (np.float32,), arch=ARCH, out_dtype=np.float32)


def test_an_operator_without_return_is_said_to_return_nothing(fresh_cache):
    def forgetful(a, b):
        a + b  # noqa: B018 - the missing return is the point

    with pytest.raises(TypeError, match=r"forgetful returns no value"):
        sharded.compile(forgetful, "reduce", (np.int64,), arch=ARCH)


@pytest.mark.skipif(DEVICE_COUNT > 0, reason="a GPU is visible: arch=None takes its architecture")
def test_arch_none_without_a_gpu_says_what_to_pass(no_compiles):
    with pytest.raises(RuntimeError, match=r"arch: no GPU .*pass arch='sm_90'"):
        sharded.compile(lambda x: x, "transform", (np.float32,))


def test_memory_hit_reports_its_own_time(fresh_cache, monkeypatch):
    op = sharded.op(lambda x: x * 17 + 1)
    first = sharded.compile(op, "transform", (np.int64,), arch=ARCH)
    again = sharded.compile(op, "transform", (np.int64,), arch=ARCH)
    assert again.cache_hit and not first.cache_hit
    assert again.compile_seconds < first.compile_seconds / 10


def test_a_thread_that_waited_for_the_build_reports_a_hit(fresh_cache, monkeypatch):
    started, release = threading.Event(), threading.Event()
    real_link = _link.link

    def slow_link(*args, **kwargs):
        started.set()
        assert release.wait(60)
        return real_link(*args, **kwargs)

    monkeypatch.setattr(_link, "link", slow_link)
    op = sharded.op(lambda x, y: x * y - 3)
    results = {}

    def compile_in(name):
        results[name] = sharded.compile(op, "transform", (np.int32, np.int32), arch=ARCH)

    builder = threading.Thread(target=compile_in, args=("builder",))
    builder.start()
    assert started.wait(60)
    waiter = threading.Thread(target=compile_in, args=("waiter",))
    waiter.start()
    waiter.join(0.5)  # it is waiting for the build
    release.set()
    builder.join(60)
    waiter.join(60)
    assert not results["builder"].cache_hit and results["waiter"].cache_hit
    assert results["waiter"].cubin == results["builder"].cubin


def test_keys_and_links_run_outside_the_compile_lock(fresh_cache, monkeypatch):
    """One operator's slow link (or slow key work) does not hold up another's compile."""
    from cuda_sharded_jit import _jit

    _jit._load_numba()
    started, release = threading.Event(), threading.Event()
    real_link = _link.link
    slow_module = {}

    def slow_link(module, ltoirs, arch):
        if slow_module.get("name") is None:
            slow_module["name"] = module
        if module == slow_module["name"]:
            started.set()
            assert release.wait(120)
        return real_link(module, ltoirs, arch)

    monkeypatch.setattr(_link, "link", slow_link)
    slow = threading.Thread(target=lambda: sharded.compile(lambda x: x * 2.5, "transform", (np.float64,),
                                                           arch=ARCH))
    slow.start()
    try:
        assert started.wait(120)
        # while the first compile links, another compiles and links (another module)
        other = sharded.compile(lambda x: x + 1, "transform", (np.int32,), arch=ARCH)
        assert other.cubin and not other.cache_hit
        # and key work never takes numba's lock: it runs while another thread holds it
        held, done = threading.Event(), threading.Event()

        def hold_lock():
            with _jit._compile_lock:
                held.set()
                done.wait(60)

        holder = threading.Thread(target=hold_lock)
        holder.start()
        assert held.wait(60)
        try:
            finished = threading.Event()
            worker = threading.Thread(target=lambda: (sharded.op(lambda x: x * _BIG[7]).identity(),
                                                      sharded.compile(lambda x: x + 1, "transform", (np.int32,),
                                                                      arch=ARCH), finished.set()))
            worker.start()
            worker.join(30)
            assert finished.is_set(), "a cache hit or key computation waited for numba's lock"
        finally:
            done.set()
            holder.join(60)
    finally:
        release.set()
        slow.join(120)


_BIG = tuple(float(index) for index in range(256))
