"""numba-cuda front end: a Python operator becomes LTO-IR behind a C-ABI wrapper.

The wrappers follow the pointer convention the shim's kernels call:
    void <abi_name>(const T0* in0, ..., Tout* out, const S0* scalar0, ...)
so values of any layout can cross. Records (numpy structured dtypes) reach operators as
tuples — named tuples when their fields have names (`p.x` or `p[0]`) — and the wrappers
read and write them field by field; how a value of each layout is typed, read and written
is the layout's (_layout); wrappers of the indexed modules also address their elements
themselves (global base + global index * itemsize). numba is imported here, at the first
compile, never at package import.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
import types

import numpy as np

from ._dtypes import record_dtype
from ._layout import describe_dtype, layout_of

_state_lock = threading.Lock()
# numba's typing and dispatcher state are guarded by numba's own compiler lock (an RLock its
# compile paths take): every entry point below holds that lock, and only that one, while it
# enters numba. Keys, fingerprints, nvJitLink and the caches run outside it, so one slow
# operator never holds up another thread's key work or link.
_compile_lock = None
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
        global _compile_lock
        try:
            from numba.cuda.core.compiler_lock import global_compiler_lock as _compile_lock
        except ImportError:  # a numba-cuda without its own: numba's
            from numba.core.compiler_lock import global_compiler_lock as _compile_lock
        from . import _ufuncs

        _ufuncs.install()
        _numba = (numba, types, tuple(errors))
        return _numba


class _TargetCC:
    """Within it, numba compiles this thread's device functions for `cc` (no GPU needed)."""

    def __init__(self, cc):
        self.cc = cc

    def __enter__(self):
        self.previous = getattr(_target, "cc", None)
        _target.cc = self.cc

    def __exit__(self, *exc):
        _target.cc = self.previous


def _serialised(function):
    """Runs `function` holding numba's compiler lock (numba is entered by one thread at a
    time; the lock is re-entrant, and numba's own compile calls take it again)."""

    @functools.wraps(function)
    def locked(*args, **kwargs):
        _load_numba()
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


def value_type(dtype: np.dtype):
    """The numba type of one value of `dtype` as an operator receives it."""
    return layout_of(dtype).value_type()


# numba return types we can store, mapped to the array dtype they become.
_RESULT_DTYPES = {
    "float32": "float32", "float64": "float64", "float16": "float32",
    "int64": "int64", "int32": "int32", "int16": "int32", "int8": "int32",
    "uint64": "uint64", "uint32": "uint32", "uint16": "uint32", "uint8": "uint32",
}


def _describe(dtypes) -> str:
    """Argument types for a message: dtypes (records by their fields), or numba types (what
    an operator returned, passed on to another: a sort's key results)."""
    return "(" + ", ".join(describe_dtype(d) if _is_dtype(d) else str(d) for d in dtypes) + ")"


def _is_dtype(value) -> bool:
    return isinstance(value, (np.dtype, type, str))


def _device_dispatcher(op, cc):
    """A fresh dispatcher for the operator and every device function it calls.

    numba freezes globals when it compiles and keeps a compiled device function per
    signature; a changed global (in the operator or in a helper it calls) must be seen, so
    each compile starts from the Python functions again. Helpers may be plain Python
    functions, numba device functions or other `sharded.op`s, reached by name, through a
    closure or through a module (`helpers.h(x)`, also via a local alias); a numba helper
    keeps its own settings (fastmath, opt, ...) and declared signatures. They compile for
    the same target.
    """
    return _fresh_function(op.func, {}, cc)


# the cuda.jit options a rebuilt helper keeps (its targetoptions that jit() takes back)
_HELPER_OPTIONS = ("device", "inline", "forceinline", "link", "debug", "opt", "lineinfo", "fastmath",
                   "lto", "extensions")


def _fresh_value(value, attributes, memo, cc):
    """A rebuilt stand-in for a helper (a fresh dispatcher), for a module holding helpers (a
    shadow module whose helper attributes are rebuilt), or None when `value` needs none.
    Helpers are `sharded.op`s, numba device functions, and plain Python functions of the
    user's (a library's functions, numpy's among them, are numba's to type)."""
    from .op import Op, is_library_module, numba_helper_function

    if isinstance(value, Op):
        return _fresh_function(value.func, memo, cc)
    py_func = numba_helper_function(value)
    if py_func is not None:
        return _fresh_function(py_func, memo, cc, value)
    if inspect.isfunction(value) and not is_library_module(getattr(value, "__module__", None) or ""):
        return _fresh_function(value, memo, cc)
    # a library module holds no helpers, and a shadow of it would hide it from numba's typing
    if isinstance(value, types.ModuleType) and not is_library_module(value.__name__):
        return _fresh_module(value, attributes, memo, cc)
    return None


def _fresh_module(module, attributes, memo, cc):
    if id(module) in memo:
        return memo[id(module)]
    memo[id(module)] = None  # a module cycle reads the original the second time round
    replaced = {}
    for name in attributes:
        value = module.__dict__.get(name)
        if value is not None:
            fresh = _fresh_value(value, attributes, memo, cc)
            if fresh is not None:
                replaced[name] = fresh
    if not replaced:
        return None
    shadow = types.ModuleType(module.__name__, module.__doc__)
    shadow.__dict__.update(module.__dict__)
    shadow.__dict__.update(replaced)
    memo[id(module)] = shadow
    return shadow


def _fresh_function(func, memo, cc, declared=None):
    """A new numba device function from `func`'s code, its helpers rebuilt first. `declared`:
    the dispatcher `func` came from, whose options and signatures the rebuild keeps."""
    numba, _, _ = _load_numba()
    if id(func) in memo:
        return memo[id(func)] or func  # recursion: numba rejects it with its own message
    memo[id(func)] = None
    from .op import _code_names

    global_names, attributes = _code_names(func.__code__)
    replaced = {}
    for name in global_names:
        if name in func.__globals__:
            fresh = _fresh_value(func.__globals__[name], attributes, memo, cc)
            if fresh is not None:
                replaced[name] = fresh
    closure, changed = [], False
    for cell in func.__closure__ or ():
        try:
            fresh = _fresh_value(cell.cell_contents, attributes, memo, cc)
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
    if declared is None:
        dispatcher = numba.cuda.jit(device=True)(func_to_compile)
    else:
        options = {name: declared.targetoptions[name] for name in _HELPER_OPTIONS
                   if name in declared.targetoptions}
        options["device"] = True
        if getattr(declared, "_can_compile", True):
            dispatcher = numba.cuda.jit(**options)(func_to_compile)
        else:  # declared signatures: compiled now, as the original was, and nothing else
            with _TargetCC(cc):
                dispatcher = numba.cuda.jit(list(declared.nopython_signatures), **options)(func_to_compile)
    memo[id(func)] = dispatcher
    return dispatcher


def _type_error(op, arg_dtypes, error) -> Exception:
    from ._link import missing_library_error

    missing = missing_library_error(error)  # numba may wrap a library that failed to load
    if missing is not None:
        return missing
    return TypeError(
        f"operator {op.name} cannot be compiled for argument types {_describe(arg_dtypes)}: "
        f"numba says:\n{error}{_shadowed_fields_hint(arg_dtypes)}"
    )


# Attributes numba's tuples resolve as their methods before a named tuple's fields of the same
# name (CPython's namedtuple lets the field win): `p.index` is tuple.index in device code.
_TUPLE_METHODS = ("index",)


def _shadowed_fields_hint(arg_dtypes) -> str:
    hints = []
    for dtype in filter(_is_dtype, arg_dtypes):
        for position, name in enumerate(layout_of(dtype).field_names or ()):
            if name in _TUPLE_METHODS:
                hints.append(f"\n(field {name!r} of {describe_dtype(dtype)}: numba reads p.{name} as "
                             f"the tuple method; write p[{position}])")
    return "".join(dict.fromkeys(hints))


def _return_type(op, argtypes, arg_dtypes, cc, dispatcher=None):
    """The numba type the operator returns for `argtypes`, typed with `dispatcher` (a fresh
    one by default; a caller that goes on to compile a wrapper passes the one it uses, so the
    operator is typed once)."""
    _, types, numba_errors = _load_numba()
    if dispatcher is None:
        dispatcher = _device_dispatcher(op, cc)
    with _TargetCC(cc):
        try:
            returned = dispatcher.compile_device(tuple(argtypes)).signature.return_type
        # numba 0.6x unifies a named tuple with a plain one by raising NotImplementedError
        except (*numba_errors, NotImplementedError) as error:
            raise _type_error(op, arg_dtypes, error) from None
    if returned == types.none:  # numba's type for a function that never returns a value
        raise TypeError(f"operator {op.name} returns no value for argument types {_describe(arg_dtypes)}: "
                        f"every path through it returns None, raises an exception or ends without "
                        f"`return`; "
                        f"it must return a number (or a tuple of numbers)")
    return returned


@_serialised
def infer_result_dtype(op, arg_dtypes, cc, tuples: bool = False, holder: str = "array") -> np.dtype:
    """The dtype the operator returns for these argument dtypes (TypeError if unsupported).

    With `tuples`, a returned tuple of numbers becomes a record dtype (an accumulator, or a
    record array): fields f0, f1, ..., or the names of a record argument returned as is.
    """
    _, types, _ = _load_numba()
    result = _return_type(op, [value_type(d) for d in arg_dtypes], arg_dtypes, cc)
    if tuples and _is_tuple(result):
        names = [str(types.unliteral(member)) for member in result]  # a constant 1 is int64
        if all(name in _RESULT_DTYPES for name in names):
            record = record_dtype([_RESULT_DTYPES[name] for name in names], f"operator {op.name}'s result")
            fields = getattr(getattr(result, "instance_class", None), "_fields", None)
            if fields is not None and len(fields) == len(names):  # a record of ours, names kept
                record = np.dtype(list(zip(fields, [record.fields[name][0] for name in record.names])),
                                  align=True)
            return record
    name = str(result)
    if name not in _RESULT_DTYPES:
        raise TypeError(
            f"operator {op.name} returns {name} for argument types {_describe(arg_dtypes)}, "
            f"which no {holder} can hold; return a number"
            + (" or a tuple of 1 to 4 numbers" if tuples else " or pass out= with the dtype you want")
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

    @intrinsic
    def element_at(typingctx, pointer, index, itemsize):
        """pointer + index * itemsize, wrapping (a global base may lie below address 0)."""
        def codegen(context, builder, signature, args):
            offset = builder.mul(args[1], context.cast(builder, args[2], signature.args[2], types.int64))
            address = builder.gep(builder.bitcast(args[0], ir.IntType(8).as_pointer()), [offset])
            return builder.bitcast(address, context.get_value_type(types.voidptr))

        return types.voidptr(pointer, index, itemsize), codegen

    with _state_lock:
        _intrinsics = (load_field, store_field, element_at)
    return _intrinsics


def _record_namespace() -> dict:
    load_field, store_field, element_at = _field_intrinsics()
    return {"_load": load_field, "_store": store_field, "_at": element_at}


def _check_returns(op, returned, out_dtype, arg_dtypes, where: str) -> None:
    """TypeError unless `returned` (a numba type) can be stored as `out_dtype`: a tuple of as
    many numbers for a record, a number otherwise."""
    mismatch = layout_of(out_dtype).return_mismatch(returned, where)
    if mismatch is not None:
        raise TypeError(f"operator {op.name} returns {returned} for argument types "
                        f"{_describe(arg_dtypes)}{mismatch}")


@_serialised
def compile_transform(op, arg_kinds, out_dtype, cc, max_scalars: int) -> bytes:
    """LTO-IR of `csj_transform_op` for an operator whose arguments are arrays or scalars.

    arg_kinds: per operator argument, ("array", dtype) or ("scalar", dtype), in call order.
    """
    _, types, _ = _load_numba()
    dispatcher = _device_dispatcher(op, cc)
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
    arg_dtypes = [dtype for _, dtype in arg_kinds]
    returned = _return_type(op, [value_type(d) for d in arg_dtypes], arg_dtypes, cc, dispatcher)
    _check_returns(op, returned, out_dtype, arg_dtypes, "out")
    namespace = {"_op": dispatcher, "_cast": getattr(np, np.dtype(out_dtype).name)}
    return _compile_wrapper(source, op.name, "csj_transform_op", namespace, signature, cc, op,
                            arg_dtypes)


@_serialised
def compile_transform_indexed(op, arg_kinds, out_dtype, cc, max_scalars: int, with_index: bool) -> bytes:
    """LTO-IR of `csj_transform_indexed_op` (transform_indexed.cu): arrays of any layout
    (records), addressed from their global bases; `with_index` passes the operator each
    element's global index after the other arguments."""
    _, types, _ = _load_numba()
    dispatcher = _device_dispatcher(op, cc)
    namespace = dict(_record_namespace(), _op=dispatcher)
    arrays, scalars, call_args, scalar_types = [], [], [], []
    for kind, dtype in arg_kinds:
        if kind == "array":
            name = f"in{len(arrays)}"
            arrays.append(name)
            call_args.append(layout_of(dtype).read_source(f"_at({name}, index, {dtype.itemsize})",
                                                          f"_in{len(arrays)}_", namespace))
        else:
            name = f"s{len(scalars)}"
            scalars.append(name)
            scalar_types.append(types.CPointer(numba_type(dtype)))
            call_args.append(f"{name}[0]")
    if with_index:
        call_args.append("index")
    arg_dtypes = [dtype for _, dtype in arg_kinds] + ([np.dtype(np.int64)] if with_index else [])
    returned = _return_type(op, [value_type(d) for d in arg_dtypes], arg_dtypes, cc, dispatcher)
    _check_returns(op, returned, out_dtype, arg_dtypes, "the result")
    unused = [f"unused{k}" for k in range(max_scalars - len(scalars))]
    params = ", ".join(arrays + ["out"] + scalars + unused + ["index"])
    out_layout = layout_of(out_dtype)
    source = (f"def csj_transform_indexed_op({params}):\n"
              f"    r = _op({', '.join(call_args)})\n"
              f"    target = _at(out, index, {out_layout.itemsize})\n"
              + out_layout.write_source("target", "r", "_out_", namespace))
    signature = ([types.voidptr] * (len(arrays) + 1) + scalar_types + [types.voidptr] * len(unused)
                 + [types.int64])
    return _compile_wrapper(source, op.name, "csj_transform_indexed_op", namespace, signature, cc, op,
                            arg_dtypes)


def _compile_wrapper(source: str, name: str, abi_name: str, namespace: dict, signature, cc,
                     op, arg_dtypes) -> bytes:
    numba, _, numba_errors = _load_numba()
    exec(compile(source, f"<sharded {abi_name} wrapper for {name}>", "exec"), namespace)
    with _TargetCC(cc):
        try:
            ltoir, _ = numba.cuda.compile(
                namespace[abi_name], signature if _is_signature(signature) else tuple(signature),
                device=True, abi="c",
                abi_info={"abi_name": abi_name}, output="ltoir", cc=cc,
            )
        except (*numba_errors, NotImplementedError) as error:
            raise _type_error(op, arg_dtypes, error) from None
    return bytes(ltoir)


def _is_signature(signature) -> bool:
    """A numba signature with its return type (the wrapper returns a value), rather than the
    argument types of a wrapper that returns nothing."""
    return hasattr(signature, "return_type")


@_serialised
def compile_compare(op, key_op, descending: bool, dtype, cc) -> bytes:
    """LTO-IR of `int csj_less(const void* a, const void* b)` (merge_sort_jit.cu): nonzero
    when element *a goes strictly before *b, that is `op(key(x), key(y))` (without a key:
    `op(x, y)`), or `op(key(y), key(x))` when `descending` (the reverse order, which keeps
    equal elements in their order: a stable descending sort). The elements (records field by
    field) are read behind void pointers; `op` must return a bool."""
    _, types, _ = _load_numba()
    layout = layout_of(dtype)
    compare = _device_dispatcher(op, cc)
    namespace = dict(_record_namespace(), _compare=compare)
    x, y = layout.read_source("a", "_x_", namespace), layout.read_source("b", "_y_", namespace)
    element = layout.value_type()
    if key_op is None:
        argtypes, arg_dtypes = [element, element], [dtype, dtype]
    else:
        key = _device_dispatcher(key_op, cc)
        namespace["_key"] = key
        key_type = _return_type(key_op, [element], [dtype], cc, key)
        argtypes = arg_dtypes = [key_type, key_type]
        x, y = f"_key({x})", f"_key({y})"
    returned = types.unliteral(_return_type(op, argtypes, arg_dtypes, cc, compare))
    if returned != types.boolean:
        raise TypeError(f"operator {op.name} returns {returned} for argument types {_describe(arg_dtypes)}; "
                        f"a comparator returns a bool: True when its first argument goes strictly "
                        f"before its second (x < y sorts ascending)")
    first, second = (y, x) if descending else (x, y)
    source = (f"def csj_less(a, b):\n"
              f"    return 1 if _compare({first}, {second}) else 0\n")
    signature = types.int32(types.voidptr, types.voidptr)
    return _compile_wrapper(source, op.name, "csj_less", namespace, signature, cc, op, arg_dtypes)


@_serialised
def compile_equal(op, dtype, cc) -> bytes:
    """LTO-IR of `int csj_equal(const void* a, const void* b)` (by_key_jit.cu): nonzero when
    keys *a and *b belong to one run, `op(x, y)` (a bool or an integer, which the by-key
    algorithms check before they compile)."""
    _, types, _ = _load_numba()
    layout = layout_of(dtype)
    equal = _device_dispatcher(op, cc)
    namespace = dict(_record_namespace(), _equal=equal)
    x, y = layout.read_source("a", "_x_", namespace), layout.read_source("b", "_y_", namespace)
    source = f"def csj_equal(a, b):\n    return 1 if _equal({x}, {y}) else 0\n"
    signature = types.int32(types.voidptr, types.voidptr)
    return _compile_wrapper(source, op.name, "csj_equal", namespace, signature, cc, op, [dtype, dtype])


def _check_predicate(op, argtypes, arg_dtypes, cc, dispatcher, argument: str) -> None:
    """TypeError naming `argument` unless the predicate returns a bool or an integer."""
    _, types, _ = _load_numba()
    returned = types.unliteral(_return_type(op, argtypes, arg_dtypes, cc, dispatcher))
    if returned != types.boolean and not isinstance(returned, types.Integer):
        raise TypeError(f"{argument}: predicate {op.name} returns {returned} for argument types "
                        f"{_describe(arg_dtypes)}; a predicate returns a bool (True keeps the element)")


@_serialised
def compile_select(first, second, with_index: bool, dtype, cc) -> bytes:
    """LTO-IR of `int csj_select_class(const void* element, long long index)` (select_jit.cu):
    the element's class, 0 where `first(x)` (or `first(x, index)` with `with_index`), else 1;
    with a `second` predicate (three_way_partition), 1 where `second(x)` and 2 for the rest.
    The element (a record field by field) is read behind a void pointer; each predicate
    must return a bool or an integer (TypeError naming it otherwise)."""
    _, types, _ = _load_numba()
    layout = layout_of(dtype)
    namespace = dict(_record_namespace())
    element = layout.value_type()
    argtypes = [element] + ([types.int64] if with_index else [])
    arg_dtypes = [dtype] + ([np.dtype(np.int64)] if with_index else [])
    call = "(x, index)" if with_index else "(x)"
    lines = [f"def csj_select_class(value, index):\n",
             f"    x = {layout.read_source('value', '_x_', namespace)}\n"]
    for name, predicate, argument in (("_first", first, "first"), ("_second", second, "second")):
        if predicate is None:
            continue
        dispatcher = _device_dispatcher(predicate, cc)
        namespace[name] = dispatcher
        _check_predicate(predicate, argtypes, arg_dtypes, cc, dispatcher, "pred" if second is None else argument)
        lines.append(f"    if {name}{call}:\n        return {0 if name == '_first' else 1}\n")
    lines.append(f"    return {1 if second is None else 2}\n")
    signature = types.int32(types.voidptr, types.int64)
    return _compile_wrapper("".join(lines), first.name, "csj_select_class", namespace, signature, cc, first,
                            arg_dtypes)


@_serialised
def infer_map_dtype(map_spec, in_dtype, cc) -> np.dtype:
    """Accumulator dtype (a record for a map that returns a tuple) a map specification
    produces from `in_dtype`."""
    kind, map_op = map_spec
    if kind == "value":  # the element itself, a record included
        return np.dtype(in_dtype)
    if kind == "predicate":
        return np.dtype(np.int64)
    if kind == "call_index":
        return infer_result_dtype(map_op, [in_dtype, np.dtype(np.int64)], cc, tuples=True, holder="accumulator")
    return infer_result_dtype(map_op, [in_dtype], cc, tuples=True, holder="accumulator")


_MAP_CALLS = {"call": "_map(x)", "call_index": "_map(x, index)", "predicate": "1 if _map(x) else 0"}


def _compile_record_reduction(op, map_spec, in_layout, acc_layout, cc, input_by_base: bool) -> tuple[bytes, bytes]:
    """compile_reduction where the accumulator or the input is a record: the wrappers read
    values field by field into (named) tuples, call the operator and store each field of
    what it returns. `input_by_base`: csj_map receives the input's global base and finds the
    element at base + index * itemsize (reduce_jit.cu's CSJ_INPUT_BY_BASE modules); otherwise
    a pointer to the element."""
    _, types, _ = _load_numba()
    in_dtype, acc_dtype = in_layout.dtype, acc_layout.dtype
    acc_type = acc_layout.value_type()
    dispatcher = _device_dispatcher(op, cc)
    returned = _return_type(op, [acc_type, acc_type], [acc_dtype, acc_dtype], cc, dispatcher)
    _check_returns(op, returned, acc_dtype, [acc_dtype, acc_dtype], "the accumulator")
    namespace = dict(_record_namespace(), _op=dispatcher)
    op_source = (f"def csj_op(a, b, out):\n"
                 f"    r = _op({acc_layout.read_source('a', '_acc_', namespace)}, "
                 f"{acc_layout.read_source('b', '_acc_', namespace)})\n"
                 + acc_layout.write_source("out", "r", "_out_", namespace))
    op_ir = _compile_wrapper(op_source, op.name, "csj_op", namespace,
                             (types.voidptr, types.voidptr, types.voidptr), cc, op, [acc_dtype, acc_dtype])

    kind, map_op = map_spec
    namespace = _record_namespace()
    element = f"_at(value, index, {in_layout.itemsize})" if input_by_base else "value"
    read = in_layout.read_source(element, "_in_", namespace)
    if kind == "value":
        if not in_layout.casts_to(acc_layout):
            raise TypeError(f"operator {op.name}: elements of {in_layout.description} cannot "
                            f"accumulate as {acc_layout.description}; a tuple accumulator is built "
                            f"from each element by a map operator (transform_reduce)")
        body = "    r = x\n"
    else:
        namespace["_map"] = _device_dispatcher(map_op, cc)
        body = f"    r = {_MAP_CALLS[kind]}\n"
    map_source = (f"def csj_map(value, index, out):\n    x = {read}\n{body}"
                  + acc_layout.write_source("out", "r", "_out_", namespace))
    map_ir = _compile_wrapper(map_source, (map_op or op).name, "csj_map", namespace,
                              (types.voidptr, types.int64, types.voidptr), cc, map_op or op, [in_dtype])
    return op_ir, map_ir


@_serialised
def compile_reduction(op, map_spec, in_dtype, acc_dtype, cc, input_by_base: bool = False) -> tuple[bytes, bytes]:
    """LTO-IR of `csj_op` (acc, acc -> acc) and `csj_map` (input -> acc) for the reduce and
    scan modules.

    map_spec: ("value", None) casts each element; ("call", op) applies a map operator;
    ("call_index", op) applies map(value, global_index); ("predicate", op) gives 1 where
    op(value) is true, else 0. `input_by_base`: see _compile_record_reduction.
    """
    in_layout, acc_layout = layout_of(in_dtype), layout_of(acc_dtype)
    if acc_layout.is_record or in_layout.is_record or input_by_base:  # typed pointers carry numbers only
        return _compile_record_reduction(op, map_spec, in_layout, acc_layout, cc, input_by_base)
    _, types, _ = _load_numba()
    acc_type = types.CPointer(numba_type(acc_dtype))
    in_type = types.CPointer(numba_type(in_dtype))
    cast = getattr(np, np.dtype(acc_dtype).name)
    dispatcher = _device_dispatcher(op, cc)
    _return_type(op, [numba_type(acc_dtype)] * 2, [acc_dtype, acc_dtype], cc, dispatcher)  # returns a value
    op_source = "def csj_op(a, b, out):\n    out[0] = _cast(_op(a[0], b[0]))\n"
    op_ir = _compile_wrapper(op_source, op.name, "csj_op",
                             {"_op": dispatcher, "_cast": cast},
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
        namespace["_map"] = _device_dispatcher(map_op, cc)
    map_ir = _compile_wrapper(map_source, (map_op or op).name, "csj_map", namespace,
                              (in_type, types.int64, acc_type), cc, map_op or op, [in_dtype])
    return op_ir, map_ir
