"""sharded.transform: out[i] = op(*args[i]) on every place."""

from __future__ import annotations

import struct

import numpy as np

from .. import _shim, compiler
from .._collective import begin, collective
from .._dtypes import as_dtype, as_flag, exact_cast, is_scalar, scalar_dtype
from .._layout import layout_of
from ..array import ShardedArray, check_out
from ..compiler import INDEX_MAP, VALUE_MAP, check_transform_counts, is_indexed_transform, kernel_libraries
from ..op import Op, as_op, identity_or_none
from ..ops import Descriptor
from ..scalar import DeviceScalar

# keyed by the dtype itself: dtype.name is computed anew (in Python) at every read
_PACK = {np.dtype(name): struct.Struct(layout) for name, layout in (
    ("float32", "<f4x"), ("float64", "<d"), ("int32", "<i4x"), ("int64", "<q"),
    ("uint32", "<I4x"), ("uint64", "<Q"))}


# what _remember_plan's plans are made of (the shim's own types, not stand-ins)
_SHIM_GROUP, _SHIM_LIBRARY = _shim.PlaceGroup, _shim.KernelLibrary

# an operator's plan entry after one full-path call: no plan yet (see _remember_plan)
_SEEN = (None, None, None, None)

# prepare's device scalars when there are none (slots, values): run tests the slots
_NO_DEVICE = ((), ())


def pack_scalars(values, dtypes) -> bytes:
    """One 8-byte slot per runtime scalar, in the dtype the operator sees."""
    if not values:
        return b""
    try:
        return b"".join(_PACK[dtype].pack(dtype.type(value)) for value, dtype in zip(values, dtypes))
    except (OverflowError, struct.error) as error:
        raise ValueError(f"args: a scalar does not fit its dtype ({error})") from None


def scalar_packer(dtype: np.dtype):
    """`pack(value) -> bytes`: the 8-byte slot of one scalar already of `dtype`."""
    return _PACK[dtype].pack


@collective("transform")
def transform(op, *args, out: ShardedArray | None = None, with_index: bool = False) -> ShardedArray:
    """out[i] = op(args[0][i], args[1][i], ...) for every element, on every place.

    Arrays (1 to 4, any supported dtypes, same group and shard sizes) are read elementwise;
    scalars among `args` are broadcast runtime arguments (a new value never recompiles). A
    sharded.DeviceScalar of the arrays' group is such a scalar read on the device, each place
    its own copy, so a value a reduction wrote there (`reduce(..., out=s)`) needs no host
    round trip.
    The result has out's dtype when `out` is given (the value is cast), else the operator's
    return type. `out` may alias an input. Returns at once (stream-ordered).

    Records: an element of a record array reaches the operator as a tuple, a named one when
    its fields have names (`p.x` or `p[0]`); an operator returning a tuple of 1 to 4 numbers
    writes a record array (fields f0, f1, ..., or an argument's names when it returns that
    argument), or the fields of `out`'s record dtype, in order. With `with_index`, the
    operator also receives each element's global index (int64) as its last argument.

    >>> c = transform(lambda x, y, a: a * x + y, a, b, 2.0)             # doctest: +SKIP
    >>> transform(sharded.ops.axpy(2.0), a, b, out=b)                   # doctest: +SKIP
    >>> polar = transform(lambda p: (math.hypot(p.x, p.y), math.atan2(p.y, p.x)), points)  # doctest: +SKIP
    """
    if isinstance(op, Descriptor):
        if with_index:
            raise TypeError("with_index: descriptor operators take no index; pass a Python operator")
        return _transform_descriptor(op, args, out)
    if out is None or (with_index is not True and with_index is not False):
        return run(prepare(op, args, out, with_index), out)
    # A call that repeats the kinds of the operator's last one launches from its plan, made
    # for the identity its kernels were compiled for (compiler.libraries_made_for).
    op = as_op(op)
    plan = op._transform_plan
    if (plan is not None and plan[3] is not None and plan[0] is with_index and plan[1] == compiler._generation
            and plan[2] == identity_or_none(op) and plan[3].launch(args, out)):
        return out
    prepared = prepare(op, args, out, with_index)
    run(prepared, out)
    _remember_plan(op, args, out, prepared, with_index)
    return out


def prepare(op, args, out: ShardedArray | None, with_index: bool = False, request: np.dtype | None = None):
    """The checks and the compile of `transform`, nothing run: (arrays, packed scalars, out
    dtype, libraries, indexed, (the DeviceScalars' slots, the DeviceScalars)), for `run`.
    Algorithms that chain a transform with another kernel compile both before either
    writes. `request`: the result dtype wanted when `out` is None (None: the operator's
    return type)."""
    if with_index is not False and with_index is not True:
        with_index = as_flag(with_index, "with_index")
    op = as_op(op)
    op.check_arity(len(args) + with_index, "transform (with the index)" if with_index else "transform")
    arrays, scalars, scalar_dtypes, kinds = [], [], [], []
    on_device = []  # (scalar slot, argument position, DeviceScalar)
    records = False  # an array of records: the indexed module (is_indexed_transform)
    group = sizes = None  # array 0's; `matched` stays True while every array shares them
    matched = True
    for position, value in enumerate(args):
        if isinstance(value, ShardedArray):
            if group is None:
                group, sizes = value._group, value._shard_sizes
            elif value._group is not group or value._shard_sizes != sizes:
                matched = False
            arrays.append(value)
            dtype = value._dtype
            kinds.append(("array", dtype))
            records = records or dtype.names is not None
        elif is_scalar(value):
            dtype = scalar_dtype(value, f"args[{position}]")
            scalars.append(value)
            scalar_dtypes.append(dtype)
            kinds.append(("scalar", dtype))
        elif isinstance(value, DeviceScalar):  # its slot holds the copy's address, per place
            on_device.append((len(scalars), position, value))
            scalars.append(0)
            scalar_dtypes.append(value.dtype)
            kinds.append(("scalar", value.dtype))
        else:
            raise TypeError(
                f"args[{position}]: expected a ShardedArray or a scalar, got {type(value).__name__}"
            )
    if not arrays:
        raise TypeError("transform: at least one argument must be a ShardedArray")
    check_transform_counts(len(arrays), len(scalars), "args", "args")
    first = arrays[0]
    if not matched:  # which array differs, and how, in argument order
        for index, array in enumerate(arrays[1:], 1):
            if array.group is not first.group:
                raise ValueError(f"args: array {index} belongs to another PlaceGroup than array 0")
            if array.shard_sizes != first.shard_sizes:
                raise ValueError(
                    f"args: array {index} has shard sizes {array.shard_sizes}, array 0 has {first.shard_sizes}"
                )
    for _, position, value in on_device:
        if value.group is not first.group:
            raise ValueError(f"args[{position}]: a DeviceScalar of another PlaceGroup than the arrays'")
    if out is not None:
        check_out(out, first)
        out_request = out._dtype
    else:
        out_request = request
    out_dtype, libraries = kernel_libraries(op, "transform", tuple(kinds), out_request, group.archs,
                                            INDEX_MAP if with_index else VALUE_MAP)
    packed = pack_scalars(scalars, scalar_dtypes) if scalars else b""
    device = (([slot for slot, _, _ in on_device], [value for _, _, value in on_device]) if on_device
              else _NO_DEVICE)
    # is_indexed_transform's answer, from what the loop saw (its cached form hashes the kinds)
    return arrays, packed, out_dtype, libraries, with_index or records or out_dtype.names is not None, device


def run(prepared, out: ShardedArray | None) -> ShardedArray:
    """Launches a transform `prepare` checked and compiled; allocates `out` when None."""
    arrays, packed, out_dtype, libraries, indexed, (slots, values) = prepared
    if out is None:
        out = ShardedArray._new_like(arrays[0], out_dtype)
    if out._group._distributed:  # every rank's checks passed, and it makes the same call
        begin(out.group, "transform", ("shard sizes", out.shard_sizes),
              ("dtypes", tuple(array.dtype.str for array in arrays) + (out.dtype.str,)))
    if slots:
        _shim.transform(libraries, [array._impl for array in arrays], out._impl, packed, indexed, slots,
                        [value._impl for value in values])
    else:
        _shim.transform(libraries, [array._impl for array in arrays], out._impl, packed, indexed)
    return out


def _remember_plan(op: Op, args: tuple, out: ShardedArray, prepared, with_index: bool) -> None:
    """Keeps on `op` what a call with these arguments' kinds needs to launch again (the shim's
    TransformPlan): arrays of this group and dtypes, scalars of these types. A call whose
    arguments match it skips `prepare`; anything else takes the full path. Made at an
    operator's second full-path call in a row: the first only marks the operator, so one made
    anew at every call (a lambda with a closure, written in the loop) pays one attribute write.
    Not for the arrays of from_mpi groups (their calls agree across ranks first) nor DeviceScalar
    arguments."""
    if op._transform_plan is None or op._transform_plan[3] is not None:  # new, or its plan declined
        op._transform_plan = _SEEN
        return
    _, _, _, libraries, indexed, (slots, _) = prepared
    group = out._group
    made_for = compiler.libraries_made_for(op, libraries)
    if made_for is None or slots or group._distributed or type(out) is not ShardedArray \
            or type(group._impl) is not _SHIM_GROUP:
        return
    for library in libraries:
        if type(library) is not _SHIM_LIBRARY:
            return
    kinds = []
    for value in args:
        kind = type(value)
        if kind is ShardedArray:
            kinds.append(("array", value._dtype))
        elif kind is float:  # a float64 slot, as scalar_dtype gives it
            kinds.append(("float", None))
        elif kind is int:  # an int64 slot
            kinds.append(("int", None))
        elif isinstance(value, np.generic) and kind is value.dtype.type:
            kinds.append(("numpy", kind, value.dtype.name))
        else:  # a subclass of an array or a number: the plan matches exact types only
            return
    generation, identity = made_for
    op._transform_plan = (with_index, generation, identity,
                          _shim.TransformPlan(ShardedArray, group, out._dtype, kinds, list(libraries), indexed))


def launch(op: Op, arrays: list, kinds: tuple, packed: bytes, out: ShardedArray) -> ShardedArray:
    """`transform(op, ...)` for a caller that made its checks itself, once per operand types
    (ShardedArray's operators): `arrays` share a group and shard sizes, `kinds` are the
    operator's (kind, dtype) arguments in order, `packed` the scalars (pack_scalars), `out`
    is allocated. Compiles or fetches the kernel, launches it, returns `out`."""
    out_dtype, libraries = kernel_libraries(op, "transform", kinds, out.dtype, arrays[0].group.archs, VALUE_MAP)
    return run((arrays, packed, out_dtype, libraries, is_indexed_transform(kinds, out_dtype, VALUE_MAP), _NO_DEVICE),
               out)


def launch_builtin(name: str, arrays: list, out: ShardedArray, scalars: bytes = b"") -> ShardedArray:
    """The built-in transform `name` (a descriptor's) on arrays already checked; returns `out`."""
    if out.group._distributed:  # every rank's checks passed, and it makes the same call
        begin(out.group, "transform", ("shard sizes", out.shard_sizes), ("ops", name), ("dtype", out.dtype.str))
    _shim.transform_builtin(getattr(_shim.BuiltinOp, name), [array._impl for array in arrays], out._impl, scalars)
    return out


def _transform_descriptor(descriptor: Descriptor, args, out):
    if len(args) != descriptor.arity:
        raise TypeError(f"ops.{descriptor.name} takes {descriptor.arity} array argument"
                        f"{'' if descriptor.arity == 1 else 's'}, got {len(args)}")
    for position, value in enumerate(args):
        if not isinstance(value, ShardedArray):
            raise TypeError(f"args[{position}]: expected a ShardedArray, got {type(value).__name__}")
    first = args[0]
    dtype = first.dtype
    layout = layout_of(dtype)
    if layout.is_record:
        raise TypeError(f"args[0]: ops.{descriptor.name} works on numbers, not records "
                        f"({layout.description}); pass a Python operator")
    for position, value in enumerate(args):
        if value.dtype != dtype:
            raise TypeError(f"args[{position}]: dtype {value.dtype} differs from args[0]'s {dtype}; "
                            f"descriptor operators need one dtype (use a Python operator to mix)")
    out = check_out(out, first)
    if out is not None and out.dtype != dtype:
        raise TypeError(f"out: dtype {out.dtype} differs from the inputs' {dtype}")
    scalars = b""
    if descriptor.scalar is not None:  # checked before anything is allocated
        value = exact_cast(descriptor.scalar, dtype, f"ops.{descriptor.name}")
        scalars = pack_scalars([value], [as_dtype(dtype)])
    if out is None:
        out = ShardedArray._new_like(first, dtype)
    return launch_builtin(descriptor.name, args, out, scalars)
