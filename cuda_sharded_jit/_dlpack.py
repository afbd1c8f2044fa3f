"""DLPack, the Python half: the checks and decisions of both directions, following the array
API standard's DLPack protocol (2023.12 and later, DLPack 1.x).

Export (`ShardView.__dlpack__` / `__dlpack_device__`): a shard, or one field of a record
shard, as a capsule a consumer (torch, CuPy, JAX) reads in place. `max_version` of at
least (1, 0) gets a versioned capsule ("dltensor_versioned", read-only flag clear), anything
else the legacy "dltensor"; `dl_device` other than the shard's own and `copy=True` raise
BufferError (no copy is ever made here); the consumer's `stream` is made to wait for the
work queued on the place's stream (None: the legacy default stream, as the standard says for
CUDA; -1: no synchronisation).

Import (`ShardedArray.adopt`, `ShardedArray.from_dlpack`, `sharded.asarray`): a producer's
tensor is asked for with our place's stream (so the producer orders its work before ours),
checked (a CUDA tensor on the place's device, a supported number dtype, C-contiguous,
writable) and kept, owned by a `_shim.DLPackImport`, until the array is let go; then the
producer's deleter runs once.

The capsules themselves are built and read in the shim (shim/bindings/dlpack.cpp), which
says why that is not done with ctypes here.
"""

from __future__ import annotations

import enum
import math
from typing import NamedTuple

import numpy as np

from . import _shim
from ._dtypes import SUPPORTED_DTYPES, _NAMES, is_integer
from ._layout import describe_dtype, layout_of


class DLDeviceType(enum.IntEnum):
    """DLPack's device types (dlpack.h), as `__dlpack_device__` reports them."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLOpenCL = 4
    kDLVulkan = 7
    kDLMetal = 8
    kDLVPI = 9
    kDLROCM = 10
    kDLROCMHost = 11
    kDLExtDev = 12
    kDLCUDAManaged = 13
    kDLOneAPI = 14
    kDLWebGPU = 15
    kDLHexagon = 16
    kDLMAIA = 17


_HOST_DEVICES = (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost, DLDeviceType.kDLROCMHost)
_CUDA_DEVICES = (DLDeviceType.kDLCUDA, DLDeviceType.kDLCUDAManaged)

# DLDataTypeCode: the numbers arrays hold, and names for the ones they don't (messages).
_KINDS = {"i": 0, "u": 1, "f": 2}  # kDLInt, kDLUInt, kDLFloat
_NUMPY_NAMES = {(0, 8): "int8", (0, 16): "int16", (1, 8): "uint8", (1, 16): "uint16", (2, 16): "float16",
                (5, 64): "complex64", (5, 128): "complex128", (6, 8): "bool", (4, 16): "bfloat16"}
_CODE_NAMES = {0: "kDLInt", 1: "kDLUInt", 2: "kDLFloat", 3: "kDLOpaqueHandle", 4: "kDLBfloat",
               5: "kDLComplex", 6: "kDLBool"}


def device_name(device_type) -> str:
    """DLPack's name of a device type ("kDLCUDA"), or its number for one it has no name for."""
    try:
        return DLDeviceType(int(device_type)).name
    except ValueError:
        return f"device type {int(device_type)}"


def dlpack_dtype(dtype) -> tuple[int, int, int]:
    """(code, bits, lanes) of DLPack's DLDataType for a supported number dtype.

    >>> dlpack_dtype(np.float32)
    (2, 32, 1)
    """
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype: {describe_dtype(dtype)} has no DLPack type here (expected one of {_NAMES})")
    return _KINDS[dtype.kind], dtype.itemsize * 8, 1


def numpy_dtype(code: int, bits: int, lanes: int) -> np.dtype | None:
    """The supported number dtype a DLDataType stands for, or None.

    >>> numpy_dtype(1, 64, 1)
    dtype('uint64')
    """
    if lanes != 1:
        return None
    for dtype in SUPPORTED_DTYPES:
        if (_KINDS[dtype.kind], dtype.itemsize * 8) == (code, bits):
            return dtype
    return None


def describe_dlpack_dtype(code: int, bits: int, lanes: int) -> str:
    """A DLDataType as messages name it: numpy's name where there is one ("float16"), else
    DLPack's code and width."""
    name = _NUMPY_NAMES.get((code, bits))
    supported = numpy_dtype(code, bits, 1)
    if supported is not None:
        name = supported.name
    elif name is None:
        name = f"{_CODE_NAMES.get(code, f'type code {code}')} of {bits} bits"
    return name if lanes == 1 else f"{name} x{lanes} lanes"


# ---- export ---------------------------------------------------------------------------------

def _wants_versioned(max_version) -> bool:
    if max_version is None:
        return False
    if (not isinstance(max_version, tuple) or len(max_version) != 2
            or not all(is_integer(part) for part in max_version)):
        raise TypeError(f"max_version: expected None or a (major, minor) tuple of ints, got {max_version!r}")
    return int(max_version[0]) >= 1


def _consumer_stream(stream) -> int | None:
    """The stream to order after ours, as the shim takes it (1, 2 or a handle); None for -1."""
    if stream is None:
        return 1  # the standard, for CUDA: None means the legacy default stream
    if not is_integer(stream):
        raise TypeError(f"stream: expected an int (a cudaStream_t, 1, 2 or -1) or None, got {type(stream).__name__}")
    stream = int(stream)
    if stream == -1:
        return None
    if stream == 0:
        raise ValueError("stream: 0 is disallowed by the DLPack standard for CUDA (it could mean either "
                         "default stream): pass 1 (legacy default), 2 (per-thread default), a "
                         "cudaStream_t, or -1 for no synchronisation")
    if not 0 < stream < 1 << 64:
        raise ValueError(f"stream: {stream} is not a CUDA stream (expected -1, 1, 2 or a cudaStream_t)")
    return stream


def _check_dl_device(dl_device, device: int) -> None:
    if dl_device is None:
        return
    try:
        device_type, device_id = dl_device
        device_type, device_id = int(device_type), int(device_id)
    except (TypeError, ValueError):
        raise TypeError(f"dl_device: expected None or a (device type, device id) pair, got {dl_device!r}") from None
    if (device_type, device_id) != (DLDeviceType.kDLCUDA, device):
        raise BufferError(f"dl_device: ({device_name(device_type)}, {device_id}) asks for a copy on another "
                          f"device; the shard lives on (kDLCUDA, {device}) and __dlpack__ makes no copies: "
                          f"copy it with the consumer (e.g. torch.from_dlpack(view).cpu()) or to_numpy()")


def _check_copy(copy) -> None:
    if copy is None or copy is False:
        return
    if copy is True:
        raise BufferError("copy: a shard view exports the shard's own memory and makes no copies; for a "
                          "copy, export a copy (a.copy().shard(i)) or copy on the consumer's side")
    raise TypeError(f"copy: expected True, False or None, got {type(copy).__name__}")


def _element_layout(view) -> tuple[int, int, int]:
    """(code, bits, stride in elements) of what a view exports; BufferError for records."""
    array = view.array
    if view.field_name is None:
        if layout_of(array.dtype).is_record:
            names = array.dtype.names
            raise BufferError(f"a shard of records {describe_dtype(array.dtype)} has no DLPack type (DLPack "
                              f"has no structs): export one field at a time, view.field(name) (fields: "
                              f"{', '.join(names)}), e.g. torch.from_dlpack(a.shard(i).field({names[0]!r}))")
        code, bits, _ = dlpack_dtype(array.dtype)
        return code, bits, 1
    field, offset = array.dtype.fields[view.field_name][:2]
    code, bits, _ = dlpack_dtype(field)
    record = array.dtype.itemsize
    # DLPack strides count elements: a field whose record size (or offset) is no multiple of
    # its own size has no DLPack stride. The aligned layout records use always gives one.
    if record % field.itemsize or offset % field.itemsize:
        raise BufferError(f"field {view.field_name!r}: its records are {record} bytes apart, at offset "
                          f"{offset}: no whole number of {field.itemsize}-byte elements, which DLPack strides "
                          f"count; read it through __cuda_array_interface__ (byte strides) instead")
    return code, bits, record // field.itemsize


def export_capsule(view, stream, max_version, dl_device, copy):
    """`view.__dlpack__(...)`: every argument checked, then the consumer's stream ordered after
    the place's, then the capsule."""
    versioned = _wants_versioned(max_version)
    _check_copy(copy)
    _check_dl_device(dl_device, view.device)
    code, bits, stride = _element_layout(view)
    consumer = _consumer_stream(stream)
    array, place = view.array, view.place
    array._impl.check_alive(f"shard({place})")
    if consumer is not None:
        array.group._impl.make_foreign_stream_wait(place, consumer)
    interface = view.__cuda_array_interface__
    return _shim.dlpack_export(view, interface["data"][0], view.device, interface["shape"][0], stride,
                               code, bits, versioned)


# ---- import ---------------------------------------------------------------------------------

class Imported(NamedTuple):
    """A producer's tensor, checked: its owner (the DLPackImport whose release runs the
    producer's deleter), where its data starts, its element count, dtype and shape."""

    owner: object
    pointer: int
    count: int
    dtype: np.dtype
    shape: tuple[int, ...]


def _check_device(device_type, device_id, device: int, place: int, obj, argument: str) -> None:
    device_type = int(device_type)
    if device_type in _HOST_DEVICES:
        raise ValueError(f"{argument}: {type(obj).__name__} lives in host memory ({device_name(device_type)}), "
                         f"not on a GPU: ShardedArray.from_numpy (or sharded.asarray) copies host data in")
    if device_type not in _CUDA_DEVICES:
        raise ValueError(f"{argument}: a {device_name(device_type)} tensor; arrays take CUDA memory "
                         f"(kDLCUDA or kDLCUDAManaged)")
    if device_type == DLDeviceType.kDLCUDA and int(device_id) != device:
        raise ValueError(f"{argument}: lives on device {int(device_id)}, expected device {device} (place {place})")


def producer_device(obj, argument: str) -> tuple[int, int] | None:
    """`obj.__dlpack_device__()` as (device type, device id), None when it has none."""
    ask = getattr(obj, "__dlpack_device__", None)
    if ask is None:
        return None
    try:
        device_type, device_id = ask()
        return int(device_type), int(device_id)
    except (TypeError, ValueError):
        raise TypeError(f"{argument}: its __dlpack_device__() gave no (device type, device id) pair") from None


def check_producer(obj, device: int, place: int, argument: str) -> None:
    """What can be known before the producer exports anything: that it is one, and (where
    it has __dlpack_device__) that it names a CUDA device of the place."""
    if type(obj).__name__ == "PyCapsule":
        raise TypeError(f"{argument}: a bare DLPack capsule; pass the array itself, whose __dlpack__ is "
                        f"called with the place's stream so that its producer's work is ordered first")
    if not callable(getattr(obj, "__dlpack__", None)):
        raise TypeError(f"{argument}: {type(obj).__name__} has no __dlpack__")
    found = producer_device(obj, argument)
    if found is not None:
        _check_device(*found, device, place, obj, argument)


def _capsule_of(obj, stream: int, argument: str):
    """The producer's capsule for a consumer working on `stream` (a versioned one if it can)."""
    try:
        try:
            return obj.__dlpack__(stream=stream, max_version=(1, 0))
        except TypeError:  # a producer older than the 2023.12 standard takes no max_version
            return obj.__dlpack__(stream=stream)
    except Exception as error:
        if hasattr(error, "add_note"):  # Python 3.11 on
            error.add_note(f"(raised by {argument}, a {type(obj).__name__}, asked for a DLPack capsule)")
        raise


def _extent(shape, argument: str) -> int:
    if any(extent < 0 for extent in shape):
        raise ValueError(f"{argument}: shape {shape} has a negative extent")
    count = math.prod(shape)
    if count >= 1 << 63:
        raise ValueError(f"{argument}: shape {shape} has more elements than fit in 64 bits")
    return count


def _check_contiguous(shape, strides, count: int, argument: str) -> None:
    """C-contiguous, in elements. Strides that never step do not matter: those of extents of
    1, and all of a tensor of at most one element."""
    if strides is None or count <= 1:
        return
    step = 1
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent != 1 and stride != step:
            raise ValueError(f"{argument}: not C-contiguous (shape {shape}, strides {strides} in elements)")
        step *= extent


def _checked(owner, obj, device: int, place: int, requested, argument: str) -> Imported:
    _check_device(*owner.device, device, place, obj, argument)
    if owner.read_only:
        raise ValueError(f"{argument}: its producer exported it read-only (DLPack's read-only flag); arrays are "
                         f"written in place (out=, fill, sort, a[i] = v), so adopt takes writable memory only: "
                         f"pass a writable copy")
    code, bits, lanes = owner.dtype
    dtype = numpy_dtype(code, bits, lanes)
    if dtype is None:
        raise TypeError(f"{argument}: unsupported dtype {describe_dlpack_dtype(code, bits, lanes)} "
                        f"(expected one of {_NAMES})")
    if requested is not None and requested != dtype:
        if layout_of(requested).is_record:
            raise TypeError(f"{argument}: DLPack has no record types (it holds {dtype}); adopt records through "
                            f"__cuda_array_interface__ with dtype=")
        raise TypeError(f"{argument}: holds {describe_dtype(dtype)}, not dtype {describe_dtype(requested)}")
    shape = tuple(int(extent) for extent in owner.shape)
    count = _extent(shape, argument)
    strides = owner.strides
    _check_contiguous(shape, None if strides is None else tuple(int(s) for s in strides), count, argument)
    if count * dtype.itemsize >= 1 << 63:
        raise ValueError(f"{argument}: shape {shape} of {dtype.itemsize}-byte elements spans more bytes than "
                         f"fit in 64 bits")
    return Imported(owner, owner.data + owner.byte_offset, count, dtype, shape)


def import_tensor(obj, device: int, place: int, stream: int, requested, argument: str) -> Imported:
    """`obj`'s DLPack tensor, exported for a consumer on `stream` (our place's), checked and
    owned. `requested`: the dtype the caller named (None: the tensor's own). A refusal gives
    the tensor back at once (its deleter runs), not when the traceback goes."""
    capsule = _capsule_of(obj, stream, argument)
    try:
        owner = _shim.dlpack_import(capsule)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{argument}: {error}") from None
    try:
        return _checked(owner, obj, device, place, requested, argument)
    except BaseException:
        owner.release()
        raise


def release(owners) -> None:
    """Gives DLPack tensors (any DLPackImport among `owners`) back to their producers now."""
    for owner in owners:
        if isinstance(owner, _shim.DLPackImport):
            owner.release()
