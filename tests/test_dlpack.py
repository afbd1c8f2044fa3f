"""DLPack both ways: shard views exported (`__dlpack__`, `__dlpack_device__`) and producers'
tensors imported (`ShardedArray.adopt`, `ShardedArray.from_dlpack`, `sharded.asarray`).

Here without a GPU: the capsules a stand-in shard view exports, read back with this file's
own ctypes rendering of dlpack.h; hand-made producers (ctypes DLManagedTensor[Versioned]
over fake pointers) imported up to the shim's adopt (a stand-in that records its arguments),
with their deleters counted; the dtype mapping against DLPack's table and numpy's own
exports; every argument error, before anything is queued. On a GPU (`gpu` marker): torch,
CuPy and JAX reading shards in place and handing us theirs, values against numpy, pointers
compared, the stream ordering both ways, lifetimes, and record fields.
"""

from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _dlpack, _shim
from cuda_sharded_jit.array import ShardView

import test_errors
from conftest import ALL_DTYPES, sample
from test_input_checks import _Reached, shim_adopt  # noqa: F401 (fixture)

# ---- dlpack.h, written out for the tests ------------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


kDLCPU, kDLCUDA, kDLCUDAManaged = 1, 2, 13
READ_ONLY, IS_COPIED = 1, 2
# DLDataType of each supported dtype: (kDLInt 0 / kDLUInt 1 / kDLFloat 2, bits, lanes)
DLPACK_TYPES = {np.dtype(np.float32): (2, 32, 1), np.dtype(np.float64): (2, 64, 1),
                np.dtype(np.int32): (0, 32, 1), np.dtype(np.int64): (0, 64, 1),
                np.dtype(np.uint32): (1, 32, 1), np.dtype(np.uint64): (1, 64, 1)}

VERSIONED, LEGACY = b"dltensor_versioned", b"dltensor"
USED_VERSIONED, USED_LEGACY = b"used_dltensor_versioned", b"used_dltensor"

_api = ctypes.PyDLL(None)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = (ctypes.py_object,)
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = (ctypes.py_object, ctypes.c_char_p)
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = (ctypes.py_object, ctypes.c_char_p)


def capsule_name(capsule) -> bytes:
    return _api.PyCapsule_GetName(capsule)


def managed_of(capsule):
    """The struct a producer's capsule holds, read with this file's rendering of dlpack.h."""
    name = capsule_name(capsule)
    kind = {VERSIONED: DLManagedTensorVersioned, LEGACY: DLManagedTensor}[name]
    return kind.from_address(_api.PyCapsule_GetPointer(capsule, name))


def consume(capsule):
    """What a consumer does: take the struct, rename the capsule, call the deleter later."""
    managed = managed_of(capsule)
    used = USED_VERSIONED if capsule_name(capsule) == VERSIONED else USED_LEGACY
    assert _api.PyCapsule_SetName(capsule, used) == 0
    return managed


def tensor_fields(tensor: DLTensor) -> dict:
    return {"data": tensor.data or 0, "device": (tensor.device.device_type, tensor.device.device_id),
            "ndim": tensor.ndim, "dtype": (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes),
            "shape": tuple(tensor.shape[i] for i in range(tensor.ndim)),
            "strides": None if not tensor.strides else tuple(tensor.strides[i] for i in range(tensor.ndim)),
            "byte_offset": tensor.byte_offset}


# ---- stand-ins: a group and arrays that never reach a GPU ---------------------------------------

STREAM_BASE = 0x7F00_0000_0000


class _GroupImpl(test_errors._GroupImpl):
    def __init__(self, devices):
        super().__init__(len(devices))
        self.devices = list(devices)
        self.waits = []  # (place, consumer stream) of every make_foreign_stream_wait

    def stream(self, place):
        return STREAM_BASE + 0x100 * place

    def make_foreign_stream_wait(self, place, stream):
        self.waits.append((place, stream))


class _ArrayImpl(test_errors._ArrayImpl):
    def __init__(self, sizes, dtype, base):
        super().__init__(sizes, dtype)
        self.base = base

    def shard_pointer(self, place):
        return self.base + place * 0x10_0000

    def check_alive(self, what):
        if self.is_freed:
            raise ValueError(f"{what}: the array was freed with free()")

    def describe(self, label=""):
        return f"stand-in ShardedArray({self.shard_sizes}, {label or self.dtype})"


def stand_in_group(devices=(0, 0, 0)) -> sharded.PlaceGroup:
    group = test_errors.stand_in_group(len(devices))
    group._impl = _GroupImpl(devices)
    return group


def stand_in_array(group, sizes=(5, 0, 7), dtype=np.float32, base=0x7E00_0000_0000) -> sharded.ShardedArray:
    array = test_errors.stand_in_array(group, sizes, dtype)
    array._impl = _ArrayImpl(sizes, dtype, base)
    return array


# ---- hand-made producers ------------------------------------------------------------------------

FAKE_POINTER = 0x7D00_0000_0000


class HandMade:
    """A DLManagedTensor[Versioned] made in ctypes over a fake device pointer, whose deleter
    counts its calls. `strides`: ... for compact ones, None for a NULL pointer."""

    def __init__(self, shape=(5,), dtype=(2, 32, 1), device=(kDLCUDA, 0), strides=..., data=FAKE_POINTER,
                 byte_offset=0, versioned=True, version=(1, 0), flags=0):
        self.deletes = 0
        self.versioned = versioned
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        if strides is ...:
            strides, step = [], 1
            for extent in reversed(shape):
                strides.insert(0, step)
                step *= extent
        self.strides = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)
        tensor = DLTensor(data, DLDevice(*device), len(shape), DLDataType(*dtype),
                          ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64)),
                          None if self.strides is None else ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64)),
                          byte_offset)
        self._deleter = DELETER(self._delete)
        if versioned:
            self.managed = DLManagedTensorVersioned(DLPackVersion(*version), None, self._deleter, flags, tensor)
        else:
            self.managed = DLManagedTensor(tensor, None, self._deleter)

    def _delete(self, address):
        assert address == ctypes.addressof(self.managed)
        self.deletes += 1

    def capsule(self):
        # no capsule destructor: these tests count the consumer's deleter calls alone
        return _api.PyCapsule_New(ctypes.addressof(self.managed), VERSIONED if self.versioned else LEGACY, None)


class Producer:
    """An object with __dlpack__ and __dlpack_device__ over a HandMade tensor; records calls."""

    def __init__(self, made: HandMade, device=None):
        self.made = made
        self.device = (made.managed.dl_tensor.device.device_type, made.managed.dl_tensor.device.device_id) \
            if device is None else device
        self.calls = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        return self.made.capsule()


class OldProducer(Producer):
    """A producer from before the 2023.12 standard: __dlpack__ takes a stream only."""

    def __dlpack__(self, *, stream=None):
        self.calls.append({"stream": stream})
        return self.made.capsule()


def collected(made: HandMade) -> int:
    gc.collect()
    return made.deletes


# ---- the dtype mapping (CPU) --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_dtypes_map_to_dlpack_types_and_back(dtype):
    dtype = np.dtype(dtype)
    assert _dlpack.dlpack_dtype(dtype) == DLPACK_TYPES[dtype]
    assert _dlpack.numpy_dtype(*DLPACK_TYPES[dtype]) == dtype


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_dtype_mapping_agrees_with_numpys_own_exports(dtype):
    capsule = np.zeros(3, dtype).__dlpack__(max_version=(1, 0))
    managed = consume(capsule)
    assert tensor_fields(managed.dl_tensor)["dtype"] == _dlpack.dlpack_dtype(dtype)
    managed.deleter(ctypes.addressof(managed))


@pytest.mark.parametrize("code, bits, lanes, name", [
    (2, 16, 1, "float16"), (4, 16, 1, "bfloat16"), (6, 8, 1, "bool"), (0, 8, 1, "int8"), (1, 16, 1, "uint16"),
    (5, 64, 1, "complex64"), (2, 32, 4, "float32 x4 lanes"), (3, 64, 1, "kDLOpaqueHandle of 64 bits"),
    (12, 8, 1, "type code 12 of 8 bits"),
])
def test_dlpack_types_arrays_do_not_hold(code, bits, lanes, name):
    assert _dlpack.numpy_dtype(code, bits, lanes) is None
    assert _dlpack.describe_dlpack_dtype(code, bits, lanes) == name


def test_dtypes_without_a_dlpack_type_here():
    with pytest.raises(TypeError, match="dtype: float16 has no DLPack type here"):
        _dlpack.dlpack_dtype(np.float16)


# ---- export (CPU, stand-in views) ---------------------------------------------------------------

@pytest.fixture
def exported():
    """A stand-in float64 array on devices (0, 1, 1) of shard sizes (5, 0, 7)."""
    group = stand_in_group((0, 1, 1))
    return stand_in_array(group, dtype=np.float64)


@pytest.mark.parametrize("max_version, name", [((1, 0), VERSIONED), ((1, 7), VERSIONED), ((2, 0), VERSIONED),
                                               (None, LEGACY), ((0, 8), LEGACY)])
def test_export_capsule_structure(exported, max_version, name):
    view = ShardView(exported, 2)
    capsule = view.__dlpack__(max_version=max_version)
    assert capsule_name(capsule) == name
    managed = managed_of(capsule)
    if name == VERSIONED:
        assert (managed.version.major, managed.version.minor) == (1, 0)
        assert managed.flags & (READ_ONLY | IS_COPIED) == 0
    assert tensor_fields(managed.dl_tensor) == {
        "data": exported._impl.shard_pointer(2), "device": (kDLCUDA, 1), "ndim": 1, "dtype": (2, 64, 1),
        "shape": (7,), "strides": (1,), "byte_offset": 0}


def test_export_device(exported):
    for place, device in enumerate((0, 1, 1)):
        device_type, device_id = ShardView(exported, place).__dlpack_device__()
        assert (device_type, device_id) == (kDLCUDA, device)
        assert device_type is _dlpack.DLDeviceType.kDLCUDA


def test_export_an_empty_shard(exported):
    fields = tensor_fields(managed_of(ShardView(exported, 1).__dlpack__(max_version=(1, 0))).dl_tensor)
    assert fields["shape"] == (0,) and fields["device"] == (kDLCUDA, 1)


@pytest.mark.parametrize("stream, waited", [(None, 1), (1, 1), (2, 2), (0x7C00_1234_5600, 0x7C00_1234_5600),
                                            (np.int64(0x7C00_0000_0100), 0x7C00_0000_0100), (-1, None)])
def test_export_orders_the_consumers_stream_after_the_place(exported, stream, waited):
    """None: the legacy default stream, as the standard says for CUDA; -1: no synchronisation."""
    ShardView(exported, 2).__dlpack__(stream=stream, max_version=(1, 0))
    assert exported.group._impl.waits == ([] if waited is None else [(2, waited)])


@pytest.mark.parametrize("kwargs, error, message", [
    ({"copy": True}, BufferError, r"copy: a shard view exports the shard's own memory"),
    ({"copy": "no"}, TypeError, r"copy: expected True, False or None, got str"),
    ({"dl_device": (kDLCPU, 0)}, BufferError, r"dl_device: \(kDLCPU, 0\) asks for a copy on another device; "
                                              r"the shard lives on \(kDLCUDA, 1\)"),
    ({"dl_device": (kDLCUDA, 0)}, BufferError, r"dl_device: \(kDLCUDA, 0\) asks for a copy"),
    ({"dl_device": "cuda"}, TypeError, r"dl_device: expected None or a \(device type, device id\) pair"),
    ({"max_version": "1.0"}, TypeError, r"max_version: expected None or a \(major, minor\) tuple of ints"),
    ({"max_version": (1,)}, TypeError, r"max_version: expected None or a \(major, minor\)"),
    ({"stream": 0}, ValueError, r"stream: 0 is disallowed by the DLPack standard"),
    ({"stream": -2}, ValueError, r"stream: -2 is not a CUDA stream"),
    ({"stream": 1 << 64}, ValueError, rf"stream: {1 << 64} is not a CUDA stream"),
    ({"stream": True}, TypeError, r"stream: expected an int .* got bool"),
    ({"stream": 1.0}, TypeError, r"stream: expected an int .* got float"),
])
def test_export_argument_errors_come_before_any_wait(exported, kwargs, error, message):
    with pytest.raises(error, match=message):
        ShardView(exported, 2).__dlpack__(**kwargs)
    assert exported.group._impl.waits == []


def test_export_takes_its_own_device_and_no_copy(exported):
    capsule = ShardView(exported, 0).__dlpack__(dl_device=(kDLCUDA, 0), copy=False, max_version=(1, 0))
    assert tensor_fields(managed_of(capsule).dl_tensor)["device"] == (kDLCUDA, 0)


def test_export_of_a_freed_array(exported):
    view = ShardView(exported, 0)
    exported._impl.is_freed = True
    with pytest.raises(ValueError, match=r"shard\(0\): the array was freed"):
        view.__dlpack__()
    assert exported.group._impl.waits == []


POINT = np.dtype([("x", np.float32), ("y", np.float64), ("n", np.int32)], align=True)  # 24 bytes


def test_export_refuses_records_and_names_field():
    array = stand_in_array(stand_in_group((0,)), sizes=(4,), dtype=POINT)
    with pytest.raises(BufferError, match=r"has no DLPack type .* view.field\(name\) \(fields: x, y, n\)"):
        ShardView(array, 0).__dlpack__()
    assert array.group._impl.waits == []


@pytest.mark.parametrize("name, offset, code_bits, stride", [("x", 0, (2, 32), 6), ("y", 8, (2, 64), 3),
                                                             ("n", 16, (0, 32), 6)])
def test_export_a_field_of_records_strided_in_elements(name, offset, code_bits, stride):
    """A field view's DLPack stride is the record's size in the field's elements (24 bytes:
    6 float32, 3 float64), its data the field's first byte."""
    array = stand_in_array(stand_in_group((0,)), sizes=(4,), dtype=POINT)
    capsule = ShardView(array, 0).field(name).__dlpack__(max_version=(1, 0))
    fields = tensor_fields(managed_of(capsule).dl_tensor)
    assert fields["data"] == array._impl.shard_pointer(0) + offset
    assert fields["dtype"] == (*code_bits, 1) and fields["shape"] == (4,) and fields["strides"] == (stride,)


def _view_and_ref():
    """A view of a new stand-in array that nothing else holds, and a weak reference to it."""
    array = stand_in_array(stand_in_group((0, 1, 1)), dtype=np.float64)
    return ShardView(array, 0), weakref.ref(array)


def test_capsule_keeps_the_array_until_the_consumers_deleter():
    view, array_ref = _view_and_ref()
    capsule = view.__dlpack__(max_version=(1, 0))
    del view
    gc.collect()
    assert array_ref() is not None
    managed = consume(capsule)
    del capsule  # consumed: its destructor leaves the tensor to the consumer
    gc.collect()
    assert array_ref() is not None
    managed.deleter(ctypes.addressof(managed))
    gc.collect()
    assert array_ref() is None


def test_the_deleter_runs_from_another_thread():
    """DLPack lets a consumer call the deleter from any thread, without the GIL (ctypes drops it
    around the call): the reference to the array is dropped all the same."""
    import threading

    view, array_ref = _view_and_ref()
    managed = consume(view.__dlpack__(max_version=(1, 0)))
    del view
    worker = threading.Thread(target=managed.deleter, args=(ctypes.addressof(managed),))
    worker.start()
    worker.join()
    gc.collect()
    assert array_ref() is None


@pytest.mark.parametrize("max_version", [(1, 0), None])
def test_an_unconsumed_capsule_lets_the_array_go(max_version):
    view, array_ref = _view_and_ref()
    capsule = view.__dlpack__(max_version=max_version)
    del view
    gc.collect()
    assert array_ref() is not None
    del capsule
    gc.collect()
    assert array_ref() is None


def test_our_capsule_through_our_import():
    """The consumer half reads the producer half: renamed, then the array lives until release."""
    view, array_ref = _view_and_ref()
    capsule = view.__dlpack__(max_version=(1, 0))
    del view
    owner = _shim.dlpack_import(capsule)
    assert capsule_name(capsule) == USED_VERSIONED
    assert owner.device == (kDLCUDA, 0) and tuple(owner.shape) == (5,) and owner.dtype == (2, 64, 1)
    del capsule
    gc.collect()
    assert array_ref() is not None
    owner.release()
    gc.collect()
    assert array_ref() is None and owner.released


# ---- import: the shim's DLPackImport (CPU, hand-made tensors) ------------------------------------

@pytest.mark.parametrize("versioned", [True, False])
def test_import_parses_and_deletes_once(versioned):
    made = HandMade(shape=(2, 3), dtype=(1, 64, 1), byte_offset=64, versioned=versioned, version=(1, 3))
    capsule = made.capsule()
    owner = _shim.dlpack_import(capsule)
    assert capsule_name(capsule) == (USED_VERSIONED if versioned else USED_LEGACY)
    assert owner.versioned is versioned and owner.version == ((1, 3) if versioned else None)
    assert owner.data == FAKE_POINTER and owner.byte_offset == 64
    assert owner.device == (kDLCUDA, 0) and owner.dtype == (1, 64, 1)
    assert tuple(owner.shape) == (2, 3) and tuple(owner.strides) == (3, 1)
    del capsule
    assert collected(made) == 0
    owner.release()
    owner.release()
    del owner
    assert collected(made) == 1


def test_import_deletes_when_the_owner_goes():
    made = HandMade(strides=None, flags=READ_ONLY | IS_COPIED)
    owner = _shim.dlpack_import(made.capsule())
    assert owner.strides is None and owner.read_only and owner.copied
    del owner
    assert collected(made) == 1


def test_import_of_another_major_version_only_deletes():
    made = HandMade(version=(2, 0))
    with pytest.raises(ValueError, match=r"DLPack 2.0 tensor: this library reads DLPack 1.x"):
        _shim.dlpack_import(made.capsule())
    assert collected(made) == 1


def test_import_refuses_malformed_tensors_and_gives_them_back():
    made = HandMade()
    made.managed.dl_tensor.ndim = -1
    with pytest.raises(ValueError, match=r"DLPack tensor with ndim -1"):
        _shim.dlpack_import(made.capsule())
    assert collected(made) == 1


def test_import_refuses_what_is_no_fresh_capsule():
    made = HandMade()
    capsule = made.capsule()
    owner = _shim.dlpack_import(capsule)
    with pytest.raises(ValueError, match=r"was consumed already \(named 'used_dltensor_versioned'\)"):
        _shim.dlpack_import(capsule)
    with pytest.raises(ValueError, match=r"a capsule named 'something' is no DLPack capsule"):
        _shim.dlpack_import(_api.PyCapsule_New(ctypes.addressof(made.managed), b"something", None))
    with pytest.raises(TypeError, match=r"expected a DLPack capsule, got int"):
        _shim.dlpack_import(5)
    del owner
    assert collected(made) == 1


# ---- import through adopt / from_dlpack (CPU, up to the shim) -----------------------------------

def test_adopt_asks_each_producer_with_the_places_stream(shim_adopt):
    group = stand_in_group((0, 1, 1))
    made = [HandMade(shape=(4,), device=(kDLCUDA, 0)),
            HandMade(shape=(0,), device=(kDLCUDA, 1), data=0),
            HandMade(shape=(2, 3), device=(kDLCUDA, 1), byte_offset=256, data=FAKE_POINTER + 0x1000)]
    producers = [Producer(made[0]), OldProducer(made[1]), Producer(made[2])]
    with pytest.raises(_Reached):
        sharded.ShardedArray.adopt(group, producers)
    assert producers[0].calls == [{"stream": STREAM_BASE, "max_version": (1, 0)}]
    assert producers[1].calls == [{"stream": STREAM_BASE + 0x100}]  # retried without max_version
    assert producers[2].calls == [{"stream": STREAM_BASE + 0x200, "max_version": (1, 0)}]
    (_, pointers, sizes, dtype, _, streams), = shim_adopt
    assert list(pointers) == [FAKE_POINTER, 0, FAKE_POINTER + 0x1000 + 256]
    assert list(sizes) == [4, 0, 6] and dtype == "float32"
    assert list(streams) == [0, 0, 0]  # the producers ordered their work: nothing left to wait for
    assert [m.deletes for m in made] == [1, 1, 1]  # the refused array let every tensor go


def test_adopt_prefers_the_cuda_array_interface(shim_adopt):
    class Both(Producer):
        def __init__(self, made):
            super().__init__(made)
            self.__cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (FAKE_POINTER, False),
                                             "version": 3, "strides": None}

    both = Both(HandMade())
    with pytest.raises(_Reached):
        sharded.ShardedArray.adopt(stand_in_group((0,)), [both])
    assert both.calls == []
    with pytest.raises(_Reached):
        sharded.ShardedArray.from_dlpack(stand_in_group((0,)), [both])
    assert len(both.calls) == 1
    assert [list(sizes) for _, _, sizes, *_ in shim_adopt] == [[3], [5]]


@pytest.mark.parametrize("made, error, message", [
    (dict(dtype=(2, 16, 1)), TypeError, r"buffers\[1\]: unsupported dtype float16 \(expected one of float32"),
    (dict(dtype=(2, 32, 2)), TypeError, r"buffers\[1\]: unsupported dtype float32 x2 lanes"),
    (dict(dtype=(2, 64, 1)), TypeError, r"buffers\[1\]: dtype float64 differs from buffers\[0\]'s float32"),
    (dict(strides=(2,)), ValueError, r"buffers\[1\]: not C-contiguous \(shape \(5,\), strides \(2,\)"),
    (dict(shape=(2, 3), strides=(1, 2)), ValueError, r"buffers\[1\]: not C-contiguous"),
    (dict(shape=(3, -2)), ValueError, r"buffers\[1\]: shape \(3, -2\) has a negative extent"),
    (dict(shape=(1 << 40, 1 << 40)), ValueError, r"buffers\[1\]: shape .* more elements than fit in 64 bits"),
    (dict(flags=READ_ONLY), ValueError, r"buffers\[1\]: its producer exported it read-only"),
    (dict(version=(2, 1)), ValueError, r"buffers\[1\]: DLPack 2.1 tensor"),
    (dict(device=(kDLCUDA, 1)), ValueError, r"buffers\[1\]: lives on device 1, expected device 0 \(place 1\)"),
    (dict(device=(kDLCPU, 0)), ValueError, r"buffers\[1\]: Producer lives in host memory \(kDLCPU\)"),
    (dict(device=(10, 0)), ValueError, r"buffers\[1\]: a kDLROCM tensor"),
])
def test_adopt_refuses_tensors_and_gives_them_back(shim_adopt, made, error, message):
    """The tensor's own fields, read after export (its producer's __dlpack_device__ said
    kDLCUDA 0): each refusal lets both producers' tensors go."""
    group = stand_in_group((0, 0))
    good, bad = HandMade(), HandMade(**made)
    with pytest.raises(error, match=message) as raised:
        sharded.ShardedArray.adopt(group, [Producer(good), Producer(bad, device=(kDLCUDA, 0))])
    assert shim_adopt == []
    # at once, although the traceback (held here) still holds adopt's frames
    assert (good.deletes, bad.deletes) == (1, 1) and raised.traceback


def test_adopt_accepts_compact_tensors_of_any_shape(shim_adopt):
    """NULL strides (compact), extents of 1 with any stride, 0-d; counted as their products."""
    made = [HandMade(shape=(3, 1, 4), strides=(4, 99, 1)), HandMade(shape=(6,), strides=None),
            HandMade(shape=()), HandMade(shape=(0, 5), strides=(7, 3))]
    with pytest.raises(_Reached):
        sharded.ShardedArray.adopt(stand_in_group((0, 0, 0, 0)), [Producer(m) for m in made])
    (_, _, sizes, *_), = shim_adopt
    assert list(sizes) == [12, 6, 1, 0]


def test_adopt_checks_every_device_before_any_producer_exports(shim_adopt):
    first = Producer(HandMade())
    on_the_host = np.zeros(4, np.float32)  # a DLPack producer too
    with pytest.raises(ValueError, match=r"buffers\[1\]: ndarray lives in host memory \(kDLCPU\)"):
        sharded.ShardedArray.adopt(stand_in_group((0, 0)), [first, on_the_host])
    wrong = Producer(HandMade(device=(kDLCUDA, 1)))
    with pytest.raises(ValueError, match=r"buffers\[1\]: lives on device 1, expected device 0 \(place 1\)"):
        sharded.ShardedArray.adopt(stand_in_group((0, 0)), [first, wrong])
    assert first.calls == [] and wrong.calls == []


def test_adopt_with_a_requested_dtype(shim_adopt):
    with pytest.raises(TypeError, match=r"buffers\[0\]: holds float32, not dtype int32"):
        sharded.ShardedArray.adopt(stand_in_group((0,)), [Producer(HandMade())], dtype=np.int32)
    with pytest.raises(TypeError, match=r"buffers\[0\]: DLPack has no record types"):
        sharded.ShardedArray.adopt(stand_in_group((0,)), [Producer(HandMade())], dtype=POINT)
    with pytest.raises(_Reached):
        sharded.ShardedArray.adopt(stand_in_group((0,)), [Producer(HandMade())], dtype=np.float32)


def test_managed_memory_is_taken_on_any_place(shim_adopt):
    made = HandMade(device=(kDLCUDAManaged, 0))
    with pytest.raises(_Reached):
        sharded.ShardedArray.from_dlpack(stand_in_group((3,)), [Producer(made)])


def test_producer_errors_say_who_raised(shim_adopt):
    class Refusing(Producer):
        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            raise BufferError("cannot export a tensor that requires grad")

    with pytest.raises(BufferError, match="requires grad") as raised:
        sharded.ShardedArray.from_dlpack(stand_in_group((0,)), [Refusing(HandMade())])
    assert any("objects[0], a Refusing" in note for note in raised.value.__notes__)


@pytest.mark.parametrize("objects, error, message", [
    ([], ValueError, r"objects: expected one object per place \(2\), got 0"),
    ([object(), object()], TypeError, r"objects\[0\]: object has no __dlpack__"),
    (Producer(HandMade()), TypeError, r"objects: expected a list of DLPack producers, one per place, got one "
                                      r"Producer: pass \[x\]"),
])
def test_from_dlpack_errors(shim_adopt, objects, error, message):
    with pytest.raises(error, match=message):
        sharded.ShardedArray.from_dlpack(stand_in_group((0, 0)), objects)
    assert shim_adopt == []


def test_from_dlpack_refuses_interface_only_objects_and_bare_capsules(shim_adopt):
    class InterfaceOnly:
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (FAKE_POINTER, False), "version": 3}

    with pytest.raises(TypeError, match=r"objects\[0\]: InterfaceOnly has no __dlpack__"):
        sharded.ShardedArray.from_dlpack(stand_in_group((0,)), [InterfaceOnly()])
    made = HandMade()
    with pytest.raises(TypeError, match=r"objects\[0\]: a bare DLPack capsule; pass the array itself"):
        sharded.ShardedArray.from_dlpack(stand_in_group((0,)), [made.capsule()])
    with pytest.raises(TypeError, match=r"group: expected a PlaceGroup"):
        sharded.ShardedArray.from_dlpack([0], [Producer(made)])
    assert collected(made) == 0  # nothing was taken


# ---- asarray of a device array (CPU, up to the shim) --------------------------------------------

def test_asarray_adopts_on_the_first_place_of_the_device(shim_adopt):
    made = HandMade(shape=(9,), dtype=(0, 64, 1), device=(kDLCUDA, 1))
    producer = Producer(made)
    with pytest.raises(_Reached):
        sharded.asarray(stand_in_group((0, 1, 1)), producer)
    (_, pointers, sizes, dtype, _, _), = shim_adopt
    assert list(pointers) == [0, FAKE_POINTER, 0] and list(sizes) == [0, 9, 0] and dtype == "int64"
    assert producer.calls == [{"stream": STREAM_BASE + 0x100, "max_version": (1, 0)}]
    assert collected(made) == 1


def test_asarray_uses_dlpack_even_where_the_interface_is(shim_adopt):
    class Both(Producer):
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (1 << 20, False), "version": 3}

    both = Both(HandMade())
    with pytest.raises(_Reached):
        sharded.asarray(stand_in_group((0,)), both)
    assert len(both.calls) == 1


def test_asarray_errors_for_device_arrays(shim_adopt):
    elsewhere = Producer(HandMade(device=(kDLCUDA, 2)))
    with pytest.raises(ValueError, match=r"obj: lives on cuda:2, a device no place of g uses \(devices \(0, 1\)\)"):
        sharded.asarray(stand_in_group((0, 1)), elsewhere)
    assert elsewhere.calls == []
    flat = HandMade(shape=(2, 3))
    with pytest.raises(ValueError, match=r"obj: expected a 1-D array, got shape \(2, 3\)"):
        sharded.asarray(stand_in_group((0, 1)), Producer(flat))
    assert flat.deletes == 1
    with pytest.raises(TypeError, match=r"dtype: .* is not a dtype"):
        sharded.asarray(stand_in_group((0,)), Producer(HandMade()), dtype="no such dtype")
    with pytest.raises(TypeError, match=r"group: expected a PlaceGroup, got list"):
        sharded.asarray([0], Producer(HandMade()))
    assert shim_adopt == []

    class InterfaceOnly:
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (1 << 20, False), "version": 3}

    with pytest.raises(TypeError, match=r"obj: a device array \(InterfaceOnly\) with __cuda_array_interface__ "
                                        r"but no DLPack device"):
        sharded.asarray(stand_in_group((0,)), InterfaceOnly())


# ---- GPU: torch -------------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


def _torch_dtype(torch, dtype):
    dtype = np.dtype(dtype)
    found = getattr(torch, dtype.name, None)
    if found is None:
        pytest.skip(f"this torch has no {dtype.name}")
    return found


def _host_of(tensor) -> np.ndarray:
    """A torch (or any DLPack) tensor's values in numpy, through the host."""
    return np.from_dlpack(tensor.cpu()) if hasattr(tensor, "cpu") else np.asarray(tensor)


def _pointer(view) -> int:
    return view.__cuda_array_interface__["data"][0]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_torch_reads_each_shard_in_place(three_places, dtype):
    torch = _torch()
    _torch_dtype(torch, dtype)
    host = sample(dtype, 3001)
    # no empty shard: its data pointer is NULL, as DLPack asks, which torch does not take
    a = sharded.ShardedArray.from_numpy(three_places, host, sizes=[1000, 1, 2000])
    for place in range(3):
        view = a.shard(place)
        tensor = torch.from_dlpack(view)
        assert tensor.device == torch.device("cuda", 0) and tuple(tensor.shape) == (a.shard_sizes[place],)
        assert tensor.data_ptr() == _pointer(view)
        start = a.shard_offsets[place]
        np.testing.assert_array_equal(_host_of(tensor), host[start:start + a.shard_sizes[place]])


@pytest.mark.gpu
def test_torch_writes_through_a_shard(one_place):
    torch = _torch()
    a = sharded.ShardedArray.from_numpy(one_place, np.zeros(100, np.float64))
    torch.from_dlpack(a.shard(0))[10:20] = 2.5
    torch.cuda.synchronize()
    expected = np.zeros(100)
    expected[10:20] = 2.5
    np.testing.assert_array_equal(a.to_numpy(), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("side_stream", [False, True], ids=["default-stream", "side-stream"])
def test_torch_sees_our_queued_writes(one_place, side_stream):
    """Our fills are queued on the place's stream and still running when torch reads on its
    own stream: the wait __dlpack__ queued makes torch see the last one."""
    torch = _torch()
    n = 1 << 26
    a = sharded.ShardedArray.allocate(one_place, n, np.float32)
    for value in range(1, 9):
        sharded.fill(a, float(value))
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        tensor = torch.from_dlpack(a.shard(0))
        every = bool((tensor == 8.0).all())
    assert every


@pytest.mark.gpu
def test_we_see_torchs_queued_writes(one_place):
    """torch's writes, queued on its current stream, are ordered before our reads by the
    stream from_dlpack hands torch's __dlpack__."""
    torch = _torch()
    n = 1 << 26
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        tensor = torch.empty(n, dtype=torch.float32, device="cuda:0")
        for value in range(1, 9):
            tensor.fill_(float(value))
        a = sharded.ShardedArray.from_dlpack(one_place, [tensor])
    assert sharded.count(a, 8.0) == n


@pytest.mark.gpu
@pytest.mark.parametrize("places", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_from_dlpack_of_torch_tensors_then_algorithms(places, dtype):
    torch = _torch()
    group = sharded.PlaceGroup.by_devices([0] * places)
    sizes = [1000, 0, 777][:places]
    hosts = [sample(dtype, size, seed=place) for place, size in enumerate(sizes)]
    tensors = [torch.from_numpy(host).to("cuda:0") for host in hosts]
    a = sharded.ShardedArray.from_dlpack(group, tensors)
    host = np.concatenate(hosts)
    assert a.storage == "adopted" and a.shard_sizes == tuple(sizes) and a.dtype == np.dtype(dtype)
    for place, tensor in enumerate(tensors):
        if sizes[place]:
            assert _pointer(a.shard(place)) == tensor.data_ptr()
    np.testing.assert_array_equal(a.to_numpy(), host)
    # x * 2 + 1 with Python ints: numba computes float32 input in float64 (x * 2 exact, + 1
    # rounded once), so numpy does the same in float64
    wide = host.astype(np.float64) if np.dtype(dtype).kind == "f" else host
    np.testing.assert_array_equal(sharded.transform(lambda x: x * 2 + 1, a).to_numpy(), wide * 2 + 1)
    if np.dtype(dtype).kind == "i":
        assert sharded.reduce(a, "sum") == host.sum()
    else:
        np.testing.assert_allclose(sharded.reduce(a, "sum"), host.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
    sharded.fill(a, 4)  # zero-copy: torch sees our writes
    group.sync()
    for tensor in tensors:
        assert bool((tensor == 4).all())


@pytest.mark.gpu
def test_from_dlpack_keeps_the_producers_memory_until_the_array_goes(one_place):
    torch = _torch()
    gc.collect()  # earlier tests' tensors go first, so that only this one is counted
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    tensor = torch.arange(1 << 20, dtype=torch.int64, device="cuda:0")
    held = torch.cuda.memory_allocated(0)
    assert held > before
    a = sharded.ShardedArray.from_dlpack(one_place, [tensor])
    del tensor
    gc.collect()
    assert torch.cuda.memory_allocated(0) == held  # our import holds torch's storage
    np.testing.assert_array_equal(a.to_numpy(), np.arange(1 << 20))
    del a
    gc.collect()
    assert torch.cuda.memory_allocated(0) == before  # the deleter ran


@pytest.mark.gpu
def test_an_exported_shard_keeps_the_array_alive(one_place):
    torch = _torch()
    host = sample(np.float32, 5000)
    a = sharded.ShardedArray.from_numpy(one_place, host)
    array_ref = weakref.ref(a)
    tensor = torch.from_dlpack(a.shard(0))
    del a
    gc.collect()
    assert array_ref() is not None
    np.testing.assert_array_equal(_host_of(tensor), host)
    del tensor
    gc.collect()
    assert array_ref() is None


@pytest.mark.gpu
def test_record_fields_through_dlpack(three_places):
    torch = _torch()
    host = np.zeros(900, POINT)
    host["x"], host["y"], host["n"] = sample(np.float32, 900), sample(np.float64, 900, 1), sample(np.int32, 900, 2)
    a = sharded.ShardedArray.from_numpy(three_places, host)
    with pytest.raises(BufferError, match=r"view.field\(name\)"):
        torch.from_dlpack(a.shard(0))
    for place in range(3):
        start, size = a.shard_offsets[place], a.shard_sizes[place]
        for name, offset in (("x", 0), ("y", 8), ("n", 16)):
            field = torch.from_dlpack(a.shard(place).field(name))
            assert field.stride() == (POINT.itemsize // POINT.fields[name][0].itemsize,)
            assert field.data_ptr() == _pointer(a.shard(place)) + offset
            np.testing.assert_array_equal(_host_of(field), host[name][start:start + size])


@pytest.mark.gpu
def test_asarray_of_a_torch_tensor(three_places, one_place):
    torch = _torch()
    tensor = torch.arange(1000, dtype=torch.int64, device="cuda:0")
    b = sharded.asarray(three_places, tensor)
    assert b.shard_sizes == (334, 333, 333) and b.storage == "separate"
    tensor.fill_(-1)  # a copy: done when asarray returned
    torch.cuda.synchronize()
    np.testing.assert_array_equal(b.to_numpy(), np.arange(1000))
    c = sharded.asarray(three_places, torch.arange(10, device="cuda:0"), dtype=np.float64, sizes=[0, 10, 0])
    assert c.dtype == np.float64 and c.shard_sizes == (0, 10, 0)
    np.testing.assert_array_equal(c.to_numpy(), np.arange(10.0))
    view_of = torch.arange(50, dtype=torch.float32, device="cuda:0")
    d = sharded.asarray(one_place, view_of)  # already where it belongs: zero-copy
    assert d.storage == "adopted" and _pointer(d.shard(0)) == view_of.data_ptr()


@pytest.mark.gpu
def test_real_capsule_structure_and_stream_checks(one_place):
    a = sharded.ShardedArray.from_numpy(one_place, np.arange(6, dtype=np.uint32))
    capsule = a.shard(0).__dlpack__(stream=-1, max_version=(1, 0))
    managed = managed_of(capsule)
    assert (managed.version.major, managed.flags) == (1, 0)
    assert tensor_fields(managed.dl_tensor)["device"] == (kDLCUDA, one_place.devices[0])
    with pytest.raises(ValueError, match=r"stream: stream 0x1234 is not a live CUDA stream of device 0"):
        a.shard(0).__dlpack__(stream=0x1234)
    view = a.shard(0)
    a.free()
    with pytest.raises(ValueError, match=r"shard\(0\): the array was freed"):
        view.__dlpack__()


# ---- GPU: CuPy ------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_cupy_both_ways(three_places, dtype):
    cp = pytest.importorskip("cupy")
    host = sample(dtype, 3000)
    a = sharded.ShardedArray.from_numpy(three_places, host)
    for place in range(3):
        x = cp.from_dlpack(a.shard(place))
        assert x.data.ptr == _pointer(a.shard(place))
        start = a.shard_offsets[place]
        np.testing.assert_array_equal(cp.asnumpy(x), host[start:start + a.shard_sizes[place]])
    buffers = [cp.asarray(sample(dtype, size, seed=size)) for size in (10, 0, 25)]
    b = sharded.ShardedArray.from_dlpack(three_places, buffers)
    np.testing.assert_array_equal(b.to_numpy(), np.concatenate([cp.asnumpy(x) for x in buffers]))


@pytest.mark.gpu
def test_cupy_on_a_non_blocking_stream_sees_our_writes(one_place):
    cp = pytest.importorskip("cupy")
    a = sharded.ShardedArray.allocate(one_place, 1 << 26, np.int32)
    for value in range(1, 9):
        sharded.fill(a, value)
    with cp.cuda.Stream(non_blocking=True):
        x = cp.from_dlpack(a.shard(0))
        every = bool((x == 8).all())
    assert every


# ---- GPU: JAX -------------------------------------------------------------------------------------

def _jax_on_a_gpu():
    jax = pytest.importorskip("jax")
    try:
        return jax, jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("this jax has no GPU backend")


def _jax_dtypes(jax):
    wide = bool(getattr(jax.config, "jax_enable_x64", False))  # 64-bit types need it
    return [dtype for dtype in ALL_DTYPES if wide or np.dtype(dtype).itemsize == 4]


def _exported_read_only(x) -> bool:
    """Whether a producer flags its versioned exports read-only (read here, independently)."""
    try:
        capsule = x.__dlpack__(max_version=(1, 0))
    except TypeError:
        return False
    return capsule_name(capsule) == VERSIONED and bool(managed_of(capsule).flags & READ_ONLY)


@pytest.mark.gpu
def test_jax_reads_shards_in_place(three_places):
    jax, _ = _jax_on_a_gpu()
    for dtype in _jax_dtypes(jax):
        host = sample(dtype, 3000)
        a = sharded.ShardedArray.from_numpy(three_places, host)
        for place in range(3):
            x = jax.dlpack.from_dlpack(a.shard(place))
            start = a.shard_offsets[place]
            np.testing.assert_array_equal(np.asarray(x), host[start:start + a.shard_sizes[place]])
            if hasattr(x, "unsafe_buffer_pointer") and a.shard_sizes[place]:
                assert x.unsafe_buffer_pointer() == _pointer(a.shard(place))


@pytest.mark.gpu
def test_jax_arrays_in(one_place):
    jax, gpu = _jax_on_a_gpu()
    import jax.numpy as jnp

    x = jax.device_put(jnp.arange(1000, dtype=jnp.float32), gpu)
    if _exported_read_only(x):
        with pytest.raises(ValueError, match=r"objects\[0\]: its producer exported it read-only"):
            sharded.ShardedArray.from_dlpack(one_place, [x])
        return
    a = sharded.ShardedArray.from_dlpack(one_place, [x])
    del x
    gc.collect()
    np.testing.assert_array_equal(a.to_numpy(), np.arange(1000, dtype=np.float32))
    assert sharded.reduce(a, "max") == np.float32(999)
