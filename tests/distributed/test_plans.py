"""CPU tests of the host-side cross-rank logic (cuda_sharded_jit/distributed/_plans.py), each
checked against numpy on a simulated layout: several ranks with several places each, empty
shards included. No MPI and no GPU involved (every rank runs them alike under mpiexec)."""

from __future__ import annotations

import numpy as np
import pytest

from cuda_sharded_jit.algorithms.reduce import _first_max, _first_min
from cuda_sharded_jit.distributed import _plans as plans

LAYOUTS = [
    # places per rank, shard sizes (one per global place)
    ([1], [7]),
    ([1, 1], [5, 0]),
    ([2, 1, 3], [4, 0, 9, 0, 0, 3]),
    ([1, 2, 1, 2], [0, 0, 6, 2, 0, 11]),
    ([3, 3], [0, 0, 0, 0, 0, 0]),
]


def _layout(places_per_rank, shard_sizes):
    owners, firsts = plans.place_layout(places_per_rank)
    return owners, firsts, len(places_per_rank)


def _shards(values: np.ndarray, shard_sizes):
    starts = plans.offsets(shard_sizes)
    return [values[start:start + size] for start, size in zip(starts, shard_sizes)]


def test_place_layout_numbers_places_in_rank_then_local_order():
    owners, firsts = plans.place_layout([2, 1, 3])
    assert owners == (0, 0, 1, 2, 2, 2)
    assert firsts == (0, 2, 3)
    assert plans.local_places(owners, 2) == (3, 4, 5)
    assert plans.local_places(owners, 1) == (2,)
    with pytest.raises(ValueError, match="rank 1 has no places"):
        plans.place_layout([1, 0])


@pytest.mark.parametrize("places_per_rank, shard_sizes", LAYOUTS)
def test_rank_counts_cover_each_rank_s_contiguous_range(places_per_rank, shard_sizes):
    owners, _, nranks = _layout(places_per_rank, shard_sizes)
    values = np.arange(sum(shard_sizes))
    counts, starts = plans.rank_counts(shard_sizes, owners, nranks)
    shards = _shards(values, shard_sizes)
    for rank in range(nranks):
        mine = [shards[place] for place in plans.local_places(owners, rank)]
        expected = np.concatenate(mine) if mine else np.empty(0, values.dtype)
        assert np.array_equal(values[starts[rank]:starts[rank] + counts[rank]], expected)
        assert plans.index_origin(shard_sizes, owners, rank) == starts[rank]
    assert sum(counts) == values.size


@pytest.mark.parametrize("places_per_rank, old", LAYOUTS)
def test_reshard_flows_move_every_element_to_its_new_shard(places_per_rank, old):
    owners, _, nranks = _layout(places_per_rank, old)
    total = sum(old)
    rng = np.random.default_rng(len(old))
    cuts = np.sort(rng.integers(0, total + 1, len(old) - 1)) if len(old) > 1 else np.array([], np.int64)
    new = np.diff(np.concatenate([[0], cuts, [total]])).astype(int).tolist()
    values = rng.standard_normal(total)
    old_counts, old_starts = plans.rank_counts(old, owners, nranks)
    new_counts, new_starts = plans.rank_counts(new, owners, nranks)
    plan_of = [plans.reshard_flows(old, new, owners, nranks).plan(rank) for rank in range(nranks)]
    for rank in range(nranks):  # what each rank receives, assembled as MPI_Alltoallv would
        received = np.full(new_counts[rank], np.nan)
        for sender in range(nranks):
            send = plan_of[sender]
            local = values[old_starts[sender]:old_starts[sender] + old_counts[sender]]
            piece = local[send.send_displacements[rank]:send.send_displacements[rank] + send.send_counts[rank]]
            mine = plan_of[rank]
            assert mine.receive_counts[sender] == send.send_counts[rank]
            at = mine.receive_displacements[sender]
            received[at:at + piece.size] = piece
        expected = values[new_starts[rank]:new_starts[rank] + new_counts[rank]]
        assert np.array_equal(received, expected)
        assert sum(plan_of[rank].send_counts) == old_counts[rank]
    with pytest.raises(ValueError, match="add up to"):
        plans.reshard_flows(old, [total + 1] + [0] * (len(old) - 1), owners, nranks)


def _run_pieces(pieces, source_shards, dest_sizes):
    """The destination shards that `pieces` fill from `source_shards` (NaN where none lands)."""
    dest = [np.full(size, np.nan) for size in dest_sizes]
    for piece in pieces:
        assert piece.count > 0
        chunk = source_shards[piece.source][piece.source_offset:piece.source_offset + piece.count]
        assert chunk.size == piece.count
        target = dest[piece.dest][piece.dest_offset:piece.dest_offset + piece.count]
        assert target.size == piece.count and np.isnan(target).all()  # no byte written twice
        target[:] = chunk
    return dest


@pytest.mark.parametrize("places_per_rank, old", LAYOUTS)
def test_exchange_pieces_go_shard_to_shard_as_the_plans_say(places_per_rank, old):
    from cuda_sharded_jit.distributed._exchange import pieces

    owners, _, nranks = _layout(places_per_rank, old)
    total = sum(old)
    rng = np.random.default_rng(len(old) + 7)
    values = rng.standard_normal(total)
    for _ in range(4):  # resharding to random sizes: every element to its global index
        cuts = np.sort(rng.integers(0, total + 1, len(old) - 1)) if len(old) > 1 else np.array([], np.int64)
        new = np.diff(np.concatenate([[0], cuts, [total]])).astype(int).tolist()
        flows = plans.reshard_flows(old, new, owners, nranks)
        moved = _run_pieces(pieces(flows, old, new, owners), _shards(values, old), new)
        assert np.array_equal(np.concatenate(moved + [np.empty(0)]), values)
    counts, starts = plans.rank_counts(old, owners, nranks)
    rank_of = np.repeat(np.arange(nranks), counts)
    for _ in range(4):  # the sort's plan from the split of random keys: each rank's pieces in rank order
        keys = np.concatenate([np.sort(rng.integers(0, 4, count)) for count in counts] + [np.empty(0, np.int64)])
        position = np.empty(total, np.int64)
        position[np.argsort(keys, kind="stable")] = np.arange(total)
        points = [[int(np.sum((rank_of == r) & (position < start))) for start in starts[1:]] for r in range(nranks)]
        flows = plans.sort_flows(points, counts)
        plan_of = [flows.plan(rank) for rank in range(nranks)]
        moved = _run_pieces(pieces(flows, old, old, owners), _shards(values, old), old)
        received = np.concatenate(moved + [np.empty(0)])
        expected = []
        locals_ = [values[start:start + count] for start, count in zip(plans.offsets(counts), counts)]
        for receiver in range(nranks):  # what MPI_Alltoallv would assemble on `receiver`
            for sender in range(nranks):
                plan = plan_of[sender]
                start = plan.send_displacements[receiver]
                expected.append(locals_[sender][start:start + plan.send_counts[receiver]])
        assert np.array_equal(received, np.concatenate(expected + [np.empty(0)]))
    listed = pieces(flows, old, old, owners)
    order = [(owners[piece.source], owners[piece.dest]) for piece in listed]
    assert order == sorted(order)  # by sending rank, then receiving rank: both ends' order
    for rank in range(nranks):  # a rank's own pieces: the whole list's that it sends or receives
        assert pieces(flows, old, old, owners, rank) == [
            piece for piece in listed if rank in (owners[piece.source], owners[piece.dest])]


def _left_fold(values, op, init=None):
    acc, have = init, init is not None
    for value in values:
        acc = op(acc, value) if have else value
        have = True
    return acc


@pytest.mark.parametrize("places_per_rank, shard_sizes", LAYOUTS[:4])
def test_fold_of_place_partials_in_global_order_is_the_sequential_fold(places_per_rank, shard_sizes):
    # A non-commutative, associative operator (composition of affine maps x -> a x + b, in
    # exact integers): any reordering of places or of the fold would change the result.
    owners, _, nranks = _layout(places_per_rank, shard_sizes)
    rng = np.random.default_rng(3)
    elements = [(int(a), int(b)) for a, b in rng.integers(-3, 4, (sum(shard_sizes), 2))]

    def compose(f, g):  # f, then g
        return (f[0] * g[0], f[1] * g[0] + g[1])

    shards = _shards(np.arange(len(elements)), shard_sizes)
    partials = [(len(shard) > 0, _left_fold([elements[i] for i in shard], compose) if len(shard) else None)
                for shard in shards]
    per_rank = [[partials[place] for place in plans.local_places(owners, rank)] for rank in range(nranks)]
    ordered = plans.present(plans.in_place_order(per_rank))
    fold = plans.host_fold(compose)
    for init in (None, (2, -1)):
        valid, value = plans.reduce_result(ordered, init, fold)
        if not elements:
            assert valid == (init is not None) and value == init
            continue
        assert valid and value == _left_fold(elements, compose, init)


def test_fold_of_first_min_pairs_keeps_numpy_s_argmin_and_argmax():
    # (value, global index) partials per place, folded in place order with the rule the GPU
    # folds with: the first index on ties, the first NaN wins.
    values = np.array([3.0, 1.0, 5.0, 1.0, np.nan, 0.5, np.nan, 0.5, 7.0, 7.0], np.float64)
    for data in (values, np.nan_to_num(values, nan=9.0), np.array([2.0, 2.0, 2.0, 2.0])):
        for shard_sizes in ([len(data)], [3, 0, len(data) - 3], [1] * len(data), [0, len(data), 0]):
            pairs = [(data[i], i) for i in range(len(data))]
            shards = _shards(np.arange(len(data)), shard_sizes)
            for rule, reference in ((_first_min, np.argmin), (_first_max, np.argmax)):
                partials = [(True, _left_fold([pairs[i] for i in shard], rule)) for shard in shards if len(shard)]
                valid, (_, index) = plans.reduce_result(plans.present(partials), None, plans.host_fold(rule))
                assert valid and index == reference(data), (data, shard_sizes, rule)


@pytest.mark.parametrize("places_per_rank, shard_sizes", LAYOUTS)
@pytest.mark.parametrize("exclusive", [False, True])
def test_scan_seeds_carry_each_place_s_exclusive_prefix(places_per_rank, shard_sizes, exclusive):
    owners, _, nranks = _layout(places_per_rank, shard_sizes)
    rng = np.random.default_rng(5)
    values = rng.integers(-50, 50, sum(shard_sizes)).astype(np.int64)
    init = 7 if exclusive else None  # an exclusive scan always has init
    shards = _shards(values, shard_sizes)
    totals = [int(shard.sum()) if len(shard) else None for shard in shards]
    per_rank = [[totals[place] for place in plans.local_places(owners, rank)] for rank in range(nranks)]
    seeds = plans.scan_seeds(plans.in_place_order(per_rank), init, plans.host_fold(lambda x, y: x + y))
    scanned = []
    for shard, seed in zip(shards, seeds):
        if not len(shard):
            assert seed is None
            continue
        inclusive = np.cumsum(shard) + (seed or 0)
        scanned.append(np.concatenate([[seed], inclusive[:-1]]) if exclusive else inclusive)
    result = np.concatenate(scanned) if scanned else np.empty(0, np.int64)
    reference = np.cumsum(values) + (init or 0)
    if exclusive:
        reference = np.concatenate([[init], reference[:-1]])[:len(values)]
    assert np.array_equal(result, reference)
    first = next((place for place, size in enumerate(shard_sizes) if size), None)
    if first is not None and init is None:
        assert seeds[first] is None  # nothing comes before the first element


def test_host_fold_chains_like_the_fold_kernel():
    # the association the shim's fold keeps across its 64-value launches: one left fold
    words = [str(i) for i in range(150)]
    prefixes, total = plans.host_fold(lambda x, y: f"({x}+{y})")(words, "i")
    assert total == _left_fold(words, lambda x, y: f"({x}+{y})", "i")
    assert prefixes[0] == "i" and prefixes[2] == "((i+0)+1)"
    prefixes, _ = plans.host_fold(lambda x, y: x + y)([1, 2, 3], None)
    assert prefixes == [None, 1, 3]


def test_histogram_counts_add_over_ranks():
    rng = np.random.default_rng(9)
    data = rng.standard_normal(1000)
    parts = np.array_split(data, 4)
    per_rank = [np.histogram(part, bins=16, range=(-2, 2))[0] for part in parts]
    assert np.array_equal(plans.sum_counts(per_rank), np.histogram(data, bins=16, range=(-2, 2))[0])
    assert plans.sum_counts([3, 0, 4]) == 7


@pytest.mark.parametrize("places_per_rank, shard_sizes", LAYOUTS)
def test_halo_plan_gives_each_shard_its_predecessor_across_empty_shards(places_per_rank, shard_sizes):
    owners, _, _ = _layout(places_per_rank, shard_sizes)
    rng = np.random.default_rng(11)
    values = rng.integers(-100, 100, sum(shard_sizes)).astype(np.int64)
    shards = _shards(values, shard_sizes)
    halos = {halo.place: halo for halo in plans.halo_plan(shard_sizes, owners)}
    pieces = []
    for place, shard in enumerate(shards):
        if not len(shard):
            assert place not in halos
            continue
        if place in halos:
            halo = halos[place]
            assert (halo.rank, halo.source_rank) == (owners[place], owners[halo.source])
            previous = shards[halo.source][-1]
            pieces.append(np.diff(np.concatenate([[previous], shard])))
        else:
            pieces.append(np.concatenate([shard[:1], np.diff(shard)]))
    result = np.concatenate(pieces) if pieces else np.empty(0, np.int64)
    reference = np.concatenate([values[:1], np.diff(values)]) if len(values) else values
    assert np.array_equal(result, reference)
    for halo in halos.values():  # only a rank's first non-empty place needs another rank's element
        if halo.rank != halo.source_rank:
            earlier = [p for p in plans.local_places(owners, halo.rank) if p < halo.place and shard_sizes[p]]
            assert not earlier


def test_choose_transport():
    assert plans.choose_transport("mpi", True, True) == "mpi"
    assert plans.choose_transport("auto", True, True) == "nccl"
    assert plans.choose_transport("auto", True, False) == "mpi"   # two ranks on one GPU
    assert plans.choose_transport("auto", False, True) == "mpi"   # no NCCL
    assert plans.choose_transport("nccl", True, True) == "nccl"
    with pytest.raises(ValueError, match="refuses two ranks"):
        plans.choose_transport("nccl", True, False)
    with pytest.raises(ValueError, match="libnccl.so.2"):
        plans.choose_transport("nccl", False, True)
    with pytest.raises(ValueError, match="transport: expected one of 'auto', 'nccl', 'mpi', got 'tcp'"):
        plans.choose_transport("tcp", True, True)


# ---- the sort's split ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16, np.uint64, np.float32, np.float64])
@pytest.mark.parametrize("descending", [False, True])
def test_order_codes_order_as_numpy_sorts(dtype, descending):
    rng = np.random.default_rng(1)
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        values = np.concatenate([rng.standard_normal(200), [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan]]).astype(dtype)
    else:
        info = np.iinfo(dtype)
        values = np.concatenate([rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True),
                                 np.array([info.min, info.max, 0], dtype)])
    codes = plans.order_codes(values, descending)
    order = np.argsort(codes, kind="stable")
    ascending = np.argsort(values, kind="stable")  # numpy: NaNs last, -0.0 == 0.0
    expected = values.size - 1 - np.argsort(values[::-1], kind="stable")[::-1] if descending else ascending
    assert np.array_equal(order, expected)
    if dtype.kind == "f":
        assert codes[values.size - 6] == codes[values.size - 5]  # 0.0 and -0.0 equal
        assert codes[-1] == codes[-2]  # every NaN equal


def _split_on_host(per_rank: list[np.ndarray], targets: list[int], ways: int) -> list[list[int]]:
    """The search of _sorting._split with the allreduce done by a sum over simulated ranks."""
    present = [codes for codes in per_rank if codes.size]
    low = [int(min(codes[0] for codes in present))] * len(targets)
    high = [int(max(codes[-1] for codes in present))] * len(targets)
    rounds = 0
    while any(lo < hi for lo, hi in zip(low, high)):
        candidates = plans.search_candidates(low, high, ways)
        totals = [[sum(int(np.searchsorted(codes, codes.dtype.type(cut), side="right")) for codes in per_rank)
                   for cut in cuts] for cuts in candidates]
        low, high = plans.narrow(low, high, candidates, totals, targets)
        rounds += 1
    assert rounds <= 64
    splitters = np.array(low, per_rank[0].dtype)
    before = [np.searchsorted(codes, splitters, side="left").tolist() for codes in per_rank]
    equal = [(np.searchsorted(codes, splitters, side="right") - np.searchsorted(codes, splitters)).tolist()
             for codes in per_rank]
    return plans.split_points(targets, before, equal)


@pytest.mark.parametrize("counts", [[5, 0, 9, 3], [0, 0, 12], [7], [4, 4, 4, 4, 4], [0, 10, 0, 0]])
@pytest.mark.parametrize("ways", [2, 16])
def test_the_split_sends_each_position_to_its_rank_in_stable_order(counts, ways):
    rng = np.random.default_rng(sum(counts))
    host = rng.integers(-3, 4, sum(counts)).astype(np.int64)  # many ties
    starts = plans.offsets(counts)
    per_rank = [np.sort(host[start:start + count]) for start, count in zip(starts, counts)]
    tagged = [(value, rank, i) for rank, part in enumerate(per_rank) for i, value in enumerate(part)]
    stable = sorted(tagged)  # the stable global order: value, then rank, then local position
    targets = starts[1:]
    codes = [plans.order_codes(part) for part in per_rank]
    points = _split_on_host(codes, targets, ways) if targets and sum(counts) else [[0] * len(targets)] * len(counts)
    received = {}
    flows = plans.sort_flows(points, counts)
    for rank in range(len(counts)):
        plan = flows.plan(rank)
        assert sum(plan.send_counts) == counts[rank]
        assert sum(plan.receive_counts) == counts[rank]  # every rank keeps its element count
        received[rank] = [(per_rank[source][plan_start + j], source, plan_start + j)
                          for source in range(len(counts))
                          for other in [flows.plan(source)]
                          for plan_start in [other.send_displacements[rank]]
                          for j in range(other.send_counts[rank])]
    for rank, start in enumerate(starts):
        assert sorted(received[rank]) == stable[start:start + counts[rank]]


@pytest.mark.parametrize("counts", [[5, 0, 9, 3], [0, 0, 12], [7], [4, 4, 4, 4, 4], [0, 10, 0, 0], [1000, 1, 333]])
def test_comparator_splits_take_each_rank_s_share_of_the_stable_order(counts):
    rng = np.random.default_rng(sum(counts) + 1)
    host = rng.integers(-3, 4, sum(counts)).astype(np.int64)  # ordered by |x|: ties of x and -x too
    starts = plans.offsets(counts)
    per_rank = [part[np.argsort(np.abs(part), kind="stable")]
                for part in (host[start:start + count] for start, count in zip(starts, counts))]
    keys = [np.abs(part) for part in per_rank]
    asked = []

    def positions(probes):  # what every rank's comparator search adds up to
        asked.append(len(probes))
        found = []
        for q, j in probes:
            x = keys[q][j]
            found.append(j + sum(int(np.searchsorted(keys[r], x, side="right" if r < q else "left"))
                                 for r in range(len(counts)) if r != q))
        return found

    targets = starts[1:]
    points = plans.corank_points(counts, targets, positions)
    stable = sorted((abs(int(value)), rank, i) for rank, part in enumerate(per_rank) for i, value in enumerate(part))
    for b, target in enumerate(targets):
        assert [sum(1 for _, rank, _ in stable[:target] if rank == q) for q in range(len(counts))] == \
            [points[q][b] for q in range(len(counts))]
    assert len(asked) <= max(counts).bit_length() + 1  # one round a halving


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint64])
@pytest.mark.parametrize("descending", [False, True])
def test_sorted_codes_search_as_the_whole_part_s_codes_would(dtype, descending):
    rng = np.random.default_rng(7)
    if np.dtype(dtype).kind == "f":
        host = np.concatenate([rng.integers(-5, 5, 300).astype(dtype), [np.nan, -0.0, 0.0, np.inf, -np.inf, np.nan]])
        host = host.astype(dtype)
    else:
        info = np.iinfo(dtype)
        host = np.concatenate([rng.integers(-5 if info.min < 0 else 0, 5, 300).astype(dtype),
                               np.array([info.min, info.max], dtype)])
    for values in (host, host[:1], host[:0]):
        codes = plans.order_codes(values, descending)
        ordered = values[np.argsort(codes, kind="stable")]  # the sort's order
        whole = np.sort(codes)
        lazy = plans.SortedCodes(ordered, descending)
        unsigned = np.dtype(f"u{np.dtype(dtype).itemsize}")
        extremes = np.array([0, np.iinfo(unsigned).max], unsigned)
        targets = np.concatenate([whole, whole - unsigned.type(1), whole + unsigned.type(1), extremes])
        for side in ("left", "right"):
            assert np.array_equal(lazy.searchsorted(targets, side), np.searchsorted(whole, targets, side=side))
        if values.size:
            assert np.array_equal(lazy.at([0, values.size - 1]), whole[[0, -1]])


def test_merge_best_takes_the_lower_index_among_ties():
    values = np.array([5, 7, 7, 1, 7], np.int32)
    indices = np.array([10, 40, 3, 2, 20], np.int64)
    best, where = plans.merge_best(values, indices, plans.order_codes(values, True), 3)
    assert best.tolist() == [7, 7, 7] and where.tolist() == [3, 20, 40]
    best, where = plans.merge_best(values, indices, plans.order_codes(values, False), 2)
    assert best.tolist() == [1, 5] and where.tolist() == [2, 10]
