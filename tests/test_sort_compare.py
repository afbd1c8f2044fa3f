"""The sort with a user comparator (a JIT merge sort) against numpy's stable sorts: stability,
keys, descending order, records, every dtype, 1 to 4 places, uneven and empty shards. CPU
tests: the compile down to SASS, its cache, errors before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim, compiler
from cuda_sharded_jit._dtypes import RECORD_SIZES
from cuda_sharded_jit.algorithms.merge_sort import compare_sort
from cuda_sharded_jit.compiler import MERGE_SORT_SIZES

from conftest import ALL_DTYPES, sample, uneven
from test_errors import shim_untouched, stand_in_array, stand_in_group  # noqa: F401 (fixture)

ARCH = "sm_90"
POINT = np.dtype([("x", np.float32), ("y", np.int32)], align=True)                         # 8 bytes
XYZ = np.dtype([("x", np.float32), ("y", np.float32), ("z", np.int32)], align=True)        # 12
SAMPLE = np.dtype([("value", np.float64), ("count", np.int32)], align=True)               # 16
MIXED = np.dtype([("a", np.int32), ("b", np.float64), ("c", np.uint32)], align=True)       # 24
WIDE = np.dtype([("a", np.float64), ("b", np.int64), ("c", np.int32), ("d", np.uint64)], align=True)  # 32
SINGLE = np.dtype([("v", np.int32)], align=True)                                          # 4
RECORDS = [SINGLE, POINT, XYZ, SAMPLE, MIXED, WIDE]

# larger than several tiles of every element size (4096 8-byte elements; 4-byte ones: merge
# tiles of 4352, block-sort tiles of 8704), and no multiple of any: several merge passes, a
# partial last tile
LARGE = 300_007


def sort_with(a, compare, key=None, descending=False, out=None):
    """The call under test: the public sort, which routes compare= to compare_sort."""
    return sharded.sort(a, key=key, compare=compare, descending=descending, out=out)


def by_abs(x, y):
    return abs(x) < abs(y)


def less(x, y):
    return x < y


def stable_order(keys: np.ndarray, descending: bool = False) -> np.ndarray:
    """The stable order of `keys` (numbers, or a structured array compared field by field),
    descending as sorted(reverse=True) is: equal keys keep their order either way."""
    _, ranks = np.unique(keys, return_inverse=True)
    ranks = ranks.reshape(-1).astype(np.int64)
    return np.argsort(-ranks if descending else ranks, kind="stable")


def with_ties(dtype, n, seed=0):
    """Values of `dtype` with many repeats (and equal magnitudes of both signs)."""
    values = sample(dtype, n, seed)
    if np.dtype(dtype).kind == "f":
        values = (np.round(values * 8) / 8).astype(dtype)
    return values


def records(dtype, n, seed=0):
    """Records whose fields repeat often (so that sorts by one field have ties)."""
    rng = np.random.default_rng(seed)
    host = np.zeros(n, dtype)
    for name in dtype.names:
        field = dtype.fields[name][0]
        if field.kind == "f":
            host[name] = rng.integers(-40, 40, n) / 4
        elif field.kind == "u":
            host[name] = rng.integers(0, 50, n)
        else:
            host[name] = rng.integers(-50, 50, n)
    return host


def sharded_array(group, host, sizes=None, contiguous=False):
    return sharded.ShardedArray.from_numpy(group, host, sizes=sizes, contiguous=contiguous)


# ---- GPU: against numpy ---------------------------------------------------------------------

def even_sizes(n: int, places: int) -> tuple:
    """The shard sizes of an even split: the first n % places shards get one more."""
    return tuple(n // places + (1 if place < n % places else 0) for place in range(places))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_stable_by_magnitude_every_dtype(places, dtype):
    host = with_ties(dtype, LARGE, seed=len(places))
    array = sharded_array(places, host)
    result = sort_with(array, by_abs)
    assert result is array and result.shard_sizes == even_sizes(LARGE, len(places))
    np.testing.assert_array_equal(result.to_numpy(), host[stable_order(np.abs(host))])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64])
def test_less_on_integers_matches_numpy_sort(places, dtype):
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    host = rng.integers(info.min, info.max, LARGE, dtype=dtype, endpoint=True)
    np.testing.assert_array_equal(sort_with(sharded_array(places, host), less).to_numpy(), np.sort(host))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint32])
def test_descending_is_stable(places, dtype):
    host = with_ties(dtype, LARGE, seed=3)
    result = sort_with(sharded_array(places, host), by_abs, descending=True).to_numpy()
    np.testing.assert_array_equal(result, host[stable_order(np.abs(host), descending=True)])


@pytest.mark.gpu
def test_key_and_compare_compose(places):
    host = sample(np.int64, LARGE, seed=5)
    # ordered by x % 7 from the largest remainder down (compare reverses the key's order)
    result = sort_with(sharded_array(places, host), lambda a, b: a > b, key=lambda x: x % 7).to_numpy()
    np.testing.assert_array_equal(result, host[stable_order(host % 7, descending=True)])
    # and descending reverses that order again, stably
    again = sort_with(sharded_array(places, host), lambda a, b: a > b, key=lambda x: x % 7,
                      descending=True).to_numpy()
    np.testing.assert_array_equal(again, host[stable_order(host % 7)])


@pytest.mark.gpu
def test_records_by_one_field_and_by_two(places):
    host = records(POINT, LARGE, seed=11)
    by_x = sort_with(sharded_array(places, host), lambda p, q: p.x < q.x).to_numpy()
    np.testing.assert_array_equal(by_x, host[stable_order(host["x"])])
    two = sort_with(sharded_array(places, host),
                    lambda p, q: p.x < q.x or (p.x == q.x and p.y > q.y)).to_numpy()
    np.testing.assert_array_equal(two, host[np.lexsort((-host["y"].astype(np.int64), host["x"]))])
    keyed = sort_with(sharded_array(places, host), less, key=lambda p: (p.y, p.x)).to_numpy()
    np.testing.assert_array_equal(keyed, host[np.lexsort((host["x"], host["y"]))])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", RECORDS, ids=lambda dtype: f"{dtype.itemsize}bytes")
def test_records_of_every_size(places, dtype):
    host = records(dtype, LARGE // 3, seed=dtype.itemsize)
    first = dtype.names[0]
    result = sort_with(sharded_array(places, host), lambda p, q: p[0] < q[0], descending=True).to_numpy()
    np.testing.assert_array_equal(result, host[stable_order(host[first], descending=True)])


@pytest.mark.gpu
def test_records_by_a_key_that_returns_a_number(places):
    host = records(SAMPLE, LARGE, seed=2)
    result = sort_with(sharded_array(places, host), less, key=lambda s: s.value * s.count).to_numpy()
    np.testing.assert_array_equal(result, host[stable_order(host["value"] * host["count"])])


@pytest.mark.gpu
def test_uneven_explicit_and_empty_shards(places):
    host = with_ties(np.int32, 50_001, seed=9)
    expected = host[stable_order(np.abs(host))]
    layouts = [uneven(places, host.size)]
    if len(places) > 1:
        layouts.append([host.size] + [0] * (len(places) - 1))
        layouts.append([0] * (len(places) - 1) + [host.size])
        layouts.append([1] * (len(places) - 1) + [host.size - len(places) + 1])
    for sizes in layouts:
        array = sharded_array(places, host, sizes=sizes)
        result = sort_with(array, by_abs)
        assert list(result.shard_sizes) == sizes
        np.testing.assert_array_equal(result.to_numpy(), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 2, 3, 255, 2047, 2048, 2049, 4095, 4096, 4097, 4352, 4353, 8703, 8704, 8705,
                               2 * 4096 + 5, 17409, 3 * 8704 + 1])
def test_small_and_tile_edge_sizes(places, n):
    # int64: tiles of 4096 for the block sort and the merges; float32: merge tiles of 4352 and
    # block-sort tiles of 8704 (the merges start at their second pass). On one place n meets
    # the edges exactly; over several the shards meet others.
    for dtype in (np.int64, np.float32):
        host = with_ties(dtype, n, seed=n)
        result = sort_with(sharded_array(places, host), by_abs).to_numpy()
        np.testing.assert_array_equal(result, host[stable_order(np.abs(host))])


@pytest.mark.gpu
def test_contiguous_arrays(places):
    host = with_ties(np.float64, LARGE, seed=4)
    array = sharded_array(places, host, contiguous=True)
    assert array.is_contiguous
    np.testing.assert_array_equal(sort_with(array, by_abs).to_numpy(), host[stable_order(np.abs(host))])


@pytest.mark.gpu
def test_out_leaves_a_as_it_was(places):
    host = with_ties(np.int64, LARGE, seed=6)
    array = sharded_array(places, host)
    out = sharded.ShardedArray.allocate(places, list(array.shard_sizes), np.int64)
    result = sort_with(array, by_abs, out=out)
    assert result is out
    np.testing.assert_array_equal(out.to_numpy(), host[stable_order(np.abs(host))])
    np.testing.assert_array_equal(array.to_numpy(), host)


@pytest.mark.gpu
def test_already_sorted_reversed_and_equal(places):
    base = np.arange(LARGE, dtype=np.int64)
    for host in (base, base[::-1].copy(), np.zeros(LARGE, np.int64), base % 3):
        result = sort_with(sharded_array(places, host), less).to_numpy()
        np.testing.assert_array_equal(result, np.sort(host, kind="stable"))
    # equal keys keep their order: sort the indices by a key that ties them in threes
    result = sort_with(sharded_array(places, base), less, key=lambda i: i // 3 % 1000).to_numpy()
    np.testing.assert_array_equal(result, base[stable_order(base // 3 % 1000)])


@pytest.mark.gpu
def test_deterministic(three_places):
    host = with_ties(np.float32, LARGE, seed=8)
    first = sort_with(sharded_array(three_places, host), by_abs).to_numpy()
    second = sort_with(sharded_array(three_places, host), by_abs).to_numpy()
    assert first.tobytes() == second.tobytes()


# ---- no GPU: the compile, its cache, errors ----------------------------------------------------

def test_every_element_size_has_a_module():
    assert set(MERGE_SORT_SIZES) == {4, 8} | set(RECORD_SIZES)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64, np.uint32, np.uint64])
def test_numbers_compile_to_sass_without_calls(fresh_cache, dtype):
    kernel = sharded.compile(by_abs, "merge_sort", dtype, arch=ARCH)
    assert kernel.module == f"merge_sort_e{np.dtype(dtype).itemsize}"
    assert kernel.out_dtype == np.dtype(dtype) and kernel.cubin[:4] == b"\x7fELF" and not kernel.cache_hit
    sass = kernel.sass()
    for entry in compiler._ENTRY_POINTS["merge_sort"]:
        assert f"Function : {entry}" in sass
    assert "CALL" not in sass  # the comparator (and everything else) inlined


@pytest.mark.parametrize("dtype", RECORDS, ids=lambda dtype: f"{dtype.itemsize}bytes")
def test_records_compile_to_sass_without_calls(fresh_cache, dtype):
    kernel = sharded.compile(lambda p, q: p[0] < q[0] or (p[0] == q[0] and p[-1] < q[-1]), "merge_sort",
                             dtype, arch=ARCH, descending=True)
    assert kernel.module == f"merge_sort_e{dtype.itemsize}"
    assert "CALL" not in kernel.sass()


def test_key_and_descending_compile(fresh_cache):
    kernel = sharded.compile(less, "merge_sort", POINT, arch=ARCH, map_op=lambda p: (p.y, p.x))
    assert kernel.module == "merge_sort_e8" and "CALL" not in kernel.sass()


def test_cache_hits_and_what_the_key_tells_apart(fresh_cache):
    first = sharded.compile(by_abs, "merge_sort", np.int64, arch=ARCH)
    again = sharded.compile(by_abs, "merge_sort", np.int64, arch=ARCH)
    assert again.cache_hit and again.cache_key == first.cache_key and again.cubin == first.cubin
    keys = {first.cache_key,
            sharded.compile(by_abs, "merge_sort", np.int64, arch=ARCH, descending=True).cache_key,
            sharded.compile(by_abs, "merge_sort", np.int64, arch=ARCH, map_op=lambda x: x // 2).cache_key,
            sharded.compile(by_abs, "merge_sort", np.int64, arch=ARCH, map_op=lambda x: x // 3).cache_key,
            sharded.compile(less, "merge_sort", np.int64, arch=ARCH).cache_key,
            sharded.compile(by_abs, "merge_sort", np.float64, arch=ARCH).cache_key}
    assert len(keys) == 6
    sharded.clear_cache(memory=True, disk=False)
    from_disk = sharded.compile(by_abs, "merge_sort", np.int64, arch=ARCH)
    assert from_disk.cache_hit and from_disk.cubin == first.cubin and from_disk.module == "merge_sort_e8"


def test_untypable_comparator_and_key_name_the_operator(fresh_cache):
    def broken(x, y):
        return x.no_such_attribute < y

    with pytest.raises(TypeError) as info:
        sharded.compile(broken, "merge_sort", np.float32, arch=ARCH)
    assert "broken" in str(info.value) and "(float32, float32)" in str(info.value)
    assert "no_such_attribute" in str(info.value)

    def bad_key(x):
        return x.nothing

    with pytest.raises(TypeError, match="operator .*bad_key cannot be compiled for argument types \\(int32\\)"):
        sharded.compile(less, "merge_sort", np.int32, arch=ARCH, map_op=bad_key)
    with pytest.raises(TypeError, match="cannot be compiled for argument types \\(UniTuple\\(float32 x 2\\)"):
        sharded.compile(lambda a, b: a + 1 < b, "merge_sort", np.float32, arch=ARCH, map_op=lambda x: (x, x))


@pytest.mark.parametrize("comparator, returned", [(lambda x, y: x - y, "int64"),
                                                  (lambda x, y: 1.0 * (x < y), "float64"),
                                                  (lambda x, y: 1 if x < y else 0, "int64")])
def test_comparators_must_return_a_bool(fresh_cache, comparator, returned):
    with pytest.raises(TypeError, match=f"returns {returned} for argument types \\(int64, int64\\); "
                                        f"a comparator returns a bool"):
        sharded.compile(comparator, "merge_sort", np.int64, arch=ARCH)


def test_compile_arguments_of_merge_sort():
    with pytest.raises(TypeError, match="takes 1 argument, but sort \\(compare\\) passes 2"):
        sharded.compile(lambda x: x, "merge_sort", np.int64, arch=ARCH)
    with pytest.raises(TypeError, match="takes 2 arguments, but sort \\(key\\) passes 1"):
        sharded.compile(less, "merge_sort", np.int64, arch=ARCH, map_op=lambda x, y: x)
    with pytest.raises(ValueError, match="dtypes: merge_sort takes one element dtype"):
        sharded.compile(less, "merge_sort", (np.int64, np.int64), arch=ARCH)
    with pytest.raises(ValueError, match="out_dtype: merge_sort writes elements of their own dtype"):
        sharded.compile(less, "merge_sort", np.int64, arch=ARCH, out_dtype=np.int32)
    with pytest.raises(ValueError, match="with_index: merge_sort's operators take no index"):
        sharded.compile(less, "merge_sort", np.int64, arch=ARCH, with_index=True)
    with pytest.raises(ValueError, match="descending: only merge_sort"):
        sharded.compile(lambda x: x, "transform", np.int64, arch=ARCH, descending=True)
    with pytest.raises(TypeError, match="descending: expected True or False"):
        sharded.compile(less, "merge_sort", np.int64, arch=ARCH, descending=1)


@pytest.fixture
def untouched(shim_untouched, monkeypatch):  # noqa: F811 - the fixture, extended
    """shim_untouched, and the comparator sort's own entry point too."""
    def entry(*args, **kwargs):
        shim_untouched.append("sort_compare")
        raise AssertionError("_shim.sort_compare was reached: the error came too late")

    monkeypatch.setattr(_shim, "sort_compare", entry)
    return shim_untouched


def test_bad_arguments_fail_before_anything_runs(untouched):
    group = stand_in_group()
    a = stand_in_array(group, dtype=np.int64)
    with pytest.raises(ValueError, match="out: belongs to another PlaceGroup than a"):
        sort_with(a, less, out=stand_in_array(stand_in_group(), dtype=np.int64))
    for call in (sort_with, compare_sort):
        with pytest.raises(ValueError, match=r"out: shard sizes \(5, 3, 2\) differ from a.* \(4, 3, 3\)"):
            call(a, less, out=stand_in_array(group, (5, 3, 2), dtype=np.int64))
        with pytest.raises(ValueError, match="out: dtype float64 differs from a.* int64"):
            call(a, less, out=stand_in_array(group, dtype=np.float64))
        with pytest.raises(ValueError, match="out: dtype .* differs from a.* int64"):
            call(a, less, out=stand_in_array(group, dtype=POINT))
    with pytest.raises(TypeError, match="out: expected a ShardedArray"):
        sort_with(a, less, out=np.zeros(10, np.int64))
    with pytest.raises(TypeError, match="a: expected a ShardedArray"):
        sort_with(np.zeros(10), less)
    with pytest.raises(TypeError, match="compare: expected an operator"):
        sort_with(a, "less")
    with pytest.raises(TypeError, match="key: expected an operator"):
        sort_with(a, less, key=3)
    with pytest.raises(TypeError, match="takes 1 argument, but sort \\(compare\\) passes 2"):
        sort_with(a, lambda x: x)
    with pytest.raises(TypeError, match="descending: expected True or False"):
        sort_with(a, less, descending="yes")


def test_operator_errors_fail_before_anything_runs(untouched, fresh_cache):
    group = stand_in_group()
    with pytest.raises(TypeError, match="returns int64 .* a comparator returns a bool"):
        sort_with(stand_in_array(group, dtype=np.int64), lambda x, y: x - y)
    with pytest.raises(TypeError, match="cannot be compiled for argument types \\(\\(x: float32, y: int32\\)"):
        sort_with(stand_in_array(group, dtype=POINT), lambda p, q: p.z < q.z)
    assert untouched == []
