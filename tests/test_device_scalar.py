"""DeviceScalar and reductions into it: reduce(a, op, init, out=s) writes, on every place,
bit for bit what reduce(a, op, init) returns for the same accumulator (against the eager
call and numpy), with nothing waited for; and the errors, before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim

from conftest import ALL_DTYPES, sample, uneven
from test_errors import shim_untouched, stand_in_array, stand_in_group  # noqa: F401 - a fixture

gpu = pytest.mark.gpu


def _copies(s: sharded.DeviceScalar) -> np.ndarray:
    """Every place's copy, in place order."""
    return s._array.to_numpy()


@gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reduce_into_matches_the_eager_reduce_bit_for_bit(places, dtype):
    host = sample(dtype, 300_001, seed=3)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size))
    for op, init in ((lambda x, y: x + y, dtype(0)), ("sum", None), ("max", None),
                     (lambda x, y: x if x < y else y, None)):
        s = sharded.DeviceScalar(places, dtype)
        assert sharded.reduce(a, op, init, out=s) is s
        eager = sharded.reduce(a, op, init)
        copies = _copies(s)
        assert copies.tobytes() == np.full(len(places), eager, dtype).tobytes()
        assert s.value.tobytes() == np.asarray(eager, dtype).tobytes()
    if np.dtype(dtype).kind in "iu":  # exact: numpy's own answer too
        s = sharded.DeviceScalar(places, dtype)
        sharded.reduce(a, "sum", out=s)
        assert s.value == host.sum(dtype=dtype)


@gpu
@pytest.mark.parametrize("sizes", [[0, 50_001, 0], [0, 0, 50_001]])
def test_reduce_into_when_one_place_other_than_the_first_holds_the_elements(sizes):
    """The fold on the one non-empty place writes its own copy; every other place's copy,
    place 0's included, is copied from it, and a transform reading s sees it on every place."""
    places = sharded.PlaceGroup.by_devices([0, 0, 0])
    host = sample(np.float64, sum(sizes), seed=9)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    s = sharded.DeviceScalar(places, np.float64, value=-1.0)
    sharded.reduce(a, lambda x, y: x + y, 0.0, out=s)
    eager = sharded.reduce(a, lambda x, y: x + y, 0.0)
    assert _copies(s).tobytes() == np.full(3, eager).tobytes()
    np.testing.assert_allclose(eager, host.sum(), rtol=1e-12)
    ones = sharded.ShardedArray.from_numpy(places, np.ones(9), sizes=[3, 3, 3])
    np.testing.assert_array_equal(sharded.transform(lambda x, c: x * c, ones, s).to_numpy(), np.full(9, eager))


@gpu
def test_reduce_into_accumulates_in_the_scalar_s_dtype(places):
    host = sample(np.float32, 100_003, seed=5)
    a = sharded.ShardedArray.from_numpy(places, host)
    s = sharded.DeviceScalar(places, np.float64, value=7.0)
    sharded.reduce(a, lambda x, y: x + y, 0.0, out=s)
    eager = sharded.reduce(a, lambda x, y: x + y, np.float64(0))
    assert isinstance(eager, np.float64)
    assert _copies(s).tobytes() == np.full(len(places), eager).tobytes()
    np.testing.assert_allclose(float(s), host.astype(np.float64).sum(), rtol=1e-12)
    sharded.reduce(a, "max", out=s)  # a float64 max of float32 elements: through the JIT
    assert s.value == np.float64(host.max())


@gpu
def test_reduce_into_of_an_empty_array(places):
    a = sharded.ShardedArray.from_numpy(places, np.zeros(0, np.int64))
    s = sharded.DeviceScalar(places, np.int64, value=5)
    sharded.reduce(a, lambda x, y: x + y, np.int64(-3), out=s)
    assert _copies(s).tolist() == [-3] * len(places)
    sharded.reduce(a, "sum", out=s)
    assert _copies(s).tolist() == [0] * len(places)
    with pytest.raises(ValueError, match="empty and no init"):
        sharded.reduce(a, lambda x, y: x + y, out=s)
    assert _copies(s).tolist() == [0] * len(places)  # left as it was


@gpu
def test_device_scalar_reads_back_and_prints(one_place):
    s = sharded.DeviceScalar(one_place, np.float32, value=1.5)
    assert s.dtype == np.float32 and s.group is one_place
    assert float(s) == 1.5 and int(sharded.DeviceScalar(one_place, np.int32, value=9)) == 9
    assert repr(s) == "DeviceScalar(np.float32(1.5), on 1 place(s))"


def test_out_must_be_a_device_scalar_of_a_s_group(shim_untouched):
    group = stand_in_group()
    a = stand_in_array(group)
    with pytest.raises(TypeError, match="out: expected a sharded.DeviceScalar, got float"):
        sharded.reduce(a, "sum", out=0.0)
    with pytest.raises(TypeError, match="out: expected a sharded.DeviceScalar, got ShardedArray"):
        sharded.reduce(a, lambda x, y: x + y, 0.0, out=stand_in_array(group))


def test_device_scalar_rejects_bad_arguments(shim_untouched, monkeypatch):
    allocated = []
    monkeypatch.setattr(_shim.ShardedArray, "allocate", lambda *args, **kwargs: allocated.append(args))
    group = stand_in_group()
    with pytest.raises(TypeError, match="group: expected a PlaceGroup, got str"):
        sharded.DeviceScalar("cuda:0", np.float64)
    with pytest.raises(TypeError, match="unsupported dtype"):
        sharded.DeviceScalar(group, np.float16)
    with pytest.raises(TypeError, match="a DeviceScalar holds one number, not a record"):
        sharded.DeviceScalar(group, np.dtype([("x", np.float32), ("y", np.float32)]))
    with pytest.raises(TypeError, match="value: expected a real number, got str"):
        sharded.DeviceScalar(group, np.float64, value="one")
    with pytest.raises(ValueError, match="value: 1.5 does not fit int64"):
        sharded.DeviceScalar(group, np.int64, value=1.5)
    with pytest.raises(ValueError, match="value: -1 does not fit uint32"):
        sharded.DeviceScalar(group, np.uint32, value=-1)
    assert allocated == []  # every error came before any memory


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_transform_reads_a_device_scalar_on_every_place(places, dtype):
    host = sample(dtype, 100_001, seed=8)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size))
    s = sharded.DeviceScalar(places, dtype)
    sharded.reduce(a, "max", out=s)  # written on the device, read there by the next kernel
    scaled = sharded.transform(lambda x, m: x - m, a, s)
    np.testing.assert_array_equal(scaled.to_numpy(), host - host.max())
    # the same kernel as a host scalar of the same dtype, and the same bits
    np.testing.assert_array_equal(scaled.to_numpy(), sharded.transform(lambda x, m: x - m, a, s.value).to_numpy())
    mixed = sharded.transform(lambda x, m, k: (x - m) * k, a, s, dtype(3), out=a)  # host and device scalars
    assert mixed is a  # (no multiply-add to fuse: numpy's rounding)
    np.testing.assert_array_equal(a.to_numpy(), (host - host.max()) * dtype(3))


@gpu
def test_one_iteration_of_a_solver_stays_on_the_device(three_places):
    """x += alpha p, r -= alpha A p with alpha = (r.r) / (p.Ap), A diagonal: the dots into
    DeviceScalars, the ratio and the axpys read them on the device; against numpy."""
    rng = np.random.default_rng(12)
    n = 50_003
    diagonal, r_host, p_host = rng.uniform(1, 2, n), rng.standard_normal(n), rng.standard_normal(n)
    d, r, p = (sharded.ShardedArray.from_numpy(three_places, v) for v in (diagonal, r_host, p_host))
    x = sharded.zeros(three_places, n, np.float64)
    rr, pap = sharded.DeviceScalar(three_places, np.float64), sharded.DeviceScalar(three_places, np.float64)
    add = lambda u, v: u + v  # noqa: E731
    sharded.reduce(sharded.transform(lambda u: u * u, r), add, 0.0, out=rr)
    ap = sharded.transform(lambda di, pi: di * pi, d, p)
    sharded.reduce(sharded.transform(lambda pi, api: pi * api, p, ap), add, 0.0, out=pap)
    sharded.transform(lambda xi, pi, a, b: xi + (a / b) * pi, x, p, rr, pap, out=x)
    sharded.transform(lambda ri, api, a, b: ri - (a / b) * api, r, ap, rr, pap, out=r)
    alpha = float(rr) / float(pap)
    np.testing.assert_allclose(float(rr), r_host @ r_host, rtol=1e-12)
    np.testing.assert_allclose(x.to_numpy(), alpha * p_host, rtol=1e-12)
    np.testing.assert_allclose(r.to_numpy(), r_host - alpha * diagonal * p_host, rtol=1e-12, atol=1e-14)


@gpu
def test_a_device_scalar_of_another_group_is_refused(one_place, three_places):
    a = sharded.ShardedArray.from_numpy(three_places, np.arange(10, dtype=np.float32))
    s = sharded.DeviceScalar(one_place, np.float32)
    with pytest.raises(ValueError, match=r"args\[1\]: a DeviceScalar of another PlaceGroup"):
        sharded.transform(lambda x, m: x - m, a, s)
    with pytest.raises(ValueError, match="out: belongs to another PlaceGroup than a"):
        sharded.reduce(a, "sum", out=s)
