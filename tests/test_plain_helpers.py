"""Plain Python functions an operator calls are compiled as device functions with it: reached
by name, through a closure or a module attribute, recursively; a changed helper is a new
kernel. The compile tests need no GPU (sm_90 SASS); the gpu test checks values against numpy."""

from __future__ import annotations

import types

import numpy as np
import pytest

import cuda_sharded_jit as sharded

ARCH = "sm_90"


def scale(v, factor):
    return v * factor


def shifted_scale(v):
    return scale(v, 3.0) + 1.0  # a helper calling a helper


def _build(function, dtypes=(np.float32,)):
    return sharded.compile(function, "transform", dtypes, arch=ARCH)


def test_a_plain_global_helper_compiles_and_is_inlined(fresh_cache):
    """The helper's multiply lands in the kernel as the operator's own would: no call left."""
    sass = _build(lambda v: scale(v, np.float32(3.0))).sass()
    direct = _build(lambda v: v * np.float32(3.0)).sass()
    multiplies = [line.split("*/")[1].split(";")[0].strip() for line in sass.splitlines() if "FMUL" in line]
    assert "CALL" not in sass
    assert multiplies == [line.split("*/")[1].split(";")[0].strip() for line in direct.splitlines()
                          if "FMUL" in line]
    assert len(multiplies) == 4  # the four elements of a vectorised load


def test_helpers_call_helpers(fresh_cache):
    assert len(_build(lambda v: shifted_scale(v)).cubin) > 0


def test_a_helper_in_a_closure_cell_compiles(fresh_cache):
    def make(helper):
        return lambda v: helper(v) * 2.0

    assert len(_build(make(lambda x: x + 1.0)).cubin) > 0


def test_a_helper_reached_through_a_module_compiles(fresh_cache):
    helpers = types.ModuleType("user_helpers")
    exec("def halve(x):\n    return x * 0.5\n", helpers.__dict__)

    def operator(v):
        return helpers.halve(v)

    assert len(_build(operator).cubin) > 0


def test_a_changed_helper_is_another_kernel(fresh_cache, monkeypatch):
    def operator(v):
        return scale(v, 2.0)

    before = _build(operator)
    monkeypatch.setitem(globals(), "scale", lambda v, factor: v * factor + 1.0)
    after = _build(operator)
    assert after.cache_key != before.cache_key and after.cubin != before.cubin


def test_an_untypable_helper_names_the_operator(fresh_cache):
    def bad(x):
        return x.no_such_attribute

    with pytest.raises(TypeError, match="operator"):
        _build(lambda v: bad(v))


@pytest.mark.gpu
def test_plain_helpers_give_the_values(one_place):
    host = np.arange(1000, dtype=np.float32)
    a = sharded.ShardedArray.from_numpy(one_place, host)
    np.testing.assert_allclose(sharded.transform(lambda v: shifted_scale(v), a).to_numpy(), host * 3.0 + 1.0)
