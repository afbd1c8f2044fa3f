"""numba-cuda front end: a Python operator becomes LTO-IR behind a C-ABI wrapper.

The wrappers follow the pointer convention the shim's kernels call:
    void <abi_name>(const T0* in0, ..., Tout* out, const S0* scalar0, ...)
so values of any layout can cross. numba is imported here, at the first compile, never at
package import.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
import types

import numpy as np

from ._dtypes import is_record, record_dtype, record_fields

_state_lock = threading.Lock()
# numba's typing and dispatcher state are not documented thread-safe (and numba-cuda 0.30
# declares no free-threading support): every entry point below holds this lock throughout.
_compile_lock = threading.RLock()
_target = threading.local()
_numba = None


def _load_numba():
    """Import numba-cuda once and let device helpers compile for an explicit `cc`.

    numba-cuda compiles nested device functions for the *current device's* compute
    capability, which needs a driver. While we compile, a thread-local target stands in for
    the device, so compiling needs no GPU (CI, ahead-of-time builds).
    """
    global _numba
    with _state_lock:
        if _numba is not None:
            return _numba
        try:
            import numba
            import numba.cuda
            import numba.cuda.dispatcher as dispatcher_module
            from numba import types
        except ImportError as error:
            raise ImportError(
                f"compiling an operator needs numba-cuda, which did not import ({error}): "
                f"pip install 'numba-cuda>=0.30.1'"
            ) from error

        original = dispatcher_module.get_current_device

        class _TargetDevice:
            def __init__(self, cc):
                self.compute_capability = cc

        def get_current_device():
            cc = getattr(_target, "cc", None)
            return original() if cc is None else _TargetDevice(cc)

        dispatcher_module.get_current_device = get_current_device
        # UnsupportedBytecodeError (an operator that assigns a global, say) is no NumbaError
        error_modules = [numba.core.errors]
        for name in ("numba.cuda.core.errors", "numba.cuda.errors"):
            try:
                error_modules.append(importlib.import_module(name))
            except ImportError:
                pass
        errors = [getattr(module, name) for module in error_modules
                  for name in ("NumbaError", "UnsupportedBytecodeError") if hasattr(module, name)]
        _numba = (numba, types, tuple(errors))
        return _numba


class _TargetCC:
    def __init__(self, cc):
        self.cc = cc

    def __enter__(self):
        _compile_lock.acquire()
        _target.cc = self.cc

    def __exit__(self, *exc):
        _target.cc = None
        _compile_lock.release()


def _serialised(function):
    """Runs `function` holding the compile lock (numba is entered by one thread at a time)."""

    @functools.wraps(function)
    def locked(*args, **kwargs):
        with _compile_lock:
            return function(*args, **kwargs)

    return locked


_NUMPY_OF = {
    "float32": "float32", "float64": "float64", "int32": "int32",
    "int64": "int64", "uint32": "uint32", "uint64": "uint64",
}


def numba_type(dtype: np.dtype):
    _, types, _ = _load_numba()
    return getattr(types, _NUMPY_OF[np.dtype(dtype).name])


# numba return types we can store, mapped to the array dtype they become.
_RESULT_DTYPES = {
    "float32": "float32", "float64": "float64", "float16": "float32",
    "int64": "int64", "int32": "int32", "int16": "int32", "int8": "int32",
    "uint64": "uint64", "uint32": "uint32", "uint16": "uint32", "uint8": "uint32",
}


def _describe(dtypes) -> str:
    return "(" + ", ".join(np.dtype(d).name for d in dtypes) + ")"


def _device_dispatcher(op):
    """A fresh dispatcher for the operator and every device function it calls.

    numba freezes globals when it compiles and keeps a compiled device function per
    signature; a changed global (in the operator or in a helper it calls) must be seen, so
    each compile starts from the Python functions again. Helpers may be numba device
    functions or other `sharded.op`s (closures or globals); they compile for the same target.
    """
    return _fresh_function(op.func, {})


def _fresh_callable(value, memo):
    from .op import Op

    if isinstance(value, Op):
        return _fresh_function(value.func, memo)
    py_func = getattr(value, "py_func", None)  # a numba dispatcher
    if py_func is not None and inspect.isfunction(py_func):
        return _fresh_function(py_func, memo)
    return None


def _fresh_function(func, memo):
    numba, _, _ = _load_numba()
    if id(func) in memo:
        return memo[id(func)] or func  # recursion: numba rejects it with its own message
    memo[id(func)] = None
    from .op import _global_names

    replaced = {}
    for name in _global_names(func.__code__):
        if name in func.__globals__:
            fresh = _fresh_callable(func.__globals__[name], memo)
            if fresh is not None:
                replaced[name] = fresh
    closure, changed = [], False
    for cell in func.__closure__ or ():
        try:
            fresh = _fresh_callable(cell.cell_contents, memo)
        except ValueError:  # empty cell
            fresh = None
        closure.append(types.CellType(fresh) if fresh is not None else cell)
        changed = changed or fresh is not None
    if replaced or changed:
        namespace = dict(func.__globals__)
        namespace.update(replaced)
        rebuilt = types.FunctionType(func.__code__, namespace, func.__name__, func.__defaults__,
                                     tuple(closure) if func.__closure__ else None)
        rebuilt.__qualname__ = func.__qualname__
        func_to_compile = rebuilt
    else:
        func_to_compile = func
    dispatcher = numba.cuda.jit(device=True)(func_to_compile)
    memo[id(func)] = dispatcher
    return dispatcher


def _type_error(op, arg_dtypes, error) -> Exception:
    from ._link import missing_library_error

    missing = missing_library_error(error)  # numba may wrap a library that failed to load
    if missing is not None:
        return missing
    return TypeError(
        f"operator {op.name} cannot be compiled for argument types {_describe(arg_dtypes)}: "
        f"numba says:\n{error}"
    )


def _return_type(op, argtypes, arg_dtypes, cc):
    _, _, numba_errors = _load_numba()
    dispatcher = _device_dispatcher(op)
    with _TargetCC(cc):
        try:
            return dispatcher.compile_device(tuple(argtypes)).signature.return_type
        except numba_errors as error:
            raise _type_error(op, arg_dtypes, error) from None


@_serialised
def infer_result_dtype(op, arg_dtypes, cc, tuples: bool = False) -> np.dtype:
    """The dtype the operator returns for these argument dtypes (TypeError if unsupported).

    With `tuples`, a returned tuple of numbers becomes a record dtype (an accumulator).
    """
    result = _return_type(op, [numba_type(d) for d in arg_dtypes], arg_dtypes, cc)
    if tuples and _is_tuple(result):
        names = [str(member) for member in result]
        if all(name in _RESULT_DTYPES for name in names):
            return record_dtype([_RESULT_DTYPES[name] for name in names], f"operator {op.name}'s result")
    name = str(result)
    if name not in _RESULT_DTYPES:
        where = "no accumulator" if tuples else "no array"
        raise TypeError(
            f"operator {op.name} returns {name} for argument types {_describe(arg_dtypes)}, "
            f"which {where} can hold; return a number"
            + (" or a tuple of numbers" if tuples else " or pass out= with the dtype you want")
        )
    return np.dtype(_RESULT_DTYPES[name])


def _is_tuple(numba_type_) -> bool:
    _, types, _ = _load_numba()
    return isinstance(numba_type_, types.BaseTuple)


_intrinsics = None


def _field_intrinsics():
    """numba intrinsics that read and write one field of a record behind a void pointer:
    load_field(pointer, byte_offset, numba_type) and store_field(pointer, byte_offset, value)."""
    global _intrinsics
    with _state_lock:
        if _intrinsics is not None:
            return _intrinsics
    _, types, _ = _load_numba()
    from llvmlite import ir
    try:
        from numba.cuda.extending import intrinsic
    except ImportError:  # older numba-cuda
        from numba.core.extending import intrinsic

    def field_pointer(builder, pointer, offset, value_type):
        address = builder.gep(builder.bitcast(pointer, ir.IntType(8).as_pointer()), [offset])
        return builder.bitcast(address, value_type.as_pointer())

    @intrinsic
    def load_field(typingctx, pointer, offset, field_type):
        target = field_type.instance_type

        def codegen(context, builder, signature, args):
            return builder.load(field_pointer(builder, args[0], args[1], context.get_value_type(target)))

        return target(pointer, offset, field_type), codegen

    @intrinsic
    def store_field(typingctx, pointer, offset, value):
        def codegen(context, builder, signature, args):
            builder.store(args[2], field_pointer(builder, args[0], args[1],
                                                 context.get_value_type(signature.args[2])))
            return context.get_dummy_value()

        return types.void(pointer, offset, value), codegen

    with _state_lock:
        _intrinsics = (load_field, store_field)
    return _intrinsics


@_serialised
def compile_transform(op, arg_kinds, out_dtype, cc, max_scalars: int) -> bytes:
    """LTO-IR of `csj_transform_op` for an operator whose arguments are arrays or scalars.

    arg_kinds: per operator argument, ("array", dtype) or ("scalar", dtype), in call order.
    """
    _, types, _ = _load_numba()
    dispatcher = _device_dispatcher(op)
    array_params, scalar_params, call_args = [], [], []
    signature = []
    for kind, dtype in arg_kinds:
        if kind == "array":
            name = f"in{len(array_params)}"
            array_params.append(name)
        else:
            name = f"s{len(scalar_params)}"
            scalar_params.append(name)
        call_args.append(f"{name}[0]")
    for kind, dtype in arg_kinds:
        if kind == "array":
            signature.append(types.CPointer(numba_type(dtype)))
    signature.append(types.CPointer(numba_type(out_dtype)))
    for kind, dtype in arg_kinds:
        if kind == "scalar":
            signature.append(types.CPointer(numba_type(dtype)))
    unused = [f"unused{k}" for k in range(max_scalars - len(scalar_params))]
    signature.extend([types.voidptr] * len(unused))
    params = ", ".join(array_params + ["out"] + scalar_params + unused)
    source = (
        f"def csj_transform_op({params}):\n"
        f"    out[0] = _cast(_op({', '.join(call_args)}))\n"
    )
    namespace = {"_op": dispatcher, "_cast": getattr(np, np.dtype(out_dtype).name)}
    return _compile_wrapper(source, op.name, "csj_transform_op", namespace, signature, cc, op,
                            [dtype for _, dtype in arg_kinds])


def _compile_wrapper(source: str, name: str, abi_name: str, namespace: dict, signature, cc,
                     op, arg_dtypes) -> bytes:
    numba, _, numba_errors = _load_numba()
    exec(compile(source, f"<sharded {abi_name} wrapper for {name}>", "exec"), namespace)
    with _TargetCC(cc):
        try:
            ltoir, _ = numba.cuda.compile(
                namespace[abi_name], tuple(signature), device=True, abi="c",
                abi_info={"abi_name": abi_name}, output="ltoir", cc=cc,
            )
        except numba_errors as error:
            raise _type_error(op, arg_dtypes, error) from None
    return bytes(ltoir)


@_serialised
def infer_map_dtype(map_spec, in_dtype, cc) -> np.dtype:
    """Accumulator dtype (a record for a map that returns a tuple) a map specification
    produces from `in_dtype`."""
    kind, map_op = map_spec
    if kind == "value":
        return np.dtype(in_dtype)
    if kind == "predicate":
        return np.dtype(np.int64)
    if kind == "call_index":
        return infer_result_dtype(map_op, [in_dtype, np.dtype(np.int64)], cc, tuples=True)
    return infer_result_dtype(map_op, [in_dtype], cc, tuples=True)


_MAP_CALLS = {"call": "_map(value[0])", "call_index": "_map(value[0], index)"}


def _compile_record_reduction(op, map_spec, in_dtype, acc_dtype, cc) -> tuple[bytes, bytes]:
    """compile_reduction for a record (tuple) accumulator: the wrappers read the fields into
    a tuple, call the operator and store each field of the tuple it returns."""
    _, types, _ = _load_numba()
    load_field, store_field = _field_intrinsics()
    fields = record_fields(acc_dtype)
    namespace = {"_load": load_field, "_store": store_field}
    for index, (_, field) in enumerate(fields):
        namespace[f"_t{index}"] = numba_type(field)

    def as_tuple(pointer):
        return "(" + "".join(f"_load({pointer}, {offset}, _t{index}), "
                             for index, (offset, _) in enumerate(fields)) + ")"

    stores = "".join(f"    _store(out, {offset}, _t{index}(r[{index}]))\n"
                     for index, (offset, _) in enumerate(fields))
    tuple_type = types.Tuple([numba_type(field) for _, field in fields])
    returned = _return_type(op, [tuple_type, tuple_type], [acc_dtype, acc_dtype], cc)
    if not (_is_tuple(returned) and len(returned) == len(fields)):
        raise TypeError(f"operator {op.name} returns {returned} for two {len(fields)}-tuples of "
                        f"{_describe([field for _, field in fields])}; it must return a tuple "
                        f"of {len(fields)} numbers")
    op_source = f"def csj_op(a, b, out):\n    r = _op({as_tuple('a')}, {as_tuple('b')})\n{stores}"
    op_ir = _compile_wrapper(op_source, op.name, "csj_op", dict(namespace, _op=_device_dispatcher(op)),
                             (types.voidptr, types.voidptr, types.voidptr), cc, op, [acc_dtype, acc_dtype])
    kind, map_op = map_spec
    if kind not in _MAP_CALLS:
        raise TypeError(f"a tuple accumulator needs a map operator that builds the tuple from each "
                        f"element (transform_reduce), not a {kind!r} map")
    map_source = f"def csj_map(value, index, out):\n    r = {_MAP_CALLS[kind]}\n{stores}"
    map_ir = _compile_wrapper(map_source, map_op.name, "csj_map",
                              dict(namespace, _map=_device_dispatcher(map_op)),
                              (types.CPointer(numba_type(in_dtype)), types.int64, types.voidptr), cc,
                              map_op, [in_dtype])
    return op_ir, map_ir


@_serialised
def compile_reduction(op, map_spec, in_dtype, acc_dtype, cc) -> tuple[bytes, bytes]:
    """LTO-IR of `csj_op` (acc, acc -> acc) and `csj_map` (input -> acc) for the reduce and
    scan modules.

    map_spec: ("value", None) casts each element; ("call", op) applies a map operator;
    ("call_index", op) applies map(value, global_index); ("predicate", op) gives 1 where
    op(value) is true, else 0.
    """
    if is_record(acc_dtype):
        return _compile_record_reduction(op, map_spec, in_dtype, np.dtype(acc_dtype), cc)
    _, types, _ = _load_numba()
    acc_type = types.CPointer(numba_type(acc_dtype))
    in_type = types.CPointer(numba_type(in_dtype))
    cast = getattr(np, np.dtype(acc_dtype).name)
    op_source = "def csj_op(a, b, out):\n    out[0] = _cast(_op(a[0], b[0]))\n"
    op_ir = _compile_wrapper(op_source, op.name, "csj_op",
                             {"_op": _device_dispatcher(op), "_cast": cast},
                             (acc_type, acc_type, acc_type), cc, op, [acc_dtype, acc_dtype])
    kind, map_op = map_spec
    body = {
        "value": "_cast(value[0])",
        "call": "_cast(_map(value[0]))",
        "call_index": "_cast(_map(value[0], index))",
        "predicate": "_cast(1) if _map(value[0]) else _cast(0)",
    }[kind]
    map_source = f"def csj_map(value, index, out):\n    out[0] = {body}\n"
    namespace = {"_cast": cast}
    if map_op is not None:
        namespace["_map"] = _device_dispatcher(map_op)
    map_ir = _compile_wrapper(map_source, (map_op or op).name, "csj_map", namespace,
                              (in_type, types.int64, acc_type), cc, map_op or op, [in_dtype])
    return op_ir, map_ir
