"""Algorithms over runs of equal keys: scans and reductions by key, unique_by_key, unique.

Every one of them starts from the same step, the runs of consecutive equal keys: an int32
flag per element, 1 where a run starts (the first element, or one whose key is not `equal`
to its predecessor's), computed by adjacent_difference's kernel, which hands each shard the
last key of the previous non-empty shard, so runs crossing shard boundaries need nothing more.

The scans by key are one segmented scan of (flag, value) records with the existing JIT scan
and its record accumulators:

    combine((f1, v1), (f2, v2)) = (f1 | f2, v2 if f2 else op(v1, v2))

is associative (not commutative), so the deterministic multi-place scan carries a run across
shards by itself, in order. reduce_by_key keeps the scan's value at each run's last element
(tail flags: the same kernel meeting each key with its successor), carrying the run's first
key in the accumulator so that keys and values come out of one compaction with the same
shard sizes; unique_by_key keeps the keys (and values) at the heads. The accumulator holds
the flag, the value's fields and the carried key in one aligned record of at most four
numbers: values with more fields are refused with a TypeError.
"""

from __future__ import annotations

import numpy as np

from .. import _shim
from .._collective import collective
from .._dtypes import MAX_RECORD_FIELDS, record_dtype
from .._layout import layout_of
from ..array import ShardedArray, check_array, check_numbers, check_out
from ..compiler import VALUE_MAP, check_transform_counts, is_indexed_transform, kernel_libraries
from ..op import Op, as_op
from .reduce import _PYTHON_OPS, _operator
from .select import select_flagged
from .sort import sort
from .transform import pack_scalars

_FLAG = np.dtype(np.int32)


def _equal(x, y):
    return x == y


def _equal_or_both_nan(x, y):  # np.unique's equal_nan=True: the NaNs make one run
    return x == y or (x != x and y != y)


def _one(x):
    return 1


_EQUAL, _EQUAL_NAN, _ONE = Op(_equal), Op(_equal_or_both_nan), Op(_one)


def _head_flag(equal: Op) -> Op:
    def head_flag(x, previous):  # adjacent_difference meets each key with its predecessor
        return 0 if equal(previous, x) else 1
    return Op(head_flag)


def _tail_flag(equal: Op) -> Op:
    def tail_flag(x, following):  # ... and, with successor=True, with its successor
        return 0 if equal(x, following) else 1
    return Op(tail_flag)


# ---- argument checks (all before anything compiles or runs) -------------------------------

def _check_values(values, keys: ShardedArray, argument: str = "values") -> ShardedArray:
    check_array(values, argument)
    if values.group is not keys.group:
        raise ValueError(f"{argument}: belongs to another PlaceGroup than keys")
    if values.shard_sizes != keys.shard_sizes:
        raise ValueError(f"{argument}: shard sizes {values.shard_sizes} differ from keys': "
                         f"{keys.shard_sizes}")
    return values


_checked_equals: dict = {}


def _check_equal(equal, keys: ShardedArray) -> Op:
    """`equal` as an Op of two keys returning a bool (an integer is read as one); TypeError
    naming it otherwise. Typed once per operator identity, key dtype and architecture."""
    if equal is None:
        return _EQUAL
    equal = as_op(equal, "equal")
    equal.check_arity(2, "equal")
    from .. import _jit
    from ..compiler import _arch_cc

    identity = equal.identity()
    for arch in keys.group.archs:
        memo = (identity, keys.dtype, arch)
        if memo in _checked_equals:
            continue
        _, types, _ = _jit._load_numba()
        element = _jit.value_type(keys.dtype)
        returned = types.unliteral(_jit._return_type(equal, [element, element], [keys.dtype, keys.dtype],
                                                     _arch_cc(arch)))
        if not (returned == types.boolean or isinstance(returned, types.Integer)):
            raise TypeError(f"equal: operator {equal.name} returns {returned} for two {keys.dtype} keys; "
                            f"it must return a bool (True when the two keys belong to one run)")
        _checked_equals[memo] = True
    return equal


def _check_op(op, values: ShardedArray, what: str) -> Op:
    layout = layout_of(values.dtype)
    if isinstance(op, str) and layout.is_record:
        raise TypeError(f"op: {op!r} combines numbers, but values hold records {layout.description}; "
                        f"pass an operator that combines two tuples")
    op = _operator(op, 2, what, layout)
    return _PYTHON_OPS[op] if isinstance(op, str) else op  # "sum", "min", "max": their Python forms


def _check_result_out(out, values: ShardedArray) -> ShardedArray | None:
    out = check_out(out, values, "values")
    if out is not None and len(layout_of(out.dtype).fields) != len(layout_of(values.dtype).fields):
        raise TypeError(f"out: holds {layout_of(out.dtype).description}, values "
                        f"{layout_of(values.dtype).description}; the result has values' fields")
    return out


# ---- transforms compiled first, launched later ----------------------------------------------

class _Transform:
    """A transform over arrays of `dtypes` and runtime `scalars`, compiled at construction
    (every kernel of an algorithm compiles before the first one runs)."""

    def __init__(self, op: Op, dtypes, scalars, out_dtype: np.dtype, archs):
        scalar_dtypes = [np.dtype(type(value)) for value in scalars]
        kinds = tuple(("array", dtype) for dtype in dtypes) + tuple(("scalar", dtype) for dtype in scalar_dtypes)
        check_transform_counts(len(dtypes), len(scalars), "values", "init")
        self.out_dtype, self.libraries = kernel_libraries(op, "transform", kinds, out_dtype, archs)
        self.indexed = is_indexed_transform(kinds, self.out_dtype, VALUE_MAP)
        self.scalars = pack_scalars(scalars, scalar_dtypes)

    def __call__(self, arrays, out: ShardedArray | None = None) -> ShardedArray:
        if out is None:
            out = ShardedArray.allocate(arrays[0].group, list(arrays[0].shard_sizes), self.out_dtype)
        _shim.transform(self.libraries, [array._impl for array in arrays], out._impl, self.scalars,
                        self.indexed)
        return out


class _Accumulator:
    """The record a by-key scan runs on, (flag, [first key,] value fields...), and the
    generated operators that pack it, combine two of them and read the value back. The
    user's operator receives values as it would in a scan of `values` (numbers, or tuples,
    named ones when the record's fields have names)."""

    def __init__(self, op: Op, value_dtype: np.dtype, key_dtype: np.dtype | None, what: str):
        self.layout = layout_of(value_dtype)
        self.fields = [field for _, field in self.layout.fields]
        self.count = len(self.fields)
        reserved = 1 + (key_dtype is not None)
        if self.count + reserved > MAX_RECORD_FIELDS:
            raise TypeError(
                f"values: {what} keeps each value ({self.count} fields {self.layout.description}) in one "
                f"record with its run's flag{' and key' if reserved == 2 else ''}, and a record holds "
                f"at most {MAX_RECORD_FIELDS} numbers: pass values of up to {MAX_RECORD_FIELDS - reserved} "
                f"fields")
        self.first = reserved  # where the value's fields start in the accumulator
        self.dtype = record_dtype([_FLAG] + ([key_dtype] if key_dtype is not None else []) + self.fields,
                                  "the accumulator")
        self.record_class = self.layout.record_class if self.layout.is_record else None
        self.namespace = {"_op": op, "_R": self.record_class, "np": np}

    def _value(self, items: list[str]) -> str:
        """Source of a value as the user's operator receives it, from its numbers' sources."""
        if not self.layout.is_record:
            return items[0]
        if self.record_class is not None:
            return "_R(" + ", ".join(items) + ")"
        return "(" + ", ".join(items) + ",)"

    def _fields_of(self, name: str, first: int) -> list[str]:
        return [f"{name}[{first + index}]" for index in range(self.count)]

    def _stored(self, name: str) -> str:
        """Source of value `name` (from the user's operator) as numbers cast to the fields."""
        if not self.layout.is_record:
            return f"np.{self.fields[0].name}({name})"
        return ", ".join(f"np.{field.name}({name}[{index}])" for index, field in enumerate(self.fields))

    def _generated(self, source: str, name: str) -> Op:
        namespace = dict(self.namespace)
        exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - source built above
        return Op(namespace[name])

    def combine(self) -> Op:
        key = "p[1], " if self.first == 2 else ""
        left, right = self._value(self._fields_of("p", self.first)), self._value(self._fields_of("q", self.first))
        return self._generated(
            "def by_key_combine(p, q):\n"
            "    if q[0] != 0:\n"
            "        return q\n"
            f"    r = _op({left}, {right})\n"
            f"    return (p[0], {key}{self._stored('r')})\n", "by_key_combine")

    def pack(self, with_key: bool, with_init: bool) -> Op:
        """(flag, [key,] value[, init numbers]) -> the accumulator. with_init: a run's head
        holds op(init, value), so that every run of the scan starts from init."""
        key = "key, " if with_key else ""
        inits = [f"i{index}" for index in range(self.count)]
        params = "flag, " + key + "value" + ("".join(f", {name}" for name in inits) if with_init else "")
        source = f"def by_key_pack({params}):\n    v = value\n"
        if with_init:
            source += ("    if flag != 0:\n"
                       f"        r = _op({self._value(inits)}, v)\n"
                       f"        return (flag, {key}{self._stored('r')})\n")
        source += f"    return (flag, {key}{self._stored('v')})\n"
        return self._generated(source, "by_key_pack")

    def unpack(self, with_init: bool) -> Op:
        """The accumulator -> its value's numbers; with_init: (flag, acc, init numbers) ->
        init at a run's head (the exclusive scan's first value of every run)."""
        items = self._fields_of("p", self.first)
        value = items[0] if not self.layout.is_record else "(" + ", ".join(items) + ",)"
        if not with_init:
            return self._generated(f"def by_key_value(p):\n    return {value}\n", "by_key_value")
        inits = [f"i{index}" for index in range(self.count)]
        init = inits[0] if not self.layout.is_record else "(" + ", ".join(inits) + ",)"
        return self._generated(
            f"def by_key_value_or_init(flag, p, {', '.join(inits)}):\n"
            "    if flag != 0:\n"
            f"        return {init}\n"
            f"    return {value}\n", "by_key_value_or_init")

    def key(self) -> Op:
        return self._generated("def by_key_first_key(p):\n    return p[1]\n", "by_key_first_key")

    def init_scalars(self, init) -> list:
        """init as one numpy scalar per value field (runtime arguments of the transforms)."""
        if init is None:
            raise ValueError("init: an exclusive scan by key needs an initial value")
        if self.layout.is_record:
            if not isinstance(init, tuple):
                raise TypeError(f"init: values hold records {self.layout.description}, so init is a "
                                f"tuple of {self.count} numbers; got {init!r}")
        elif isinstance(init, tuple):
            raise TypeError(f"init: values hold {self.layout.description} numbers; got a tuple")
        unpacked = self.layout.unpack(self.layout.pack_init(init))
        return list(unpacked) if self.layout.is_record else [unpacked]


# ---- the runs-of-equal-keys step -------------------------------------------------------------

class _RunFlags:
    """The kernels of the head (successor=False) or tail flags of `keys`' runs, compiled."""

    def __init__(self, keys: ShardedArray, equal: Op, successor: bool):
        kinds = (("array", keys.dtype), ("array", keys.dtype))
        flag = (_tail_flag if successor else _head_flag)(equal)
        archs = keys.group.archs
        _, self.difference = kernel_libraries(flag, "transform", kinds, _FLAG, archs)
        _, self.edge = kernel_libraries(_ONE, "transform", kinds[:1], _FLAG, archs)
        self.successor = successor

    def __call__(self, keys: ShardedArray) -> ShardedArray:
        flags = ShardedArray.allocate(keys.group, list(keys.shard_sizes), _FLAG)
        _shim.adjacent_difference(self.difference, self.edge, keys._impl, flags._impl, self.successor)
        return flags


class _SegmentedScan:
    """The scan of accumulator records under the segmented combine, compiled."""

    def __init__(self, acc: _Accumulator, archs):
        self.itemsize = acc.dtype.itemsize
        _, self.libraries = kernel_libraries(acc.combine(), "scan", (("array", acc.dtype),), acc.dtype, archs)

    def __call__(self, records: ShardedArray, exclusive: bool, init: bytes = b"") -> ShardedArray:
        _shim.scan(self.libraries, records._impl, records._impl, self.itemsize, init, exclusive)
        return records


def _scan_by_key(keys, values, op, init, out, equal, exclusive: bool, what: str) -> ShardedArray:
    check_numbers(keys, what, "keys")
    _check_values(values, keys)
    op = _check_op(op, values, what)
    out = _check_result_out(out, values)
    equal = _check_equal(equal, keys)
    # the scan runs in the result's dtype: out's when given, else values'
    acc = _Accumulator(op, values.dtype if out is None else out.dtype, None, what)
    inits = acc.init_scalars(init) if exclusive else []
    archs = keys.group.archs
    out_dtype = values.dtype if out is None else out.dtype
    # every kernel compiles before the first one runs
    heads = _RunFlags(keys, equal, False)
    pack = _Transform(acc.pack(False, exclusive), (_FLAG, values.dtype), inits, acc.dtype, archs)
    scan = _SegmentedScan(acc, archs)
    unpack = (_Transform(acc.unpack(True), (_FLAG, acc.dtype), inits, out_dtype, archs) if exclusive
              else _Transform(acc.unpack(False), (acc.dtype,), [], out_dtype, archs))
    flags = heads(keys)
    records = pack([flags, values])
    if exclusive:
        # the exclusive scan of the records: at a run's head the previous run's total (replaced
        # by init), elsewhere op(init, head) op ... op the element before
        scan(records, True, bytes(acc.dtype.itemsize))  # init (0, 0...): a head replaces it
        return unpack([flags, records], out)
    scan(records, False)
    return unpack([records], out)


@collective("inclusive_scan_by_key", supported=False)
def inclusive_scan_by_key(keys: ShardedArray, values: ShardedArray, op,
                          out: ShardedArray | None = None, equal=None) -> ShardedArray:
    """out[i] = values[h] op values[h+1] op ... op values[i], h the first index of i's run of
    equal keys: a scan that restarts at every run, across shard boundaries.

    `keys`: numbers; runs are consecutive keys with `equal(x, y)` (default ==). `values`:
    same group and shard sizes; numbers or records of up to 3 fields (op then takes and
    returns tuples). `op` need only be associative; the scan runs in, and returns, values'
    dtype (out's when given; `out` may be `values`). Stream-ordered: returns at once.

    >>> k = sharded.ShardedArray.from_numpy(g, np.array([1, 1, 2, 2, 2], np.int32))  # doctest: +SKIP
    >>> v = sharded.ShardedArray.from_numpy(g, np.array([1, 2, 3, 4, 5], np.int32))  # doctest: +SKIP
    >>> sharded.inclusive_scan_by_key(k, v, lambda x, y: x + y).to_numpy()            # doctest: +SKIP
    array([ 1,  3,  3,  7, 12], dtype=int32)
    """
    return _scan_by_key(keys, values, op, None, out, equal, False, "inclusive_scan_by_key")


@collective("exclusive_scan_by_key", supported=False)
def exclusive_scan_by_key(keys: ShardedArray, values: ShardedArray, op, init,
                          out: ShardedArray | None = None, equal=None) -> ShardedArray:
    """out[h] = init at the first index h of every run of equal keys, then out[i] = init op
    values[h] op ... op values[i-1] within the run; as inclusive_scan_by_key otherwise (init:
    a number, or a tuple when values hold records).

    >>> sharded.exclusive_scan_by_key(k, v, lambda x, y: x + y, 0).to_numpy()         # doctest: +SKIP
    array([0, 1, 0, 3, 7], dtype=int32)
    """
    return _scan_by_key(keys, values, op, init, out, equal, True, "exclusive_scan_by_key")


@collective("reduce_by_key", supported=False)
def reduce_by_key(keys: ShardedArray, values: ShardedArray, op, equal=None):
    """(unique_keys, reduced_values): each run of consecutive equal keys (`equal(x, y)`,
    default ==) collapsed to its first key and to its values folded with `op` in order.

    `op` need only be associative (not commutative): the result is the sequential fold of
    each run, bitwise the same run after run; runs may cross shard boundaries. `values`:
    numbers or records of up to 2 fields (the accumulator also holds the run's flag and first
    key), of keys' group and shard sizes. Both results are new arrays with the same shard
    sizes: shard i holds the runs that end in shard i.

    >>> k = sharded.ShardedArray.from_numpy(g, np.array([1, 1, 2, 2, 2], np.int32))  # doctest: +SKIP
    >>> v = sharded.ShardedArray.from_numpy(g, np.array([1, 2, 3, 4, 5], np.int32))  # doctest: +SKIP
    >>> uk, rv = sharded.reduce_by_key(k, v, lambda x, y: x + y)                       # doctest: +SKIP
    >>> uk.to_numpy(), rv.to_numpy()                                                   # doctest: +SKIP
    (array([1, 2], dtype=int32), array([ 3, 12], dtype=int32))
    """
    check_numbers(keys, "reduce_by_key", "keys")
    _check_values(values, keys)
    op = _check_op(op, values, "reduce_by_key")
    equal = _check_equal(equal, keys)
    acc = _Accumulator(op, values.dtype, keys.dtype, "reduce_by_key")
    archs = keys.group.archs
    heads, tails = _RunFlags(keys, equal, False), _RunFlags(keys, equal, True)
    pack = _Transform(acc.pack(True, False), (_FLAG, keys.dtype, values.dtype), [], acc.dtype, archs)
    scan = _SegmentedScan(acc, archs)
    first_key = _Transform(acc.key(), (acc.dtype,), [], keys.dtype, archs)
    value = _Transform(acc.unpack(False), (acc.dtype,), [], values.dtype, archs)
    records = scan(pack([heads(keys), keys, values]), False)
    # the scan's record at a run's last element holds its flag, first key and fold
    (ends,) = select_flagged([records], tails(keys))
    return first_key([ends]), value([ends])


@collective("unique_by_key", supported=False)
def unique_by_key(keys: ShardedArray, values: ShardedArray | None = None, equal=None):
    """The first element of every run of consecutive equal keys (`equal(x, y)`, default
    ==): `(keys, values)`, the values of those elements (None when no values are given).

    Runs may cross shard boundaries; shard i of each result holds the runs that start in
    shard i. `values`: any dtype (records too), of keys' group and shard sizes.

    >>> k = sharded.ShardedArray.from_numpy(g, np.array([1, 1, 2, 3, 3], np.int32))  # doctest: +SKIP
    >>> sharded.unique_by_key(k)[0].to_numpy()                                         # doctest: +SKIP
    array([1, 2, 3], dtype=int32)
    """
    check_numbers(keys, "unique_by_key", "keys")
    if values is not None:
        _check_values(values, keys)
    equal = _check_equal(equal, keys)
    heads = _RunFlags(keys, equal, False)
    kept = select_flagged([keys] if values is None else [keys, values], heads(keys))
    return kept[0], (None if values is None else kept[1])


@collective("unique", supported=False)
def unique(a: ShardedArray) -> ShardedArray:
    """The sorted distinct elements of `a`, as `np.unique(a)` (the NaNs, sorted last, make
    one): a sorted copy, then unique_by_key. `a` is left as it was.

    >>> sharded.unique(a).to_numpy()                                                   # doctest: +SKIP
    """
    check_numbers(a, "unique")
    equal = _EQUAL_NAN if a.dtype.kind == "f" else _EQUAL
    heads = _RunFlags(a, equal, False)  # compiled before the sort runs
    ordered = sort(a, out=ShardedArray.allocate(a.group, list(a.shard_sizes), a.dtype))
    return select_flagged([ordered], heads(ordered))[0]


__all__ = ["inclusive_scan_by_key", "exclusive_scan_by_key", "reduce_by_key", "unique_by_key", "unique"]
