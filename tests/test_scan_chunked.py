"""GPU tests of the scan in L2-resident chunks (shim/src/reduce.cpp, scan_in_chunks), which the
temporary switches CSJ_X_SCAN, CSJ_X_SCAN_CHUNK_MIB and CSJ_X_SCAN_STREAMING select for
single-place scans. The shim reads them on every scan, so each test sets them with
monkeypatch. Integers must match numpy and the base scan exactly; floating point must be close
to numpy and bitwise equal run to run; non-commutative operators must follow the sequential
answer."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import sample
from test_records import AFFINE, MODULUS, XYZ, compose, compose_reference, random_records
from test_reduce import _matmul_packed, _matrices

pytestmark = pytest.mark.gpu

# CSJ_X_SCAN values; "/streaming" adds CSJ_X_SCAN_STREAMING=1 (evict-first loads and stores)
VARIANTS = ["chunked", "fused", "chunked-pdl", "fused-pdl", "persistent", "chunked/streaming", "fused-pdl/streaming",
            "persistent/streaming"]
# MiB of input per chunk: far less than a scan tile (so one tile a chunk, hundreds of chunks),
# a few tiles that do not divide the sizes below, and one chunk bigger than most inputs here.
CHUNKS = ["0.001", "0.05", "1"]
SIZES = [1, 4095, 4097, 1_000_003]


@pytest.fixture
def scan_variant(monkeypatch):
    """Sets the scan variant and chunk size for the scans that follow (None: unset, the base)."""

    def choose(variant, chunk_mib=None):
        streaming = None
        if variant is not None and variant.endswith("/streaming"):
            variant, streaming = variant.split("/")[0], "1"
        for name, value in (("CSJ_X_SCAN", variant), ("CSJ_X_SCAN_CHUNK_MIB", chunk_mib),
                            ("CSJ_X_SCAN_STREAMING", streaming)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)

    return choose


def _running(values, op):
    out = []
    acc = None
    for value in values:
        acc = value if acc is None else op(acc, value)
        out.append(acc)
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("chunk_mib", CHUNKS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n", SIZES)
def test_integers_exact_and_equal_to_base(one_place, scan_variant, variant, chunk_mib, dtype, n):
    host = sample(dtype, n, seed=n)
    array = sharded.ShardedArray.from_numpy(one_place, host)
    scan_variant("base")
    base_inclusive = sharded.inclusive_scan(array, lambda x, y: x + y).to_numpy()
    base_exclusive = sharded.exclusive_scan(array, "sum", 7).to_numpy()
    scan_variant(variant, chunk_mib)
    inclusive = sharded.inclusive_scan(array, lambda x, y: x + y).to_numpy()
    exclusive = sharded.exclusive_scan(array, "sum", 7).to_numpy()
    np.testing.assert_array_equal(inclusive, np.cumsum(host, dtype=dtype))
    np.testing.assert_array_equal(exclusive, np.concatenate([[7], 7 + np.cumsum(host[:-1], dtype=dtype)]).astype(dtype))
    np.testing.assert_array_equal(inclusive, base_inclusive)
    np.testing.assert_array_equal(exclusive, base_exclusive)
    # a seeded inclusive scan and a running maximum (built-in): the seed goes in once, first
    seeded = sharded.inclusive_scan(array, lambda x, y: x + y, init=dtype(-3)).to_numpy()
    np.testing.assert_array_equal(seeded, (-3 + np.cumsum(host, dtype=np.int64)).astype(dtype))
    np.testing.assert_array_equal(sharded.inclusive_scan(array, "max").to_numpy(), np.maximum.accumulate(host))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("chunk_mib", CHUNKS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_floats_close_and_deterministic(one_place, scan_variant, variant, chunk_mib, dtype):
    host = sample(dtype, 1_000_003, seed=5)
    array = sharded.ShardedArray.from_numpy(one_place, host)
    scan_variant(variant, chunk_mib)
    for scan in (lambda: sharded.inclusive_scan(array, lambda x, y: x + y),
                 lambda: sharded.inclusive_scan(array, "sum"),
                 lambda: sharded.exclusive_scan(array, lambda x, y: x + y, 0.5)):
        first = scan().to_numpy()
        second = scan().to_numpy()
        assert first.tobytes() == second.tobytes()
    inclusive = sharded.inclusive_scan(array, "sum").to_numpy()
    np.testing.assert_allclose(inclusive, np.cumsum(host.astype(np.float64)), rtol=1e-3, atol=1e-2)
    exclusive = sharded.exclusive_scan(array, lambda x, y: x + y, 0.5).to_numpy()
    expected = np.concatenate([[0.5], 0.5 + np.cumsum(host.astype(np.float64))[:-1]])
    np.testing.assert_allclose(exclusive, expected, rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("chunk_mib", CHUNKS)
def test_non_commutative_operator_follows_order(one_place, scan_variant, variant, chunk_mib):
    host = _matrices(30_011, seed=13)  # 2x2 matrices of 16-bit entries packed in an int64
    array = sharded.ShardedArray.from_numpy(one_place, host)
    scan_variant(variant, chunk_mib)
    expected = _running([int(v) for v in host], _matmul_packed)
    assert sharded.inclusive_scan(array, _matmul_packed).to_numpy().tolist() == expected
    # exclusive with the identity matrix as init: the inclusive answer shifted by one
    identity = np.int64(1 | (1 << 48))
    exclusive = sharded.exclusive_scan(array, _matmul_packed, identity).to_numpy().tolist()
    assert exclusive == [int(identity)] + expected[:-1]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("chunk_mib", CHUNKS)
def test_records(one_place, scan_variant, variant, chunk_mib):
    """Affine maps (16-byte records, not commutative) and 12-byte records, whose fold walks
    4-byte stand-ins from the chunk's first record (reduce_jit.cu)."""
    scan_variant(variant, chunk_mib)
    rng = np.random.default_rng(17)
    maps_host = np.zeros(20_011, AFFINE)
    maps_host["scale"] = rng.integers(1, MODULUS, maps_host.size)
    maps_host["shift"] = rng.integers(0, MODULUS, maps_host.size)
    maps = sharded.ShardedArray.from_numpy(one_place, maps_host)
    np.testing.assert_array_equal(sharded.inclusive_scan(maps, compose).to_numpy(), compose_reference(maps_host))
    seeded = compose_reference(maps_host, init=(3, 5))
    exclusive = sharded.exclusive_scan(maps, compose, (3, 5)).to_numpy()
    assert tuple(exclusive[0]) == (3, 5)
    np.testing.assert_array_equal(exclusive[1:], seeded[:-1])

    points_host = random_records(XYZ, 30_001, seed=18)
    points = sharded.ShardedArray.from_numpy(one_place, points_host)
    result = sharded.inclusive_scan(points, lambda p, q: (p.x + q.x, p.y + q.y, q.z)).to_numpy()
    for name in ("x", "y"):  # exact: floats on a 1/8 grid
        np.testing.assert_array_equal(result[name], np.cumsum(points_host[name], dtype=np.float64).astype(np.float32))
    np.testing.assert_array_equal(result["z"], points_host["z"])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("chunk_mib", ["0.001", "0.05"])
def test_in_place_and_mapped(one_place, scan_variant, variant, chunk_mib):
    scan_variant(variant, chunk_mib)
    host = sample(np.int64, 250_007, seed=19)
    array = sharded.ShardedArray.from_numpy(one_place, host)
    same = sharded.inclusive_scan(array, lambda x, y: x + y, out=array)
    assert same is array
    np.testing.assert_array_equal(array.to_numpy(), np.cumsum(host))
    again = sharded.ShardedArray.from_numpy(one_place, host)
    sharded.exclusive_scan(again, "sum", 0, out=again)
    np.testing.assert_array_equal(again.to_numpy(), np.concatenate([[0], np.cumsum(host)[:-1]]))
    # a map from int32 to int64 that uses the global index: input and output words differ in
    # size, and each chunk's index base is its first element's
    small = sample(np.int32, 100_003, seed=20)
    mapped = sharded.transform_inclusive_scan(sharded.ShardedArray.from_numpy(one_place, small),
                                              lambda x, i: np.int64(x) * 2 + i, "sum",
                                              with_index=True).to_numpy()
    np.testing.assert_array_equal(mapped, np.cumsum(small.astype(np.int64) * 2 + np.arange(small.size)))


def test_several_places_keep_the_base_scan(three_places, scan_variant):
    """The switches apply to one place; several places still scan exactly (the base path)."""
    scan_variant("fused-pdl", "0.001")
    host = sample(np.int64, 300_007, seed=21)
    array = sharded.ShardedArray.from_numpy(three_places, host)
    np.testing.assert_array_equal(sharded.inclusive_scan(array, "sum").to_numpy(), np.cumsum(host))


def test_unknown_switch_values_mean_the_defaults(one_place, scan_variant):
    scan_variant("no-such-variant", "not-a-number")
    host = sample(np.float32, 100_003, seed=22)
    array = sharded.ShardedArray.from_numpy(one_place, host)
    unknown = sharded.inclusive_scan(array, "sum").to_numpy()
    scan_variant(None)
    assert unknown.tobytes() == sharded.inclusive_scan(array, "sum").to_numpy().tobytes()
