"""GPU tests of from_mpi groups under mpiexec (every rank on cuda:0, transport "mpi"; and the
"nccl" transport where every rank has a GPU of its own, at one rank on one GPU): data in
and out, and every algorithm that runs across processes, against numpy and bit for bit
against by_devices([0] * P) with the same P places and shard sizes.

    python tests/distributed/run.py -n 2 -n 3 -n 4 -- -m gpu

Every rank makes the same host data (the same seed), so each can compute the references
itself. Collectives first, assertions after: an assertion that fails on one rank must not
skip a collective the others still make.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import sample, uneven
from helpers.bits import bit_difference

from .conftest import RANK, SIZE, allgather, outcome_of, ties_and_nans

import cuda_sharded_jit as sharded

pytestmark = pytest.mark.gpu

N = (1 << 20) + 4099  # several blocks per place, and a ragged tail


def _bits(value) -> bytes:
    """The value's bytes; a record's field by field (its padding is never written)."""
    if isinstance(value, tuple):
        return b"".join(_bits(field) for field in value)
    value = np.asarray(value)
    if value.dtype.names:
        return b"".join(value[name].tobytes() for name in value.dtype.names)
    return value.tobytes()


@pytest.fixture(scope="module", params=["one-place-a-rank", "two-places-a-rank", "nccl"])
def groups(request):
    """(a from_mpi group, by_devices([0] * its places)): the same places on one GPU over MPI
    (one or two places a rank); or, over NCCL, one place a rank on a GPU of its own (skipped
    where there are fewer GPUs than ranks, or no NCCL: NCCL refuses two ranks on one GPU)."""
    if request.param == "nccl":
        from cuda_sharded_jit.distributed._nccl import nccl_loads

        able = sharded._shim.visible_device_count() >= SIZE and nccl_loads()
        if not all(allgather(able)):  # every rank skips, or none does
            pytest.skip(f"the NCCL transport needs NCCL and a GPU a rank ({SIZE} ranks on one host)")
        group = sharded.PlaceGroup.from_mpi(devices=[RANK], transport="nccl")
    else:
        group = sharded.PlaceGroup.from_mpi(devices=[0] if request.param == "one-place-a-rank" else [0, 0],
                                            transport="mpi")
    return group, sharded.PlaceGroup.by_devices([0] * len(group))


def _pair(groups, dtype, n=N, seed=0, sizes=None):
    """(host, array on the from_mpi group, array on the reference group), same shard sizes."""
    group, reference = groups
    host = sample(dtype, n, seed)
    sizes = uneven(len(group), n) if sizes is None else sizes
    return (host, sharded.ShardedArray.from_numpy(group, host, sizes=sizes, root=None),
            sharded.ShardedArray.from_numpy(reference, host, sizes=sizes))


def test_the_group_numbers_places_in_rank_order(groups):
    group, _ = groups
    per_rank = len(group) // SIZE
    nccl = group.transport == "nccl"
    assert group.nranks == SIZE and group.rank == RANK and group.transport in ("mpi", "nccl")
    assert group.local_places == tuple(range(RANK * per_rank, (RANK + 1) * per_rank))
    assert group.place_ranks == tuple(rank for rank in range(SIZE) for _ in range(per_rank))
    assert group.devices == (tuple(range(SIZE)) if nccl else (0,) * len(group))
    assert group.archs == (group.archs[0],) * per_rank
    assert group._exchange_how == ("nccl" if nccl else "staged")  # the mpich wheel is not CUDA-aware
    assert all(isinstance(group.stream(place), int) for place in group.local_places)
    if SIZE > 1:
        other = (group.local_places[-1] + 1) % len(group)
        with pytest.raises(ValueError, match=f"place: {other} lives on rank"):
            group.stream(other)
    assert "from_mpi" in repr(group)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64])
def test_data_in_and_out(groups, dtype):
    group, _ = groups
    host = sample(dtype, 1000 + 7 * len(group), seed=1)
    sizes = uneven(len(group), host.size)
    last = SIZE - 1
    scattered = sharded.ShardedArray.from_numpy(group, host if RANK == 0 else None, sizes=sizes)
    from_last = sharded.ShardedArray.from_numpy(group, host if RANK == last else None, root=last)
    everyone = sharded.ShardedArray.from_numpy(group, host, root=None)
    at_root = scattered.to_numpy()
    at_last = from_last.to_numpy(root=last)
    at_all = everyone.to_numpy(root=None)
    converted = np.asarray(scattered)
    views = [(view.place, view.shape, view.device) for view in scattered.local_shards()]
    assert scattered.shard_sizes == tuple(sizes) and scattered.size == host.size and len(scattered) == host.size
    assert from_last.shard_sizes == everyone.shard_sizes == tuple(_even(host.size, len(group)))
    assert (at_root is not None) == (RANK == 0) and (at_last is not None) == (RANK == last)
    if RANK == 0:
        assert np.array_equal(at_root, host)
    if RANK == last:
        assert np.array_equal(at_last, host)
    assert np.array_equal(at_all, host) and np.array_equal(converted, host)
    assert views == [(place, (sizes[place],), 0) for place in group.local_places]


def _even(n, places):
    return [n // places + (1 if place < n % places else 0) for place in range(places)]


def test_from_local_gathers_every_rank_s_sizes(groups):
    group, _ = groups
    parts = [np.arange(place + 3, dtype=np.float64) + 100 * place for place in group.local_places]
    array = sharded.ShardedArray.from_local(group, parts)
    gathered = array.to_numpy(root=None)
    records = np.dtype([("x", np.float32), ("n", np.int64)], align=True)
    record_parts = [np.zeros(place + 1, records) for place in group.local_places]
    for place, part in zip(group.local_places, record_parts):
        part["x"], part["n"] = place, np.arange(place + 1)
    record_array = sharded.ShardedArray.from_local(group, record_parts)
    record_host = record_array.to_numpy(root=None)
    expected = np.concatenate([np.arange(place + 3, dtype=np.float64) + 100 * place for place in range(len(group))])
    assert array.shard_sizes == tuple(place + 3 for place in range(len(group)))
    assert np.array_equal(gathered, expected)
    assert record_array.dtype == records
    assert np.array_equal(record_host["n"], np.concatenate([np.arange(place + 1) for place in range(len(group))]))


def test_from_local_adopts_device_buffers(groups):
    cupy = pytest.importorskip("cupy")
    group, _ = groups
    parts = [cupy.arange(place + 2, dtype=cupy.float32) for place in group.local_places]
    array = sharded.ShardedArray.from_local(group, parts)
    host = array.to_numpy(root=None)
    assert array.storage == "adopted"
    assert np.array_equal(host, np.concatenate([np.arange(place + 2, dtype=np.float32) for place in range(len(group))]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint64])
def test_reductions_match_by_devices_bit_for_bit(groups, dtype):
    host, a, r = _pair(groups, dtype, seed=2)
    calls = {
        "sum": lambda x: sharded.sum(x),
        "min": lambda x: sharded.min(x),
        "max": lambda x: sharded.max(x),
        "user add": lambda x: sharded.reduce(x, lambda p, q: p + q),
        "user add, init": lambda x: sharded.reduce(x, lambda p, q: p + q, init=3),
        "wider init": lambda x: sharded.reduce(x, "sum", init=np.float64(0.5)),
        "squares": lambda x: sharded.transform_reduce(x, lambda v: v * v, lambda p, q: p + q, 0),
        "tuple": lambda x: sharded.transform_reduce(x, lambda v: (v, v * v), lambda p, q: (p[0] + q[0], p[1] + q[1]),
                                                   None),
        "with index": lambda x: sharded.transform_reduce(x, lambda v, i: v * (i % 3), lambda p, q: p + q, 0,
                                                        with_index=True),
        "argmin": lambda x: sharded.argmin(x),
        "argmax": lambda x: sharded.argmax(x),
        "count": lambda x: sharded.count(x, host[5]),
        "count_if": lambda x: sharded.count_if(x, lambda v: v > 0),
        "mean": lambda x: x.mean(),
        "var": lambda x: x.var(),
    }
    ours = {name: call(a) for name, call in calls.items()}
    theirs = {name: call(r) for name, call in calls.items()}
    wide = host.astype(np.float64)
    assert {name: _bits(value) for name, value in ours.items()} == {name: _bits(value) for name, value in theirs.items()}
    assert ours["argmin"] == np.argmin(host) and ours["argmax"] == np.argmax(host)
    assert ours["count"] == np.count_nonzero(host == host[5]) and ours["count_if"] == np.count_nonzero(host > 0)
    assert ours["min"] == host.min() and ours["max"] == host.max()
    if np.dtype(dtype).kind == "f":
        assert np.isclose(ours["sum"], wide.sum(), rtol=1e-4)
        assert np.isclose(ours["tuple"][1], (wide * wide).sum(), rtol=1e-4)
        assert np.isclose(ours["mean"], wide.mean()) and np.isclose(ours["var"], wide.var())
    else:
        assert ours["sum"] == host.sum(dtype=host.dtype)
        assert ours["with index"] == (host * (np.arange(host.size) % 3)).sum(dtype=host.dtype)


def test_argmin_keeps_numpy_s_first_index_and_nan_rules(groups):
    host = np.full(4000, 5.0, np.float32)
    host[[100, 2500, 3999]] = -1.0  # ties: the first wins
    with_nan = host.copy()
    with_nan[[1800, 3000]] = np.nan  # the first NaN wins
    group, reference = groups
    sizes = uneven(len(group), host.size)
    results = []
    for data in (host, with_nan):
        a = sharded.ShardedArray.from_numpy(group, data, sizes=sizes, root=None)
        r = sharded.ShardedArray.from_numpy(reference, data, sizes=sizes)
        results.append((sharded.argmin(a), sharded.argmax(a), sharded.argmin(r), sharded.argmax(r),
                        np.argmin(data), np.argmax(data)))
    for ours_min, ours_max, their_min, their_max, numpy_min, numpy_max in results:
        assert (ours_min, ours_max) == (their_min, their_max) == (numpy_min, numpy_max)


def test_histogram_adds_every_rank_s_counts(groups):
    host, a, r = _pair(groups, np.float32, seed=3)
    ours = sharded.histogram_even(a, num_bins=64, lower=-2.0, upper=2.0)
    theirs = sharded.histogram_even(r, num_bins=64, lower=-2.0, upper=2.0)
    assert np.array_equal(ours, theirs)
    assert np.array_equal(ours, np.histogram(host, bins=64, range=(-2.0, 2.0))[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_scans_match_by_devices_bit_for_bit(groups, dtype):
    host, a, r = _pair(groups, dtype, seed=4)
    calls = {
        "inclusive sum": lambda x: sharded.inclusive_scan(x),
        "inclusive max": lambda x: sharded.inclusive_scan(x, "max"),
        "exclusive sum": lambda x: sharded.exclusive_scan(x, "sum", 0),
        "user inclusive": lambda x: sharded.inclusive_scan(x, lambda p, q: p + q),
        "user inclusive, init": lambda x: sharded.inclusive_scan(x, lambda p, q: p + q, init=2),
        "user exclusive": lambda x: sharded.exclusive_scan(x, lambda p, q: p + q, 1),
        "indexed map": lambda x: sharded.transform_inclusive_scan(x, lambda v, i: v + (i % 5), lambda p, q: p + q,
                                                                 with_index=True),
        "running first min": lambda x: sharded.transform_inclusive_scan(
            x, lambda v, i: (v, i), lambda p, q: q if q[0] < p[0] else p, with_index=True),
        "in place": lambda x: (lambda y: sharded.inclusive_scan(y, out=y))(x.copy()),
    }
    ours = {name: call(a).to_numpy(root=None) for name, call in calls.items()}
    theirs = {name: call(r).to_numpy() for name, call in calls.items()}
    assert {name: _bits(value) for name, value in ours.items()} == {name: _bits(value) for name, value in theirs.items()}
    index = np.arange(host.size)
    if np.dtype(dtype).kind == "i":
        assert np.array_equal(ours["inclusive sum"], np.cumsum(host))
        assert np.array_equal(ours["exclusive sum"], np.concatenate([[0], np.cumsum(host)[:-1]]))
        assert np.array_equal(ours["indexed map"], np.cumsum(host + index % 5))
        assert np.array_equal(ours["user exclusive"], 1 + np.concatenate([[0], np.cumsum(host)[:-1]]))
    else:
        assert np.allclose(ours["inclusive sum"], np.cumsum(host.astype(np.float64)), rtol=1e-3, atol=1e-2)
    assert np.array_equal(ours["inclusive max"], np.maximum.accumulate(host))
    minima = np.minimum.accumulate(host)
    record = host < np.concatenate([[np.inf], minima[:-1]])  # where a prefix's minimum first appears
    assert np.array_equal(ours["running first min"]["f1"], np.maximum.accumulate(np.where(record, index, 0)))
    assert np.array_equal(ours["running first min"]["f0"], minima)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_lone_shard_scans_as_in_one_process(groups, dtype):
    """Where the last place holds every element, its rank scans it as one process scans a
    lone shard (in one pass): float sums the same bits as by_devices', and near numpy's."""
    group, _ = groups
    host, a, r = _pair(groups, dtype, seed=6, sizes=[0] * (len(group) - 1) + [N])
    calls = (lambda x: sharded.inclusive_scan(x, lambda p, q: p + q), lambda x: sharded.exclusive_scan(x, "sum", 0.5))
    for call in calls:
        ours, theirs = call(a).to_numpy(root=None), call(r).to_numpy()
        assert _bits(ours) == _bits(theirs)
    running = np.cumsum(host.astype(np.float64))
    assert np.allclose(ours, 0.5 + np.concatenate([[0.0], running[:-1]]), rtol=1e-3, atol=1e-2)


def test_transform_and_sequence_see_global_indices(groups):
    host, a, r = _pair(groups, np.float64, seed=5)
    indexed = sharded.transform(lambda x, i: x * 2 + i, a, with_index=True).to_numpy(root=None)
    sequence = sharded.sequence(sharded.ShardedArray.allocate(a.group, list(a.shard_sizes), np.int64), 10, 3)
    filled = sharded.fill(sharded.ShardedArray.allocate(a.group, list(a.shard_sizes), np.float32), 2.5)
    axpy = sharded.transform(sharded.ops.axpy(2.0), a, a).to_numpy(root=None)
    arithmetic = (a * 3.0 - a).to_numpy(root=None)
    compared = (a > 0).to_numpy(root=None)
    sequence_host = sequence.to_numpy(root=None)
    filled_host = filled.to_numpy(root=None)
    assert np.array_equal(indexed, host * 2 + np.arange(host.size))
    assert np.array_equal(sequence_host, 10 + 3 * np.arange(host.size))
    assert np.array_equal(filled_host, np.full(host.size, 2.5, np.float32))
    assert np.array_equal(axpy, 2.0 * host + host)
    assert np.array_equal(arithmetic, host * 3.0 - host)
    assert np.array_equal(compared, (host > 0).astype(compared.dtype)) and compared.dtype.kind == "u"


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_adjacent_difference_meets_the_previous_rank_s_last_element(groups, dtype):
    group, reference = groups
    host = sample(dtype, 20000, seed=9)
    layouts = [uneven(len(group), host.size), [0] * (len(group) - 1) + [host.size],
               [host.size] + [0] * (len(group) - 1)]
    layouts.append([host.size // len(group) if place % 2 else 0 for place in range(len(group))])
    layouts[-1][-1] += host.size - sum(layouts[-1])  # every other shard empty
    results = []
    for sizes in layouts:
        a = sharded.ShardedArray.from_numpy(group, host, sizes=sizes, root=None)
        r = sharded.ShardedArray.from_numpy(reference, host, sizes=sizes)
        results.append((sharded.adjacent_difference(a).to_numpy(root=None),
                        sharded.adjacent_difference(r).to_numpy(),
                        sharded.adjacent_difference(a, op=lambda x, previous: x * 2 - previous).to_numpy(root=None),
                        sharded.adjacent_difference(r, op=lambda x, previous: x * 2 - previous).to_numpy()))
    for ours, theirs, ours_op, theirs_op in results:
        assert bit_difference(ours, theirs) is None and bit_difference(ours_op, theirs_op) is None
        assert np.array_equal(ours, np.concatenate([host[:1], np.diff(host)]))
        wide = host.astype(np.result_type(host.dtype, np.int64))  # numba: float32 * int64 is float64
        assert ours_op.dtype == wide.dtype
        assert np.array_equal(ours_op, np.concatenate([wide[:1], wide[1:] * 2 - wide[:-1]]))


def test_resharded_moves_elements_between_ranks(groups):
    host, a, _ = _pair(groups, np.int32, seed=6)
    places = len(a.group)
    target = [0] * places
    target[-1] = host.size  # everything to the last rank's last place
    moved = a.resharded(target)
    even = sharded.redistribute(moved)
    records = np.dtype([("v", np.int32), ("w", np.float64)], align=True)
    record_host = np.zeros(host.size, records)
    record_host["v"], record_host["w"] = host, host * 0.5
    record_array = sharded.ShardedArray.from_numpy(a.group, record_host, root=None)
    record_moved = record_array.resharded(uneven(places, host.size)[::-1])
    results = (moved.to_numpy(root=None), even.to_numpy(root=None), record_moved.to_numpy(root=None))
    assert moved.shard_sizes == tuple(target) and even.shard_sizes == tuple(_even(host.size, places))
    assert np.array_equal(results[0], host) and np.array_equal(results[1], host)
    assert np.array_equal(results[2], record_host)


def test_an_error_on_one_rank_is_raised_on_every_rank(groups):
    _, a, _ = _pair(groups, np.float32, n=5000, seed=7)
    last = SIZE - 1
    bad_op = (lambda x: x) if RANK == last else (lambda x, y: x + y)  # one rank's operator takes 1 argument
    outcomes = [
        outcome_of(lambda: sharded.reduce(a, bad_op)),
        outcome_of(lambda: sharded.inclusive_scan(a, bad_op)),
        outcome_of(lambda: sharded.transform(bad_op, a, a)),
    ]
    after = float(sharded.sum(a))  # the group still works after each error
    everywhere = allgather(outcomes)
    assert all(outcome == everywhere[0] for outcome in everywhere)
    for outcome in outcomes:
        assert outcome is not None and outcome[0] == "TypeError" and "takes 1 argument" in outcome[1]
    assert allgather(after) == [after] * SIZE


def test_a_rank_with_other_shard_sizes_gets_a_clear_value_error_everywhere(groups):
    group, _ = groups
    sizes = uneven(len(group), 6000)
    if RANK == SIZE - 1:
        sizes[0], sizes[-1] = sizes[0] + 1, sizes[-1] - 1  # this rank alone believes other sizes
    a = sharded.ShardedArray.allocate(group, sizes, np.float32)  # each allocates its own part: fine
    outcomes = allgather([outcome_of(lambda: sharded.sum(a)), outcome_of(lambda: sharded.inclusive_scan(a))])
    if SIZE == 1:
        assert outcomes == [[None, None]]
        return
    assert all(outcome == outcomes[0] for outcome in outcomes)
    for kind, text in outcomes[0]:
        assert kind == "ValueError" and "shard sizes" in text and f"on rank {SIZE - 1}" in text


def test_an_allocation_failure_on_one_rank_is_a_memory_error_everywhere(groups):
    group, _ = groups
    sizes = [1000] * len(group)
    if RANK == SIZE - 1:
        sizes[group.local_places[0]] = 1 << 50  # 8 PiB of float64 on this rank's first place
    outcome = outcome_of(lambda: sharded.ShardedArray.allocate(group, sizes, np.float64))
    survivor = sharded.ShardedArray.from_numpy(group, np.arange(10.0), root=None).to_numpy(root=None)
    assert allgather(outcome) == [outcome] * SIZE and outcome[0] == "MemoryError"
    assert np.array_equal(survivor, np.arange(10.0))


def test_what_is_not_a_collective_yet_says_so(groups):
    _, a, _ = _pair(groups, np.float32, n=100)
    outcomes = [outcome_of(lambda: a[3]), outcome_of(lambda: sharded.searchsorted(a, a))]
    assert outcomes[0][0] == "TypeError" and outcomes[0][1].startswith("index: host indexing")
    assert outcomes[1][0] == "ValueError" and outcomes[1][1].startswith("values: searchsorted on a PlaceGroup.from_mpi")


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_segmented_reduce_matches_by_devices_bit_for_bit(groups, dtype):
    group, _ = groups
    host = sample(dtype, N, seed=28)
    rng = np.random.default_rng(29)
    offsets = {"one segment": np.array([0, N]), "short ones": np.arange(0, N + 1, 301),
               "long and empty ones": np.sort(np.concatenate([[0, 0, N, N], rng.integers(0, N + 1, 40)]))}
    everything_first = [N] + [0] * (len(group) - 1)
    results = []
    for sizes in (uneven(len(group), N), everything_first, everything_first[::-1]):
        a, r = _both(groups, host, sizes)
        for name, positions in offsets.items():
            on_ranks = sharded.ShardedArray.from_numpy(group, positions.astype(np.int64), root=None)
            calls = [lambda x: sharded.segmented_reduce(x, on_ranks if x is a else positions, "sum", 0),
                     lambda x: sharded.segmented_reduce(x, positions, lambda p, q: p + q, 2),
                     lambda x: sharded.segmented_reduce(x, positions, "max", -10 ** 6),
                     lambda x: sharded.segmented_reduce(x, positions, lambda p, q: (p[0] + q[0], p[1] + q[1]),
                                                        (0, 0.0), map_op=lambda v, i: (1, v * (i % 3)), with_index=True)]
            results.append((name, positions, [(call(a).to_numpy(root=None), call(r).to_numpy()) for call in calls]))
    for name, positions, pairs in results:
        for ours, theirs in pairs:
            assert ours.shape == (len(positions) - 1,) and _bits(ours) == _bits(theirs), name
        wide = host.astype(np.float64)
        sums = np.array([wide[b:e].sum() for b, e in zip(positions[:-1], positions[1:])])
        lengths = np.diff(positions)
        assert np.allclose(pairs[0][0], sums, rtol=1e-4, atol=1e-2), name
        assert np.allclose(pairs[1][0], sums + 2, rtol=1e-4, atol=1e-2), name
        assert np.array_equal(pairs[2][0], [host[b:e].max() if e > b else -10 ** 6
                                            for b, e in zip(positions[:-1], positions[1:])]), name
        assert np.array_equal(pairs[3][0]["f0"], lengths), name


def test_more_places_than_one_fold_launch_takes():
    # 64 places fold in one launch; beyond, launches chain (by_devices refuses so many, and
    # so does each rank: a rank folds at most 64 non-empty shards of its own)
    if SIZE == 1:
        pytest.skip("more than 64 places need at least two ranks")
    per_rank = -(-65 // SIZE)
    group = sharded.PlaceGroup.from_mpi(devices=[0] * per_rank, transport="mpi")
    host = sample(np.int64, 40 * len(group), seed=8)
    a = sharded.ShardedArray.from_numpy(group, host, root=None)
    total, scanned = sharded.sum(a), sharded.inclusive_scan(a, lambda p, q: p + q).to_numpy(root=None)
    assert len(group) > 64
    assert total == host.sum() and np.array_equal(scanned, np.cumsum(host))


# ---- sorts, selections, searches, runs of equal keys -------------------------------------------------


def _stable_order(host, descending):
    """numpy's stable order (NaNs last), or its reverse with ties in index order (NaNs first)."""
    if not descending:
        return np.argsort(host, kind="stable")
    return host.size - 1 - np.argsort(host[::-1], kind="stable")[::-1]


def _quiet(values):
    values = values.copy()
    if values.dtype.kind == "f":
        values[np.isnan(values)] = np.array(np.nan, values.dtype)
    return values


def _both(groups, host, sizes):
    group, reference = groups
    return (sharded.ShardedArray.from_numpy(group, host, sizes=sizes, root=None),
            sharded.ShardedArray.from_numpy(reference, host, sizes=sizes))


def _shard_layouts(places, n):
    last = [0] * places
    last[-1] = n
    return {"uneven": uneven(places, n), "all on the last place": last}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64])
@pytest.mark.parametrize("descending", [False, True])
def test_sorts_match_by_devices_bit_for_bit(groups, dtype, descending):
    group, _ = groups
    host = ties_and_nans(dtype, N, seed=20, span=50, infinities=5)
    payload = np.arange(N, dtype=np.int64) * 7
    results = {}
    for name, sizes in _shard_layouts(len(group), N).items():
        (a, r), (va, vr) = _both(groups, host, sizes), _both(groups, payload, sizes)
        ours, theirs = ([sharded.sort(x.copy(), descending=descending),
                         *sharded.sort_by_key(x.copy(), values, descending=descending),
                         sharded.argsort(x, descending=descending)] for x, values in ((a, va), (r, vr)))
        results[name] = ([x.to_numpy(root=None) for x in ours], [x.to_numpy() for x in theirs],
                         [x.shard_sizes for x in ours], tuple(sizes))
    order = _stable_order(host, descending)
    for name, (ours, theirs, shard_sizes, sizes) in results.items():
        assert all(s == sizes for s in shard_sizes), name
        for mine, other in zip(ours, theirs):
            assert bit_difference(mine, other) is None, (name, bit_difference(mine, other))
        assert ours[0].tobytes() == _quiet(host[order]).tobytes()
        assert np.array_equal(ours[2], payload[order]) and np.array_equal(ours[3], order)


def test_sort_by_key_moves_records_across_ranks(groups):
    group, reference = groups
    keys_host = ties_and_nans(np.float32, N, seed=21, span=50, infinities=5)
    records = np.dtype([("x", np.float32), ("n", np.int64), ("y", np.int32)], align=True)
    record_host = np.zeros(N, records)
    record_host["n"] = np.arange(N)
    record_host["y"] = -np.arange(N, dtype=np.int32)
    sizes = uneven(len(group), N)
    (ka, kr), (va, vr) = _both(groups, keys_host, sizes), _both(groups, record_host, sizes)
    ours = [x.to_numpy(root=None) for x in sharded.sort_by_key(ka, va, descending=True)]
    theirs = [x.to_numpy() for x in sharded.sort_by_key(kr, vr, descending=True)]
    order = _stable_order(keys_host, True)
    assert ours[0].tobytes() == theirs[0].tobytes() and ours[1].tobytes() == theirs[1].tobytes()
    assert np.array_equal(ours[1]["n"], order)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_selections_top_k_and_searchsorted_match_by_devices(groups, dtype):
    group, _ = groups
    host = ties_and_nans(dtype, N, seed=22, span=50, infinities=5)
    sizes = uneven(len(group), N)
    a, r = _both(groups, host, sizes)

    def selections(x):
        low, middle, high = sharded.three_way_partition(x, lambda v: v < -20, lambda v: v < 20)
        yes, no = sharded.partition(x, lambda v: v > 0)
        return [sharded.select(x, lambda v: v % 3 == 0), sharded.select(x, lambda v, i: i % 5 == 2, with_index=True),
                yes, no, low, middle, high]

    ours = selections(a)
    theirs = selections(r)
    picked = [(x.shard_sizes, x.to_numpy(root=None)) for x in ours]
    expected = [(x.shard_sizes, x.to_numpy()) for x in theirs]
    tops = {(k, largest): (sharded.top_k(a, k, largest), sharded.top_k(r, k, largest))
            for k in (1, 100, 5000) for largest in (True, False)}
    sa, sr = sharded.sort(a.copy()), sharded.sort(r.copy())
    queries = np.array([-60, -20, 0, 3, 49, 70] + ([np.nan] if np.dtype(dtype).kind == "f" else []), dtype)
    searched = {side: (sharded.searchsorted(sa, queries, side=side), sharded.searchsorted(sr, queries, side=side))
                for side in ("left", "right")}
    for (sizes_ours, mine), (sizes_theirs, other) in zip(picked, expected):
        assert sizes_ours == sizes_theirs and mine.tobytes() == other.tobytes()
    if np.dtype(dtype).kind == "i":
        assert np.array_equal(picked[0][1], host[host % 3 == 0])
    for (k, largest), ((v1, i1), (v2, i2)) in tops.items():
        assert v1.tobytes() == v2.tobytes() and np.array_equal(i1, i2), (k, largest)
        assert np.array_equal(i1, _stable_order(host, largest)[:k]), (k, largest)
    for side, (mine, other) in searched.items():
        assert np.array_equal(mine, other) and np.array_equal(mine, np.searchsorted(np.sort(host), queries, side=side))


@pytest.mark.parametrize("descending", [False, True])
def test_key_sorts_and_comparator_searches_match_by_devices(groups, descending):
    group, _ = groups
    host = ties_and_nans(np.int64, N, seed=27, span=50)
    records = np.dtype([("score", np.float32), ("n", np.int64)], align=True)
    record_host = np.zeros(N, records)
    record_host["score"] = host % 7
    record_host["n"] = np.arange(N)
    sizes = uneven(len(group), N)
    (a, r), (ra, rr) = _both(groups, host, sizes), _both(groups, record_host, sizes)

    def sorts(x, rec):
        return [sharded.sort(x.copy(), key=lambda v: abs(v), descending=descending),
                sharded.sort(x.copy(), key=lambda v: (v % 3, -v), descending=descending),
                sharded.sort(rec.copy(), key=lambda p: p.score, descending=descending),
                sharded.sort(x.copy(), compare=lambda p, q: abs(p) < abs(q), descending=descending),
                sharded.sort(rec.copy(), compare=lambda p, q: p[0] < q[0], descending=descending),
                sharded.sort(rec.copy(), key=lambda p: p.score, compare=lambda p, q: p > q)]

    ours = [x.to_numpy(root=None) for x in sorts(a, ra)]
    theirs = [x.to_numpy() for x in sorts(r, rr)]
    for index, (mine, other) in enumerate(zip(ours, theirs)):
        assert _bits(mine) == _bits(other), index
    assert np.array_equal(ours[0], host[_stable_order(np.abs(host), descending)])
    index = np.arange(N)  # lexsort's last key is the primary one; ties keep index order either way
    tuple_order = np.lexsort((index, host, -(host % 3)) if descending else (index, -host, host % 3))
    assert np.array_equal(ours[1], host[tuple_order])
    assert np.array_equal(ours[2]["n"], _stable_order(record_host["score"], descending))
    assert np.array_equal(ours[3], ours[0]) and np.array_equal(ours[4]["n"], ours[2]["n"])
    assert np.array_equal(ours[5]["n"], _stable_order(record_host["score"], True))

    by_abs = lambda p, q: abs(p) < abs(q)  # noqa: E731
    sa, sr = sharded.sort(a.copy(), key=lambda v: abs(v)), sharded.sort(r.copy(), key=lambda v: abs(v))
    queries = np.array([-60, -20, 0, 3, -3, 49, 70], np.int64)
    table = np.abs(sa.to_numpy(root=None))
    for side in ("left", "right"):
        mine = sharded.searchsorted(sa, queries, side=side, compare=by_abs)
        other = sharded.searchsorted(sr, queries, side=side, compare=by_abs)
        assert np.array_equal(mine, other) and np.array_equal(mine, np.searchsorted(table, np.abs(queries), side=side))
    by_score = lambda p, q: p[0] < q[0]  # noqa: E731
    sorted_records = sharded.sort(ra.copy(), key=lambda p: p.score)
    record_queries = np.zeros(3, records)
    record_queries["score"] = [0.5, 3, 9]
    mine = sharded.searchsorted(sorted_records, record_queries, compare=by_score)
    assert np.array_equal(mine, np.searchsorted(np.sort(record_host["score"]), record_queries["score"]))


def _long_runs(n, seed):
    rng = np.random.default_rng(seed)
    lengths = rng.choice([1, 3, 50, 4000, 300000], size=n // 1000 + 10)
    return np.repeat(np.arange(lengths.size, dtype=np.int32) % 5, lengths)[:n].copy()


def _same_bits(by_key, mine, reference) -> list:
    """by_key's results on the from_mpi arrays `mine`, (shard sizes, host copy) each, after
    checking them bit for bit, shard sizes included, against the same on `reference`."""
    ours = [(x.shard_sizes, x.to_numpy(root=None)) for x in by_key(*mine)]
    theirs = [(x.shard_sizes, x.to_numpy()) for x in by_key(*reference)]
    for index, ((sizes_ours, got), (sizes_theirs, other)) in enumerate(zip(ours, theirs)):
        assert sizes_ours == sizes_theirs, (index, sizes_ours, sizes_theirs)
        assert bit_difference(got, other) is None, (index, bit_difference(got, other))
    return ours


@pytest.mark.parametrize("value_dtype", [np.int32, np.int64])
def test_by_key_algorithms_match_by_devices_bit_for_bit(groups, value_dtype):
    group, _ = groups
    keys_host = _long_runs(N, seed=23)
    values_host = sample(value_dtype, N, seed=24)
    sizes = uneven(len(group), N)
    (ka, kr), (va, vr) = _both(groups, keys_host, sizes), _both(groups, values_host, sizes)

    def by_key(k, v):
        return [sharded.inclusive_scan_by_key(k, v, "sum"),
                sharded.inclusive_scan_by_key(k, v, lambda x, y: y if y > 0 else x),  # associative, not commutative
                sharded.exclusive_scan_by_key(k, v, lambda x, y: x + y, 7),
                *sharded.reduce_by_key(k, v, "sum"), *sharded.reduce_by_key(k, v, "max"),
                *sharded.unique_by_key(k, v), sharded.unique(v)]

    ours = _same_bits(by_key, (ka, va), (kr, vr))
    starts = np.flatnonzero(np.concatenate([[True], keys_host[1:] != keys_host[:-1]]))
    assert np.array_equal(ours[3][1], keys_host[starts])
    assert np.array_equal(ours[4][1], np.add.reduceat(values_host, starts).astype(value_dtype))
    assert np.array_equal(ours[9][1], np.unique(values_host))


@pytest.mark.parametrize("value_dtype", [np.float32, np.float64])
def test_float_scans_and_reduce_by_key_match_by_devices_bit_for_bit(groups, value_dtype):
    """A run that crosses ranks is folded as one process folds it across places: the carry
    from the earlier ranks' totals, in place order, on the GPU."""
    group, _ = groups
    keys_host = _long_runs(N, seed=25)
    values_host = sample(value_dtype, N, seed=26)
    sizes = uneven(len(group), N)
    (ka, kr), (va, vr) = _both(groups, keys_host, sizes), _both(groups, values_host, sizes)

    def by_key(k, v):
        return [sharded.inclusive_scan_by_key(k, v, "sum"),
                sharded.exclusive_scan_by_key(k, v, lambda x, y: x * 0.5 + y, 0.25),  # not associative in floats
                *sharded.reduce_by_key(k, v, lambda x, y: x + y)]

    ours = _same_bits(by_key, (ka, va), (kr, vr))
    starts = np.flatnonzero(np.concatenate([[True], keys_host[1:] != keys_host[:-1]]))
    assert np.array_equal(ours[2][1], keys_host[starts])
    expected = np.add.reduceat(values_host.astype(np.float64), starts)
    assert np.allclose(ours[3][1], expected, rtol=1e-3, atol=0.5)


def test_an_error_before_the_totals_exchange_reaches_every_rank(groups, monkeypatch):
    """The last rank fails before its engine exchanges the shards' totals; every other rank's
    real engine is then inside the exchange (called from C++), learns of the error there, and
    raises it through the shim: every rank raises the same error once, and nobody hangs."""
    _, keys, _ = _pair(groups, np.int32, n=20_000, seed=40)
    _, values, _ = _pair(groups, np.int64, n=20_000, seed=41)
    expected = sharded.inclusive_scan_by_key(keys, values, "sum").to_numpy(root=None)
    real = sharded._shim.scan_by_key

    def failing(*args, **kwargs):
        if RANK == SIZE - 1:
            raise MemoryError("out of memory before the totals exchange")
        return real(*args, **kwargs)

    monkeypatch.setattr(sharded._shim, "scan_by_key", failing)
    outcome = outcome_of(lambda: sharded.inclusive_scan_by_key(keys, values, "sum"))
    monkeypatch.setattr(sharded._shim, "scan_by_key", real)
    after = sharded.inclusive_scan_by_key(keys, values, "sum").to_numpy(root=None)  # the group still works
    assert allgather(outcome) == [("MemoryError", "out of memory before the totals exchange")] * SIZE
    assert np.array_equal(after, expected)
