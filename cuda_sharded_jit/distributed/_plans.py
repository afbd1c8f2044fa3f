"""The host-side logic of the cross-rank steps, as pure functions: no MPI, no GPU, so each is
tested against numpy on its own (tests/distributed/test_plans.py), and the GPU path calls
exactly these.

Places are numbered globally in rank order, then local order, so the places of one rank are
consecutive and its shards hold one contiguous range of global indices. Every per-place
list below is indexed by global place.

Folds take a `fold(values, init) -> (prefixes, total)` primitive: the GPU path passes the
shim's fold kernel (the association of the one-process cross-place fold, so results match
by_devices bit for bit), the tests `host_fold` of a Python operator. `init` is the
accumulator's bytes (or value), empty / None for none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

# ---- layout --------------------------------------------------------------------------------


def place_layout(places_per_rank: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the rank of each global place, the first global place of each rank), places numbered
    in rank order, then local order."""
    owners, firsts = [], []
    for rank, count in enumerate(places_per_rank):
        if count < 1:
            raise ValueError(f"devices: rank {rank} has no places; every rank needs at least one")
        firsts.append(len(owners))
        owners.extend([rank] * count)
    return tuple(owners), tuple(firsts)


def local_places(owners: Sequence[int], rank: int) -> tuple[int, ...]:
    """The global indices of the places `rank` holds, in order."""
    return tuple(place for place, owner in enumerate(owners) if owner == rank)


def offsets(shard_sizes: Sequence[int]) -> list[int]:
    """The global index of each shard's first element (an exclusive prefix of the sizes)."""
    total, starts = 0, []
    for size in shard_sizes:
        starts.append(total)
        total += size
    return starts


def rank_counts(shard_sizes: Sequence[int], owners: Sequence[int], nranks: int) -> tuple[list[int], list[int]]:
    """(elements each rank holds, where its range starts): the counts and displacements of the
    scatter (from_numpy with a root), gather (to_numpy) and allgather of whole arrays."""
    counts = [0] * nranks
    for size, owner in zip(shard_sizes, owners):
        counts[owner] += size
    return counts, offsets(counts)


def index_origin(shard_sizes: Sequence[int], owners: Sequence[int], rank: int) -> int:
    """The global index of the first element `rank` holds."""
    return sum(size for size, owner in zip(shard_sizes, owners) if owner < rank)


# ---- resharding ------------------------------------------------------------------------------


class AllToAll(NamedTuple):
    """One rank's part of an all-to-all-v, in elements: what it sends to each rank (counts,
    displacements into its old local range) and receives from each (into its new one)."""

    send_counts: list[int]
    send_displacements: list[int]
    receive_counts: list[int]
    receive_displacements: list[int]


class Flows(NamedTuple):
    """Every rank's part of an all-to-all-v at once (R x R int64, [sender, receiver]): how
    many elements of the sender's local range go to the receiver, where in the sender's
    range they start, and where in the receiver's they land. Made with numpy in O(R^2)
    array work (a few ms at R = 512) where per-rank Python plans would loop R^2 times."""

    counts: np.ndarray
    starts: np.ndarray
    lands: np.ndarray

    def plan(self, rank: int) -> AllToAll:
        """`rank`'s own part, as MPI_Alltoallv takes it."""
        return AllToAll(self.counts[rank].tolist(), self.starts[rank].tolist(),
                        self.counts[:, rank].tolist(), self.lands[:, rank].tolist())


def reshard_flows(old_sizes: Sequence[int], new_sizes: Sequence[int], owners: Sequence[int],
                  nranks: int) -> Flows:
    """The flows of resharding an array of shard sizes `old_sizes` to `new_sizes` (same
    total): each element keeps its global index, so rank r sends rank s the overlap of its
    old range with s's new range, in global order."""
    if sum(old_sizes) != sum(new_sizes):
        raise ValueError(f"sizes: {list(new_sizes)} add up to {sum(new_sizes)}, not {sum(old_sizes)}")
    old_counts, old_starts = (np.array(x, np.int64) for x in rank_counts(old_sizes, owners, nranks))
    new_counts, new_starts = (np.array(x, np.int64) for x in rank_counts(new_sizes, owners, nranks))
    low = np.maximum(old_starts[:, None], new_starts[None, :])
    high = np.minimum((old_starts + old_counts)[:, None], (new_starts + new_counts)[None, :])
    counts = np.maximum(high - low, 0)
    moving = counts > 0
    return Flows(counts, np.where(moving, low - old_starts[:, None], 0), np.where(moving, low - new_starts[None, :], 0))


# ---- reductions --------------------------------------------------------------------------------


def in_place_order(gathered: Sequence[Sequence]) -> list:
    """Every rank's per-place results (allgathered, in rank order: each rank's list in local
    order) as one list in global place order: rank order, then local order."""
    return [entry for per_rank in gathered for entry in per_rank]


def present(partials: Sequence[tuple[bool, object]]) -> list:
    """The values of the places that hold elements (valid), in order: what a fold combines."""
    return [value for valid, value in partials if valid]


def host_fold(op: Callable) -> Callable:
    """A fold primitive from a Python operator `op(a, b)` (a before b), with the association
    of the shim's fold kernel: acc = init; acc = op(acc, v) for each v (the first v alone
    without init). prefixes[k] is the fold before v_k (None for k == 0 without init)."""

    def fold(values, init):
        prefixes, have, acc = [], init is not None and init != b"", init
        for value in values:
            prefixes.append(acc if have else None)
            acc = op(acc, value) if have else value
            have = True
        return prefixes, acc

    return fold


def reduce_result(values: Sequence, init, fold: Callable) -> tuple[bool, object]:
    """(valid, accumulator) of a reduce: `values` (the places' partials that hold elements, in
    global order) folded after init. With no values: (whether init was given, init); one value
    and no init: that value, as the one-place reduce returns it."""
    has_init = init is not None and init != b""
    if not values:
        return has_init, init
    if len(values) == 1 and not has_init:
        return True, values[0]
    return True, fold(list(values), init)[1]


def scan_seeds(totals: Sequence, init, fold: Callable) -> list:
    """Each place's seed for its scan (what comes before its first element): totals[p] is
    place p's shard total, None for an empty shard (which needs none). The seed is the fold
    of init and every earlier non-empty place's total; None where nothing comes before (the
    first non-empty place without init)."""
    values = [total for total in totals if total is not None]
    prefixes = fold(values, init)[0] if values else []
    seeds, k = [], 0
    for total in totals:
        if total is None:
            seeds.append(None)
        else:
            seeds.append(prefixes[k])
            k += 1
    return seeds


def sum_counts(per_rank: Sequence):
    """Counts (numbers, or numpy arrays of them: histograms) added over ranks. Integers: any
    order gives the same sum, so an allreduce does this on the GPU path."""
    total = per_rank[0]
    for counts in per_rank[1:]:
        total = total + counts
    return total


# ---- neighbours ----------------------------------------------------------------------------------


class Halo(NamedTuple):
    """Place `place` needs the last element of `source` (the last non-empty place before it)."""

    place: int
    source: int
    rank: int
    source_rank: int


def halo_plan(shard_sizes: Sequence[int], owners: Sequence[int]) -> list[Halo]:
    """For adjacent_difference (and any step that reads an element's predecessor): every
    non-empty place but the first gets the last element of the nearest non-empty place
    before it, which skips empty shards. The halos with `rank != source_rank` cross ranks;
    only a rank's first non-empty place can need one."""
    halos, last = [], None
    for place, size in enumerate(shard_sizes):
        if size == 0:
            continue
        if last is not None:
            halos.append(Halo(place, last, owners[place], owners[last]))
        last = place
    return halos


# ---- transports ------------------------------------------------------------------------------------

TRANSPORTS = ("auto", "nccl", "mpi")


def choose_transport(requested: str, nccl_loads: bool, gpus_distinct: bool) -> str:
    """The transport a group uses: "mpi" moves data through MPI, "nccl" through NCCL, which
    refuses two ranks on one GPU; "auto" takes NCCL where it loads (on every rank) and every
    place's GPU is distinct, else MPI."""
    if requested not in TRANSPORTS:
        raise ValueError(f"transport: expected one of {', '.join(map(repr, TRANSPORTS))}, got {requested!r}")
    if requested == "mpi":
        return "mpi"
    if requested == "nccl":
        if not nccl_loads:
            raise ValueError("transport: 'nccl' needs libnccl.so.2 on every rank (pip install nvidia-nccl-cu13, "
                             "or set CUDA_SHARDED_JIT_NCCL to the site's)")
        if not gpus_distinct:
            raise ValueError("transport: NCCL refuses two ranks (or places) on one GPU; use 'mpi' to run "
                             "several on one device")
        return "nccl"
    return "nccl" if nccl_loads and gpus_distinct else "mpi"


# ---- the sort's split ------------------------------------------------------------------------------


def order_codes(values, descending: bool = False):
    """`values` (a numpy array of numbers) as unsigned codes of their width whose order is the
    sort's order: integers by value, floats as numpy sorts them (-0.0 equals 0.0, every NaN
    equal and after +inf); with `descending`, the exact reverse (NaNs first). A sorted
    shard's codes are non-decreasing, so counting the elements at or before a code is a
    binary search."""

    values = np.asarray(values)
    unsigned = np.dtype(f"u{values.dtype.itemsize}")
    top = unsigned.type(1 << (8 * values.dtype.itemsize - 1))
    if values.dtype.kind == "f":
        raw = np.where(values == 0, np.zeros((), values.dtype), values).view(unsigned)  # -0.0 as 0.0
        codes = np.where((raw & top) != 0, ~raw, raw | top)
        codes[np.isnan(values)] = np.iinfo(unsigned).max
    elif values.dtype.kind == "i":
        codes = values.view(unsigned) ^ top
    else:
        codes = values.copy()
    return ~codes if descending else codes


class SortedCodes:
    """The order codes of a part sorted in the sort's order (so its codes do not decrease),
    computed only where a search looks: searchsorted by a binary search over positions, all
    targets at once, coding the ~log2(n) elements each target meets (order_codes of the whole
    part costs a few passes over it: seconds for 2^26 float32 on one core)."""

    def __init__(self, values, descending: bool):

        self.values = np.asarray(values)
        self.descending = descending
        self.size = int(self.values.size)
        self.dtype = np.dtype(f"u{self.values.dtype.itemsize}")

    def at(self, positions):
        """The codes of the elements at `positions`."""
        return order_codes(self.values[positions], self.descending)

    def searchsorted(self, targets, side: str = "left"):
        """np.searchsorted(order_codes(values), targets, side) without coding every element."""

        targets = np.asarray(targets, dtype=self.dtype)
        low = np.zeros(targets.shape, np.int64)
        high = np.full(targets.shape, self.size, np.int64)
        while True:
            open_ = low < high
            if not open_.any():
                return low
            middle = (low + high) // 2
            codes = self.at(np.minimum(middle, self.size - 1))
            after = (codes <= targets) if side == "right" else (codes < targets)
            low = np.where(open_ & after, middle + 1, low)
            high = np.where(open_ & ~after, middle, high)


def search_candidates(low: Sequence[int], high: Sequence[int], ways: int) -> list[list[int]]:
    """One round of the splitters' search: for each bracket [low, high] of codes, up to
    `ways - 1` codes that cut it into `ways` nearly equal parts (none once low == high)."""
    candidates = []
    for lo, hi in zip(low, high):
        width = hi - lo + 1
        step = -(-width // ways)
        candidates.append([lo + j * step - 1 for j in range(1, ways) if lo + j * step - 1 < hi])
    return candidates


def narrow(low: Sequence[int], high: Sequence[int], candidates: Sequence[Sequence[int]],
           at_or_before: Sequence[Sequence[int]], targets: Sequence[int]) -> tuple[list[int], list[int]]:
    """The brackets after one round: target k's code is the smallest code c with at least
    k + 1 elements at or before it (over every rank: `at_or_before[b][j]` counts them for
    `candidates[b][j]`), so the bracket shrinks to the part holding that crossing."""
    new_low, new_high = [], []
    for lo, hi, cuts, totals, target in zip(low, high, candidates, at_or_before, targets):
        for cut, total in zip(cuts, totals):
            if total >= target + 1:
                hi = cut
                break
            lo = cut + 1
        new_low.append(lo)
        new_high.append(hi)
    return new_low, new_high


def split_points(targets: Sequence[int], before: Sequence[Sequence[int]],
                 equal: Sequence[Sequence[int]]) -> list[list[int]]:
    """How many of each rank's sorted elements go before global position targets[b]:
    `before[r][b]` of rank r's elements order strictly before that position's code,
    `equal[r][b]` equal it. The ties fill the remaining positions in rank order (the stable
    order: rank order is global index order). Returns points[r][b]."""
    nranks = len(before)
    points = [[0] * len(targets) for _ in range(nranks)]
    for b, target in enumerate(targets):
        need = target - sum(before[r][b] for r in range(nranks))
        for r in range(nranks):
            take = min(max(need, 0), equal[r][b])
            points[r][b] = before[r][b] + take
            need -= take
    return points


def corank_points(counts: Sequence[int], targets: Sequence[int],
                  positions: Callable[[list[tuple[int, int]]], Sequence[int]]) -> list[list[int]]:
    """The split of a sort whose order is known only through comparisons (a comparator): how
    many of each rank's sorted elements go before each global position targets[b] of the
    stable merge of every rank's sorted part (rank order is global index order). Element j
    of rank q sits at a position `positions([(q, j), ...])` gives (the ranks before q count
    their elements not after it, the ranks after q those before it, plus j); positions rise
    with j, so points[q][b] is the smallest j with position >= targets[b] (or counts[q]),
    found by one binary search per (rank, target), all of a round's probes asked at once."""
    low = [[0] * len(targets) for _ in counts]
    high = [[count] * len(targets) for count in counts]
    while True:
        open_ = [(q, b) for q in range(len(counts)) for b in range(len(targets)) if low[q][b] < high[q][b]]
        if not open_:
            return low
        probes = sorted({(q, (low[q][b] + high[q][b]) // 2) for q, b in open_})
        found = dict(zip(probes, positions(probes)))
        for q, b in open_:
            middle = (low[q][b] + high[q][b]) // 2
            if found[(q, middle)] < targets[b]:
                low[q][b] = middle + 1
            else:
                high[q][b] = middle


def sort_flows(points: Sequence[Sequence[int]], counts: Sequence[int]) -> Flows:
    """The sort's flows from the split points (points[r][d - 1]: how many of rank r's sorted
    elements go to ranks before d, for d = 1 .. R - 1): rank r sends its elements in
    [points[r][d - 1], points[r][d]) to rank d, and rank d receives them in rank order."""
    nranks = len(counts)
    cuts = np.zeros((nranks, nranks + 1), np.int64)  # cuts[r, d]: how many of r's go to ranks before d
    if nranks > 1:
        cuts[:, 1:nranks] = np.asarray(points, np.int64).reshape(nranks, nranks - 1)
    cuts[:, nranks] = counts
    flows = np.diff(cuts, axis=1)
    return Flows(flows, cuts[:, :nranks], np.cumsum(flows, axis=0) - flows)


def merge_best(values, indices, codes, k: int):
    """top_k's merge of every rank's candidates (values, global indices and their ascending
    order codes, concatenated): the k best, best first, ties to the lower index. `codes` are
    already reversed for the largest (order_codes(..., descending=True))."""

    order = np.lexsort((indices, codes))[:k]
    return values[order], indices[order]
