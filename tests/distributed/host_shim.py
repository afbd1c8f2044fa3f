"""A host-backed stand-in of the shim's groups, arrays and built-in kernels (numpy on host
buffers), so that the distributed layer's Python runs under mpiexec on a machine with no GPU:
every collective's agreements, data movement and folds, on this rank's part of each array.

It stands in for what the from_mpi paths call: PlaceGroup.by_devices, ShardedArray.allocate
and its host copies, the built-in reductions' per-place partials and fold, the built-in
scans (with their carry, and a lone place's), count, histogram_even, fill, sequence, the
built-in add and negate, copy_lanes, the radix sorts (sort, sort_by_key: stable, over the rank's places as one
sequence, NaNs last ascending and first descending, the exact reverse), top_k, searchsorted
select, the scans by key, reduce_by_key, adjacent_difference, the flagged compaction, the
run heads, segmented_reduce, the comparator sort and search and the transform of numbers (whose
compiled operators `select_libraries`, `compiled_libraries` and `transform_libraries` stand
in for with the Python functions themselves). Its folds are sequential
numpy folds, not the GPU's: results are checked against numpy, never bitwise against the
GPU (the gpu tests do that). `install(monkeypatch)` puts it in place for one test.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from cuda_sharded_jit import _shim as real_shim

_OPS = {"sum": np.add, "min": np.minimum, "max": np.maximum}
_LIMIT_BYTES = 1 << 40  # larger shards "do not fit": MemoryError, as a full device


class PlaceGroup:
    """One rank's places: devices, streams (fake handles), nothing to wait for."""

    def __init__(self, devices):
        self.devices = list(devices)
        self.locality_domains = [0] * len(self.devices)

    @staticmethod
    def by_devices(devices):
        if devices is None:
            devices = [0]
        if not devices:
            raise ValueError("devices: expected at least one device, got an empty list")
        return PlaceGroup(devices)

    def __len__(self):
        return len(self.devices)

    def stream(self, place):
        return 1000 + place

    def compute_capability(self, place):
        return 9, 0

    def sync(self):
        pass


class ShardedArray:
    """One rank's shards in one host buffer, in place order."""

    even_sizes = staticmethod(real_shim.ShardedArray.even_sizes)

    def __init__(self, group, sizes, dtype_name, itemsize):
        if len(sizes) != len(group):
            raise ValueError(f"sizes: expected one size per place ({len(group)}), got {len(sizes)}")
        self.group = group
        self.dtype = dtype_name
        self.itemsize = itemsize
        self.shard_sizes = list(sizes)
        self.shard_offsets = [int(offset) for offset in np.cumsum([0] + self.shard_sizes[:-1])]
        self.size = sum(self.shard_sizes)
        self.num_shards = len(self.shard_sizes)
        self.storage = "separate"
        self.is_freed = False
        self.index_origin = 0
        if self.size * itemsize > _LIMIT_BYTES:
            raise MemoryError(f"out of memory on device {group.devices[0]}: {self.size * itemsize} bytes asked")
        self.data = np.zeros(self.size * itemsize, np.uint8)

    @staticmethod
    def allocate(group, sizes, dtype_name, contiguous=False, itemsize=0):
        return ShardedArray(group, sizes, dtype_name, itemsize or np.dtype(dtype_name).itemsize)

    def set_index_origin(self, origin):
        self.index_origin = origin

    def typed(self, place=None):
        """The elements (of one place) as a numpy view of the buffer."""
        values = self.data.view(np.dtype(self.dtype)) if self.dtype != "record" else self.data
        if place is None:
            return values
        start = self.shard_offsets[place]
        return values[start:start + self.shard_sizes[place]]

    def shard_pointer(self, place):
        return self.data.ctypes.data + self.shard_offsets[place] * self.itemsize

    def copy_from_host(self, host, nbytes):
        assert nbytes == self.data.nbytes
        ctypes.memmove(self.data.ctypes.data, host, nbytes)

    def copy_to_host(self, host, nbytes):
        assert nbytes == self.data.nbytes
        ctypes.memmove(host, self.data.ctypes.data, nbytes)

    def copy_range_from_host(self, start, stop, host, nbytes):
        assert nbytes == (stop - start) * self.itemsize
        ctypes.memmove(self.data.ctypes.data + start * self.itemsize, host, nbytes)

    def copy_range_to_host(self, start, stop, host, nbytes):
        assert nbytes == (stop - start) * self.itemsize
        ctypes.memmove(host, self.data.ctypes.data + start * self.itemsize, nbytes)

    def free(self):
        self.is_freed = True


def _fold(op, values, init):
    """The shim's fold's association on numpy scalars: prefixes and total."""
    prefixes, acc = [], init
    for value in values:
        prefixes.append(acc)
        acc = value if acc is None else op(acc, value)
    return prefixes, acc


def reduce_builtin_partials(op, impl):
    ufunc, dtype = _OPS[op.name], np.dtype(impl.dtype)
    return [(True, ufunc.reduce(impl.typed(place), dtype=dtype).tobytes()) if impl.shard_sizes[place]
            else (False, b"") for place in range(impl.num_shards)]


def fold_builtin(op, dtype_name, group, values, init):
    ufunc, dtype = _OPS[op.name], np.dtype(dtype_name)
    scalars = [np.frombuffer(value, dtype)[0] for value in values]
    prefixes, total = _fold(ufunc, scalars, np.frombuffer(init, dtype)[0] if init else None)
    return ([None if prefix is None else prefix.tobytes() for prefix in prefixes],
            b"" if total is None else total.tobytes())


def scan_builtin_carried(op, impl, out, exclusive, carry):
    ufunc, dtype = _OPS[op.name], np.dtype(impl.dtype)
    seeds = carry(reduce_builtin_partials(op, impl))
    for place, seed in enumerate(seeds):
        values = impl.typed(place)
        if not values.size:
            continue
        scanned = ufunc.accumulate(values, dtype=dtype)
        if seed is not None:
            scanned = ufunc(np.frombuffer(seed, dtype)[0], scanned).astype(dtype)
        if exclusive:
            scanned = np.concatenate([[np.frombuffer(seed, dtype)[0]], scanned[:-1]]).astype(dtype)
        out.typed(place)[:] = scanned


def scan_builtin(op, impl, out, init, exclusive):
    """The one-process scan of this rank's places, which a from_mpi scan runs where one place
    holds every element: each non-empty place seeded with init and the places before it."""
    ufunc, dtype = _OPS[op.name], np.dtype(impl.dtype)

    def carry(totals):
        seeds, acc = [], np.frombuffer(init, dtype)[0] if init else None
        for valid, value in totals:
            seeds.append(None if acc is None else acc.tobytes())
            if valid:
                total = np.frombuffer(value, dtype)[0]
                acc = total if acc is None else ufunc(acc, total)
        return seeds

    scan_builtin_carried(op, impl, out, exclusive, carry)


def count(impl, value):
    return int(np.count_nonzero(impl.typed() == np.frombuffer(value, np.dtype(impl.dtype))[0]))


def check_histogram_memory(impl, num_bins):
    pass


def histogram_even(impl, num_bins, edges, edge_bytes, counts):
    edge_dtype = np.float32 if edge_bytes == (num_bins + 1) * 4 else np.float64
    edge_values = np.frombuffer((ctypes.c_char * edge_bytes).from_address(edges), edge_dtype)
    counts[:] = np.histogram(impl.typed(), bins=edge_values)[0]


def transform_builtin(op, inputs, out, scalars):
    values = out.typed()
    if op == real_shim.BuiltinOp.fill:
        values[:] = np.frombuffer(scalars[:out.itemsize], values.dtype)[0]
    elif op == real_shim.BuiltinOp.sequence:
        wide = {"f": np.float64, "i": np.int64, "u": np.uint64}[values.dtype.kind]
        start, step = np.frombuffer(scalars[:16], wide)
        index = out.index_origin + np.arange(out.size)  # global indices: the origin is this rank's
        values[:] = (start + step * index).astype(values.dtype)
    elif op == real_shim.BuiltinOp.add:
        values[:] = inputs[0].typed() + inputs[1].typed()
    elif op == real_shim.BuiltinOp.negate:
        values[:] = -inputs[0].typed()
    else:
        raise NotImplementedError(f"the host shim has no {op}")


def copy_lanes(source, source_offset, target, target_offset, width):
    """Bytes [offset, offset + width) of every element, from source's elements to target's."""
    assert source.size == target.size
    lanes = source.data.reshape(-1, source.itemsize)[:, source_offset:source_offset + width]
    target.data.reshape(-1, target.itemsize)[:, target_offset:target_offset + width] = lanes


def _sort_order(values, descending):
    """The stable order of the shim's radix sort: numpy's (NaNs last, -0.0 == 0.0), or its
    exact reverse with ties still in index order."""
    from cuda_sharded_jit.distributed._plans import order_codes

    return np.argsort(order_codes(values, descending), kind="stable")


def _canonical(values):
    """What the sort writes back: every NaN as the positive quiet NaN."""
    if values.dtype.kind == "f":
        values = values.copy()
        values[np.isnan(values)] = np.array(np.nan, values.dtype)
    return values


def sort(impl, out, descending):
    values = impl.typed()
    out.typed()[:] = _canonical(values[_sort_order(values, descending)])


def sort_by_key(keys, out_keys, values, out_values, descending):
    order = _sort_order(keys.typed(), descending)
    moved = values.data.reshape(-1, values.itemsize)[order].reshape(-1)
    out_keys.typed()[:] = _canonical(keys.typed()[order])
    out_values.data[:] = moved


def top_k(impl, k, largest, values, value_bytes, indices, index_bytes):
    from cuda_sharded_jit.distributed._plans import order_codes

    data = impl.typed()
    order = np.lexsort((np.arange(data.size), order_codes(data, largest)))[:k]  # ties: the lower index
    best, where = np.ascontiguousarray(data[order]), order.astype(np.int64)  # kept alive while copied
    ctypes.memmove(values, best.ctypes.data, value_bytes)
    ctypes.memmove(indices, where.ctypes.data, index_bytes)


def searchsorted(sorted_impl, queries, positions, right):
    found = np.searchsorted(sorted_impl.typed(), queries.typed(), side="right" if right else "left")
    positions.typed()[:] = found


def select_libraries(op, algorithm, arg_kinds, out_request, archs, spec=None):
    """Stands in for compiler.kernel_libraries in algorithms/select.py: the predicates
    themselves, which `select` calls on the host."""
    return None, (op, spec)


def select(libraries, impl, outputs, single_pass=True):  # one engine on the host: single_pass unused
    from cuda_sharded_jit.compiler import SELECT_KINDS

    first, (kind, second) = libraries
    with_index = kind == SELECT_KINDS[True]
    values = impl.typed()
    origin = impl.index_origin
    classes = np.empty(impl.size, np.int64)
    for i, value in enumerate(values):
        if (first(value, origin + i) if with_index else first(value)):
            classes[i] = 0
        else:
            classes[i] = 1 if second is None or second(value) else 2
    result = []
    for kept in range(outputs):
        sizes = [int(np.count_nonzero(classes[offset:offset + size] == kept))
                 for offset, size in zip(impl.shard_offsets, impl.shard_sizes)]
        part = ShardedArray(impl.group, sizes, impl.dtype, impl.itemsize)
        picked = impl.data.reshape(-1, impl.itemsize)[classes == kept].reshape(-1)
        part.data[:] = picked
        result.append(part)
    return result


def compiled_libraries(op, algorithm, arg_kinds, out_request, archs, map_spec=None):
    """Stands in for compiler.kernel_libraries in algorithms/by_key.py: (the result dtype, the
    operator and its map specification), which the by-key stand-ins call on the host."""
    return out_request, (op, map_spec)


def _from_parts(group, like, values, ends):
    """A new stand-in array of `values` (numpy) whose elements belong to the places holding
    `ends` (indices into `like`'s elements)."""
    bounds = np.cumsum(like.shard_sizes)
    places = np.searchsorted(bounds, np.asarray(ends, np.int64), side="right")
    sizes = [int(np.count_nonzero(places == place)) for place in range(len(like.shard_sizes))]
    result = ShardedArray(group, sizes, values.dtype.name, values.dtype.itemsize)
    result.typed()[:] = values
    return result


def _heads(keys, equal):
    return [i == 0 or not equal(keys[i - 1], keys[i]) for i in range(keys.size)]


def _cast(value, dtype):
    with np.errstate(all="ignore"):
        return np.array([value]).astype(dtype)[0]


_RECORD = np.dtype([("valid", "u1"), ("head", "u1"), ("pad", "V6"), ("tails", "<i8"), ("key", "V8"),
                    ("unused", "V8"), ("value", "V32")])  # 64 bytes, opaque to the Python layer


def _run_edges(keys, values, equal, edges):
    """The local part's head flags and, across ranks, whether its last run goes on in a later
    rank, and the carry into its first element: the earlier ranks' totals folded (exchanged
    through the edges' callback with this rank's shards' records, 64 bytes each)."""
    key_values, source = keys.typed(), values.typed()
    before, after, totals = edges if edges is not None else (b"", b"", None)
    heads = _heads(key_values, equal)
    if key_values.size and before:
        heads[0] = not equal(np.frombuffer(before, key_values.dtype)[0], key_values[0])
    continues = bool(key_values.size and after and equal(key_values[-1], np.frombuffer(after, key_values.dtype)[0]))
    carry = None
    if totals is not None:
        records = np.zeros(sum(1 for size in keys.shard_sizes if size), _RECORD)
        n = len(heads)
        ends = [heads[i + 1] if i + 1 < n else not continues for i in range(n)]  # a run ends at i
        at = k = 0
        for size in keys.shard_sizes:
            if not size:
                continue
            shard_heads = [at + j for j in range(size) if heads[at + j]]
            start = shard_heads[-1] if shard_heads else at
            record = records[k]
            record["valid"], record["head"] = 1, bool(shard_heads)
            record["tails"] = sum(1 for j in range(at, at + size) if ends[j])
            record["key"] = key_values[start].tobytes().ljust(8, b"\0")
            record["value"] = _fold_values(source[start:at + size], values.fold).tobytes().ljust(32, b"\0")
            at, k = at + size, k + 1
        earlier = np.frombuffer(totals(records.tobytes()), _RECORD)
        for record in earlier:  # the earlier ranks' totals, in place order: the run into this rank
            if not record["valid"]:
                continue
            value = np.frombuffer(record["value"].tobytes()[:source.itemsize], source.dtype)[0]
            key = np.frombuffer(record["key"].tobytes()[:key_values.itemsize], key_values.dtype)[0]
            carry = (key, value) if record["head"] or carry is None else (carry[0], values.fold(carry[1], value))
    return heads, continues, (carry if key_values.size and not heads[0] else None)


def _fold_values(values, op):
    acc = values[0]
    for value in values[1:]:
        acc = op(acc, value)
    return np.array([acc], values.dtype)


class _Values:
    """values and the operator folding them in their dtype."""

    def __init__(self, array, op):
        self.array, self.dtype = array, np.dtype(array.dtype)
        self.fold = lambda x, y: _cast(op(x, y), self.dtype)

    def typed(self):
        return self.array.typed()


def scan_by_key(libraries, keys, values, out, exclusive, init, edges=None):
    op, (_, equal) = libraries
    dtype = np.dtype(out.dtype)
    folding = _Values(values, op)
    heads, _, carry = _run_edges(keys, folding, equal, edges)
    source = values.typed()
    seed = np.frombuffer(init, dtype)[0] if exclusive else None
    result = np.empty(source.size, dtype)
    acc = None
    if carry is not None:  # the run goes on from earlier ranks
        acc = folding.fold(seed, carry[1]) if exclusive else carry[1]
    for i, head in enumerate(heads):
        if exclusive:
            acc = seed if head else acc
            result[i] = acc
            acc = _cast(op(acc, source[i]), dtype)
        else:
            acc = source[i] if head else _cast(op(acc, source[i]), dtype)
            result[i] = acc
    out.typed()[:] = result


def reduce_by_key(libraries, keys, values, edges=None):
    op, (_, equal) = libraries
    folding = _Values(values, op)
    heads, continues, carry = _run_edges(keys, folding, equal, edges)
    key_values, source = keys.typed(), values.typed()
    dtype = source.dtype
    firsts, folds, ends = [], [], []
    if carry is not None:  # the run from earlier ranks: its first key, the fold so far
        firsts.append(carry[0])
        folds.append(carry[1])
    for i, head in enumerate(heads):
        if head:
            if firsts:
                ends.append(i - 1)
            firsts.append(key_values[i])
            folds.append(source[i])
        else:
            folds[-1] = _cast(op(folds[-1], source[i]), dtype)
    if firsts:
        ends.append(key_values.size - 1)
    if continues:  # its last run ends on a later rank, which writes it
        firsts, folds, ends = firsts[:-1], folds[:-1], ends[:-1]
    return (_from_parts(keys.group, keys, np.array(firsts, key_values.dtype), ends),
            _from_parts(values.group, values, np.array(folds, dtype), ends))


def adjacent_difference(difference, first, a, out, successor, halo=b""):
    assert not successor
    values, result = a.typed(), out.typed()
    (difference_op, _), (first_op, _) = difference, first
    for i in range(values.size):
        if i == 0:
            result[i] = (difference_op(values[0], np.frombuffer(halo, values.dtype)[0]) if halo
                         else first_op(values[0]))
        else:
            result[i] = difference_op(values[i], values[i - 1])


def _compact(kept, like, arrays):
    """Each array compacted to its elements where `kept`, on the places of `like` that held them."""
    ends = np.flatnonzero(kept)
    result = []
    for array in arrays:
        part = _from_parts(array.group, like, np.zeros(ends.size, np.uint8), ends)  # the sizes
        whole = ShardedArray(array.group, part.shard_sizes, array.dtype, array.itemsize)
        whole.data[:] = array.data.reshape(-1, array.itemsize)[kept].reshape(-1)
        result.append(whole)
    return result


def select_flagged(flags, arrays):
    return _compact(flags.typed() != 0, flags, arrays)


def select_heads(libraries, keys, arrays):
    """The one-process run heads (unique_by_key): each array compacted to the elements whose
    key starts a run of `equal` keys, all places as one sequence."""
    _, (_, equal) = libraries
    return _compact(np.asarray(_heads(keys.typed(), equal), dtype=bool), keys, arrays)


def visible_device_count():
    return 1


def segmented_reduce(libraries, impl, offsets, num_offsets, out, acc_size, init):
    """Each segment folded in element order from init (numbers; no map)."""
    op, _ = libraries
    dtype = np.dtype(out.dtype)
    positions = np.ctypeslib.as_array(ctypes.cast(offsets, ctypes.POINTER(ctypes.c_int64)), (num_offsets,))
    values, seed = impl.typed(), np.frombuffer(init, dtype)[0]
    folded = []
    for begin, end in zip(positions[:-1], positions[1:]):
        acc = seed
        for value in values[begin:end]:
            acc = _cast(op(acc, value), dtype)
        folded.append(acc)
    out.typed()[:] = np.array(folded, dtype)


def transform_libraries(op, algorithm, arg_kinds, out_request, archs, map_spec=None):
    """Stands in for compiler.kernel_libraries in algorithms/transform.py (arrays of numbers,
    no scalars): the result dtype (asked for, else the operator's on zeros: a tuple makes a
    record) and the operator, which `transform` calls on the host."""
    if out_request is None:
        result = op(*[np.zeros(1, dtype)[0] for _, dtype in arg_kinds])
        if isinstance(result, tuple):
            out_request = np.dtype([(f"f{k}", np.asarray(v).dtype) for k, v in enumerate(result)], align=True)
        else:
            out_request = np.asarray(result).dtype
    return np.dtype(out_request), op


def transform(libraries, inputs, out, scalars, indexed=False):
    op, dtype = libraries, np.dtype(out.dtype)
    columns = [impl.typed() for impl in inputs]
    out.typed()[:] = np.array([op(*row) for row in zip(*columns)], dtype)


def _before(libraries):
    """The comparator sort's order from the stand-in libraries: before(x, y), x strictly first."""
    compare, (order, key) = libraries
    lift = (lambda value: value) if key is None else key
    if order == "descending":
        return lambda x, y: bool(compare(lift(y), lift(x)))
    return lambda x, y: bool(compare(lift(x), lift(y)))


def sort_compare(libraries, impl, out):
    """A stable sort in the comparator's order, over the rank's places as one sequence."""
    before = _before(libraries)
    order = functools.cmp_to_key(lambda x, y: -1 if before(x, y) else (1 if before(y, x) else 0))
    out.typed()[:] = np.array(sorted(impl.typed().tolist(), key=order), np.dtype(out.dtype))


def search_compare(libraries, sorted_impl, queries, positions, right):
    """Per query, the sorted elements before it (left), or not after it (right)."""
    before, values = _before(libraries), sorted_impl.typed().tolist()
    positions.typed()[:] = [sum(1 for x in values if (not before(q, x) if right else before(x, q)))
                            for q in queries.typed().tolist()]


_pinned: dict[int, np.ndarray] = {}  # the stand-in's page-locked buffers, by address


def pinned_host_alloc(nbytes):
    buffer = np.empty(nbytes, np.uint8)
    _pinned[buffer.ctypes.data] = buffer
    return buffer.ctypes.data


def pinned_host_free(address):
    del _pinned[address]  # a KeyError for a buffer freed twice


NAMES = ["PlaceGroup", "ShardedArray", "reduce_builtin_partials", "fold_builtin", "scan_builtin_carried",
         "scan_builtin", "count", "check_histogram_memory", "histogram_even", "transform_builtin", "copy_lanes",
         "visible_device_count", "sort", "sort_by_key", "top_k", "searchsorted", "select",
         "scan_by_key", "reduce_by_key", "adjacent_difference", "select_flagged", "select_heads", "segmented_reduce",
         "sort_compare", "search_compare", "transform", "pinned_host_alloc", "pinned_host_free"]


def install(monkeypatch) -> None:
    """The stand-in in place of the shim's own, for one test."""
    import sys

    module = sys.modules[__name__]
    for name in NAMES:
        monkeypatch.setattr(real_shim, name, getattr(module, name))
    from cuda_sharded_jit.algorithms import select as select_module

    monkeypatch.setattr(select_module, "kernel_libraries", select_libraries)
    from cuda_sharded_jit.algorithms import by_key as by_key_module

    monkeypatch.setattr(by_key_module, "kernel_libraries", compiled_libraries)
    from cuda_sharded_jit.algorithms import segmented as segmented_module

    monkeypatch.setattr(segmented_module, "kernel_libraries", compiled_libraries)
    from cuda_sharded_jit.algorithms import merge_sort as merge_sort_module
    from cuda_sharded_jit.algorithms import search as search_module

    monkeypatch.setattr(merge_sort_module, "kernel_libraries", compiled_libraries)
    from cuda_sharded_jit.algorithms import transform as transform_module

    monkeypatch.setattr(transform_module, "kernel_libraries", transform_libraries)
    monkeypatch.setattr(search_module, "kernel_libraries", compiled_libraries)
    from cuda_sharded_jit.distributed import _group

    monkeypatch.setattr(_group, "device_identity", lambda device: f"stand-in device {device}")
