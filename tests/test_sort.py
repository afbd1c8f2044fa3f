"""sharded.sort against np.sort: every dtype, hard distributions, any number of places."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim

from conftest import ALL_DTYPES, DEVICE_COUNT


def keys(dtype, distribution: str, n: int, seed: int = 0) -> np.ndarray:
    """n keys of `dtype` drawn as `distribution`, over the dtype's whole range where it can."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        uniform = (rng.standard_normal(n) * 1e3).astype(dtype)
    else:
        info = np.iinfo(dtype)
        uniform = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    if distribution == "uniform":
        return uniform
    if distribution == "sorted":
        return np.sort(uniform)
    if distribution == "reverse":
        return np.sort(uniform)[::-1].copy()
    if distribution == "equal":
        return np.full(n, uniform[0] if n else 0, dtype)
    if distribution == "few":
        return rng.choice(uniform[:5] if n >= 5 else np.zeros(1, dtype), n).astype(dtype)
    if distribution == "special":  # floats: NaNs of both signs, infinities, both zeros, tiny
        assert dtype.kind == "f"
        specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, np.finfo(dtype).tiny,
                             -np.finfo(dtype).tiny, np.finfo(dtype).max, np.finfo(dtype).min], dtype)
        mixed = uniform.copy()
        where = rng.random(n) < 0.3
        mixed[where] = rng.choice(specials, int(where.sum()))
        return mixed
    raise ValueError(distribution)


def expected(host: np.ndarray, descending: bool) -> np.ndarray:
    ordered = np.sort(host, kind="stable")
    return ordered[::-1] if descending else ordered


def check_sorted(result: np.ndarray, host: np.ndarray, descending: bool = False) -> None:
    np.testing.assert_array_equal(result, expected(host, descending))
    if result.dtype.kind == "f":  # every NaN comes back as the positive quiet NaN
        assert not np.signbit(result[np.isnan(result)]).any()
        # -0.0 and 0.0 are equal keys: together, between the negatives and the positives
        zeros = np.flatnonzero(result == 0)
        if zeros.size:
            assert zeros[-1] - zeros[0] + 1 == zeros.size


def groups_for_test():
    """Groups of 1, 2, 3 and 4 places; devices repeat when fewer GPUs are visible."""
    devices = max(DEVICE_COUNT, 1)
    return {count: [place % devices for place in range(count)] for count in (1, 2, 3, 4)}


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda count: f"{count}places")
def places(request):
    return sharded.PlaceGroup.by_devices(groups_for_test()[request.param])


DISTRIBUTIONS = ["uniform", "sorted", "reverse", "equal", "few"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_sort_matches_numpy(places, dtype, distribution):
    host = keys(dtype, distribution, 30011, seed=len(places))
    array = sharded.ShardedArray.from_numpy(places, host)
    assert sharded.sort(array) is array
    check_sorted(array.to_numpy(), host)
    assert array.shard_sizes == tuple(sharded.ShardedArray.allocate(places, host.size, dtype).shard_sizes)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_floats_nan_inf_and_zeros(places, dtype, descending):
    host = keys(dtype, "special", 20000, seed=5)
    array = sharded.ShardedArray.from_numpy(places, host)
    sharded.sort(array, descending=descending)
    check_sorted(array.to_numpy(), host, descending)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_sort_descending(places, dtype):
    host = keys(dtype, "few" if np.dtype(dtype).itemsize == 4 else "uniform", 25000, seed=2)
    array = sharded.ShardedArray.from_numpy(places, host)
    sharded.sort(array, descending=True)
    check_sorted(array.to_numpy(), host, descending=True)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [[0, 0, 0, 0], [0, 7, 0, 0], [1, 0, 0, 1], [0, 5000, 0, 3],
                                   [4096, 1, 9000, 0], [3, 3, 3, 20000], [20000, 0, 0, 0]])
@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.uint64])
def test_sort_explicit_and_zero_size_shards(sizes, dtype):
    group = sharded.PlaceGroup.by_devices(groups_for_test()[4])
    host = keys(dtype, "uniform", sum(sizes), seed=sum(sizes))
    array = sharded.ShardedArray.from_numpy(group, host, sizes=sizes)
    sharded.sort(array)
    assert array.shard_sizes == tuple(sizes)
    check_sorted(array.to_numpy(), host)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_sort_contiguous(places, dtype):
    host = keys(dtype, "uniform", 100003, seed=9)
    array = sharded.ShardedArray.from_numpy(places, host, contiguous=True)
    sharded.sort(array)
    assert array.is_contiguous
    check_sorted(array.to_numpy(), host)


@pytest.mark.gpu
def test_sort_out_leaves_input(places):
    host = keys(np.float32, "special", 40000, seed=4)
    array = sharded.ShardedArray.from_numpy(places, host)
    out = sharded.ShardedArray.allocate(places, host.size, np.float32)
    assert sharded.sort(array, out=out) is out
    check_sorted(out.to_numpy(), host)
    np.testing.assert_array_equal(array.to_numpy(), host)  # NaN payloads too: untouched
    assert np.array_equal(array.to_numpy().view(np.uint32), host.view(np.uint32))


@pytest.mark.gpu
def test_sort_large_across_digit_rounds(places):
    # keys that agree on their high bits force every round of the splitter search, and
    # long runs of one value straddle the shard boundaries
    rng = np.random.default_rng(11)
    host = (np.int64(1) << 40) + rng.integers(0, 1 << 20, 1 << 20)
    host[rng.random(host.size) < 0.25] = (1 << 40) + 12345
    array = sharded.ShardedArray.from_numpy(places, host)
    sharded.sort(array)
    check_sorted(array.to_numpy(), host)


# From 2^25 keys per shard over several devices (here from 2^20: CSJ_SORT_SAMPLE_MIN_KEYS),
# samples taken during the local sorts bound the cuts, and the first chunk's keys travel as
# soon as the sorts end; bounds that miss (keys the samples misjudge;
# CSJ_SORT_SAMPLE_SIGMAS=0 makes them miss almost always) send the place's pieces again, one
# after another. With one GPU the places share it: nothing travels.
SAMPLED_N = 1 << 20


@pytest.fixture
def sampled_from_2_20(monkeypatch):
    monkeypatch.setenv("CSJ_SORT_SAMPLE_MIN_KEYS", str(SAMPLED_N))


def skewed(dtype, n: int, seed: int) -> np.ndarray:
    """Nine keys in ten crowded in a narrow range, the rest spread: the bounds of most cuts
    fall inside the crowd."""
    rng = np.random.default_rng(seed)
    spread = keys(dtype, "uniform", n, seed)
    crowd = np.asarray(rng.integers(1000, 1064, n), dtype=dtype)
    return np.where(rng.random(n) < 0.9, crowd, spread)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, distribution, sigmas", [
    (np.int32, "uniform", None), (np.int32, "sorted", None), (np.int32, "reverse", None), (np.int32, "few", None),
    (np.int32, "skewed", None), (np.float64, "uniform", None), (np.float64, "skewed", None),
    (np.int32, "uniform", "0"), (np.int32, "few", "0"), (np.float64, "uniform", "0")])
def test_sort_sampled_bounds(places, monkeypatch, sampled_from_2_20, dtype, distribution, sigmas):
    if sigmas is not None:
        monkeypatch.setenv("CSJ_SORT_SAMPLE_SIGMAS", sigmas)
    n = len(places) * SAMPLED_N + 4099
    seed = len(places)
    host = skewed(dtype, n, seed) if distribution == "skewed" else keys(dtype, distribution, n, seed)
    array = sharded.ShardedArray.from_numpy(places, host)
    sampled, missed, _ = _shim._sort_path_counts()
    sharded.sort(array)
    check_sorted(array.to_numpy(), host)
    after = _shim._sort_path_counts()
    if len(set(places.devices)) > 1 and distribution == "uniform" and dtype == np.int32:
        # keys spread evenly over the buckets: every place's windows fit, so the samples'
        # bounds are used; with a margin of 6 standard deviations they hold, with none they
        # miss (a bucket holds ~32 keys here, the samples' error ~2000)
        assert after[0] == sampled + 1
        assert after[1] == (missed if sigmas is None else missed + 1)
    sharded.sort(array, descending=True)  # sorted keys, the other way
    check_sorted(array.to_numpy(), host, descending=True)


@pytest.mark.gpu
def test_sort_sampled_bounds_uneven_shards(sampled_from_2_20):
    group = sharded.PlaceGroup.by_devices(groups_for_test()[3])
    sizes = [SAMPLED_N, 3 * SAMPLED_N + 17, SAMPLED_N + 5]
    host = keys(np.int64, "uniform", sum(sizes), seed=5)
    array = sharded.ShardedArray.from_numpy(group, host, sizes)
    out = sharded.ShardedArray.allocate(group, sizes, np.int64)
    sharded.sort(array, out=out)
    assert out.shard_sizes == tuple(sizes)
    check_sorted(out.to_numpy(), host)
    np.testing.assert_array_equal(array.to_numpy(), host)


@pytest.mark.gpu
def test_sort_twice_is_stable_and_deterministic(places):
    host = keys(np.float64, "few", 50000, seed=3)
    first = sharded.sort(sharded.ShardedArray.from_numpy(places, host)).to_numpy()
    second = sharded.sort(sharded.ShardedArray.from_numpy(places, host)).to_numpy()
    assert np.array_equal(first.view(np.uint64), second.view(np.uint64))


@pytest.mark.gpu
@pytest.mark.parametrize("descending", [False, True])
def test_sort_repeated_on_the_same_buffers(places, descending):
    # the same array sorted again and again with new keys: from the second sort on, the local
    # sorts are replayed from CUDA graphs (same buffers, same size), which must sort what the
    # buffers hold now
    n = (1 << 16) + 3
    array = sharded.ShardedArray.allocate(places, n, np.int64)
    for round_ in range(5):
        start, step = round_ * 12345, (-1) ** round_ * (round_ + 1) * 1000003
        sharded.sequence(array, start=start, step=step)
        host = start + np.arange(n, dtype=np.int64) * step
        np.testing.assert_array_equal(array.to_numpy(), host)
        sharded.sort(array, descending=descending)
        check_sorted(array.to_numpy(), host, descending)


@pytest.mark.gpu
def test_concurrent_sorts_on_one_group():
    group = sharded.PlaceGroup.by_devices(groups_for_test()[3])
    hosts = [keys(dtype, "uniform", 50000 + 17 * index, seed=index)
             for index, dtype in enumerate([np.int32, np.float32, np.uint64, np.float64] * 2)]
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            array = sharded.ShardedArray.from_numpy(group, hosts[index])
            for _ in range(3):
                sharded.sort(array, descending=bool(index % 2))
            results[index] = array.to_numpy()
        except BaseException as error:  # reported below, in the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(len(hosts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for index, host in enumerate(hosts):
        check_sorted(results[index], host, descending=bool(index % 2))


@pytest.mark.gpu
def test_sort_rejects_mismatched_out(three_places, one_place):
    array = sharded.ShardedArray.from_numpy(three_places, np.arange(10, dtype=np.int32))
    with pytest.raises(ValueError, match="out: dtype"):
        sharded.sort(array, out=sharded.ShardedArray.allocate(three_places, 10, np.int64))
    with pytest.raises(ValueError, match="out: shard sizes"):
        sharded.sort(array, out=sharded.ShardedArray.allocate(three_places, [10, 0, 0], np.int32))
    with pytest.raises(ValueError, match="out: belongs"):
        sharded.sort(array, out=sharded.ShardedArray.allocate(one_place, 10, np.int32))
    freed = sharded.ShardedArray.allocate(three_places, 10, np.int32)
    freed.free()
    with pytest.raises(ValueError):
        sharded.sort(freed)
    np.testing.assert_array_equal(array.to_numpy(), np.arange(10, dtype=np.int32))


def test_sort_argument_types():
    with pytest.raises(TypeError, match="a: expected a ShardedArray"):
        sharded.sort(np.arange(3))
