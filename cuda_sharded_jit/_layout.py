"""Value layouts: everything that depends on how one element of a dtype is laid out.

A number and a record (an aligned C struct of numbers, a numpy structured dtype) are two
layouts of one idea, a value: each knows its numba type as an operator receives it, how a
generated wrapper reads and writes it behind a void pointer, how a host value packs into
its bytes and a result unpacks from them, how the shim and the CUDA Array Interface name
it, how messages describe it and how a cache header writes it down. Callers ask the layout
(`layout_of(dtype).description`, `.pack_init(init)`, `.read_source(...)`) instead of
branching on "is it a record" at every step; where an algorithm genuinely differs for
records (the kernel module it links, a built-in that combines numbers only), it asks
`layout.is_record` by name.

`_dtypes` stays the gate: it validates and builds dtypes (as_dtype, as_array_dtype,
check_record, record_dtype); layouts describe dtypes already accepted (and, for messages,
any dtype at all: a NumberLayout of float16 still names itself). `layout_of` caches one
layout per dtype, so asking costs a dict lookup. The numba-facing methods load numba
through `_jit` at the first compile; importing this module never imports numba.
"""

from __future__ import annotations

import collections
import json
import keyword
import struct
import threading

import numpy as np

from ._dtypes import exact_cast, record_dtype


def _numba():
    """(numba, numba.types): loaded by _jit, at the first compile."""
    from ._jit import _load_numba

    numba, types, _ = _load_numba()
    return numba, types


def _scalar_type(dtype: np.dtype):
    from ._jit import numba_type

    return numba_type(dtype)


class Layout:
    """How one element of `dtype` is laid out; see NumberLayout and RecordLayout.

    Attributes (computed once): `dtype`, `itemsize`, `fields` ((byte offset, dtype) of each
    number it holds: a number is one field at offset 0), `description` (for messages),
    `key` (cache headers, read back by `dtype_from_key`), `shim_dtype` (the shim's dtype
    name and itemsize), `repr_label` (the dtype in ShardedArray's repr), `field_names` (the
    names operators may use, or None). `dtype` is the first of the equal dtypes asked
    about (numpy finds an `align=True` dtype and its explicit-offsets twin equal, with
    different reprs): use it for bytes, never in a cache key, which takes the caller's own.
    """

    __slots__ = ("dtype", "itemsize", "fields", "description", "key", "shim_dtype", "repr_label",
                 "field_names")
    is_record = False

    def value_type(self):
        """The numba type of one value as an operator receives it."""
        raise NotImplementedError

    def read_source(self, pointer: str, prefix: str, namespace: dict) -> str:
        """An expression (wrapper source) reading the value at `pointer`, a void pointer;
        the names it uses (prefixed with `prefix`) are added to `namespace`."""
        raise NotImplementedError

    def write_source(self, pointer: str, value: str, prefix: str, namespace: dict) -> str:
        """Statements (wrapper source) storing `value` at `pointer`, cast to this layout."""
        raise NotImplementedError

    def return_mismatch(self, returned, where: str) -> str | None:
        """The end of the message refusing `returned` (a numba type an operator returns) as
        a value of this layout, held by `where`; None when it can be stored."""
        raise NotImplementedError

    def casts_to(self, other: Layout) -> bool:
        """Whether a value of this layout is stored as `other` by a cast (numbers) or field by
        field (records of the same field dtypes, names aside)."""
        raise NotImplementedError

    def pack_init(self, value) -> bytes:
        """An algorithm's `init` as the bytes of one accumulator (None: b"", no init);
        TypeError / ValueError naming init when it has the wrong shape or does not fit."""
        raise NotImplementedError

    def unpack(self, raw: bytes):
        """The host value of the element held in `raw`: a numpy scalar, or a tuple of them."""
        raise NotImplementedError

    def interface_entries(self) -> dict:
        """The CUDA Array Interface entries naming the element type (typestr, and descr)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.description})"


class NumberLayout(Layout):
    """One number, passed to operators by value and moved by kernels as a machine word."""

    # The supported dtypes' struct formats (native order, as tobytes writes): pack_init and
    # unpack take them for the common values, a Python float or int and a number read back,
    # where numpy's casts cost a few µs per call; anything else goes through numpy.
    _FORMATS = {"float32": "=f", "float64": "=d", "int32": "=i", "int64": "=q", "uint32": "=I",
                "uint64": "=Q"}
    __slots__ = ("_struct", "_int_range", "_scalar", "_packs_own")

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.itemsize = dtype.itemsize
        self.fields = ((0, dtype),)
        self.description = dtype.name
        self.key = dtype.name
        self.shim_dtype = (dtype.name, 0)
        self.repr_label = dtype.name
        self.field_names = None
        layout = self._FORMATS.get(dtype.name) if dtype.isnative else None
        self._struct = None if layout is None else struct.Struct(layout)
        self._scalar = dtype.type  # read on every unpack: dtype.type is a descriptor
        # a numpy scalar of this type packs through struct bit for bit: integers exactly, a
        # float64 is a Python float; a float32 goes through a double, exact but for a NaN's
        # payload (a signalling NaN comes back quiet), so a float32 NaN takes tobytes
        self._packs_own = dtype.kind in "iu" or dtype.itemsize == 8
        # the Python ints packed without numpy: the dtype's range, or for floats those exact
        # in a double (converted once, as numpy's cast from int64 rounds them)
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            self._int_range = (int(info.min), int(info.max))
        else:
            self._int_range = (-(1 << 53), 1 << 53)

    def value_type(self):
        return _scalar_type(self.dtype)

    def read_source(self, pointer: str, prefix: str, namespace: dict) -> str:
        namespace[f"{prefix}t"] = _scalar_type(self.dtype)
        return f"_load({pointer}, 0, {prefix}t)"

    def write_source(self, pointer: str, value: str, prefix: str, namespace: dict) -> str:
        namespace[f"{prefix}c"] = _scalar_type(self.dtype)
        return f"    _store({pointer}, 0, {prefix}c({value}))\n"

    def return_mismatch(self, returned, where: str) -> str | None:
        _, types = _numba()
        if isinstance(returned, types.BaseTuple):
            return (f", but {where} holds numbers ({self.dtype}); return a number, or leave out= "
                    f"out to get a record array")
        return None

    def casts_to(self, other: Layout) -> bool:
        return not other.is_record

    def pack_init(self, value) -> bytes:
        if value is None:
            return b""
        if isinstance(value, tuple):
            raise TypeError(f"init: a tuple, but the accumulator is a single {self.dtype}; a tuple "
                            f"accumulator comes from a map that returns tuples (transform_reduce)")
        kind = type(value)
        packer = self._struct
        if packer is not None:  # the bytes exact_cast's would have, without numpy
            if kind is self._scalar:  # a numpy scalar of the accumulator's own type: its bytes
                if self._packs_own:
                    return packer.pack(value)
                number = float(value)
                if number == number:
                    return packer.pack(number)
                return value.tobytes()
            if kind is float and self.dtype.kind == "f":
                try:
                    return packer.pack(value)
                except OverflowError:  # beyond float32: numpy's cast makes it inf
                    pass
            elif kind is int and self._int_range[0] <= value <= self._int_range[1]:
                return packer.pack(value)
        return exact_cast(value, self.dtype, "init").tobytes()

    def unpack(self, raw: bytes):
        packer = self._struct
        if packer is not None and len(raw) == self.itemsize:
            value = packer.unpack(raw)[0]
            if value == value:  # a NaN keeps its exact bits through numpy (float32's payload)
                return self._scalar(value)
        return np.frombuffer(raw, dtype=self.dtype)[0]

    def interface_entries(self) -> dict:
        return {"typestr": self.dtype.str}


# The named tuple class of a record with named fields, per tuple of names: records of other
# field dtypes with the same names share it, so numba sees one class for them.
_record_classes: dict[tuple[str, ...], type] = {}
_record_classes_lock = threading.Lock()


def _has_default_names(names: tuple[str, ...]) -> bool:
    """Whether a record's fields are numpy's default names f0, f1, ... (tuple accumulators)."""
    return list(names) == [f"f{index}" for index in range(len(names))]


def _operator_names(names: tuple[str, ...]) -> tuple[str, ...] | None:
    """The names operators may use for a record's fields (r.x), or None for plain tuples: a
    record with numpy's default names, or a name that is no Python identifier, a keyword or
    starts with "_" (which a named tuple cannot take)."""
    if _has_default_names(names):
        return None
    if all(name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")
           for name in names):
        return names
    return None


class RecordLayout(Layout):
    """An aligned struct of numbers: a (named) tuple to operators, raw bytes to the shim."""

    __slots__ = ("names",)
    is_record = True

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.itemsize = dtype.itemsize
        self.names = dtype.names
        self.fields = tuple((dtype.fields[name][1], dtype.fields[name][0]) for name in self.names)
        self.description = "(" + ", ".join(f"{name}: {field.name}"
                                           for name, (_, field) in zip(self.names, self.fields)) + ")"
        if _has_default_names(self.names):
            self.key = "(" + ",".join(field.name for _, field in self.fields) + ")"
        else:
            self.key = "record:" + json.dumps([[name, field.name]
                                               for name, (_, field) in zip(self.names, self.fields)])
        self.shim_dtype = ("record", dtype.itemsize)  # the shim knows a record by its size only
        self.repr_label = "record" + self.description
        self.field_names = _operator_names(self.names)

    @property
    def record_class(self):
        """The named tuple the record reaches operators as (None: a plain tuple)."""
        if self.field_names is None:
            return None
        with _record_classes_lock:
            found = _record_classes.get(self.field_names)
            if found is None:
                found = _record_classes[self.field_names] = collections.namedtuple("Record", self.field_names)
            return found

    def value_type(self):
        numba, types = _numba()
        cls = self.record_class
        if cls is None:
            return types.Tuple([_scalar_type(field) for _, field in self.fields])
        return numba.typeof(cls(*[field.type(0) for _, field in self.fields]))

    def read_source(self, pointer: str, prefix: str, namespace: dict) -> str:
        items = []
        for index, (offset, field) in enumerate(self.fields):
            namespace[f"{prefix}t{index}"] = _scalar_type(field)
            items.append(f"_load({pointer}, {offset}, {prefix}t{index})")
        cls = self.record_class
        if cls is None:
            return "(" + ", ".join(items) + ",)"
        namespace[f"{prefix}R"] = cls
        return f"{prefix}R(" + ", ".join(items) + ")"

    def write_source(self, pointer: str, value: str, prefix: str, namespace: dict) -> str:
        lines = []
        for index, (offset, field) in enumerate(self.fields):
            namespace[f"{prefix}c{index}"] = _scalar_type(field)
            lines.append(f"    _store({pointer}, {offset}, {prefix}c{index}({value}[{index}]))\n")
        return "".join(lines)

    def return_mismatch(self, returned, where: str) -> str | None:
        _, types = _numba()
        count = len(self.fields)
        if isinstance(returned, types.BaseTuple) and len(returned) == count:
            return None
        return (f"; {where} holds records of {count} fields {self.description}, so it must return "
                f"a tuple of {count} numbers")

    def casts_to(self, other: Layout) -> bool:
        return (other.is_record and other.itemsize == self.itemsize
                and [field for _, field in other.fields] == [field for _, field in self.fields])

    def pack_init(self, value) -> bytes:
        if value is None:
            return b""
        if not isinstance(value, tuple) or len(value) != len(self.fields):
            raise TypeError(f"init: the accumulator is a tuple of {len(self.fields)} "
                            f"({', '.join(field.name for _, field in self.fields)}); got {value!r}")
        record = np.zeros((), self.dtype)
        for index, (item, name, (_, field)) in enumerate(zip(value, self.names, self.fields)):
            record[name] = exact_cast(item, field, f"init[{index}]")
        return record.tobytes()

    def unpack(self, raw: bytes):
        value = np.frombuffer(raw, dtype=self.dtype)[0]
        return tuple(field.type(value[name]) for name, (_, field) in zip(self.names, self.fields))

    def interface_entries(self) -> dict:
        # consumers that read only typestr (|V<itemsize>) see raw bytes; descr names the fields
        return {"typestr": self.dtype.str, "descr": self.dtype.descr}


_layouts: dict[np.dtype, Layout] = {}


def layout_of(dtype) -> Layout:
    """The layout of `dtype` (anything np.dtype takes), one per dtype: a dict lookup after
    the first ask.

    >>> layout_of(np.dtype([("x", np.float32), ("y", np.float32)], align=True)).description
    '(x: float32, y: float32)'
    """
    if isinstance(dtype, np.dtype):  # asked on every call: dtypes skip the conversion
        found = _layouts.get(dtype)
        if found is not None:
            return found
    else:
        dtype = np.dtype(dtype)
    found = _layouts.get(dtype)
    if found is None:
        made = (RecordLayout if dtype.names is not None else NumberLayout)(dtype)
        found = _layouts.setdefault(dtype, made)  # a racing thread's equal layout may win
    return found


def describe_dtype(dtype) -> str:
    """A dtype's name, or a record's fields: "(x: float32, y: float64)"."""
    return layout_of(dtype).description


def dtype_key(dtype) -> str:
    """A text form of a dtype or record that `dtype_from_key` reads back (cache headers)."""
    return layout_of(dtype).key


def dtype_from_key(key: str) -> np.dtype:
    """The dtype a `dtype_key` text stands for."""
    if key.startswith("("):
        return record_dtype(key[1:-1].split(","))
    if key.startswith("record:"):
        return np.dtype([(name, field) for name, field in json.loads(key[len("record:"):])], align=True)
    return np.dtype(key)
