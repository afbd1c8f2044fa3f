"""NumPy ufuncs on scalars inside operators (np.sqrt(x), np.abs(x), np.power(x, y), ...):
each links to SASS for every dtype and NumPy's result type (CPU; float loops are the very
code of their `math` counterparts), gives NumPy's values (GPU), and what still cannot
compile is the documented TypeError naming the operator."""

from __future__ import annotations

import math  # noqa: F401 - the reference operators use it

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _jit, _ufuncs

from conftest import ALL_DTYPES

ARCH = "sm_90"
UNARY = ["sqrt", "exp", "exp2", "expm1", "log1p", "floor", "ceil", "trunc", "rint", "fabs", "absolute",
         "cbrt", "negative", "positive", "sign", "square", "sin", "log", "tanh", "arctan"]
BINARY = ["power", "fmod", "copysign", "nextafter", "add", "subtract", "multiply", "floor_divide",
          "remainder", "maximum", "minimum", "arctan2", "hypot"]
FLOAT_ONLY = {"fmod", "copysign", "nextafter", "fabs", "rint", "cbrt", "exp", "exp2", "expm1", "log1p",
              "sqrt", "sin", "log", "tanh", "arctan", "arctan2", "hypot"}


def _unary(name):
    return eval(f"lambda x: np.{name}(x)")  # noqa: S307 - one operator per ufunc


def _binary(name):
    return eval(f"lambda x, y: np.{name}(x, y)")  # noqa: S307


def test_every_added_loop_is_an_element_type_loop():
    _jit._load_numba()
    assert {"sqrt", "exp", "absolute", "power", "floor"} <= set(_ufuncs.ADDED)
    for name, loops in _ufuncs.ADDED.items():
        for loop in loops:
            inputs, output = loop.split("->")
            assert set(inputs) <= set("iIlLqQfd") and set(output) <= set("iIlLqQfd?"), (name, loop)


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda dtype: np.dtype(dtype).name)
def test_unary_ufuncs_link_for_every_dtype(fresh_cache, name, dtype):
    kernel = sharded.compile(_unary(name), "transform", (dtype,), arch=ARCH)
    with np.errstate(all="ignore"):
        expected = getattr(np, name)(np.ones(1, dtype)).dtype
    assert kernel.out_dtype == expected and kernel.cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda dtype: np.dtype(dtype).name)
def test_binary_ufuncs_link_for_every_dtype(fresh_cache, name, dtype):
    if name == "fmod" and np.dtype(dtype).kind != "f":
        pytest.skip("integer fmod is not supported (see test_unsupported_loop_is_a_type_error)")
    kernel = sharded.compile(_binary(name), "transform", (dtype, dtype), arch=ARCH)
    assert kernel.out_dtype == getattr(np, name)(np.ones(1, dtype), np.ones(1, dtype)).dtype
    assert kernel.cubin[:4] == b"\x7fELF"


# NumPy's float loops compile to the very code of their math counterparts (libdevice)
SAME_AS_MATH = [("sqrt", "sqrt", 1), ("exp", "exp", 1), ("exp2", "exp2", 1), ("expm1", "expm1", 1),
                ("log1p", "log1p", 1), ("fabs", "fabs", 1), ("power", "pow", 2), ("fmod", "fmod", 2),
                ("copysign", "copysign", 2)]


@pytest.mark.parametrize("name, math_name, arity", SAME_AS_MATH)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_float_loops_are_the_math_functions(fresh_cache, name, math_name, arity, dtype):
    names = ", ".join("xy"[:arity])
    ours = sharded.compile(eval(f"lambda {names}: np.{name}({names})"), "transform", (dtype,) * arity, arch=ARCH)  # noqa: S307
    reference = sharded.compile(eval(f"lambda {names}: math.{math_name}({names})"), "transform",  # noqa: S307
                                (dtype,) * arity, arch=ARCH)
    assert ours.out_dtype == reference.out_dtype == np.dtype(dtype)
    assert ours.cubin == reference.cubin


def test_unsupported_loop_is_a_type_error_naming_the_operator(fresh_cache):
    def remainder_of(x, y):
        return np.fmod(x, y)

    with pytest.raises(TypeError, match=r"operator .*remainder_of cannot be compiled for argument types "
                                        r"\(int32, int32\)"):
        sharded.compile(remainder_of, "transform", (np.int32, np.int32), arch=ARCH)


def test_numpy_math_in_reductions(fresh_cache):
    kernel = sharded.compile(lambda a, b: np.maximum(np.abs(a), np.abs(b)), "reduce", (np.float32,), arch=ARCH)
    assert kernel.out_dtype == np.float32 and kernel.cubin[:4] == b"\x7fELF"


def _inputs(dtype, name, second: bool = False):
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(7 + second)
    if dtype.kind == "f":
        values = rng.uniform(0.1 if name in ("sqrt", "log", "log1p", "power", "cbrt") else -4.0, 4.0, 4096)
        if second and name in ("power",):
            values = rng.uniform(-2.0, 2.0, 4096)
    elif dtype.kind == "u":
        values = rng.integers(1, 9 if name == "power" else 1000, 4096)
    else:
        values = rng.integers(1 if second else -1000, 9 if name == "power" else 1000, 4096)
        if name == "power":
            values = np.abs(values) if second else values % 9 - 4
    return values.astype(dtype)


def _check(result, expected):
    if expected.dtype.kind == "f":
        eps = np.finfo(expected.dtype).eps  # libdevice and NumPy may differ by a few ulp
        np.testing.assert_allclose(result, expected, rtol=8 * eps, atol=8 * eps)
    else:
        np.testing.assert_array_equal(result, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda dtype: np.dtype(dtype).name)
def test_unary_ufunc_values(one_place, name, dtype):
    host = _inputs(dtype, name)
    result = sharded.transform(_unary(name), sharded.ShardedArray.from_numpy(one_place, host)).to_numpy()
    with np.errstate(all="ignore"):
        _check(result, getattr(np, name)(host))


@pytest.mark.gpu
@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda dtype: np.dtype(dtype).name)
def test_binary_ufunc_values(one_place, name, dtype):
    if name == "fmod" and np.dtype(dtype).kind != "f":
        pytest.skip("integer fmod is not supported")
    first, second = _inputs(dtype, name), _inputs(dtype, name, second=True)
    arrays = [sharded.ShardedArray.from_numpy(one_place, values) for values in (first, second)]
    result = sharded.transform(_binary(name), *arrays).to_numpy()
    with np.errstate(all="ignore"):
        _check(result, getattr(np, name)(first, second))
