"""Record arrays (numpy structured dtypes) and tuple values in transforms, reductions and
scans, against numpy and sequential Python references."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit._dtypes import is_record

from conftest import uneven
from test_errors import shim_untouched, stand_in_array, stand_in_group  # noqa: F401 (fixture)

ARCH = "sm_90"
POINT = np.dtype([("x", np.float32), ("y", np.float32)], align=True)                     # 8 bytes
SAMPLE = np.dtype([("value", np.float64), ("count", np.int32)], align=True)              # 16
XYZ = np.dtype([("x", np.float32), ("y", np.float32), ("z", np.float32)], align=True)    # 12
MIXED = np.dtype([("a", np.int32), ("b", np.float64), ("c", np.uint32)], align=True)     # 24
WIDE = np.dtype([("a", np.float64), ("b", np.int64), ("c", np.int32), ("d", np.uint64)], align=True)  # 32
AFFINE = np.dtype([("scale", np.int64), ("shift", np.int64)], align=True)                # 16
MODULUS = 1_000_003


def random_records(dtype, n, seed=0):
    """Values that stay exact through small sums: integers, or floats on a 1/8 grid."""
    rng = np.random.default_rng(seed)
    host = np.zeros(n, dtype)
    for name in dtype.names:
        field = dtype.fields[name][0]
        if field.kind == "f":
            host[name] = rng.integers(-800, 800, n) / 8
        elif field.kind == "u":
            host[name] = rng.integers(0, 1000, n)
        else:
            host[name] = rng.integers(-1000, 1000, n)
    return host


def compose(p, q):
    """Affine maps x -> scale * x + shift modulo a prime: p first, then q (not commutative)."""
    return (p.scale * q.scale) % MODULUS, (p.shift * q.scale + q.shift) % MODULUS


def compose_reference(host, init=None):
    """Inclusive prefix compositions, sequentially in Python ints."""
    scale, shift = (1, 0) if init is None else init
    out = np.zeros(host.size, AFFINE)
    for index, (a, b) in enumerate(zip(host["scale"].tolist(), host["shift"].tolist())):
        scale, shift = (scale * a) % MODULUS, (shift * a + b) % MODULUS
        out[index] = (scale, shift)
    return out


def add_points(p, q):
    return p.x + q.x, p.y + q.y


@sharded.op
def norm2(p):
    return p.x * p.x + p.y * p.y


def swap(p):
    return p.y, p.x


def first_min(p, q):  # (value, index): p comes first, ties keep it
    return q if q[0] < p[0] else p


# ---- no GPU: dtypes, the compile path down to SASS, errors ----

def test_record_dtypes_accepted_and_refused():
    from cuda_sharded_jit._dtypes import as_array_dtype

    for dtype in (POINT, SAMPLE, XYZ, MIXED, WIDE, np.dtype([("x", np.float32), ("y", np.float32)])):
        assert as_array_dtype(dtype) == dtype  # packed but laid out as the aligned struct
    packed = np.dtype([("x", np.float32), ("y", np.float64)])  # y at offset 4, itemsize 12
    with pytest.raises(TypeError, match=r"host: record dtype .* not in the aligned .* offsets \[0, 4\] "
                                        r"and itemsize 12, expected \[0, 8\] and 16; convert with \.astype"):
        as_array_dtype(packed, "host")
    refused = {
        np.dtype([("x", ">f4")]): "non-native byte order",
        np.dtype([("x", np.float16)]): "unsupported dtype float16",
        np.dtype([("x", np.float32, (2,))]): "not nested records or sub-arrays",
        np.dtype([("p", POINT)]): "not nested records or sub-arrays",
        np.dtype([(name, np.float32) for name in "abcde"]): "records of 1 to 4 fields",
        np.dtype({"names": ["x"], "formats": [np.float32], "itemsize": 8}): "not in the aligned",
    }
    for dtype, message in refused.items():
        with pytest.raises(TypeError, match=message):
            as_array_dtype(dtype, "dtype")


def test_named_records_round_trip_through_cache_keys():
    from cuda_sharded_jit._layout import dtype_from_key, dtype_key

    for dtype in (POINT, MIXED, WIDE):
        assert dtype_from_key(dtype_key(dtype)) == dtype
        assert dtype_from_key(dtype_key(dtype)).names == dtype.names


def test_records_reach_operators_as_named_tuples_when_named():
    from cuda_sharded_jit._layout import layout_of

    assert layout_of(POINT).record_class._fields == ("x", "y")
    assert layout_of(np.dtype("f4,f8", align=True)).record_class is None        # f0, f1: plain tuples
    assert layout_of(np.dtype([("class", np.float32)])).record_class is None  # not an identifier to use


def test_record_transforms_compile_to_sass_without_calls():
    kernel = sharded.compile(norm2, "transform", (POINT,), arch=ARCH)
    assert kernel.module == "transform_indexed_n1" and kernel.out_dtype == np.float32
    assert "CALL" not in kernel.sass()
    kernel = sharded.compile(swap, "transform", (POINT,), arch=ARCH)
    assert kernel.out_dtype == np.dtype([("f0", np.float32), ("f1", np.float32)], align=True)
    assert "CALL" not in kernel.sass()
    identity = sharded.compile(lambda p: p, "transform", (MIXED,), arch=ARCH)
    assert identity.out_dtype == MIXED and identity.out_dtype.names == ("a", "b", "c")
    pair = sharded.compile(lambda x, y, s: (x * s, y), "transform", (np.float32, np.int64, np.float64),
                           arch=ARCH, scalars=(2,), out_dtype=SAMPLE)
    assert pair.module == "transform_indexed_n2" and pair.out_dtype == SAMPLE
    assert "CALL" not in pair.sass()
    indexed = sharded.compile(lambda x, i: x + i, "transform", (np.float64,), arch=ARCH, with_index=True)
    assert indexed.module == "transform_indexed_n1" and indexed.out_dtype == np.float64
    assert "CALL" not in indexed.sass()
    fast = sharded.compile(lambda x: x * x, "transform", (np.float32,), arch=ARCH)
    assert fast.module == "transform_o4_i4"  # numbers keep the vectorised modules


@pytest.mark.parametrize("map_op, in_dtype, module, fields", [
    (lambda x: (x, x), np.float32, "scan_a8_i4", [np.float32, np.float32]),
    (lambda x: (x, np.int64(1)), np.float64, "scan_a16_i8", [np.float64, np.int64]),
    (lambda x: (np.float64(x), 1, x), np.float32, "scan_a24_i4", [np.float64, np.int64, np.float32]),
    (lambda x: (x, x, np.int32(1), x), np.int64, "scan_a32_i8", [np.int64, np.int64, np.int32, np.int64]),
    (lambda x: (x, x, x), np.int32, "scan_a12_i4", [np.int32, np.int32, np.int32]),
])
def test_tuple_scans_compile_to_sass_without_calls(map_op, in_dtype, module, fields):
    kernel = sharded.compile(lambda p, q: q, "scan", in_dtype, arch=ARCH, map_op=map_op)
    assert kernel.module == module
    assert kernel.out_dtype == np.dtype([(f"f{k}", field) for k, field in enumerate(fields)], align=True)
    assert "CALL" not in kernel.sass()


@pytest.mark.parametrize("dtype, module", [(POINT, "scan_a8_i8"), (XYZ, "scan_a12_i12"),
                                           (SAMPLE, "scan_a16_i16"), (MIXED, "scan_a24_i24"),
                                           (WIDE, "scan_a32_i32")])
def test_record_scans_and_reductions_compile(dtype, module):
    def op(p, q):
        return p  # every field kept: typed as the record

    scan = sharded.compile(op, "scan", dtype, arch=ARCH)
    assert scan.module == module and scan.out_dtype == dtype and "CALL" not in scan.sass()
    reduction = sharded.compile(op, "reduce", dtype, arch=ARCH)
    assert reduction.module == f"reduce_a{dtype.itemsize}_irec" and "CALL" not in reduction.sass()
    mapped = sharded.compile(lambda a, b: a + b, "reduce", dtype, arch=ARCH, map_op=lambda p: p[0])
    assert mapped.module == f"reduce_a{dtype.fields[dtype.names[0]][0].itemsize}_irec"


def test_record_compile_errors():
    with pytest.raises(TypeError, match="a scan of records .* takes no map"):
        sharded.compile(add_points, "scan", POINT, arch=ARCH, map_op=swap)
    with pytest.raises(TypeError, match="accumulates and writes that layout"):
        sharded.compile(add_points, "scan", POINT, arch=ARCH, out_dtype=SAMPLE)
    with pytest.raises(TypeError, match="must return a tuple of 2 numbers"):
        sharded.compile(lambda p, q: p.x, "reduce", POINT, arch=ARCH)
    with pytest.raises(TypeError, match="holds numbers .* leave out= out"):
        sharded.compile(swap, "transform", (POINT,), arch=ARCH, out_dtype=np.float32)
    with pytest.raises(TypeError, match="must return a tuple of 3 numbers"):
        sharded.compile(norm2, "transform", (POINT,), arch=ARCH, out_dtype=XYZ)
    with pytest.raises(TypeError, match="operator .* cannot be compiled for argument types "
                                        r"\(\(x: float32, y: float32\)\)"):
        sharded.compile(lambda p: p.z, "transform", (POINT,), arch=ARCH)
    with pytest.raises(TypeError, match="takes 1 argument, but .* passes 2"):  # the index is one more
        sharded.compile(lambda x: x, "transform", (np.float32,), arch=ARCH, with_index=True)


def test_algorithms_that_take_numbers_refuse_records(shim_untouched):
    group = stand_in_group()
    points = stand_in_array(group, dtype=POINT)
    numbers = stand_in_array(group, dtype=np.float32)
    calls = {
        "sort": lambda: sharded.sort(points),
        "fill": lambda: sharded.fill(points, 1.0),
        "sequence": lambda: sharded.sequence(points),
        "count": lambda: sharded.count(points, 1.0),
        "histogram_even": lambda: sharded.histogram_even(points, 4, 0.0, 1.0),
        "'sum' combines numbers": lambda: sharded.sum(points),
        "'max' combines numbers": lambda: sharded.reduce(points, "max"),
        "'sum' combines numbers, but a holds": lambda: sharded.inclusive_scan(points),
        "argmin compares numbers": lambda: sharded.argmin(points),
        "adjacent_difference takes arrays of numbers": lambda: sharded.adjacent_difference(points),
        "writes numbers, not records": lambda: sharded.adjacent_difference(numbers, out=points),
        "ops.negate works on numbers": lambda: sharded.transform(sharded.ops.negate, points),
    }
    for message, call in calls.items():
        with pytest.raises(TypeError, match=message):
            call()


def test_tuple_values_errors_before_anything_runs(shim_untouched):
    group = stand_in_group()
    points = stand_in_array(group, dtype=POINT)
    numbers = stand_in_array(group, dtype=np.float32)
    with pytest.raises(TypeError, match="holds numbers"):
        sharded.transform(swap, points, out=numbers)
    with pytest.raises(TypeError, match="must return a tuple of 2"):
        sharded.transform(norm2, points, out=points)
    with pytest.raises(TypeError, match=r"init: .* tuple of 2"):
        sharded.reduce(points, add_points, init=(0.0, 0.0, 0.0))
    with pytest.raises(TypeError, match="init: a tuple, but the accumulator is a single float32"):
        sharded.inclusive_scan(numbers, lambda a, b: a + b, init=(0.0, 1.0))
    with pytest.raises(TypeError, match="combines single numbers, but the map returns tuples"):
        sharded.transform_inclusive_scan(numbers, lambda x: (x, x), "sum")
    with pytest.raises(ValueError, match=r"init\[1\]"):
        sharded.exclusive_scan(stand_in_array(group, dtype=AFFINE), compose, (1, 0.5))
    with pytest.raises(ValueError, match="init: an exclusive scan needs an initial value"):
        sharded.transform_exclusive_scan(numbers, lambda x: (x, x), first_min, None)
    with pytest.raises(TypeError, match="with_index: expected True or False"):
        sharded.transform(lambda x, i: x, numbers, with_index=1)
    with pytest.raises(TypeError, match="takes 1 argument, but transform \\(with the index\\) passes 2"):
        sharded.transform(lambda x: x, numbers, with_index=True)


def _record_interface(dtype, **changes):
    interface = {"shape": (8,), "typestr": dtype.str, "descr": dtype.descr, "strides": None,
                 "data": (1 << 20, False), "version": 3}
    return dict(interface, **changes)


def test_adopted_records_keep_the_offsets_their_descr_gives():
    from cuda_sharded_jit.array import _interface_dtype

    for dtype in (POINT, SAMPLE, XYZ, MIXED, WIDE):  # aligned: padding inside or at the end
        found = _interface_dtype(_record_interface(dtype), None, "buffers[0]")
        assert found == dtype and found.names == dtype.names
    # Same itemsize as the aligned (x: float32, y: float64), but x after 4 bytes of padding:
    # read from its own offset it is refused, not taken for the aligned layout.
    shifted = np.dtype({"names": ["x", "y"], "formats": [np.float32, np.float64], "offsets": [4, 8],
                        "itemsize": 16})
    with pytest.raises(TypeError, match=r"buffers\[0\]: record dtype .* offsets \[4, 8\] and itemsize 16, "
                                        r"expected \[0, 8\] and 16"):
        _interface_dtype(_record_interface(shifted), None, "buffers[0]")
    with pytest.raises(TypeError, match=r"buffers\[0\]: .* not nested records or sub-arrays"):
        _interface_dtype(_record_interface(np.dtype([("x", np.float32, (2,))])), None, "buffers[0]")
    with pytest.raises(TypeError, match=r"buffers\[0\]: its descr lays out 16 bytes, its typestr 24"):
        _interface_dtype(_record_interface(SAMPLE, typestr="|V24"), None, "buffers[0]")
    with pytest.raises(TypeError, match=r"need their fields named"):
        _interface_dtype(_record_interface(SAMPLE, descr=[("", "|V16")]), None, "buffers[0]")


def test_adopt_refuses_a_descr_off_the_aligned_layout(shim_untouched):
    class Buffer:
        def __init__(self, dtype):
            self.__cuda_array_interface__ = _record_interface(dtype)

    shifted = np.dtype({"names": ["x", "y"], "formats": [np.float32, np.float64], "offsets": [4, 8],
                        "itemsize": 16})
    with pytest.raises(TypeError, match=r"buffers\[1\]: record dtype .* not in the aligned"):
        sharded.ShardedArray.adopt(stand_in_group(2), [Buffer(SAMPLE), Buffer(shifted)])


# ---- GPU ----

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [POINT, XYZ, SAMPLE, MIXED, WIDE])
@pytest.mark.parametrize("contiguous", [False, True])
def test_round_trip_is_bit_exact(places, dtype, contiguous):
    host = np.zeros(10_007, dtype)
    host.view(np.uint8)[:] = np.random.default_rng(2).integers(0, 256, host.nbytes, dtype=np.uint8)
    try:
        array = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size),
                                                contiguous=contiguous)
    except ValueError as error:  # contiguous arrays need peer access between every device
        assert contiguous and "peer access" in str(error)
        return
    back = array.to_numpy()
    assert back.dtype == dtype and back.tobytes() == host.tobytes()  # padding bytes included
    count = len(places)
    even = sharded.ShardedArray.allocate(places, 1001, dtype)
    assert even.dtype == dtype and even.to_numpy().shape == (1001,)
    assert even.shard_sizes == tuple(1001 // count + (place < 1001 % count) for place in range(count))
    assert array.shard_sizes == tuple(uneven(places, host.size))  # explicit sizes, an empty shard


@pytest.mark.gpu
def test_shard_views_describe_records(three_places):
    host = random_records(SAMPLE, 1000, seed=3)
    array = sharded.ShardedArray.from_numpy(three_places, host, sizes=[600, 0, 400])
    view = array.shard(2)
    interface = view.__cuda_array_interface__
    assert interface["typestr"] == "|V16" and interface["shape"] == (400,)
    assert interface["descr"] == SAMPLE.descr and interface["stream"] == three_places.stream(2)
    assert interface["data"][0] == array._impl.shard_pointer(2)
    value = view.field("value").__cuda_array_interface__
    assert value["typestr"] == "<f8" and value["strides"] == (16,) and value["data"][0] == interface["data"][0]
    count = view.field("count").__cuda_array_interface__
    assert count["typestr"] == "<i4" and count["data"][0] == interface["data"][0] + 8
    assert array.shard(1).field("count").__cuda_array_interface__["shape"] == (0,)
    with pytest.raises(ValueError, match="no field 'z'"):
        view.field("z")
    assert "record(value: float64, count: int32)" in repr(array) and "600@cuda:" in repr(array)


@pytest.mark.gpu
def test_record_shards_through_numba(three_places):
    from numba import cuda

    host = random_records(MIXED, 3001, seed=4)
    array = sharded.ShardedArray.from_numpy(three_places, host)
    offset = 0
    for place, size in enumerate(array.shard_sizes):
        view = array.shard(place)
        raw = cuda.as_cuda_array(view)           # numba reads typestr only: void elements
        assert raw.dtype.itemsize == MIXED.itemsize and raw.shape == (size,)
        records = raw.view(MIXED).copy_to_host()
        assert records.tobytes() == host[offset:offset + size].tobytes()
        field = cuda.as_cuda_array(view.field("b")).copy_to_host()
        np.testing.assert_array_equal(field, host["b"][offset:offset + size])
        offset += size


@pytest.mark.gpu
def test_record_fields_through_cupy(three_places):
    cupy = pytest.importorskip("cupy")
    host = random_records(POINT, 2000, seed=5)
    array = sharded.ShardedArray.from_numpy(three_places, host)
    offset = 0
    for place, size in enumerate(array.shard_sizes):
        with cupy.cuda.Device(array.shard(place).device):
            ys = cupy.asarray(array.shard(place).field("y"))
            np.testing.assert_array_equal(cupy.asnumpy(ys), host["y"][offset:offset + size])
        offset += size


@pytest.mark.gpu
def test_transforms_read_and_write_records(places):
    host = random_records(POINT, 50_001, seed=6)
    sizes = uneven(places, host.size)
    points = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    np.testing.assert_array_equal(sharded.transform(norm2, points).to_numpy(),
                                  host["x"] * host["x"] + host["y"] * host["y"])
    swapped = sharded.transform(swap, points)
    assert swapped.dtype.names == ("f0", "f1")
    np.testing.assert_array_equal(swapped.to_numpy()["f0"], host["y"])
    np.testing.assert_array_equal(swapped.to_numpy()["f1"], host["x"])
    kept = sharded.transform(lambda p: p, points).to_numpy()   # an argument returned keeps its names
    assert kept.dtype == POINT and kept.tobytes() == host.tobytes()
    # out= casts each field to out's fields, in order; a scalar argument is a runtime value
    out = sharded.ShardedArray.allocate(places, sizes, SAMPLE)
    sharded.transform(lambda p, s: (p.x * s, p.y), points, np.float64(0.5), out=out)
    result = out.to_numpy()
    np.testing.assert_array_equal(result["value"], host["x"].astype(np.float64) * 0.5)
    np.testing.assert_array_equal(result["count"], host["y"].astype(np.int32))
    # in place on a record array
    sharded.transform(lambda p: (p.x + 1, p.y - 1), points, out=points)
    np.testing.assert_array_equal(points.to_numpy()["x"], host["x"] + 1)
    np.testing.assert_array_equal(points.to_numpy()["y"], host["y"] - 1)


@pytest.mark.gpu
def test_transform_tuples_from_numbers_and_the_index(places):
    values = np.random.default_rng(7).standard_normal(40_003)
    counts = np.arange(values.size, dtype=np.int32) % 17
    sizes = uneven(places, values.size)
    x = sharded.ShardedArray.from_numpy(places, values, sizes=sizes)
    k = sharded.ShardedArray.from_numpy(places, counts, sizes=sizes)
    pairs = sharded.transform(lambda v, c: (v * c, c), x, k).to_numpy()
    assert pairs.dtype == np.dtype([("f0", np.float64), ("f1", np.int32)], align=True)
    np.testing.assert_array_equal(pairs["f0"], values * counts)
    np.testing.assert_array_equal(pairs["f1"], counts)
    indexed = sharded.transform(lambda v, i: v + i, x, with_index=True).to_numpy()
    np.testing.assert_array_equal(indexed, values + np.arange(values.size))
    # mixed: a record array, a number array and the index, three arrays of different layouts
    points = sharded.ShardedArray.from_numpy(places, random_records(XYZ, values.size, seed=8), sizes=sizes)
    mixed = sharded.transform(lambda p, v, c, i: (p.z + v, c + i, p.x), points, x, k, with_index=True)
    reference = points.to_numpy()
    result = mixed.to_numpy()
    np.testing.assert_array_equal(result["f0"], reference["z"].astype(np.float64) + values)
    np.testing.assert_array_equal(result["f1"], counts.astype(np.int64) + np.arange(values.size))
    np.testing.assert_array_equal(result["f2"], reference["x"])


@pytest.mark.gpu
def test_reduce_records(places):
    host = random_records(POINT, 120_001, seed=9)
    points = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size))
    sx, sy = sharded.reduce(points, add_points)          # every value on a 1/8 grid: exact sums
    assert (sx, sy) == (host["x"].sum(dtype=np.float64), host["y"].sum(dtype=np.float64))
    assert isinstance(sx, np.float32)
    assert sharded.reduce(points, add_points, init=(1.0, -1.0)) == (sx + 1, sy - 1)
    total = sharded.transform_reduce(points, norm2, lambda a, b: a + b, np.float64(0))
    assert total == np.sum(host["x"].astype(np.float64) ** 2 + host["y"].astype(np.float64) ** 2)
    # index-aware map over records: the first point farthest from the origin
    far = sharded.transform_reduce(points, lambda p, i: (-norm2(p), i), first_min, None, with_index=True)
    squared = host["x"] * host["x"] + host["y"] * host["y"]
    assert far[1] == int(np.argmax(squared)) and far[0] == -squared.max()
    assert sharded.count_if(points, lambda p: p.x > p.y) == int(np.count_nonzero(host["x"] > host["y"]))
    empty = sharded.ShardedArray.allocate(places, 0, POINT)
    assert sharded.reduce(empty, add_points, init=(2.0, 3.0)) == (2.0, 3.0)


def add_three(p, q):
    return p[0] + q[0], p[1] + q[1], p[2] + q[2]


def add_three_keep_first(p, q):
    return p[0] + q[0], p[1] + q[1], p[2] + q[2], p[3]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, op", [(XYZ, add_three), (MIXED, add_three), (WIDE, add_three_keep_first)])
def test_reduce_records_of_every_size(places, dtype, op):
    host = random_records(dtype, 77_777, seed=10)
    array = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size))
    result = sharded.reduce(array, op)
    for index, name in enumerate(dtype.names[:3]):  # exact: integers, floats on a 1/8 grid
        wide = np.float64 if host[name].dtype.kind == "f" else np.int64
        assert result[index] == host[name].sum(dtype=wide), name
        assert isinstance(result[index], host[name].dtype.type)
    if len(dtype.names) == 4:
        assert result[3] == host[dtype.names[3]][0]  # kept from the first element


@pytest.mark.gpu
def test_non_commutative_record_reduce_and_scans(places):
    rng = np.random.default_rng(11)
    host = np.zeros(30_011, AFFINE)
    host["scale"] = rng.integers(1, MODULUS, host.size)
    host["shift"] = rng.integers(0, MODULUS, host.size)
    sizes = uneven(places, host.size)
    maps = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    reference = compose_reference(host)
    assert sharded.reduce(maps, compose) == tuple(reference[-1])
    inclusive = sharded.inclusive_scan(maps, compose)
    assert inclusive.dtype == AFFINE
    np.testing.assert_array_equal(inclusive.to_numpy(), reference)
    seeded = compose_reference(host, init=(3, 5))
    exclusive = sharded.exclusive_scan(maps, compose, (3, 5)).to_numpy()
    assert tuple(exclusive[0]) == (3, 5)
    np.testing.assert_array_equal(exclusive[1:], seeded[:-1])
    sharded.inclusive_scan(maps, compose, out=maps, init=(3, 5))   # in place
    np.testing.assert_array_equal(maps.to_numpy(), seeded)


def add_two_keep_last(p, q):
    return p[0] + q[0], p[1] + q[1], q[2]


def add_two_keep_last4(p, q):
    return p[0] + q[0], p[1] + q[1], q[2], q[3]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, op", [(XYZ, add_two_keep_last), (MIXED, add_two_keep_last),
                                       (WIDE, add_two_keep_last4)])
def test_scans_of_records_of_every_size(places, dtype, op):
    host = random_records(dtype, 50_021, seed=12)
    array = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size))
    result = sharded.inclusive_scan(array, op).to_numpy()
    assert result.dtype == dtype
    for name in dtype.names[:2]:  # exact: integers, floats on a 1/8 grid
        wide = np.float64 if host[name].dtype.kind == "f" else np.int64
        np.testing.assert_array_equal(result[name], np.cumsum(host[name], dtype=wide).astype(host[name].dtype))
    for name in dtype.names[2:]:
        np.testing.assert_array_equal(result[name], host[name])  # the latest element's


@pytest.mark.gpu
def test_tuple_scans_of_numbers(places):
    values = np.random.default_rng(13).integers(-1000, 1000, 60_013).astype(np.float32)
    values[[5, 9000, 40_000]] = -5000  # ties of the minimum: the first index stays
    x = sharded.ShardedArray.from_numpy(places, values, sizes=uneven(places, values.size))
    running = sharded.transform_inclusive_scan(x, lambda v, i: (v, i), first_min, with_index=True).to_numpy()
    np.testing.assert_array_equal(running["f0"], np.minimum.accumulate(values))
    first_index = np.array([int(np.argmin(values[:k + 1])) for k in range(0, values.size, 997)])
    np.testing.assert_array_equal(running["f1"][::997], first_index)
    # (count, sum) before each element, exact in integers and on the float grid
    before = sharded.transform_exclusive_scan(
        x, lambda v: (1, np.float64(v)), lambda p, q: (p[0] + q[0], p[1] + q[1]), (0, 0.0)).to_numpy()
    np.testing.assert_array_equal(before["f0"], np.arange(values.size))
    np.testing.assert_array_equal(before["f1"], np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)[:-1]]))
    # a scalar map: transform_inclusive_scan without tuples, into out= of another dtype
    squares = sharded.ShardedArray.allocate(places, list(x.shard_sizes), np.float64)
    sharded.transform_inclusive_scan(x, lambda v: v * v, "sum", out=squares)
    np.testing.assert_array_equal(squares.to_numpy(), np.cumsum(values.astype(np.float64) ** 2))


@pytest.mark.gpu
def test_mapped_scans_of_records(places):
    host = random_records(POINT, 45_007, seed=14)
    points = sharded.ShardedArray.from_numpy(places, host, sizes=uneven(places, host.size))
    lengths = sharded.transform_inclusive_scan(points, lambda p: np.float64(p.x) * p.x, "sum").to_numpy()
    np.testing.assert_array_equal(lengths, np.cumsum(host["x"].astype(np.float64) ** 2))
    extremes = sharded.transform_exclusive_scan(
        points, lambda p: (p.x, p.y), lambda p, q: (min(p[0], q[0]), max(p[1], q[1])),
        (np.inf, -np.inf)).to_numpy()
    np.testing.assert_array_equal(extremes["f0"][1:], np.minimum.accumulate(host["x"])[:-1])
    np.testing.assert_array_equal(extremes["f1"][1:], np.maximum.accumulate(host["y"])[:-1])
    assert extremes["f0"][0] == np.inf and extremes["f1"][0] == -np.inf
    with pytest.raises(TypeError, match="combines single numbers, but the map returns tuples"):
        sharded.transform_inclusive_scan(points, swap, "max")


@pytest.mark.gpu
def test_record_scans_are_deterministic(places):
    host = np.zeros(200_003, POINT)
    rng = np.random.default_rng(15)
    host["x"], host["y"] = rng.standard_normal(host.size), rng.standard_normal(host.size)
    points = sharded.ShardedArray.from_numpy(places, host)
    first = sharded.inclusive_scan(points, add_points).to_numpy()
    second = sharded.inclusive_scan(points, add_points).to_numpy()
    assert first.tobytes() == second.tobytes()
    np.testing.assert_allclose(first["x"], np.cumsum(host["x"], dtype=np.float64), atol=0.1)
    assert [np.asarray(v).tobytes() for v in sharded.reduce(points, add_points)] == \
        [np.asarray(v).tobytes() for v in sharded.reduce(points, add_points)]


@pytest.mark.gpu
def test_adopt_numba_record_buffers(one_place):
    from numba import cuda

    host = random_records(SAMPLE, 500, seed=16)
    buffer = cuda.to_device(host)
    with pytest.raises(TypeError, match=r"need their fields named: pass dtype="):
        sharded.ShardedArray.adopt(one_place, [buffer])
    with pytest.raises(TypeError, match="does not describe them"):
        sharded.ShardedArray.adopt(one_place, [buffer], dtype=POINT)
    adopted = sharded.ShardedArray.adopt(one_place, [buffer], dtype=SAMPLE)
    assert adopted.dtype == SAMPLE and adopted.to_numpy().tobytes() == host.tobytes()
    total = sharded.transform_reduce(adopted, lambda s: s.value * s.count, lambda a, b: a + b, 0.0)
    assert total == np.sum(host["value"] * host["count"])


def test_mapped_scans_of_records_take_init_dtype_as_of_numbers(monkeypatch):
    """transform_*_scan: a numpy init asks for its dtype, a Python one does not, whether the
    input holds records (an indexed transform, then the scan) or numbers."""
    import cuda_sharded_jit.algorithms.reduce as reduce_module
    import cuda_sharded_jit.algorithms.transform as transform_module

    class Compiling(Exception):
        pass

    requests = []

    def square(x):
        return x * x

    def kernel_libraries(op, algorithm, arg_kinds, out_request, archs, map_spec=None):
        requests.append(out_request)
        raise Compiling

    monkeypatch.setattr(transform_module, "kernel_libraries", kernel_libraries)
    monkeypatch.setattr(reduce_module, "kernel_libraries", kernel_libraries)
    group = stand_in_group()
    for array in (stand_in_array(group, dtype=POINT), stand_in_array(group, dtype=np.float32)):
        requests.clear()
        with pytest.raises(Compiling):
            sharded.transform_inclusive_scan(array, norm2 if is_record(array.dtype) else square, "sum",
                                             init=np.float64(0.5))
        with pytest.raises(Compiling):
            sharded.transform_exclusive_scan(array, norm2 if is_record(array.dtype) else square, "sum", 0.5)
        assert requests == [np.float64, None]


def test_a_field_named_like_a_tuple_method_is_read_by_position():
    ranked = np.dtype([("value", np.float32), ("index", np.int64)], align=True)
    with pytest.raises(TypeError, match=r"field 'index' of \(value: float32, index: int64\): numba reads "
                                        r"p\.index as the tuple method; write p\[1\]"):
        sharded.compile(lambda p: p.value + p.index, "transform", (ranked,), arch=ARCH)
    kernel = sharded.compile(lambda p: p.value + p[1], "transform", (ranked,), arch=ARCH)
    assert kernel.out_dtype == np.float64


def test_record_layouts_never_share_a_kernel():
    """Field names, their order and their dtypes are all in the cache key."""
    layouts = [POINT, np.dtype([("y", np.float32), ("x", np.float32)], align=True),
               np.dtype([("x", np.int32), ("y", np.float32)], align=True),
               np.dtype([("x", np.float32), ("y", np.float64)], align=True)]
    kernels = [sharded.compile(lambda p: p.x, "transform", (layout,), arch=ARCH) for layout in layouts]
    assert len({kernel.cache_key for kernel in kernels}) == len(layouts)
    assert kernels[0].sass() != kernels[1].sass()  # x read at offset 0, then at offset 4
    reductions = [sharded.compile(lambda p, q: p, "reduce", layout, arch=ARCH) for layout in layouts]
    assert len({kernel.cache_key for kernel in reductions}) == len(layouts)
