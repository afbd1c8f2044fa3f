"""segmented_reduce: one fold per segment [offsets[s], offsets[s + 1]), against numpy and the
sequential Python fold; segments empty, spanning shards, ending on shard boundaries; tuple
accumulators, records and non-commutative operators. Every GPU case runs on both routes: host
positions (numpy) and device positions (an int64 ShardedArray on a's group, split over its
places). The argument checks run without a GPU, on the stand-ins of test_errors.py."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim

from conftest import sample
from test_errors import stand_in_array, stand_in_group

gpu = pytest.mark.gpu


@pytest.fixture(params=["host", "device"])
def route(request):
    """Where the positions are given: a numpy array, or an int64 ShardedArray."""
    return request.param


def given(a, offsets, route):
    """`offsets` as the route passes them: numpy, or a ShardedArray evenly split over a's group."""
    if route == "host":
        return np.asarray(offsets)
    return sharded.ShardedArray.from_numpy(a.group, np.asarray(offsets, dtype=np.int64))


def sequential(values, offsets, op, init):
    """The answer of folding each segment left to right in Python, init first."""
    out = []
    for s in range(len(offsets) - 1):
        acc = init
        for value in values[offsets[s]:offsets[s + 1]]:
            acc = op(acc, value)
        out.append(acc)
    return out


def sums(host, offsets):
    """Each segment's sum, exactly for integers (numpy, independent of the kernels)."""
    return np.array([host[offsets[s]:offsets[s + 1]].sum(dtype=np.float64 if host.dtype.kind == "f" else host.dtype)
                     for s in range(len(offsets) - 1)])


def random_offsets(n, segments, seed=0, empty=True):
    rng = np.random.default_rng(seed)
    inner = np.sort(rng.integers(0, n + 1, segments - 1))
    if empty:  # runs of repeated positions: empty segments, also at both ends
        inner[: max(1, segments // 10)] = 0
        inner[-max(1, segments // 10):] = n
    return np.concatenate([[0], inner, [n]]).astype(np.int64)


def boundary_offsets(array):
    """Segments ending exactly at every shard boundary, one spanning all shards, empties."""
    n = array.size
    bounds = [int(o) for o in array.shard_offsets] + [n]
    return np.array(sorted(set(bounds)) + [n], dtype=np.int64), np.array([0, 0, n, n], dtype=np.int64)


# ---- GPU: values against references ---------------------------------------------------

@gpu
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint64])
def test_integer_sums_match_numpy(places, dtype, route):
    host = sample(dtype, 10_007, seed=1)
    a = sharded.ShardedArray.from_numpy(places, host)
    for seed, segments in enumerate((1, 7, 300, 5000)):
        offsets = random_offsets(len(host), segments, seed)
        result = sharded.segmented_reduce(a, given(a, offsets, route), "sum", 0)
        assert result.dtype == np.dtype(dtype)
        assert tuple(result.shard_sizes) == tuple(_shim.ShardedArray.even_sizes(segments, len(places)))
        np.testing.assert_array_equal(result.to_numpy(), sums(host, offsets).astype(dtype))


@gpu
def test_float_sums_in_both_kernel_paths(places, route):
    # long equal segments (a block per piece, vectorised) and short ones (a warp per piece)
    host = sample(np.float32, 1 << 20, seed=2)
    a = sharded.ShardedArray.from_numpy(places, host)
    for segment in (4096, 5000, 37, 1):
        offsets = np.arange(0, len(host) + 1, segment, dtype=np.int64)
        if offsets[-1] != len(host):
            offsets = np.append(offsets, len(host))
        result = sharded.segmented_reduce(a, given(a, offsets, route), lambda x, y: x + y,
                                          np.float32(0)).to_numpy()
        np.testing.assert_allclose(result, sums(host, offsets), rtol=1e-4, atol=1e-3)


@gpu
def test_segments_at_shard_boundaries_spanning_all_and_empty(places, route):
    host = sample(np.int64, 1000, seed=3)
    variants = [None]
    if len(places) >= 2:  # empty shards first and between: [0, 1000], [0, 500, 500], [0, 500, 0, 500]
        sizes = [0] * len(places)
        sizes[1] = 500
        sizes[-1] += 500
        variants.append(sizes)
    for sizes in variants:
        a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
        for offsets in boundary_offsets(a):
            result = sharded.segmented_reduce(a, given(a, offsets, route), "sum", 5).to_numpy()
            np.testing.assert_array_equal(result, sums(host, offsets) + 5)


@gpu
def test_uneven_and_empty_shards(places, route):
    host = sample(np.int32, 3001, seed=4)
    count = len(places)
    sizes = [0] * count
    sizes[-1] = 1000
    sizes[0] += 2001
    if count >= 3:
        sizes[1], sizes[0] = 1, 2000
    a = sharded.ShardedArray.from_numpy(places, host, sizes=sizes)
    offsets = random_offsets(len(host), 64, seed=5)
    result = sharded.segmented_reduce(a, given(a, offsets, route), "sum", np.int64(0))
    assert result.dtype == np.int64  # init's wider numpy type
    np.testing.assert_array_equal(result.to_numpy(), sums(host.astype(np.int64), offsets))


@gpu
def test_elements_outside_every_segment_are_ignored(places, route):
    host = sample(np.int64, 2000, seed=6)
    a = sharded.ShardedArray.from_numpy(places, host)
    offsets = np.array([13, 13, 400, 1999], dtype=np.int64)
    np.testing.assert_array_equal(sharded.segmented_reduce(a, given(a, offsets, route), "sum", 0).to_numpy(),
                                  sums(host, offsets))


@gpu
def test_min_max_and_offsets_as_a_sharded_array(places):
    host = sample(np.float64, 5000, seed=7)
    a = sharded.ShardedArray.from_numpy(places, host)
    offsets = random_offsets(len(host), 200, seed=8)
    positions = sharded.ShardedArray.from_numpy(places, offsets)
    low = sharded.segmented_reduce(a, positions, "min", np.inf).to_numpy()
    high = sharded.segmented_reduce(a, offsets, "max", -np.inf).to_numpy()
    for s in range(len(offsets) - 1):
        part = host[offsets[s]:offsets[s + 1]]
        assert low[s] == (part.min() if part.size else np.inf)
        assert high[s] == (part.max() if part.size else -np.inf)


@gpu
def test_non_commutative_operator_gives_the_sequential_answer(places, route):
    # x -> (a, b) the affine map t -> a t + b; composing "first then second" is associative,
    # not commutative. Modulo a prime so every product stays exact in int64.
    prime = 1_000_003

    def compose(p, q):
        return (p[0] * q[0]) % prime, (q[0] * p[1] + q[1]) % prime

    host = sample(np.int64, 20_000, seed=9) % 97 + 2
    a = sharded.ShardedArray.from_numpy(places, host)
    offsets = random_offsets(len(host), 150, seed=10)
    result = sharded.segmented_reduce(a, given(a, offsets, route), compose, (np.int64(1), np.int64(0)),
                                      map_op=lambda x: (x, x + 1)).to_numpy()
    expected = sequential([(int(x), int(x) + 1) for x in host], offsets, compose, (1, 0))
    assert [(int(r[0]), int(r[1])) for r in result] == expected


@gpu
def test_last_element_and_first_min_with_index(places, route):
    host = sample(np.float32, 9000, seed=11)
    a = sharded.ShardedArray.from_numpy(places, host)
    offsets = random_offsets(len(host), 400, seed=12)
    last = sharded.segmented_reduce(a, given(a, offsets, route), lambda x, y: y, np.float32(-7)).to_numpy()
    np.testing.assert_array_equal(last, sequential(list(host), offsets, lambda x, y: y, np.float32(-7)))

    def first_min(p, q):
        return q if q[0] < p[0] else p

    found = sharded.segmented_reduce(a, given(a, offsets, route), first_min, (np.float32(np.inf), np.int64(-1)),
                                     map_op=lambda x, i: (x, i), with_index=True).to_numpy()
    for s in range(len(offsets) - 1):
        part = host[offsets[s]:offsets[s + 1]]
        expected = int(offsets[s] + np.argmin(part)) if part.size else -1
        assert int(found["f1"][s]) == expected


@gpu
def test_count_and_sum_tuple_accumulator(places, route):
    host = sample(np.float64, 30_000, seed=13)
    a = sharded.ShardedArray.from_numpy(places, host)
    offsets = random_offsets(len(host), 1000, seed=14)
    stats = sharded.segmented_reduce(a, given(a, offsets, route), lambda p, q: (p[0] + q[0], p[1] + q[1]),
                                     (np.int64(0), 0.0), map_op=lambda x: (np.int64(1), x)).to_numpy()
    np.testing.assert_array_equal(stats["f0"], np.diff(offsets))
    np.testing.assert_allclose(stats["f1"], sums(host, offsets), rtol=1e-9, atol=1e-9)


@gpu
def test_records_fold_as_themselves(places, route):
    point = np.dtype([("x", np.float32), ("y", np.int32)], align=True)
    host = np.zeros(4000, point)
    host["x"] = sample(np.float32, 4000, seed=15)
    host["y"] = sample(np.int32, 4000, seed=16)
    a = sharded.ShardedArray.from_numpy(places, host)
    offsets = random_offsets(len(host), 90, seed=17)
    result = sharded.segmented_reduce(a, given(a, offsets, route), lambda p, q: (p.x + q.x, p.y + q.y),
                                      (np.float32(0), np.int32(0))).to_numpy()
    np.testing.assert_array_equal(result["y"], sums(host["y"], offsets))
    np.testing.assert_allclose(result["x"], sums(host["x"], offsets), rtol=1e-4, atol=1e-3)


@gpu
def test_empty_array_no_segments_and_determinism(places, route):
    empty = sharded.ShardedArray.from_numpy(places, np.zeros(0, np.int64))
    np.testing.assert_array_equal(
        sharded.segmented_reduce(empty, given(empty, np.zeros(5, np.int64), route), "sum", 3).to_numpy(),
        np.full(4, 3))
    host = sample(np.float32, 50_000, seed=18)
    a = sharded.ShardedArray.from_numpy(places, host)
    assert sharded.segmented_reduce(a, given(a, np.array([7]), route), "sum", 0.0).size == 0
    offsets = random_offsets(len(host), 33, seed=19)
    first = sharded.segmented_reduce(a, given(a, offsets, route), "sum", 0.0).to_numpy()
    again = sharded.segmented_reduce(a, given(a, offsets, route), "sum", 0.0).to_numpy()
    assert first.tobytes() == again.tobytes()
    np.testing.assert_allclose(first, sums(host, offsets), rtol=1e-4, atol=1e-3)


@gpu
def test_device_positions_in_one_shard_or_spread_and_both_routes_agree(places):
    # positions held by one place (read in place where it shares the device, else copied),
    # or spread one per place; both routes fold every piece with the same association on one
    # place, so the bits agree there; on several the shapes may differ, the sums may not
    host = sample(np.float64, 200_003, seed=20)
    a = sharded.ShardedArray.from_numpy(places, host, sizes=None)
    offsets = random_offsets(len(host), 777, seed=21)
    count = len(places)
    layouts = [[len(offsets)] + [0] * (count - 1), [0] * (count - 1) + [len(offsets)], None]
    from_host = sharded.segmented_reduce(a, offsets, "sum", 0.0).to_numpy()
    np.testing.assert_allclose(from_host, sums(host, offsets), rtol=1e-12, atol=1e-9)
    for sizes in layouts:
        positions = sharded.ShardedArray.from_numpy(places, offsets, sizes=sizes)
        from_device = sharded.segmented_reduce(a, positions, "sum", 0.0).to_numpy()
        np.testing.assert_allclose(from_device, sums(host, offsets), rtol=1e-12, atol=1e-9)
        if count == 1:
            assert from_device.tobytes() == from_host.tobytes()


@gpu
def test_many_calls_in_flight_keep_their_own_positions(places, route):
    # the host route stages positions in reused pinned buffers: calls queued back to back
    # (no wait between them) must each fold with their own positions
    host = sample(np.int64, 300_000, seed=22)
    a = sharded.ShardedArray.from_numpy(places, host)
    cases = [random_offsets(len(host), 50 + 37 * k, seed=100 + k) for k in range(24)]
    results = [sharded.segmented_reduce(a, given(a, offsets, route), "sum", 0) for offsets in cases]
    for offsets, result in zip(cases, results):
        np.testing.assert_array_equal(result.to_numpy(), sums(host, offsets))


@gpu
def test_bad_device_positions_raise_the_host_messages(places):
    host = sample(np.float32, 1000, seed=23)
    a = sharded.ShardedArray.from_numpy(places, host)
    cases = {
        r"offsets: positions must be non-decreasing; offsets\[2\] = 3 comes after offsets\[1\] = 500":
            [0, 500, 3, 2, 1000],
        r"offsets: positions must lie in \[0, len\(a\)\] = \[0, 1000\]; offsets\[0\] is -1": [-1, 4, 1000],
        r"offsets: positions must lie in \[0, len\(a\)\] = \[0, 1000\]; offsets\[2\] is 1001": [0, 4, 1001],
        r"offsets: positions must be non-decreasing; offsets\[1\] = -5": [-1, -5, 2000],  # a fall comes first
        r"offsets\[0\] is 1002": [1002],
    }
    for message, offsets in cases.items():
        for where in (given(a, offsets, "host"), given(a, offsets, "device")):
            with pytest.raises(ValueError, match=message):
                sharded.segmented_reduce(a, where, "sum", 0.0)
    # a first fall far into many positions (the kernel's least index, the host's first block)
    offsets = np.minimum(np.arange(100_001, dtype=np.int64), 1000)
    offsets[70_001] = 3
    offsets[90_001] = 2
    for where in (given(a, offsets, "host"), given(a, offsets, "device")):
        with pytest.raises(ValueError, match=r"offsets\[70001\] = 3 comes after offsets\[70000\] = 1000"):
            sharded.segmented_reduce(a, where, "sum", 0.0)
    # an empty array: no fold runs, the check runs alone
    empty = sharded.ShardedArray.from_numpy(places, np.zeros(0, np.float32))
    for where in (given(empty, [0, 0, 1], "host"), given(empty, [0, 0, 1], "device")):
        with pytest.raises(ValueError, match=r"\[0, len\(a\)\] = \[0, 0\]; offsets\[2\] is 1"):
            sharded.segmented_reduce(empty, where, "sum", 0.0)
    # nothing was left behind: the next call is right
    good = random_offsets(len(host), 40, seed=24)
    np.testing.assert_allclose(sharded.segmented_reduce(a, given(a, good, "device"), "sum", 0.0).to_numpy(),
                               sums(host, good), rtol=1e-4, atol=1e-3)


@gpu
def test_device_positions_of_another_group_or_dtype_are_refused(places):
    a = sharded.ShardedArray.from_numpy(places, sample(np.float32, 100, seed=25))
    other = sharded.PlaceGroup.by_devices(list(places.devices))
    with pytest.raises(ValueError, match="offsets: belongs to another PlaceGroup than a"):
        sharded.segmented_reduce(a, sharded.ShardedArray.from_numpy(other, np.array([0, 100])), "sum", 0.0)
    with pytest.raises(TypeError, match="offsets: a ShardedArray of offsets must hold int64, not uint64"):
        sharded.segmented_reduce(a, sharded.ShardedArray.from_numpy(places, np.array([0, 100], np.uint64)),
                                 "sum", 0.0)


# ---- CPU: argument errors before anything runs -------------------------------------------

@pytest.fixture
def untouched(monkeypatch):
    reached = []
    for name in ("segmented_reduce", "reduce", "KernelLibrary"):
        def entry(*args, _name=name, **kwargs):
            reached.append(_name)
            raise AssertionError(f"_shim.{_name} was reached: the error came too late")
        monkeypatch.setattr(_shim, name, entry, raising=False)
    yield reached
    assert reached == []


def test_offsets_errors_name_offsets(untouched):
    group = stand_in_group()
    a = stand_in_array(group)  # 10 elements
    add = lambda x, y: x + y  # noqa: E731
    with pytest.raises(ValueError, match=r"offsets: positions must be non-decreasing; offsets\[2\] = 3"):
        sharded.segmented_reduce(a, np.array([0, 5, 3, 10]), add, 0.0)
    with pytest.raises(ValueError, match=r"offsets: positions must lie in \[0, len\(a\)\] = \[0, 10\]; "
                                         r"offsets\[1\] is 11"):
        sharded.segmented_reduce(a, np.array([0, 11]), add, 0.0)
    with pytest.raises(ValueError, match=r"offsets\[0\] is -1"):
        sharded.segmented_reduce(a, np.array([-1, 4]), add, 0.0)
    with pytest.raises(ValueError, match="offsets: expected S \\+ 1 positions"):
        sharded.segmented_reduce(a, np.zeros(0, np.int64), add, 0.0)
    with pytest.raises(ValueError, match="offsets: expected a 1-D array"):
        sharded.segmented_reduce(a, np.zeros((2, 2), np.int64), add, 0.0)
    with pytest.raises(TypeError, match="offsets: expected integer positions, got an array of float64"):
        sharded.segmented_reduce(a, np.array([0.0, 10.0]), add, 0.0)
    with pytest.raises(TypeError, match="offsets: expected a numpy integer array or an int64 ShardedArray"):
        sharded.segmented_reduce(a, [0, 10], add, 0.0)
    with pytest.raises(TypeError, match="offsets: a ShardedArray of offsets must hold int64, not int32"):
        sharded.segmented_reduce(a, stand_in_array(group, dtype=np.int32), add, 0.0)
    with pytest.raises(ValueError, match="offsets: belongs to another PlaceGroup than a"):
        sharded.segmented_reduce(a, stand_in_array(stand_in_group(), dtype=np.int64), add, 0.0)
    with pytest.raises(ValueError, match=r"offsets: expected S \+ 1 positions \(at least one\), got none"):
        sharded.segmented_reduce(a, stand_in_array(group, sizes=(0, 0, 0), dtype=np.int64), add, 0.0)
    with pytest.raises(ValueError, match=r"offsets: positions must lie in \[0, len\(a\)\] = \[0, 10\]; "
                                         r"offsets\[0\] is 11"):
        sharded.segmented_reduce(a, np.array([11]), add, 0.0)
    with pytest.raises(ValueError, match=r"offsets\[1\] is 12"):
        sharded.segmented_reduce(a, np.array([0, 12], np.uint64), add, 0.0)


def first_bad_message(offsets, size):
    """The message the host check gives, from numpy (independent of the shim's pass)."""
    falls = np.flatnonzero(offsets[1:] < offsets[:-1])
    if falls.size:
        at = int(falls[0]) + 1
        return (f"offsets: positions must be non-decreasing; offsets[{at}] = {offsets[at]} "
                f"comes after offsets[{at - 1}] = {offsets[at - 1]}")
    at = 0 if offsets[0] < 0 else len(offsets) - 1
    return f"offsets: positions must lie in [0, len(a)] = [0, {size}]; offsets[{at}] is {offsets[at]}"


def test_host_check_finds_the_first_bad_position_in_one_pass():
    rng = np.random.default_rng(26)
    size = 50_000
    for trial in range(40):
        count = int(rng.integers(1, 20_000))
        offsets = np.sort(rng.integers(0, size + 1, count)).astype(np.int64)
        for _ in range(int(rng.integers(0, 3))):  # zero to two falls, anywhere (block edges too)
            at = int(rng.choice([rng.integers(0, count), min(4096, count - 1), min(4097, count - 1)]))
            offsets[at] = offsets[at] - int(rng.integers(1, 10))
        if trial % 5 == 0:
            offsets[-1] = size + 1
        if trial % 7 == 0:
            offsets[0] = -1
        bad = np.any(offsets[1:] < offsets[:-1]) or offsets[0] < 0 or offsets[-1] > size
        if not bad:
            _shim.check_segment_offsets(offsets.ctypes.data, len(offsets), size)
            continue
        with pytest.raises(ValueError) as raised:
            _shim.check_segment_offsets(offsets.ctypes.data, len(offsets), size)
        assert str(raised.value) == first_bad_message(offsets, size)


def test_operator_and_init_errors(untouched):
    a = stand_in_array(stand_in_group())
    offsets = np.array([0, 10])
    with pytest.raises(ValueError, match="init: segmented_reduce needs an initial value"):
        sharded.segmented_reduce(a, offsets, "sum", None)
    with pytest.raises(TypeError, match="init: a tuple accumulator is built from each element by a map"):
        sharded.segmented_reduce(a, offsets, lambda p, q: p, (0, 0.0))
    with pytest.raises(TypeError, match="segmented_reduce"):
        sharded.segmented_reduce(a, offsets, lambda p: p, 0.0)
    with pytest.raises(ValueError, match="op: expected an operator or one of sum, min, max"):
        sharded.segmented_reduce(a, offsets, "prod", 0.0)
    with pytest.raises(ValueError, match="with_index: needs a map_op"):
        sharded.segmented_reduce(a, offsets, "sum", 0.0, with_index=True)
    with pytest.raises(TypeError, match="a: expected a ShardedArray"):
        sharded.segmented_reduce(np.zeros(10), offsets, "sum", 0.0)
