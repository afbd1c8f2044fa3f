"""ShardedArray: a 1-D array split into shards, shard i on place i of a PlaceGroup."""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.lib.format import descr_to_dtype

from . import _collective, _dlpack, _shim
from ._dtypes import as_array_dtype, check_record, is_integer, is_record
from ._layout import describe_dtype, layout_of
from .places import PlaceGroup


_arithmetic_module = None


def _arithmetic():
    """algorithms.arithmetic, imported at first use (it imports this module) and kept: every
    `a + b` asks for it, and an import statement costs more than the rest of the dispatch."""
    global _arithmetic_module
    if _arithmetic_module is None:
        from .algorithms import arithmetic

        _arithmetic_module = arithmetic
    return _arithmetic_module


def _position(index: int, size: int) -> int:
    """A host index (negative from the end) as a position; IndexError outside the array."""
    position = index + size if index < 0 else index
    if not 0 <= position < size:
        raise IndexError(f"index {index} is out of bounds for a ShardedArray of {size} elements")
    return position


def _positions_of(index: np.ndarray, size: int) -> np.ndarray:
    """The positions a numpy mask or integer array selects; IndexError or TypeError otherwise."""
    if index.dtype == np.bool_:
        if index.shape != (size,):
            raise IndexError(f"mask: shape {index.shape} does not match the array's ({size},)")
        return np.flatnonzero(index)
    if index.size == 0:
        return np.empty(0, np.int64)
    if index.dtype.kind not in "iu" or index.ndim != 1:
        raise TypeError(f"index: a 1-D integer array or a boolean mask, got a {index.ndim}-D {index.dtype} array")
    positions = index.astype(np.int64)
    positions = np.where(positions < 0, positions + size, positions)
    if positions.min() < 0 or positions.max() >= size:
        raise IndexError(f"index: values outside [-{size}, {size})")
    return positions


def check_array(value, argument: str = "a") -> "ShardedArray":
    """TypeError naming `argument` unless `value` is a ShardedArray."""
    if not isinstance(value, ShardedArray):
        raise TypeError(f"{argument}: expected a ShardedArray, got {type(value).__name__}")
    return value


def check_numbers(array: "ShardedArray", algorithm: str, argument: str = "a") -> "ShardedArray":
    """TypeError naming `argument` when the array holds records, which `algorithm` (a
    built-in kernel that knows only numbers) cannot take."""
    check_array(array, argument)
    layout = layout_of(array.dtype)
    if layout.is_record:
        raise TypeError(f"{argument}: {algorithm} takes arrays of numbers, not records "
                        f"{layout.description}")
    return array


def check_out(out, like: "ShardedArray", like_name: str = "the inputs"):
    """`out` (None passes), checked before anything compiles or runs: TypeError unless a
    ShardedArray, ValueError when its group or shard sizes differ from `like`'s."""
    if out is None:
        return None
    if not isinstance(out, ShardedArray):
        check_array(out, "out")  # raises
    if out._group is not like._group:  # the slots behind .group and .shard_sizes: every call asks
        raise ValueError(f"out: belongs to another PlaceGroup than {like_name}")
    if out._shard_sizes != like._shard_sizes:
        raise ValueError(f"out: shard sizes {out.shard_sizes} differ from {like_name}: "
                         f"{like.shard_sizes}")
    return out


def _distributed():
    """distributed._arrays, imported for the arrays of from_mpi groups only."""
    from .distributed import _arrays

    return _arrays


def check_one_process_root(root) -> None:
    """`root` of from_numpy / to_numpy on a one-process group: 0 or None (its only rank)."""
    if root is not None and (not is_integer(root) or int(root) != 0):
        raise ValueError(f"root: a one-process group has one rank, 0; got {root!r} (roots are ranks "
                         f"of PlaceGroup.from_mpi groups)")


def _check_group(group) -> PlaceGroup:
    if not isinstance(group, PlaceGroup):
        raise TypeError(f"group: expected a PlaceGroup, got {type(group).__name__}")
    return group


def _shard_sizes(group: PlaceGroup, n_or_sizes, argument: str = "n") -> list[int]:
    """Shard sizes from a total (even split, decided by the shim) or an explicit list."""
    if isinstance(n_or_sizes, (int, np.integer)) and not isinstance(n_or_sizes, bool):
        return _shim.ShardedArray.even_sizes(int(n_or_sizes), len(group))
    if isinstance(n_or_sizes, Sequence) or isinstance(n_or_sizes, np.ndarray):
        sizes = []
        for index, size in enumerate(n_or_sizes):
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
                raise TypeError(f"sizes[{index}]: expected an int, got {type(size).__name__}")
            sizes.append(int(size))
        return sizes
    raise TypeError(
        f"{argument}: expected a total size (int) or a list of shard sizes, "
        f"got {type(n_or_sizes).__name__}"
    )


def _allocate(group: PlaceGroup, sizes: list[int], dtype: np.dtype, contiguous: bool):
    if _collective.capturing:  # a captured function may not make arrays
        session = _collective.capture_session()
        if session is not None:
            session.allocating()
    name, itemsize = layout_of(dtype).shim_dtype
    return _shim.ShardedArray.allocate(group._impl, sizes, name, contiguous, itemsize)


def _interface_dtype(interface: dict, requested: np.dtype | None, argument: str) -> np.dtype:
    """A buffer's dtype: its typestr, its descr for records, or `requested` (checked)."""
    typestr = np.dtype(interface["typestr"])
    if typestr.kind != "V":
        found = as_array_dtype(typestr, argument)
    elif requested is None:
        descr = list(interface.get("descr") or ())
        if not any(entry[0] for entry in descr):  # only '' entries, which pad
            raise TypeError(f"{argument}: records ({typestr.str}) need their fields named: pass "
                            f"dtype= (the record's numpy dtype)")
        # The descr's own offsets (its '' entries pad, wherever they are), checked against the
        # aligned layout: rebuilding the aligned struct from the named fields alone would move
        # a field that follows leading padding to another offset of the same itemsize.
        try:
            described = descr_to_dtype(descr)
        except (TypeError, ValueError) as error:
            raise TypeError(f"{argument}: its descr {descr!r} is not a numpy descr ({error})") from None
        if described.itemsize != typestr.itemsize:
            raise TypeError(f"{argument}: its descr lays out {described.itemsize} bytes, its typestr "
                            f"{typestr.itemsize}")
        check_record(described, argument)
        found = np.dtype([(name, described.fields[name][0]) for name in described.names], align=True)
    else:
        if requested.itemsize != typestr.itemsize or not is_record(requested):
            raise TypeError(f"{argument}: holds {typestr.itemsize}-byte elements ({typestr.str}); "
                            f"dtype {requested} does not describe them")
        return requested
    if requested is not None and requested != found:
        raise TypeError(f"{argument}: holds {describe_dtype(found)}, not dtype {describe_dtype(requested)}")
    return found


_INT64_MAX = (1 << 63) - 1


def _interface_extent(interface: dict, itemsize: int, argument: str) -> tuple[tuple[int, ...], int]:
    """A buffer's shape and element count, in exact integers: a product that wraps around
    (np.prod's int64 does, silently) would adopt a few elements of a buffer described as
    exabytes, or a negative size."""
    shape = tuple(interface["shape"])
    for extent in shape:
        if not is_integer(extent):
            raise TypeError(f"{argument}: shape {shape} holds {type(extent).__name__} "
                            f"{extent!r}, expected ints")
    shape = tuple(int(extent) for extent in shape)
    if any(extent < 0 for extent in shape):
        raise ValueError(f"{argument}: shape {shape} has a negative extent")
    count = math.prod(shape)  # 1 for a 0-d buffer
    if count > _INT64_MAX:
        raise ValueError(f"{argument}: shape {shape} has more elements than fit in 64 bits")
    if count * itemsize > _INT64_MAX:
        raise ValueError(f"{argument}: shape {shape} of {itemsize}-byte elements spans more bytes "
                         f"than fit in 64 bits")
    return shape, count


def _interface_stream(interface: dict, argument: str) -> int:
    """The stream a buffer's producer ordered its work on, as the shim takes it (0: none).

    CAI v3: absent or None asks for no synchronisation, 1 is the legacy default stream, 2 the
    per-thread default stream, any other integer a cudaStream_t; 0 is disallowed, as it could
    mean either default stream. CuPy writes 1 for its default stream, numba None, torch
    (version 2) no stream. A 0 is refused rather than guessed at: waiting on the wrong default
    stream, or on none, would race the producer's work."""
    stream = interface.get("stream")
    if stream is None:
        return 0
    if not is_integer(stream):
        raise TypeError(f"{argument}: stream must be an int (a cudaStream_t, 1 or 2) or None, "
                        f"got {type(stream).__name__}")
    stream = int(stream)
    if stream == 0:
        raise ValueError(f"{argument}: stream 0 is disallowed by the CUDA Array Interface (v3), "
                         f"being ambiguous between the default streams: use 1 (legacy), "
                         f"2 (per-thread), a cudaStream_t, or None for no synchronisation")
    if not 0 < stream < 1 << 64:
        raise ValueError(f"{argument}: stream {stream} is not a CUDA stream handle "
                         f"(expected a positive integer below 2**64)")
    return stream


class _Part(NamedTuple):
    """One adopted buffer, checked: where its data starts, its element count, the producer
    stream to wait for (0: none), its dtype (None: an empty shard that any dtype fits), its
    shape, and what keeps its memory alive (the buffer, or a DLPack producer's tensor)."""

    pointer: int
    count: int
    stream: int
    dtype: np.dtype | None
    shape: tuple[int, ...]
    keep: object


_EMPTY_SHARD = _Part(0, 0, 0, None, (0,), None)

# The even split of n elements over p places (ShardedArray.even_sizes), by (n, p): the
# algorithms' outputs ask for the same few sizes call after call; bounded, cleared when full.
_EVEN_SIZES: dict[tuple[int, int], tuple[int, ...]] = {}


def _interface_part(interface: dict, requested: np.dtype | None, argument: str) -> _Part:
    """A __cuda_array_interface__ buffer's part: everything read from the interface alone."""
    itemsize = np.dtype(interface["typestr"]).itemsize
    shape, count = _interface_extent(interface, itemsize, argument)
    buffer_dtype = _interface_dtype(interface, requested, argument)
    strides = interface.get("strides")
    if strides is not None:
        expected, step = [], itemsize
        for extent in reversed(shape):
            expected.append(step)
            step *= extent
        if tuple(reversed(expected)) != tuple(strides) and count > 1:
            raise ValueError(f"{argument}: not C-contiguous (strides {tuple(strides)})")
    if interface.get("mask") is not None:
        raise ValueError(f"{argument}: masked arrays are not supported")
    return _Part(int(interface["data"][0]), count, _interface_stream(interface, argument), buffer_dtype, shape,
                 None)


def _common_dtype(parts: list[_Part], requested: np.dtype | None, arguments: list[str],
                  one_dimensional: bool) -> np.dtype:
    """The one dtype of the parts (TypeError naming the first that differs); 1-D shapes only
    where `one_dimensional`."""
    dtype, first = None, None
    for index, part in enumerate(parts):
        if one_dimensional and len(part.shape) > 1:
            raise ValueError(f"{arguments[index]}: expected a 1-D array, got shape {part.shape}")
        if part.dtype is None:
            continue
        if dtype is None:
            dtype, first = part.dtype, index
        elif part.dtype != dtype:
            raise TypeError(f"{arguments[index]}: dtype {describe_dtype(part.dtype)} differs from "
                            f"{arguments[first]}'s {describe_dtype(dtype)}")
    if dtype is None:  # no buffer names one (only empty shards)
        dtype = requested if requested is not None else np.dtype(np.float64)
    return dtype


def _release_contiguous(impl) -> None:
    """Frees a contiguous array when its wrapper goes. Unmapping waits for the places' streams:
    `free()` waits with the GIL released, where the C++ destructor (run when the last reference
    drops, GIL held) would stall every other Python thread meanwhile."""
    impl.free()


def _release_adopted(group_impl, buffers) -> None:
    """Waits for the group's queued work; `buffers` are released when this returns."""
    try:
        group_impl.sync()
    except RuntimeError:  # a failed context: nothing left to wait for
        pass


_DLPACK_CPU = 1  # DLDeviceType kDLCPU


def _host_part(value, argument: str) -> np.ndarray | None:
    """A from_local part as a 1-D host array, or None for a device buffer (adopted)."""
    if hasattr(value, "__cuda_array_interface__"):
        return None
    if not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        device = value.__dlpack_device__()[0] if hasattr(value, "__dlpack_device__") else _DLPACK_CPU
        if device != _DLPACK_CPU:
            return None  # a device tensor: adopt takes it through DLPack
        value = np.from_dlpack(value)
    host = np.asarray(value)
    if host.ndim != 1:
        raise ValueError(f"{argument}: expected a 1-D array, got {host.ndim} dimensions {host.shape}")
    return host


def from_local_parts(group: PlaceGroup, arrays) -> "ShardedArray":
    """ShardedArray.from_local on a one-process group (a from_mpi group's rank passes its
    local group here): one part per place, host arrays copied or device buffers adopted."""
    if isinstance(arrays, (str, bytes, np.ndarray)) or not isinstance(arrays, Sequence):
        raise TypeError(f"arrays: expected a list of arrays, one per place, got {type(arrays).__name__}")
    arrays = list(arrays)
    if len(arrays) != len(group):
        raise ValueError(f"arrays: expected one per place ({len(group)}), got {len(arrays)}")
    hosts = [_host_part(value, f"arrays[{index}]") for index, value in enumerate(arrays)]
    if all(host is None for host in hosts):
        return ShardedArray.adopt(group, arrays)
    if any(host is None for host in hosts):
        raise TypeError("arrays: device buffers (__cuda_array_interface__) and host arrays mixed; "
                        "pass one kind")
    dtype = None
    for index, host in enumerate(hosts):
        found = as_array_dtype(host.dtype, f"arrays[{index}]")
        if dtype is None:
            dtype = found
        elif found != dtype:
            raise TypeError(f"arrays[{index}]: dtype {describe_dtype(found)} differs from arrays[0]'s "
                            f"{describe_dtype(dtype)}")
    array = ShardedArray.allocate(group, [host.size for host in hosts], dtype)
    start = 0
    for host in hosts:
        if host.size:
            host = np.ascontiguousarray(host)
            array._impl.copy_range_from_host(start, start + host.size, host.ctypes.data, host.nbytes)
        start += host.size
    return array


class ShardView:
    """Zero-copy view of one shard: a 1-D device array with `__cuda_array_interface__` (v3).

    Its `stream` is the place's stream, so CuPy, numba and torch order their work after
    ours. The view keeps its array alive. `array` and `place` say whose shard it is. A record
    shard's interface has typestr `|V<itemsize>` and a `descr` naming the fields; consumers
    that read only typestr (numba, CuPy) see raw void elements, so `field(name)` gives a
    strided view of one field, which they all take. DLPack too (`__dlpack__`,
    `__dlpack_device__`): `torch.from_dlpack(view)`, `jax.dlpack.from_dlpack(view)`.

    >>> view = a.shard(0)                                                 # doctest: +SKIP
    >>> cupy.asarray(view).sum()                                          # doctest: +SKIP
    >>> torch.from_dlpack(view)                                           # doctest: +SKIP
    """

    __slots__ = ("array", "place", "field_name", "__cuda_array_interface__")

    def __init__(self, array: ShardedArray, place: int, field_name: str | None = None):
        self.array = array
        self.place = place
        self.field_name = field_name
        impl = array._impl
        dtype = array.dtype
        local = array._shim_place(place)  # the shim holds this process's shards only
        size = impl.shard_sizes[local]
        pointer = impl.shard_pointer(local)
        if field_name is None:  # typestr, and a record's descr
            element, data, strides = layout_of(dtype).interface_entries(), pointer, None
        else:
            field, offset = dtype.fields[field_name][:2]
            element, strides = {"typestr": field.str}, (dtype.itemsize,)
            data = pointer + offset if size else pointer
        interface = {
            "shape": (size,),
            **element,
            "data": (data, False),
            "strides": strides,
            "version": 3,
            "stream": array.group.stream(place),
        }
        self.__cuda_array_interface__ = interface

    def field(self, name: str) -> ShardView:
        """Zero-copy view of one field of a record shard: strided (`strides` is the record's
        itemsize), typed as the field, on the same stream.

        >>> xs = cupy.asarray(points.shard(0).field("x"))                   # doctest: +SKIP
        """
        dtype = self.array.dtype
        if not layout_of(dtype).is_record or self.field_name is not None:
            raise TypeError(f"name: field views are views of a record shard; this one holds {self.dtype}")
        if name not in dtype.names:
            raise ValueError(f"name: no field {name!r} (fields: {', '.join(dtype.names)})")
        return ShardView(self.array, self.place, name)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """The shard as a DLPack capsule, which consumers read in place: `torch.from_dlpack`,
        `cupy.from_dlpack`, `jax.dlpack.from_dlpack` (array API standard 2023.12, DLPack 1.x).
        Called by the consumer, not by you.

        `max_version` (1, 0) or later gets a versioned capsule (writable), None the legacy one.
        `stream` is the consumer's, numbered as the standard does for CUDA: None the legacy
        default stream, 1 legacy, 2 per-thread, another int a cudaStream_t of the shard's
        device, -1 no synchronisation (0 is refused); it is made to wait for the work queued on
        the place's stream. Nothing is ever copied: `dl_device` other than `__dlpack_device__()`
        and `copy=True` raise BufferError. Records have no DLPack type (BufferError): export a
        field, `field(name)`, strided by the record size. The capsule keeps the array alive
        until the consumer lets go, but `free()` releases the memory at once: drop the
        consumer's tensor first.

        >>> t = torch.from_dlpack(a.shard(0))                              # doctest: +SKIP
        >>> x = jax.dlpack.from_dlpack(a.shard(1))                         # doctest: +SKIP
        """
        return _dlpack.export_capsule(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple:
        """(DLDeviceType.kDLCUDA, device id): where the shard lives, as DLPack names it.

        >>> a.shard(0).__dlpack_device__()                                 # doctest: +SKIP
        (<DLDeviceType.kDLCUDA: 2>, 0)
        """
        return _dlpack.DLDeviceType.kDLCUDA, self.device

    @property
    def device(self) -> int:
        """The CUDA device id the shard lives on."""
        return self.array.group.devices[self.place]

    @property
    def shape(self) -> tuple[int]:
        """(number of elements in the shard,)."""
        return self.__cuda_array_interface__["shape"]

    @property
    def dtype(self) -> np.dtype:
        """The array's element type (a field view: the field's)."""
        if self.field_name is not None:
            return self.array.dtype.fields[self.field_name][0]
        return self.array.dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        field = "" if self.field_name is None else f", field={self.field_name!r}"
        return (f"ShardView(place={self.place}, device=cuda:{self.device}, size={len(self)}, "
                f"dtype={describe_dtype(self.dtype)}{field})")


class ShardedArray:
    """A 1-D array whose shard i lives on place i of its group, in global index order.

    Operators work elementwise on the GPUs, with NumPy's result types and values: `a + b`,
    `a - 2`, `2.0 * a`, `a / b`, `a ** 2`, `-a`, `abs(a)`, the in-place forms (`a += b`), and
    the comparisons `<`, `<=`, `>`, `>=`, `==`, `!=` between arrays of one group and shard
    sizes or with a Python or NumPy number on either side. Comparisons return a new uint32
    array of 1 (true) and 0 (false), where NumPy gives bool: arrays hold no bool. So
    `(a > 0).sum()` counts (in uint32), and a host mask is `(a > 0).to_numpy().astype(bool)`;
    as in NumPy, `==` is elementwise (arrays are unhashable; `is` tells them apart) and
    `bool(a)` is an error unless `a` has one element.

    >>> g = PlaceGroup.by_devices([0, 0])                                 # doctest: +SKIP
    >>> a = ShardedArray.from_numpy(g, np.arange(10, dtype=np.float32))  # doctest: +SKIP
    >>> a.shard_sizes, a.to_numpy()[-1]                                   # doctest: +SKIP
    ((5, 5), 9.0)
    >>> ((a * 2 + 1) / 3 > 2.5).to_numpy()                                # doctest: +SKIP
    array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1], dtype=uint32)
    """

    __slots__ = ("_impl", "_group", "_dtype", "_keepalive", "_shard_sizes", "__weakref__")

    def __init__(self, impl, group: PlaceGroup, dtype: np.dtype | None = None):
        if not isinstance(impl, _shim.ShardedArray):
            raise TypeError("use ShardedArray.allocate / from_numpy / adopt to make an array")
        self._impl = impl
        self._group = group
        # the shim knows a record only by its size: its fields live here
        self._dtype = np.dtype(impl.dtype) if dtype is None else dtype
        self._keepalive = None  # adopted and contiguous arrays: a finalizer (adopt, allocate_contiguous)
        self._shard_sizes = tuple(impl.shard_sizes)  # fixed for life; every call compares them

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def allocate(cls, group: PlaceGroup, n, dtype) -> ShardedArray:
        """Uninitialised array: `n` elements split evenly (the first n % P shards get one
        more), or explicit per-shard sizes (zero allowed); one allocation per shard.

        `dtype`: a supported number type, or a record (a numpy structured dtype of 1 to 4
        such fields in the aligned layout, `np.dtype([...], align=True)`).

        >>> a = ShardedArray.allocate(g, [600, 400], np.float32)          # doctest: +SKIP
        >>> points = ShardedArray.allocate(g, 1000, np.dtype([("x", np.float32),
        ...                                                    ("y", np.float32)]))  # doctest: +SKIP
        """
        group = _check_group(group)
        if group._distributed:
            return _distributed().allocate(group, n, dtype)
        dtype = as_array_dtype(dtype)
        return cls(_allocate(group, _shard_sizes(group, n), dtype, False), group, dtype)

    @classmethod
    def _new_like(cls, like: ShardedArray, dtype: np.dtype) -> ShardedArray:
        """Internal (the algorithms' outputs): an uninitialised array with `like`'s group and
        shard sizes, of a `dtype` the caller has already checked; no argument is re-checked."""
        group = like._group
        sizes = like._shard_sizes
        if group._distributed:  # a collective there: every rank allocates its part, then agrees
            return _distributed().allocate(group, list(sizes), dtype)
        return cls._unchecked(group, sizes, dtype)

    @classmethod
    def _new_even(cls, group: PlaceGroup, n: int, dtype: np.dtype) -> ShardedArray:
        """Internal (the algorithms' outputs): `allocate(group, n, dtype)` on a one-process
        group for an int `n` and a `dtype` the caller has already checked (a kernel's result
        or accumulator dtype); no argument is re-checked, as in _new_like."""
        key = (n, len(group))
        sizes = _EVEN_SIZES.get(key)
        if sizes is None:
            if len(_EVEN_SIZES) >= 256:
                _EVEN_SIZES.clear()
            sizes = _EVEN_SIZES[key] = tuple(_shim.ShardedArray.even_sizes(n, len(group)))
        return cls._unchecked(group, sizes, dtype)

    @classmethod
    def _unchecked(cls, group: PlaceGroup, sizes: tuple, dtype: np.dtype) -> ShardedArray:
        """__init__ less its checks, and with the sizes asked for (reading them back from the
        shim would convert its vector again): every call that returns a new array comes here."""
        array = object.__new__(cls)
        array._impl = _allocate(group, list(sizes), dtype, False)
        array._group = group
        array._dtype = dtype
        array._keepalive = None
        array._shard_sizes = sizes
        return array

    @classmethod
    def allocate_contiguous(cls, group: PlaceGroup, n, dtype) -> ShardedArray:
        """Like `allocate`, but all shards lie in one virtual address range (CUDA VMM).

        Shard i starts at base + offset_i. Physical memory follows the shards: each place
        backs the part of the range from its shard's start, rounded to the nearest
        allocation granule (2 MiB on current GPUs), to the next shard's rounded start, on
        its own device; so at most half a granule at each end of a shard lives on a
        neighbour. Every device of the group can read and write the whole range, which
        needs peer access between all of them.

        >>> a = ShardedArray.allocate_contiguous(g, 1 << 20, np.float32)   # doctest: +SKIP
        """
        group = _check_group(group)
        if group._distributed:
            raise ValueError("group: one virtual address range spans the places of one process; the "
                             "arrays of a PlaceGroup.from_mpi group are allocated per rank (allocate)")
        dtype = as_array_dtype(dtype)
        impl = _allocate(group, _shard_sizes(group, n), dtype, True)
        array = cls(impl, group, dtype)
        array._keepalive = weakref.finalize(array, _release_contiguous, impl)
        return array

    @classmethod
    def from_numpy(cls, group: PlaceGroup, host, sizes=None, contiguous: bool = False,
                   root: int | None = 0) -> ShardedArray:
        """Copy a 1-D numpy array to the group (even split unless `sizes` is given).

        A record array (structured dtype) must be in the aligned layout; a packed one is
        refused with the `astype` that converts it (to_numpy gives back the same bytes).

        On a PlaceGroup.from_mpi group (a collective) rank `root` scatters its `host` (and
        `sizes`; other ranks may pass None), or with root=None every rank passes the whole
        array and keeps its part. A one-process group has one rank: root is 0 or None.

        >>> a = ShardedArray.from_numpy(g, np.arange(5.0))                # doctest: +SKIP
        >>> a = ShardedArray.from_numpy(g, host if g.rank == 0 else None, root=0)  # doctest: +SKIP
        """
        group = _check_group(group)
        if group._distributed:
            return _distributed().from_numpy(group, host, sizes, contiguous, root)
        check_one_process_root(root)
        host = np.asarray(host)
        if host.ndim != 1:
            raise ValueError(f"host: expected a 1-D array, got {host.ndim} dimensions {host.shape}")
        dtype = as_array_dtype(host.dtype, "host")
        if sizes is not None:
            shard_sizes = _shard_sizes(group, sizes, "sizes")
            if sum(shard_sizes) != host.size:
                raise ValueError(
                    f"sizes: shard sizes sum to {sum(shard_sizes)}, but host has {host.size} elements"
                )
        else:
            shard_sizes = host.size
        make = cls.allocate_contiguous if contiguous else cls.allocate
        array = make(group, shard_sizes, dtype)
        host = np.ascontiguousarray(host)
        array._impl.copy_from_host(host.ctypes.data, host.nbytes)
        return array

    @classmethod
    def adopt(cls, group: PlaceGroup, buffers: Sequence, dtype=None) -> ShardedArray:
        """Zero-copy array over device buffers you own, one per place, each on that place's
        device, contiguous, of one supported dtype: objects with `__cuda_array_interface__`
        (CuPy, numba, torch), else DLPack producers (`__dlpack__`: JAX, or any array of the
        array API standard). The buffers (a producer's DLPack tensor) are kept alive and never
        freed by us (handed back to their producer, its deleter called, when the array goes).

        Records: an interface's typestr (`|V16`) does not name fields, so pass `dtype` (the
        record; its itemsize must match) unless the interface carries a `descr`. DLPack has no
        record types.

        Each buffer must lie whole inside one allocation of its place's device (its pointer
        and all `shape` elements after it). Its interface's `stream` is waited for before our
        work on the place: None (or none given) for no synchronisation, 1 or 2 for the legacy
        or per-thread default stream, else a live stream of the place's device; 0, which CAI
        v3 disallows, is refused. A DLPack producer is asked for its tensor with the place's
        stream (`__dlpack__(stream=..., max_version=(1, 0))`), which orders its work before
        ours; the tensor must be writable. A refusal adopts nothing, and every interface and
        every producer's device are checked before any producer exports (past that, a refused
        tensor goes back to its producer, whose export may have made the place's stream wait
        for its queued work: later, never different, results).

        >>> a = ShardedArray.adopt(g, [cupy.zeros(5, cupy.float32)])      # doctest: +SKIP
        >>> a = ShardedArray.adopt(g, [jnp.zeros(5, jnp.float32)])        # doctest: +SKIP
        """
        group = _check_group(group)
        if group._distributed:
            raise ValueError("group: a PlaceGroup.from_mpi group's buffers are each rank's own: pass "
                             "them with ShardedArray.from_local(group, buffers)")
        buffers = list(buffers)
        if len(buffers) != len(group):
            raise ValueError(f"buffers: expected one buffer per place ({len(group)}), got {len(buffers)}")
        requested = None if dtype is None else as_array_dtype(dtype)
        return cls._adopt(group, buffers, requested, [f"buffers[{index}]" for index in range(len(buffers))])

    @classmethod
    def from_dlpack(cls, group: PlaceGroup, objects: Sequence) -> ShardedArray:
        """Zero-copy array over DLPack producers (objects with `__dlpack__`: torch, CuPy and JAX
        arrays), one per place, each a contiguous CUDA tensor of a supported dtype on that
        place's device; `adopt` through the DLPack protocol only (also for objects that have
        `__cuda_array_interface__` too). Each producer is asked for its tensor with the place's
        stream, so its queued work runs before ours; its memory stays alive until the array is
        let go, then the producer's deleter runs.

        >>> t = torch.arange(10, dtype=torch.float32, device="cuda")       # doctest: +SKIP
        >>> a = ShardedArray.from_dlpack(PlaceGroup.by_devices([0]), [t])  # doctest: +SKIP
        >>> sharded.sum(a)                                                 # doctest: +SKIP
        np.float32(45.0)
        """
        group = _check_group(group)
        if group._distributed:
            raise ValueError("group: a PlaceGroup.from_mpi group's buffers are each rank's own: pass "
                             "them with ShardedArray.from_local(group, objects)")
        if hasattr(objects, "__dlpack__") or isinstance(objects, (str, bytes)):
            raise TypeError(f"objects: expected a list of DLPack producers, one per place, got one "
                            f"{type(objects).__name__}: pass [x]")
        objects = list(objects)
        if len(objects) != len(group):
            raise ValueError(f"objects: expected one object per place ({len(group)}), got {len(objects)}")
        return cls._adopt(group, objects, None, [f"objects[{index}]" for index in range(len(objects))],
                          dlpack_only=True)

    @classmethod
    def _adopt(cls, group: PlaceGroup, buffers: list, requested: np.dtype | None, arguments: list[str],
               dlpack_only: bool = False, one_dimensional: bool = False) -> ShardedArray:
        """adopt's work: `buffers` (None for an empty shard), each named by `arguments`."""
        devices = group.devices
        # First what each buffer says without exporting anything: a refusal here has asked no
        # producer for its memory. DLPack producers wait for the second pass (None here).
        parts: list[_Part | None] = []
        for index, buffer in enumerate(buffers):
            interface = None if dlpack_only or buffer is None else getattr(buffer, "__cuda_array_interface__", None)
            if buffer is None:
                parts.append(_EMPTY_SHARD)
            elif interface is not None:
                parts.append(_interface_part(interface, requested, arguments[index]))
            elif dlpack_only or hasattr(buffer, "__dlpack__"):
                _dlpack.check_producer(buffer, devices[index], index, arguments[index])
                parts.append(None)
            else:
                raise TypeError(f"{arguments[index]}: {type(buffer).__name__} has no __cuda_array_interface__ "
                                f"and no __dlpack__")
        # Then each producer exports its tensor for a consumer on the place's stream: its work
        # is ordered before ours there, so the shim has no stream of its to wait for. From here
        # on a refusal gives every tensor taken back to its producer at once.
        try:
            for index, buffer in enumerate(buffers):
                if parts[index] is None:
                    imported = _dlpack.import_tensor(buffer, devices[index], index, group.stream(index),
                                                     requested, arguments[index])
                    parts[index] = _Part(imported.pointer, imported.count, 0, imported.dtype, imported.shape,
                                         imported.owner)
            dtype = _common_dtype(parts, requested, arguments, one_dimensional)
            # The shim checks every buffer's memory and stream before it adopts anything, then
            # makes our streams start after whatever the producers queued on theirs (CAI v3).
            impl = _shim.ShardedArray.adopt(group._impl, [part.pointer for part in parts],
                                            [part.count for part in parts], *layout_of(dtype).shim_dtype,
                                            [part.stream for part in parts])
        except BaseException:
            _dlpack.release(part.keep for part in parts if part is not None)
            raise
        array = cls(impl, group, dtype)
        # The buffers (and DLPack producers' tensors) live as long as the array, and are let go
        # only after the work queued on them has run (their owner may reuse the memory at once).
        keep = tuple(buffer if part.keep is None else part.keep for buffer, part in zip(buffers, parts))
        array._keepalive = weakref.finalize(array, _release_adopted, group._impl, keep)
        return array

    @classmethod
    def from_local(cls, group: PlaceGroup, arrays: Sequence) -> ShardedArray:
        """An array from this process's own shards, one per place it holds, in order: numpy
        arrays (copied) or device buffers (`__cuda_array_interface__` or DLPack producers,
        adopted without a copy, as `adopt` takes them), not mixed. Shard i has the size of
        the array given for it.

        On a PlaceGroup.from_mpi group (a collective) each rank passes the shards of its
        `local_places`, and the shard sizes are gathered from every rank; on a one-process
        group, one shard per place.

        >>> mine = [np.arange(3.0) + 3 * place for place in g.local_places]  # doctest: +SKIP
        >>> a = ShardedArray.from_local(g, mine)                          # doctest: +SKIP
        """
        group = _check_group(group)
        if group._distributed:
            return _distributed().from_local(group, arrays)
        return from_local_parts(group, arrays)

    # ---- data out -----------------------------------------------------------------------
    def to_numpy(self, root: int | None = 0) -> np.ndarray | None:
        """Copy the whole array to a new 1-D numpy array (waits for queued work).

        On a PlaceGroup.from_mpi group (a collective) the array is gathered to rank `root`,
        which returns it (the others return None), or to every rank with root=None.

        >>> host = a.to_numpy()                                           # doctest: +SKIP
        """
        check_one_process_root(root)
        _collective.refuse_host_wait("to_numpy")
        host = np.empty(self.size, dtype=self._dtype)
        self._impl.copy_to_host(host.ctypes.data, host.nbytes)
        return host

    def local_shards(self) -> list[ShardView]:
        """Zero-copy views of the shards this process holds, in place order: every shard on
        a one-process group, this rank's on a PlaceGroup.from_mpi group.

        >>> [view.place for view in a.local_shards()]                     # doctest: +SKIP
        [2, 3]
        """
        return [ShardView(self, place) for place in range(self.num_shards)]

    def _shim_place(self, place: int) -> int:
        """The shim's index of shard `place` (the same on a one-process group)."""
        return place

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError("a ShardedArray lives on GPUs: converting it to numpy always copies")
        host = self.to_numpy()
        return host if dtype is None else host.astype(dtype, copy=False)

    def shard(self, place: int) -> ShardView:
        """Zero-copy view of shard `place` with `__cuda_array_interface__` (v3, with stream)
        and DLPack (`__dlpack__`, `__dlpack_device__`)."""
        place = operator.index(place)
        if not 0 <= place < self.num_shards:
            raise IndexError(f"place: {place} out of range for {self.num_shards} shards")
        return ShardView(self, place)

    def resharded(self, sizes=None) -> ShardedArray:
        """A copy with other shard sizes: the even split (None) or `sizes`, one per place
        adding up to len(self); elements move between places in global order
        (`sharded.redistribute`).

        >>> a.resharded([10, 0]).shard_sizes                                  # doctest: +SKIP
        (10, 0)
        """
        from .algorithms.select import redistribute

        return redistribute(self, sizes)

    def free(self) -> None:
        """Release device memory now (adopted buffers are let go once queued work has run).
        Idempotent; any later use raises ValueError."""
        self._impl.free()
        if self._keepalive is not None:
            self._keepalive()

    # ---- properties ---------------------------------------------------------------------
    @property
    def group(self) -> PlaceGroup:
        """The PlaceGroup whose place i holds shard i."""
        return self._group

    @property
    def dtype(self) -> np.dtype:
        """The element type: one of SUPPORTED_DTYPES, or a record (structured dtype) of them."""
        return self._dtype

    @property
    def size(self) -> int:
        """Number of elements over all shards."""
        return self._impl.size

    @property
    def shape(self) -> tuple[int]:
        """(size,): the arrays are one-dimensional."""
        return (self._impl.size,)

    def __len__(self) -> int:
        return self._impl.size

    @property
    def shard_sizes(self) -> tuple[int, ...]:
        """Elements per shard, in place order (fixed for the array's life)."""
        return self._shard_sizes

    @property
    def shard_offsets(self) -> tuple[int, ...]:
        """Global index of each shard's first element."""
        return tuple(self._impl.shard_offsets)

    @property
    def num_shards(self) -> int:
        """Number of shards: the group's number of places."""
        return self._impl.num_shards

    @property
    def is_contiguous(self) -> bool:
        """True when all shards lie in one virtual address range (allocate_contiguous)."""
        return self._impl.storage == "contiguous"

    @property
    def storage(self) -> str:
        """"separate", "contiguous" or "adopted"."""
        return self._impl.storage

    @property
    def base_pointer(self) -> int:
        """Start of the virtual range of a contiguous array (0 otherwise)."""
        return self._impl.base_pointer

    @property
    def is_freed(self) -> bool:
        """True after free(): the array can no longer be used."""
        return self._impl.is_freed

    def __repr__(self) -> str:
        return self._impl.describe(layout_of(self._dtype).repr_label)

    # ---- arithmetic and NumPy-style methods (algorithms/arithmetic.py) ---------------------
    # NumPy's result types; each returns a new array (the in-place forms write into this one).
    __array_ufunc__ = None  # NumPy defers to these operators: np.float32(2) * a is a ShardedArray

    def __add__(self, other) -> ShardedArray:
        return _arithmetic().binary("add", self, other)

    def __radd__(self, other) -> ShardedArray:
        return _arithmetic().binary("add", other, self)

    def __iadd__(self, other) -> ShardedArray:
        return _arithmetic().binary("add", self, other, out=self)

    def __sub__(self, other) -> ShardedArray:
        return _arithmetic().binary("sub", self, other)

    def __rsub__(self, other) -> ShardedArray:
        return _arithmetic().binary("sub", other, self)

    def __isub__(self, other) -> ShardedArray:
        return _arithmetic().binary("sub", self, other, out=self)

    def __mul__(self, other) -> ShardedArray:
        return _arithmetic().binary("mul", self, other)

    def __rmul__(self, other) -> ShardedArray:
        return _arithmetic().binary("mul", other, self)

    def __imul__(self, other) -> ShardedArray:
        return _arithmetic().binary("mul", self, other, out=self)

    def __truediv__(self, other) -> ShardedArray:
        return _arithmetic().binary("truediv", self, other)

    def __rtruediv__(self, other) -> ShardedArray:
        return _arithmetic().binary("truediv", other, self)

    def __itruediv__(self, other) -> ShardedArray:
        return _arithmetic().binary("truediv", self, other, out=self)

    def __pow__(self, other) -> ShardedArray:
        return _arithmetic().binary("pow", self, other)

    def __rpow__(self, other) -> ShardedArray:
        return _arithmetic().binary("pow", other, self)

    def __ipow__(self, other) -> ShardedArray:
        return _arithmetic().binary("pow", self, other, out=self)

    def __neg__(self) -> ShardedArray:
        return _arithmetic().unary("neg", self)

    def __abs__(self) -> ShardedArray:
        return _arithmetic().unary("abs", self)

    # Comparisons give uint32 arrays of 1 (true) and 0 (false): NumPy's values, in the
    # smallest dtype arrays hold (there is no bool). `1 < a` is Python's reflection, a > 1.
    def __lt__(self, other) -> ShardedArray:
        return _arithmetic().compare("lt", self, other)

    def __le__(self, other) -> ShardedArray:
        return _arithmetic().compare("le", self, other)

    def __gt__(self, other) -> ShardedArray:
        return _arithmetic().compare("gt", self, other)

    def __ge__(self, other) -> ShardedArray:
        return _arithmetic().compare("ge", self, other)

    def __eq__(self, other) -> ShardedArray:
        return _arithmetic().compare("eq", self, other)

    def __ne__(self, other) -> ShardedArray:
        return _arithmetic().compare("ne", self, other)

    # `==` is elementwise, so arrays are unhashable, as numpy's are; `a is b` still tells
    # arrays apart, and `a in [a, b]` finds `a` by identity before comparing anything.
    __hash__ = None

    def __bool__(self) -> bool:
        """As numpy: the truth of the one element of a 1-element array; ValueError otherwise."""
        size = self.size
        if size == 1:
            return bool(self._host_range(0, 1)[0])
        if size == 0:
            raise ValueError("the truth value of an empty ShardedArray is ambiguous: use a.size > 0 to "
                             "check that it is not empty")
        raise ValueError(f"the truth value of a ShardedArray of {size} elements is ambiguous: reduce it "
                         f"first, e.g. (a > 0).max() == 1 for any, (a > 0).min() == 1 for all")

    # ---- host indexing --------------------------------------------------------------------
    def __getitem__(self, index):
        """Reads to the host: `a[i]` (negative allowed) → a numpy scalar; `a[i:j:k]` → a numpy
        array; `a[mask]` / `a[indices]` with a host numpy boolean mask or integer array → a
        numpy array. Only the range of elements the index touches is copied, from the shards
        that hold it. Device-side indexing is `select`, `transform` or `shard(i)`.

        >>> a[0], a[-3:], a[np.array([1, 5])]                             # doctest: +SKIP
        """
        size = self.size
        if is_integer(index):
            position = _position(int(index), size)
            return self._host_range(position, position + 1)[0]
        if isinstance(index, slice):
            positions = np.arange(*index.indices(size), dtype=np.int64)
        elif isinstance(index, (np.ndarray, list)):
            positions = _positions_of(np.asarray(index), size)
        elif isinstance(index, ShardedArray):
            raise TypeError("index: a ShardedArray does not index on the host; a comparison's 1/0 flags "
                            "select as a[(a > 0.5).to_numpy().astype(bool)] (without astype, a uint32 "
                            "array reads positions 0 and 1), or on the GPUs sharded.select(a, lambda x: x > 0.5)")
        else:
            raise TypeError(f"index: a ShardedArray is indexed on the host by an int, a slice or a numpy "
                            f"mask / integer array, not {type(index).__name__}; on the GPUs use "
                            f"sharded.select, transform or shard(i)")
        if positions.size == 0:
            return np.empty(0, self._dtype)
        low, high = int(positions.min()), int(positions.max()) + 1
        return self._host_range(low, high)[positions - low]

    def __setitem__(self, index, value) -> None:
        """Writes from the host: `a[i] = v`, `a[i:j] = values` (a number or an array of the
        slice's length, cast to a's dtype as numpy casts). Other writes: `transform` (with
        `with_index`) or `fill`.

        >>> a[0] = 1.5; a[10:20] = np.zeros(10)                           # doctest: +SKIP
        """
        size = self.size
        if is_integer(index):
            start = _position(int(index), size)
            stop = start + 1
        elif isinstance(index, slice):
            start, stop, step = index.indices(size)
            if step != 1:
                raise TypeError("index: a host write takes a slice without a step; on the GPUs use "
                                "transform(..., with_index=True)")
            stop = max(start, stop)
        else:
            raise TypeError(f"index: a host write takes an int or a slice, not {type(index).__name__}; "
                            f"on the GPUs use transform or fill")
        host = np.array(value, dtype=self._dtype).reshape(-1)
        if host.size == 1 and stop - start != 1:
            host = np.full(stop - start, host[0], self._dtype)
        if host.size != stop - start:
            raise ValueError(f"value: {host.size} elements for a slice of {stop - start}")
        _collective.refuse_host_wait("a host write (a[i] = v)")
        self._impl.copy_range_from_host(start, stop, host.ctypes.data, host.nbytes)

    def _host_range(self, start: int, stop: int) -> np.ndarray:
        _collective.refuse_host_wait("a host read (a[i])")
        host = np.empty(stop - start, self._dtype)
        self._impl.copy_range_to_host(start, stop, host.ctypes.data, host.nbytes)
        return host

    def __iter__(self):
        raise TypeError("a ShardedArray is not iterated on the host, element by element: use "
                        "to_numpy() for the values, shard(i) for a place's shard, or transform / "
                        "reduce to work on the GPUs")

    def copy(self) -> ShardedArray:
        """A new array with the same group, shard sizes, dtype and elements.

        >>> b = a.copy()                                                  # doctest: +SKIP
        """
        return _arithmetic().copy(self)

    def astype(self, dtype) -> ShardedArray:
        """A copy in another number dtype (a plain copy when it is the same).

        >>> a.astype(np.float64)                                          # doctest: +SKIP
        """
        return _arithmetic().astype(self, dtype)

    def sum(self):
        """sharded.sum(self): the sum, a numpy value."""
        from .algorithms import reduce

        return reduce.sum(self)

    def min(self):
        """sharded.min(self)."""
        from .algorithms import reduce

        return reduce.min(self)

    def max(self):
        """sharded.max(self)."""
        from .algorithms import reduce

        return reduce.max(self)

    def argmin(self) -> int:
        """sharded.argmin(self): the global index of the first smallest element."""
        from .algorithms import reduce

        return reduce.argmin(self)

    def argmax(self) -> int:
        """sharded.argmax(self): the global index of the first largest element."""
        from .algorithms import reduce

        return reduce.argmax(self)

    def mean(self):
        """The mean in float64, one pass (Welford's accumulator); NaN when empty.

        >>> a.mean(), a.var(), a.std()                                    # doctest: +SKIP
        """
        return _arithmetic().mean(self)

    def var(self, ddof: int = 0):
        """The variance M2 / (n - ddof) in float64, from the same one pass as mean."""
        return _arithmetic().var(self, ddof)

    def std(self, ddof: int = 0):
        """The standard deviation, the square root of var."""
        return _arithmetic().std(self, ddof)

    def _repr_html_(self) -> str:
        """A notebook's view: size, dtype and storage, then a table of the shards (place,
        device, size, bytes, first global index)."""
        import html

        itemsize = self._dtype.itemsize
        devices = self._group.devices
        rows = "".join(f"<tr><td>{place}</td><td>cuda:{devices[place]}</td><td>{size}</td>"
                       f"<td>{size * itemsize}</td><td>{offset}</td></tr>"
                       for place, (size, offset) in enumerate(zip(self._shard_sizes, self.shard_offsets)))
        label = html.escape(layout_of(self._dtype).repr_label)
        state = "freed" if self._impl.is_freed else f"{self._impl.storage} storage"
        return (f"<b>ShardedArray</b> of {self.size} elements, {label}, {state}"
                f"<table><tr><th>place</th><th>device</th><th>shard size</th><th>bytes</th>"
                f"<th>first index</th></tr>{rows}</table>")
