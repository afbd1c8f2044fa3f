"""CPU tests of the from_mpi collectives under mpiexec, on the host-backed stand-in of the shim
(host_shim.py): from_mpi groups of two places a rank, data in and out, the built-in
reductions, scans, counts, fill, sequence and resharding, against numpy; and errors that one
rank hits alone, raised on every rank. The layer's Python and every MPI step run as on GPUs;
only the per-place kernels are numpy's (the gpu tests run the real ones)."""

from __future__ import annotations

import numpy as np
import pytest

from . import fake_nccl, host_shim
from .conftest import RANK, SIZE, allgather, outcome_of, ties_and_nans

import cuda_sharded_jit as sharded
from cuda_sharded_jit.distributed._exchange import ENV_CUDA_AWARE


@pytest.fixture
def group(monkeypatch):
    host_shim.install(monkeypatch)
    monkeypatch.setenv(ENV_CUDA_AWARE, "0")
    return sharded.PlaceGroup.from_mpi(devices=[0, 0], transport="mpi")


@pytest.fixture(params=["staged", "device", "nccl"])
def exchanging_group(request, monkeypatch):
    """A group of each way the all-to-all-v moves data: host staged through MPI, device
    buffers through a CUDA-aware MPI (here host_shim's host buffers), and NCCL (fake_nccl's
    calls carried out by MPI: two places a rank on distinct devices, as NCCL needs)."""
    host_shim.install(monkeypatch)
    monkeypatch.setenv(ENV_CUDA_AWARE, "1" if request.param == "device" else "0")
    if request.param == "nccl":
        fake = fake_nccl.install(monkeypatch)
        made = sharded.PlaceGroup.from_mpi(devices=[2 * RANK, 2 * RANK + 1], transport="nccl")
        assert made.transport == "nccl" and made._nccl._library is fake
    else:
        made = sharded.PlaceGroup.from_mpi(devices=[0, 0], transport="mpi")
    assert made._exchange_how == request.param
    return made


def _sizes(places: int, n: int) -> list[int]:
    """Uneven sizes with empty shards: place 1 and the last but one hold nothing."""
    weights = np.arange(1, places + 1, dtype=np.float64)
    weights[1] = 0
    if places > 3:
        weights[-2] = 0
    sizes = np.floor(weights / weights.sum() * n).astype(np.int64)
    sizes[-1] += n - sizes.sum()
    return [int(size) for size in sizes]


def _host(n=1003, dtype=np.int64, seed=0):
    return np.random.default_rng(seed).integers(-100, 100, n).astype(dtype)


def test_the_layout(group):
    assert len(group) == 2 * SIZE and group.nranks == SIZE and group.transport == "mpi"
    assert group.local_places == (2 * RANK, 2 * RANK + 1)
    assert group.place_ranks == tuple(rank for rank in range(SIZE) for _ in range(2))
    assert group.archs == ("sm_90", "sm_90")  # this rank's places': the kernels it loads
    assert group.devices == (0,) * len(group) and group.locality_domains == (0,) * len(group)


def test_data_in_and_out(group):
    host = _host()
    sizes = _sizes(len(group), host.size)
    last = SIZE - 1
    scattered = sharded.ShardedArray.from_numpy(group, host if RANK == 0 else None, sizes=sizes)
    from_last = sharded.ShardedArray.from_numpy(group, host if RANK == last else None, root=last)
    everyone = sharded.ShardedArray.from_numpy(group, host, sizes=sizes, root=None)
    results = [scattered.to_numpy(), from_last.to_numpy(root=last), everyone.to_numpy(root=None),
               np.asarray(scattered)]
    views = [(view.place, view.shape) for view in everyone.local_shards()]
    assert scattered.shard_sizes == everyone.shard_sizes == tuple(sizes)
    assert from_last.shard_sizes == tuple(sharded._shim.ShardedArray.even_sizes(host.size, len(group)))
    assert (results[0] is not None) == (RANK == 0) and (results[1] is not None) == (RANK == last)
    for result in results:
        assert result is None or np.array_equal(result, host)
    assert views == [(place, (sizes[place],)) for place in group.local_places]
    assert scattered.size == host.size and scattered.num_shards == len(group)
    assert scattered.shard_offsets == tuple(np.cumsum([0] + sizes[:-1]).tolist())


def test_from_local_gathers_every_rank_s_sizes(group):
    parts = [np.arange(place % 3, dtype=np.float32) + 10 * place for place in group.local_places]
    array = sharded.ShardedArray.from_local(group, parts)
    records = np.dtype([("x", np.float32), ("n", np.int64)], align=True)
    record_parts = [np.zeros(place + 1, records) for place in group.local_places]
    for place, part in zip(group.local_places, record_parts):
        part["n"] = place
    record_array = sharded.ShardedArray.from_local(group, record_parts)
    gathered, record_host = array.to_numpy(root=None), record_array.to_numpy(root=None)
    assert array.shard_sizes == tuple(place % 3 for place in range(len(group)))
    assert np.array_equal(gathered, np.concatenate([np.arange(place % 3, dtype=np.float32) + 10 * place
                                                    for place in range(len(group))]))
    assert np.array_equal(record_host["n"], np.repeat(np.arange(len(group)), np.arange(1, len(group) + 1)))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float64])
def test_builtin_reductions_counts_and_histograms(group, dtype):
    host = _host(dtype=dtype, seed=1)
    a = sharded.ShardedArray.from_numpy(group, host, sizes=_sizes(len(group), host.size), root=None)
    empty = sharded.ShardedArray.from_numpy(group, np.zeros(0, dtype), root=None)
    results = {
        "sum": sharded.sum(a), "min": sharded.min(a), "max": sharded.max(a),
        "sum, init": sharded.reduce(a, "sum", init=5),
        "empty sum": sharded.sum(empty), "empty min": outcome_of(lambda: sharded.min(empty)),
        "count": sharded.count(a, host[7]), "count 2.5": sharded.count(a, 2.5),
        "histogram": sharded.histogram_even(a, num_bins=16, lower=-50.0, upper=50.0),
    }
    assert results["min"] == host.min() and results["max"] == host.max()
    if np.dtype(dtype).kind == "f":
        assert np.isclose(results["sum"], host.sum()) and np.isclose(results["sum, init"], host.sum() + 5)
    else:
        assert results["sum"] == host.sum(dtype=dtype) and results["sum, init"] == host.sum(dtype=dtype) + 5
    assert results["empty sum"] == 0 and results["empty min"][0] == "ValueError"
    assert results["count"] == np.count_nonzero(host == host[7])
    assert results["count 2.5"] == np.count_nonzero(host == 2.5)
    assert np.array_equal(results["histogram"], np.histogram(host, bins=16, range=(-50.0, 50.0))[0])


def test_builtin_scans_carry_across_ranks(group):
    host = _host(seed=2)
    a = sharded.ShardedArray.from_numpy(group, host, sizes=_sizes(len(group), host.size), root=None)
    scans = {
        "inclusive": sharded.inclusive_scan(a).to_numpy(root=None),
        "inclusive, init": sharded.inclusive_scan(a, init=3).to_numpy(root=None),
        "max": sharded.inclusive_scan(a, "max").to_numpy(root=None),
        "exclusive": sharded.exclusive_scan(a, "sum", 7).to_numpy(root=None),
    }
    assert np.array_equal(scans["inclusive"], np.cumsum(host))
    assert np.array_equal(scans["inclusive, init"], 3 + np.cumsum(host))
    assert np.array_equal(scans["max"], np.maximum.accumulate(host))
    assert np.array_equal(scans["exclusive"], 7 + np.concatenate([[0], np.cumsum(host)[:-1]]))


def test_fill_and_sequence_use_global_indices(group):
    sizes = _sizes(len(group), 501)
    a = sharded.sequence(sharded.ShardedArray.allocate(group, sizes, np.int64), start=10, step=3)
    b = sharded.fill(sharded.zeros(group, 501, np.float32), 2.5)
    results = (a.to_numpy(root=None), b.to_numpy(root=None))
    assert np.array_equal(results[0], 10 + 3 * np.arange(501))
    assert np.array_equal(results[1], np.full(501, 2.5, np.float32))


def test_resharding_moves_elements_between_ranks(exchanging_group):
    group = exchanging_group
    host = _host(seed=3)
    a = sharded.ShardedArray.from_numpy(group, host, root=None)
    target = [0] * len(group)
    target[-1] = host.size
    moved = a.resharded(target)
    back = sharded.redistribute(moved, _sizes(len(group), host.size))
    results = (moved.to_numpy(root=None), back.to_numpy(root=None))
    assert moved.shard_sizes == tuple(target) and back.shard_sizes == tuple(_sizes(len(group), host.size))
    assert np.array_equal(results[0], host) and np.array_equal(results[1], host)
    if group._exchange_how == "nccl":  # the pieces went through NCCL's calls, one group a move
        assert group._nccl._library.exchanges == 2


def test_staged_moves_reuse_the_group_s_pinned_buffers(monkeypatch):
    """The staged all-to-all-v takes its host buffers from the group's pinned slots: made at
    the first moves, taken again by later ones of the same size, given back with the group."""
    import gc

    host_shim.install(monkeypatch)
    monkeypatch.setenv(ENV_CUDA_AWARE, "0")
    group = sharded.PlaceGroup.from_mpi(devices=[0, 0], transport="mpi")

    host = ties_and_nans(np.float64, 901, seed=21)
    a = sharded.ShardedArray.from_numpy(group, host, sizes=_sizes(len(group), host.size), root=None)
    expected, backwards = np.sort(host), list(reversed(a.shard_sizes))
    made = None
    for _ in range(4):
        into = sharded.ShardedArray.allocate(group, list(a.shard_sizes), np.float64)
        assert np.array_equal(sharded.sort(a, out=into).to_numpy(root=None), expected, equal_nan=True)
        assert np.array_equal(sharded.redistribute(a, backwards).to_numpy(root=None), host, equal_nan=True)
        made = set(host_shim._pinned) if made is None else made  # after the first round
    assert set(host_shim._pinned) == made  # nothing allocated again
    mine = set(group._staging._slots[slot][0] for slot in group._staging._slots)
    assert mine and mine <= made
    del a, into, group
    gc.collect()
    assert not mine & set(host_shim._pinned)  # the group's buffers went with it


def test_errors_one_rank_hits_alone_are_raised_on_every_rank(group):
    last = SIZE - 1
    a = sharded.ShardedArray.from_numpy(group, _host(100), root=None)
    outcomes = {
        # a value that does not fit the dtype, on the last rank only
        "fill": outcome_of(lambda: sharded.fill(a, 2.5 if RANK == last else 2)),
        # the root alone checks its host array
        "from_numpy": outcome_of(lambda: sharded.ShardedArray.from_numpy(group, np.zeros((2, 2)) if RANK == 0 else None)),
        "root": outcome_of(lambda: a.to_numpy(root=SIZE)),
        "op name": outcome_of(lambda: sharded.reduce(a, "prod" if RANK == last else "sum")),
        "allocation": outcome_of(lambda: sharded.ShardedArray.allocate(
            group, [1 << 40 if RANK == last and place == group.local_places[0] else 4 for place in range(len(group))],
            np.float64)),
    }
    after = sharded.sum(a)  # the group still works
    everywhere = allgather(outcomes)
    assert all(seen == everywhere[0] for seen in everywhere)
    assert outcomes["fill"][0] == "ValueError" and "value" in outcomes["fill"][1]
    assert outcomes["from_numpy"] == ("ValueError", "host: expected a 1-D array, got 2 dimensions (2, 2)")
    assert outcomes["root"] == ("ValueError", f"root: expected a rank in [0, {SIZE}) or None, got {SIZE}")
    assert outcomes["op name"][0] == "ValueError" and "'prod'" in outcomes["op name"][1]
    assert outcomes["allocation"][0] == "MemoryError"
    assert allgather(after) == [after] * SIZE


def test_a_rank_with_other_shard_sizes_gets_a_value_error_everywhere(group):
    sizes = _sizes(len(group), 300)
    if RANK == SIZE - 1 and SIZE > 1:  # this rank alone believes other sizes
        sizes[0], sizes[-1] = sizes[0] + 1, sizes[-1] - 1
    a = sharded.ShardedArray.allocate(group, sizes, np.int32)  # each allocates its own part: fine
    outcomes = allgather([outcome_of(lambda: sharded.sum(a)), outcome_of(lambda: sharded.inclusive_scan(a)),
                          outcome_of(lambda: a.to_numpy(root=None))])
    if SIZE == 1:
        assert outcomes == [[None, None, None]]
        return
    assert all(seen == outcomes[0] for seen in outcomes)
    for kind, text in outcomes[0]:
        assert kind == "ValueError" and f"on rank {SIZE - 1}" in text and "shard sizes" in text


def test_ranks_calling_different_collectives_get_a_value_error_not_a_hang(group):
    a = sharded.ShardedArray.from_numpy(group, _host(50), root=None)
    call = (lambda: sharded.sum(a)) if RANK == SIZE - 1 else (lambda: sharded.inclusive_scan(a))
    outcomes = allgather(outcome_of(call))
    after = sharded.sum(a)
    if SIZE == 1:
        assert outcomes == [None]
        return
    assert all(seen == outcomes[0] for seen in outcomes)
    kind, text = outcomes[0]
    assert kind == "ValueError" and text.startswith(f"collective: rank {SIZE - 1} is at reduce where rank 0 is at ")
    assert allgather(after) == [after] * SIZE


def test_operators_between_from_mpi_arrays(group):
    host = _host(seed=4)
    a = sharded.ShardedArray.from_numpy(group, host, sizes=_sizes(len(group), host.size), root=None)
    b = sharded.ShardedArray.from_numpy(group, host[::-1].copy(), sizes=_sizes(len(group), host.size), root=None)
    one = sharded.ShardedArray.from_numpy(group, np.array([3], np.int64), root=None)
    results = ((a + b).to_numpy(root=None), (-a).to_numpy(root=None), a.copy().to_numpy(root=None),
               a.astype(np.int64).to_numpy(root=None), bool(one), outcome_of(lambda: bool(a)))
    assert np.array_equal(results[0], host + host[::-1]) and np.array_equal(results[1], -host)
    assert np.array_equal(results[2], host) and np.array_equal(results[3], host)
    assert results[4] is True and results[5][0] == "ValueError" and f"{host.size} elements" in results[5][1]


# ---- sorts, selections, searches ---------------------------------------------------------------


def _layouts(places, n):
    """Uneven with empty shards; every element on the last place; on the first."""
    last, first = [0] * places, [0] * places
    last[-1], first[0] = n, n
    return [_sizes(places, n), last, first]


def _np_argsort(host, descending):
    """numpy's stable order (NaNs last), or its reverse with ties still in index order (NaNs
    first): the stable ascending order of the reversed array, reversed."""
    if not descending:
        return np.argsort(host, kind="stable")
    return host.size - 1 - np.argsort(host[::-1], kind="stable")[::-1]


def _np_sort(host, descending):
    return host[_np_argsort(host, descending)]


def _same(x, y):
    return x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x.view(np.uint8), y.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint32, np.float64, np.float32])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_keeps_shard_sizes_against_numpy(exchanging_group, dtype, descending):
    group = exchanging_group
    host = ties_and_nans(dtype, 1201, seed=5)
    results = []
    for sizes in _layouts(len(group), host.size):
        a = sharded.ShardedArray.from_numpy(group, host, sizes=sizes, root=None)
        out = sharded.sort(a, descending=descending, out=sharded.ShardedArray.allocate(group, sizes, dtype))
        same = sharded.sort(a, descending=descending)  # in place
        results.append((sizes, out.shard_sizes, out.to_numpy(root=None), same is a, a.to_numpy(root=None)))
    empty = sharded.sort(sharded.ShardedArray.from_numpy(group, np.zeros(0, dtype), root=None)).to_numpy(root=None)
    expected = _canonical_nans(_np_sort(host, descending))
    for sizes, kept, sorted_out, in_place, sorted_in_place in results:
        assert kept == tuple(sizes) and in_place
        assert _same(sorted_out, expected) and _same(sorted_in_place, expected)
    assert empty.size == 0


def _canonical_nans(values):
    values = values.copy()
    if values.dtype.kind == "f":
        values[np.isnan(values)] = np.array(np.nan, values.dtype)
    return values


def test_sort_keeps_negative_zeros_in_index_order(exchanging_group):
    group = exchanging_group
    host = np.tile(np.array([0.0, -0.0, 1.0, -0.0, 0.0, -1.0]), 50)
    a = sharded.ShardedArray.from_numpy(group, host, sizes=_sizes(len(group), host.size), root=None)
    up = sharded.sort(a, out=sharded.ShardedArray.allocate(group, list(a.shard_sizes), np.float64)).to_numpy(root=None)
    down = sharded.sort(a, descending=True, out=sharded.ShardedArray.allocate(
        group, list(a.shard_sizes), np.float64)).to_numpy(root=None)
    zeros = host[host == 0]
    assert _same(up[up == 0], zeros) and _same(down[down == 0], zeros)  # stable: the signs in index order


@pytest.mark.parametrize("descending", [False, True])
def test_sort_by_key_and_argsort_carry_values_across_ranks(exchanging_group, descending):
    group = exchanging_group
    keys_host = ties_and_nans(np.float32, 999, seed=6)
    values_host = np.arange(999, dtype=np.int64) * 3 - 7
    records = np.dtype([("x", np.float32), ("n", np.int64), ("y", np.int32)], align=True)
    record_host = np.zeros(999, records)
    record_host["n"] = np.arange(999)
    record_host["y"] = -np.arange(999)
    results = []
    for sizes in _layouts(len(group), keys_host.size):
        keys = sharded.ShardedArray.from_numpy(group, keys_host, sizes=sizes, root=None)
        values = sharded.ShardedArray.from_numpy(group, values_host, sizes=sizes, root=None)
        rec = sharded.ShardedArray.from_numpy(group, record_host, sizes=sizes, root=None)
        out_k = sharded.ShardedArray.allocate(group, sizes, np.float32)
        out_v = sharded.ShardedArray.allocate(group, sizes, np.int64)
        sk, sv = sharded.sort_by_key(keys, values, descending=descending, out_keys=out_k, out_values=out_v)
        out_k2 = sharded.ShardedArray.allocate(group, sizes, np.float32)
        _, sr = sharded.sort_by_key(keys, rec, descending=descending, out_keys=out_k2,
                                    out_values=sharded.ShardedArray.allocate(group, sizes, records))
        order = sharded.argsort(keys, descending=descending)
        results.append((sk.to_numpy(root=None), sv.to_numpy(root=None), sr.to_numpy(root=None),
                        order.to_numpy(root=None), order.shard_sizes, tuple(sizes), keys.to_numpy(root=None)))
    expected = _np_argsort(keys_host, descending)
    for sorted_keys, sorted_values, sorted_records, indices, order_sizes, sizes, keys_after in results:
        assert _same(sorted_keys, _canonical_nans(keys_host[expected]))
        assert np.array_equal(sorted_values, values_host[expected])
        assert np.array_equal(sorted_records["n"], expected) and np.array_equal(sorted_records["y"], -expected)
        assert indices.dtype == np.int64 and np.array_equal(indices, expected) and order_sizes == sizes
        assert _same(keys_after, keys_host)  # argsort and the out= sorts leave the keys as they were


def test_sorts_match_one_process_on_the_stand_in(exchanging_group):
    """The same stand-in on one process (a by_devices group of as many places, the same shard
    sizes) sorts the same data to the same bits."""
    group = exchanging_group
    host = ties_and_nans(np.float64, 777, seed=7)
    payload = np.arange(host.size, dtype=np.int64)
    sizes = _sizes(len(group), host.size)
    results = []
    for grouping in (group, sharded.PlaceGroup.by_devices([0] * len(group))):
        def make(values):
            return sharded.ShardedArray.from_numpy(grouping, values, sizes=sizes, root=None if grouping is group else 0)

        down = sharded.sort(make(host), descending=True)
        keys, values = sharded.sort_by_key(make(host), make(payload))
        results.append([array.to_numpy() for array in (down, keys, values)] + [down.shard_sizes])
    (mpi_down, mpi_keys, mpi_values, mpi_sizes), (one_down, one_keys, one_values, one_sizes) = results
    assert mpi_sizes == one_sizes == tuple(sizes)
    if RANK == 0:  # to_numpy(root=0): rank 0 holds the gathered arrays
        assert _same(mpi_down, one_down) and _same(mpi_keys, one_keys) and _same(mpi_values, one_values)


def test_selections_keep_each_shard_s_elements(group):
    host = _host(n=601, seed=8)
    sizes = _sizes(len(group), host.size)
    a = sharded.ShardedArray.from_numpy(group, host, sizes=sizes, root=None)
    kept = sharded.select(a, lambda x: x % 3 == 0)
    indexed = sharded.select(a, lambda x, i: i % 4 == 1, with_index=True)
    yes, no = sharded.partition(a, lambda x: x < 0)
    low, middle, high = sharded.three_way_partition(a, lambda x: x < -30, lambda x: x < 30)
    results = {name: (array.shard_sizes, array.to_numpy(root=None)) for name, array in
               dict(kept=kept, indexed=indexed, yes=yes, no=no, low=low, middle=middle, high=high).items()}
    bounds = np.cumsum([0] + sizes)
    shards = [host[bounds[p]:bounds[p + 1]] for p in range(len(group))]
    index = np.arange(host.size)

    def expect(mask):
        return tuple(int(np.count_nonzero(mask[bounds[p]:bounds[p + 1]])) for p in range(len(group))), host[mask]

    masks = dict(kept=host % 3 == 0, indexed=index % 4 == 1, yes=host < 0, no=host >= 0, low=host < -30,
                 middle=(host >= -30) & (host < 30), high=host >= 30)
    assert len(shards) == len(group)
    for name, mask in masks.items():
        expected_sizes, expected = expect(mask)
        assert results[name][0] == expected_sizes, name
        assert np.array_equal(results[name][1], expected), name


@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_top_k_and_searchsorted_on_every_rank(group, dtype):
    host = ties_and_nans(dtype, 803, seed=9)
    sizes = _sizes(len(group), host.size)
    a = sharded.ShardedArray.from_numpy(group, host, sizes=sizes, root=None)
    tops = {(k, largest): sharded.top_k(a, k, largest) for k in (0, 1, 7, 300, host.size) for largest in (True, False)}
    sorted_a = sharded.sort(sharded.ShardedArray.from_numpy(group, host, sizes=sizes, root=None))
    queries = np.array([-100, -20, -3, 0, 5, 19, 50, np.nan if np.dtype(dtype).kind == "f" else 7]).astype(dtype)
    left = sharded.searchsorted(sorted_a, queries)
    right = sharded.searchsorted(sorted_a, queries, side="right")
    scalar = sharded.searchsorted(sorted_a, 3)
    refused = outcome_of(lambda: sharded.searchsorted(sorted_a, sorted_a))
    everywhere = allgather((left.tolist(), right.tolist(), int(scalar)))
    reference = np.sort(host)
    assert all(seen == everywhere[0] for seen in everywhere)
    assert np.array_equal(left, np.searchsorted(reference, queries)) and left.dtype == np.int64
    assert np.array_equal(right, np.searchsorted(reference, queries, side="right"))
    assert scalar == np.searchsorted(reference, 3) and np.ndim(scalar) == 0
    assert refused[0] == "ValueError" and refused[1].startswith("values: searchsorted on a PlaceGroup.from_mpi")
    for (k, largest), (values, indices) in tops.items():
        order = _np_argsort(host, largest)[:k]  # best first, ties to the lower index, NaNs the largest
        assert indices.dtype == np.int64 and np.array_equal(indices, order), (k, largest)
        assert _same(values, host[order]), (k, largest)


# ---- runs of equal keys across ranks ---------------------------------------------------------------


def _runs_of(keys):
    """[(start, stop)] of the runs of equal consecutive keys."""
    starts = [0] + [i for i in range(1, keys.size) if keys[i] != keys[i - 1]]
    return list(zip(starts, starts[1:] + [keys.size]))


def _long_runs(n, seed):
    """Keys with runs long enough to cross shards and ranks, and short ones."""
    rng = np.random.default_rng(seed)
    lengths = rng.choice([1, 2, 5, 40, 300], size=n)
    return np.repeat(np.arange(lengths.size, dtype=np.int64) % 7, lengths)[:n].copy()


def _in_shards(host_positions, sizes):
    """How many of `host_positions` fall in each shard."""
    bounds = np.cumsum(sizes)
    places = np.searchsorted(bounds, np.asarray(host_positions, np.int64), side="right")
    return tuple(int(np.count_nonzero(places == place)) for place in range(len(sizes)))


def test_scans_by_key_into_the_keys_and_an_error_before_the_totals_exchange(group, monkeypatch):
    """A scan by key into its own keys takes a new array first on every rank alike; an error
    one rank hits inside the engine before it exchanges the totals reaches every rank."""
    n = 700
    keys_host = _long_runs(n, seed=30)
    values_host = np.random.default_rng(31).integers(-50, 50, n).astype(np.int64)
    sizes = _sizes(len(group), n)
    keys = sharded.ShardedArray.from_numpy(group, keys_host, sizes=sizes, root=None)
    values = sharded.ShardedArray.from_numpy(group, values_host, sizes=sizes, root=None)
    expected = sharded.inclusive_scan_by_key(keys, values, "sum").to_numpy(root=None)
    into_keys = sharded.ShardedArray.from_numpy(group, keys_host, sizes=sizes, root=None)
    sharded.inclusive_scan_by_key(into_keys, into_keys, "sum", out=into_keys)
    scanned_keys = into_keys.to_numpy(root=None)
    keys_only = np.empty(n, np.int64)
    for start, stop in _runs_of(keys_host):
        keys_only[start:stop] = np.cumsum(keys_host[start:stop])
    real = host_shim.scan_by_key

    def failing(libraries, k, v, out, exclusive, init, edges=None):
        if RANK == SIZE - 1:
            raise MemoryError("out of memory in the stand-in's first pass")
        return real(libraries, k, v, out, exclusive, init, edges)

    monkeypatch.setattr(sharded._shim, "scan_by_key", failing)
    outcome = outcome_of(lambda: sharded.inclusive_scan_by_key(keys, values, "sum"))
    monkeypatch.setattr(sharded._shim, "scan_by_key", real)
    after = sharded.inclusive_scan_by_key(keys, values, "sum").to_numpy(root=None)  # the group still works
    assert np.array_equal(scanned_keys, keys_only)
    assert allgather(outcome) == [("MemoryError", "out of memory in the stand-in's first pass")] * SIZE
    assert np.array_equal(after, expected)


@pytest.mark.parametrize("layout", [0, 1, 2])
def test_by_key_algorithms_carry_runs_across_ranks(group, layout):
    n = 901
    keys_host = _long_runs(n, seed=10)
    values_host = np.random.default_rng(11).integers(-1000, 1000, n).astype(np.int64)
    sizes = _layouts(len(group), n)[layout]
    keys = sharded.ShardedArray.from_numpy(group, keys_host, sizes=sizes, root=None)
    values = sharded.ShardedArray.from_numpy(group, values_host, sizes=sizes, root=None)
    inclusive = sharded.inclusive_scan_by_key(keys, values, "sum")
    maxima = sharded.inclusive_scan_by_key(keys, values, lambda x, y: x if x > y else y)
    # the last positive value seen: associative, not commutative
    exclusive = sharded.exclusive_scan_by_key(keys, values, lambda x, y: y if y > 0 else x, 5)
    unique_keys, sums = sharded.reduce_by_key(keys, values, "sum")
    first_keys, first_values = sharded.unique_by_key(keys, values)
    only_keys, none = sharded.unique_by_key(keys)
    results = {name: (array.shard_sizes, array.to_numpy(root=None)) for name, array in dict(
        inclusive=inclusive, maxima=maxima, exclusive=exclusive, unique_keys=unique_keys, sums=sums,
        first_keys=first_keys, first_values=first_values, only_keys=only_keys).items()}
    runs = _runs_of(keys_host)
    expected_inclusive, expected_maxima, expected_exclusive = (np.empty(n, np.int64) for _ in range(3))
    for start, stop in runs:
        expected_inclusive[start:stop] = np.cumsum(values_host[start:stop])
        expected_maxima[start:stop] = np.maximum.accumulate(values_host[start:stop])
        acc = 5
        for i in range(start, stop):
            expected_exclusive[i] = acc
            acc = values_host[i] if values_host[i] > 0 else acc
    heads = [start for start, _ in runs]
    ends = [stop - 1 for _, stop in runs]
    assert none is None
    assert np.array_equal(results["inclusive"][1], expected_inclusive)
    assert np.array_equal(results["maxima"][1], expected_maxima)
    assert np.array_equal(results["exclusive"][1], expected_exclusive)
    assert results["inclusive"][0] == tuple(sizes)
    assert np.array_equal(results["unique_keys"][1], keys_host[heads])
    assert np.array_equal(results["sums"][1], [values_host[start:stop].sum() for start, stop in runs])
    assert results["unique_keys"][0] == results["sums"][0] == _in_shards(ends, sizes)  # where each run ends
    for name in ("first_keys", "only_keys"):
        assert np.array_equal(results[name][1], keys_host[heads])
        assert results[name][0] == _in_shards(heads, sizes)  # where each run starts
    assert np.array_equal(results["first_values"][1], values_host[heads])


def test_one_run_over_every_rank(group):
    n = 400
    keys_host = np.full(n, 3, np.int32)
    values_host = np.arange(n, dtype=np.int32)
    sizes = _sizes(len(group), n)
    keys = sharded.ShardedArray.from_numpy(group, keys_host, sizes=sizes, root=None)
    values = sharded.ShardedArray.from_numpy(group, values_host, sizes=sizes, root=None)
    scanned = sharded.inclusive_scan_by_key(keys, values, "sum").to_numpy(root=None)
    unique_keys, sums = sharded.reduce_by_key(keys, values, "sum")
    result = (unique_keys.to_numpy(root=None), sums.to_numpy(root=None), sums.shard_sizes)
    assert np.array_equal(scanned, np.cumsum(values_host, dtype=np.int32))
    assert result[0].tolist() == [3] and result[1].tolist() == [values_host.sum()]
    assert result[2] == _in_shards([n - 1], sizes)


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_unique_sorts_then_keeps_the_first_of_each_run(exchanging_group, dtype):
    group = exchanging_group
    host = ties_and_nans(dtype, 700, seed=12)
    a = sharded.ShardedArray.from_numpy(group, host, sizes=_sizes(len(group), host.size), root=None)
    found = sharded.unique(a)
    result = (found.to_numpy(root=None), a.to_numpy(root=None))
    ordered = _canonical_nans(host[np.argsort(host, kind="stable")])
    same_as_previous = (ordered[1:] == ordered[:-1]) | (np.isnan(ordered[1:]) & np.isnan(ordered[:-1]))
    expected = ordered[np.concatenate([[True], ~same_as_previous])]  # the NaNs make one; the first zero's sign
    assert np.array_equal(expected, np.unique(host), equal_nan=True)
    assert _same(result[0], expected)
    assert _same(result[1], host)


def test_runs_selections_and_top_k_match_one_process_on_the_stand_in(group):
    """The cross-rank steps against the one-process paths of the same stand-in (a by_devices
    group of as many places, the same shard sizes): the same values and shard sizes."""
    n = 833
    keys_host = _long_runs(n, seed=13)
    values_host = np.random.default_rng(14).integers(-50, 50, n).astype(np.int32)
    sizes = _sizes(len(group), n)
    results = []
    for grouping in (group, sharded.PlaceGroup.by_devices([0] * len(group))):
        def make(host):
            return sharded.ShardedArray.from_numpy(grouping, host, sizes=sizes, root=None if grouping is group else 0)

        keys, values = make(keys_host), make(values_host)
        arrays = [sharded.inclusive_scan_by_key(keys, values, "sum"),
                  sharded.exclusive_scan_by_key(keys, values, "max", -7),
                  *sharded.reduce_by_key(keys, values, "sum"), sharded.unique_by_key(keys, values)[1],
                  sharded.select(values, lambda x: x > 10), *sharded.partition(values, lambda x: x % 2 == 0)]
        results.append(([(array.shard_sizes, array.to_numpy()) for array in arrays],
                        [sharded.top_k(values, k, largest) for k in (0, 5, n) for largest in (True, False)]))
    (mpi_arrays, mpi_tops), (one_arrays, one_tops) = results
    for (mpi_sizes, mpi_host), (one_sizes, one_host) in zip(mpi_arrays, one_arrays):
        assert mpi_sizes == one_sizes
        assert RANK != 0 or np.array_equal(mpi_host, one_host)  # to_numpy(root=0): rank 0 holds them
    for (mpi_values, mpi_indices), (one_values, one_indices) in zip(mpi_tops, one_tops):
        assert np.array_equal(mpi_values, one_values) and np.array_equal(mpi_indices, one_indices)


def test_the_new_collectives_agree_on_errors_and_calls(group):
    last = SIZE - 1
    host = _host(n=300, seed=15)
    a = sharded.ShardedArray.from_numpy(group, host, sizes=_sizes(len(group), host.size), root=None)
    queries = np.array([0, 5]) if RANK != last else np.array([0, 6])
    out = sharded.ShardedArray.allocate(group, list(a.shard_sizes), np.int64)
    outcomes = {
        "top_k k": outcome_of(lambda: sharded.top_k(a, 3 if RANK == last else 4)),
        "top_k bad k": outcome_of(lambda: sharded.top_k(a, host.size + 1 if RANK == last else 2)),
        "searchsorted queries": outcome_of(lambda: sharded.searchsorted(a, queries)),
        "select arity": outcome_of(lambda: sharded.select(a, (lambda x, y: x > y) if RANK == last
                                                        else (lambda x: x > 0))),
        "descending": outcome_of(lambda: sharded.sort(a, descending=RANK == last, out=out)),
        "sharded queries": outcome_of(lambda: sharded.searchsorted(a, a)),
        "compare descending": outcome_of(lambda: sharded.sort(a, compare=lambda x, y: x < y, descending=RANK == last,
                                                              out=out)),
    }
    after = sharded.sort(a).to_numpy(root=None)  # the group still works
    everywhere = allgather(outcomes)
    assert all(seen == everywhere[0] for seen in everywhere)
    assert outcomes["top_k bad k"][0] == "ValueError" and outcomes["top_k bad k"][1].startswith("k: expected")
    assert outcomes["select arity"][0] == "TypeError"
    assert outcomes["sharded queries"][0] == "ValueError" and outcomes["sharded queries"][1].startswith("values: ")
    if SIZE > 1:
        assert outcomes["top_k k"][0] == "ValueError" and f"on rank {last}" in outcomes["top_k k"][1]
        assert outcomes["searchsorted queries"][0] == "ValueError" and "queries" in outcomes["searchsorted queries"][1]
        assert outcomes["descending"][0] == "ValueError" and "descending" in outcomes["descending"][1]
        assert outcomes["compare descending"][0] == "ValueError" and "descending" in outcomes["compare descending"][1]
    else:
        assert outcomes["top_k k"] is None and outcomes["searchsorted queries"] is None
    assert np.array_equal(after, np.sort(host))


def _segment_folds(host, positions, op, init):
    folded = []
    for begin, end in zip(positions[:-1], positions[1:]):
        acc = init
        for value in host[begin:end]:
            acc = op(acc, value)
        folded.append(acc)
    return np.array(folded, host.dtype)


def test_segmented_reduce_carries_segments_across_ranks(group):
    host = _host(n=1201, seed=16)
    host[::7] = 0
    n, places = host.size, len(group)
    everything_first = [n] + [0] * (places - 1)
    layouts = [_sizes(places, n), everything_first, everything_first[::-1]]
    offsets = [np.array([0, n]),  # one segment over every rank
               np.array([0, 0, 3, 3, 400, 401, 1000, n, n]),  # empty ones, at 0 and at len(a) too
               np.arange(0, n + 1, 37), np.sort(np.random.default_rng(5).integers(0, n + 1, 60))]
    last_nonzero = lambda x, y: y if y != 0 else x  # noqa: E731  associative, not commutative
    results = []
    for sizes in layouts:
        a = sharded.ShardedArray.from_numpy(group, host, sizes=sizes, root=None)
        for positions in offsets:
            sums = sharded.segmented_reduce(a, positions, "sum", 5)
            on_ranks = sharded.ShardedArray.from_numpy(group, positions.astype(np.int64), root=None)
            lasts = sharded.segmented_reduce(a, on_ranks, last_nonzero, -1)  # offsets as a from_mpi array
            results.append((positions, sums.shard_sizes, sums.to_numpy(root=None), lasts.to_numpy(root=None)))
    for positions, shard_sizes, sums, lasts in results:
        assert sum(shard_sizes) == len(positions) - 1 and shard_sizes == tuple(_even(places, len(positions) - 1))
        assert np.array_equal(sums, _segment_folds(host, positions, lambda x, y: x + y, 5))
        assert np.array_equal(lasts, _segment_folds(host, positions, last_nonzero, -1))


def _even(places, n):
    return [n // places + (1 if place < n % places else 0) for place in range(places)]


def test_comparator_sorts_and_searches_split_by_comparisons_across_ranks(exchanging_group):
    group = exchanging_group
    host = _host(n=700, seed=17) // 10  # many ties, and x and -x equal by |x|
    n, places = host.size, len(group)
    everything_last = [0] * (places - 1) + [n]
    by_abs = lambda x, y: abs(x) < abs(y)  # noqa: E731
    results = []
    for sizes in (_sizes(places, n), everything_last, everything_last[::-1]):
        a = sharded.ShardedArray.from_numpy(group, host, sizes=sizes, root=None)
        ascending = sharded.sort(a.copy(), compare=by_abs)
        descending = sharded.sort(a.copy(), compare=by_abs, descending=True)
        keyed = sharded.sort(a.copy(), key=lambda x: -x, compare=lambda x, y: x < y)
        queries = np.array([0, 3, -3, 9, 100], np.int64)
        found = [sharded.searchsorted(ascending, queries, side=side, compare=by_abs) for side in ("left", "right")]
        results.append((ascending.shard_sizes, ascending.to_numpy(root=None), descending.to_numpy(root=None),
                        keyed.to_numpy(root=None), found))
    index = np.arange(n)
    for shard_sizes, ascending, descending, keyed, (left, right) in results:
        assert sum(shard_sizes) == n
        assert np.array_equal(ascending, host[np.lexsort((index, np.abs(host)))])  # stable: ties by index
        assert np.array_equal(descending, host[np.lexsort((index, -np.abs(host)))])
        assert np.array_equal(keyed, host[np.lexsort((index, -host))])
        table = np.abs(ascending)
        assert np.array_equal(left, np.searchsorted(table, np.abs(queries), side="left"))
        assert np.array_equal(right, np.searchsorted(table, np.abs(queries), side="right"))


def test_key_sorts_sort_by_the_computed_keys_across_ranks(exchanging_group):
    group = exchanging_group
    host = _host(n=600, seed=18) // 7  # many ties
    n, places = host.size, len(group)
    index = np.arange(n)
    results = []
    for sizes in (_sizes(places, n), [0] * (places - 1) + [n]):
        a = sharded.ShardedArray.from_numpy(group, host, sizes=sizes, root=None)
        results.append([sharded.sort(a.copy(), key=lambda x: abs(x)).to_numpy(root=None),
                        sharded.sort(a.copy(), key=lambda x: abs(x), descending=True).to_numpy(root=None),
                        sharded.sort(a.copy(), key=lambda x: (x % 3, -x)).to_numpy(root=None)])
    for by_abs, by_abs_descending, by_tuple in results:
        assert np.array_equal(by_abs, host[np.lexsort((index, np.abs(host)))])  # ties keep index order
        assert np.array_equal(by_abs_descending, host[np.lexsort((index, -np.abs(host)))])
        assert np.array_equal(by_tuple, host[np.lexsort((index, -host, host % 3))])
