"""`sharded.op`: a Python function marked as a device operator, and its identity.

Nothing compiles here. The identity (what the compile caches key on) has a static part,
computed once per code object (bytecode, constants with their types, nested code), and a
dynamic part re-read at every call (defaults, closure cell values, referenced globals and
what is read through the modules among them), so that changing a captured value or a
global changes the kernel on the next call.

What a kernel bakes in must be described soundly, in a form that means the same in another
process (the disk cache): numbers by their exact bits and type, tuples with their class
and field names, modules by every attribute the code could read from them (also through a
local alias), functions and numba device functions by their code, values and settings.
A value we cannot describe (an arbitrary object, a list, a large array) is refused with a
TypeError that says what to pass instead: guessing would serve a stale kernel.
"""

from __future__ import annotations

import builtins
import dis
import enum
import functools
import hashlib
import inspect
import types
import weakref

import numpy as np

# Marks a value we can describe in this process only (a numba object whose repr carries its
# address): the kernel is cached in memory only.
VOLATILE = "volatile"

# Captured numpy arrays are baked into the kernel as constants (numba freezes them), so
# their contents are part of the key; larger tables are refused.
MAX_CAPTURED_ARRAY_BYTES = 1 << 20
# Captured tuples are unrolled into the code: numba and nvJitLink take time that grows with
# the square of their length (256 items 0.9 s, 1024 items 7.5 s, 8000 items 395 s measured).
MAX_CAPTURED_TUPLE_ITEMS = 256

# Packages whose modules and functions are versioned with the toolchain (the disk key holds
# the versions) and never hold user helpers: their functions are keyed by name (walking their
# code on every call would be slow), their modules described once, and the JIT never shadows
# them (numba's typing templates key on the module objects themselves: cuda.threadIdx).
_LIBRARY_ROOTS = frozenset({"numpy", "math", "cmath", "operator", "numba", "numba_cuda", "llvmlite",
                            "builtins", "cuda"})


def is_library_module(name: str) -> bool:
    """Whether the module named `name` belongs to one of the _LIBRARY_ROOTS packages."""
    return name.split(".")[0] in _LIBRARY_ROOTS


def numba_helper_function(value):
    """The Python function behind a numba device function (a CUDA dispatcher), else None."""
    py_func = getattr(value, "py_func", None)
    if py_func is not None and inspect.isfunction(py_func) and hasattr(value, "targetoptions"):
        return py_func
    return None


_EXACT_SIMPLE = (type(None), bool, int, complex, str, bytes)
_NOT_GENERATOR = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_MISSING = object()


class _Refused(Exception):
    """A value an operator reads that no key can describe; `path` names where it was read."""

    def __init__(self, path: str, value, reason: str, hint: str):
        super().__init__(path)
        self.path, self.value, self.reason, self.hint = path, value, reason, hint


# ---- the static part ----------------------------------------------------------------------

def _code_digest(code: types.CodeType, digest) -> None:
    digest.update(code.co_code)
    digest.update(repr((code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                        code.co_flags, code.co_names, code.co_varnames,
                        code.co_freevars, code.co_cellvars)).encode())
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            _code_digest(constant, digest)
        else:
            # typed: 1, 1.0 and True compare equal in a tuple but compile differently;
            # floats by their exact bits (-0.0 is not 0.0)
            if isinstance(constant, float):
                constant = constant.hex()
            digest.update(repr((type(constant).__qualname__, constant)).encode())


@functools.lru_cache(maxsize=4096)
def _code_static_digest(code: types.CodeType) -> str:
    digest = hashlib.sha256()
    _code_digest(code, digest)
    return digest.hexdigest()


_ATTRIBUTE_READS = {"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"}


@functools.lru_cache(maxsize=4096)
def _code_names(code: types.CodeType) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(globals the code loads, attribute names it could read from a module), nested code
    included. Attribute names are every name read with `.` anywhere in the code and every
    string constant that could be one (`getattr(m, "X")`): a module bound to a local alias
    (`m = cfg; m.SCALE`) is read through names that follow no global load."""
    loaded, attributes = [], []
    for instruction in dis.get_instructions(code):
        if instruction.opname == "LOAD_GLOBAL":
            loaded.append(instruction.argval)
        elif instruction.opname in _ATTRIBUTE_READS:
            attributes.append(instruction.argval)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            nested_globals, nested_attributes = _code_names(constant)
            loaded.extend(nested_globals)
            attributes.extend(nested_attributes)
        elif isinstance(constant, str) and constant.isidentifier():
            attributes.append(constant)
    return tuple(dict.fromkeys(loaded)), tuple(sorted(set(attributes)))


_NO_DEFAULTS = ("tuple",)


@functools.lru_cache(maxsize=4096)
def _code_facts(code: types.CodeType) -> tuple[bool, bool, str, list, int, tuple]:
    """(whether the code can be an operator's, _check_function's test: no generator or async,
    plain positional parameters; whether it loads a global; its static digest; a one-item
    list holding the last kernel_libraries memo of any operator of this code, which a new
    operator of it starts from: a lambda written in the call is a new operator each time;
    its parameter count; the (code, static digest) pair Op._static_for starts from when the
    function has no defaults)."""
    plain = not (code.co_flags & (_NOT_GENERATOR | inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
                 or code.co_kwonlyargcount)
    digest = _code_static_digest(code)
    return plain, bool(_code_names(code)[0]), digest, [None], code.co_argcount, (code, (digest, _NO_DEFAULTS))


# ---- values -------------------------------------------------------------------------------

def _fingerprint(value, attributes: tuple[str, ...], seen: frozenset, path: str):
    """A hashable, process-independent description of a value an operator reads (`path`
    names it in errors; `attributes` are the names the reading code could take from a
    module). Raises _Refused for a value no description can stand for."""
    kind = type(value)
    if kind is float:
        return ("float", value.hex())  # tells -0.0 from 0.0 and keeps NaN equal to itself
    if kind in _EXACT_SIMPLE:
        return (kind.__name__, value)
    if isinstance(value, np.generic):
        if isinstance(value, np.void):  # a record scalar
            return ("np", value.dtype.descr.__repr__(), value.tobytes())
        return ("np", value.dtype.str, value.tobytes())
    if isinstance(value, enum.Enum):
        return ("enum", _class_fingerprint(kind, seen, path), value.name)
    if isinstance(value, tuple):
        if len(value) > MAX_CAPTURED_TUPLE_ITEMS:
            raise _Refused(path, value, f"a tuple of {len(value)} items; kernels unroll captured tuples "
                           f"(8000 items took minutes to link), up to {MAX_CAPTURED_TUPLE_ITEMS}",
                           "pass a numpy array instead (baked in as a table, up to "
                           f"{MAX_CAPTURED_ARRAY_BYTES} bytes)")
        items = tuple(_fingerprint(item, attributes, seen, f"{path}[{index}]")
                      for index, item in enumerate(value))
        if kind is tuple:
            return ("tuple",) + items
        # a named tuple's class and field order give its fields their meaning (PT.x)
        return ("tuple of", kind.__module__, kind.__qualname__, getattr(kind, "_fields", None)) + items
    if isinstance(value, np.ndarray):
        return _array_fingerprint(value, path)
    if isinstance(value, np.dtype):
        return ("dtype", repr(value.descr) if value.names is not None else value.str)
    if isinstance(value, types.ModuleType):
        return _module_fingerprint(value, attributes, seen, path)
    if isinstance(value, Op):
        value = value.func
    py_func = numba_helper_function(value)
    if py_func is not None:
        return ("dispatcher", _dispatcher_settings(value), _function_fingerprint(py_func, seen))
    if inspect.isfunction(value):
        if is_library_module(getattr(value, "__module__", None) or ""):
            return ("library function", value.__module__, value.__qualname__)
        return ("function", _function_fingerprint(value, seen))
    if isinstance(value, type):
        return _class_fingerprint(value, seen, path)
    if isinstance(value, types.BuiltinFunctionType):
        return ("builtin", getattr(value, "__module__", None), value.__qualname__)
    if isinstance(value, np.ufunc):
        return ("ufunc", value.__name__)
    if isinstance(value, (int, float, complex, str, bytes)):  # a subclass: its class, its value
        base = next(base for base in (int, float, complex, str, bytes) if isinstance(value, base))
        return ("subclass", kind.__module__, kind.__qualname__, _fingerprint(base(value), (), seen, path))
    if kind.__module__.split(".")[0] in ("numba", "numba_cuda"):
        # numba types (numba.float32) and other numba objects numba itself types
        text = repr(value)
        return ("numba", kind.__module__, kind.__qualname__, (VOLATILE, id(value)) if " at 0x" in text else text)
    raise _Refused(path, value, *_refusal(value))


def _refusal(value) -> tuple[str, str]:
    """(what the value is, what to pass instead) for an error message."""
    if isinstance(value, (list, dict, set, bytearray)):
        return (f"a {type(value).__name__}, which can change after the kernel is built",
                "use a tuple (kernels bake in what operators read)")
    return (f"a {type(value).__module__}.{type(value).__qualname__} object, which the kernel's "
            f"cache key cannot describe",
            "pass the numbers it holds as scalar arguments (transform(op, a, value)) or bind "
            "them as defaults (def op(x, scale=settings.scale))")


_array_digests: dict[int, tuple] = {}


def _array_fingerprint(array: np.ndarray, path: str):
    """An array's dtype, shape and contents: hashed once per array object (numba bakes a
    captured array in when it compiles, so it is a constant of the kernel: assign a new array
    to change it). Arrays over MAX_CAPTURED_ARRAY_BYTES are refused."""
    if array.nbytes > MAX_CAPTURED_ARRAY_BYTES or array.dtype.hasobject:
        what = (f"a numpy array of {array.nbytes} bytes" if not array.dtype.hasobject
                else "a numpy array of Python objects")
        raise _Refused(path, array, f"{what}; kernels bake captured arrays in, up to "
                       f"{MAX_CAPTURED_ARRAY_BYTES} bytes of numbers",
                       "pass a smaller table, or the values the operator needs as scalar arguments")
    def describe():
        contents = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
        layout = repr(array.dtype.descr) if array.dtype.names is not None else array.dtype.str
        return ("ndarray", layout, array.shape, contents)

    return _memoised(_array_digests, array, describe)


def _memoised(table: dict, value, describe):
    """describe(), computed once per live object `value` (kept by id while it lives)."""
    found = table.get(id(value))
    if found is not None and found[0]() is value:
        return found[1]
    description = describe()
    key = id(value)
    try:
        reference = weakref.ref(value, lambda _, key=key: table.pop(key, None))
    except TypeError:  # not weakly referable: described on every call
        return description
    table[key] = (reference, description)
    return description


_library_modules: dict[tuple, tuple] = {}


def _module_fingerprint(module: types.ModuleType, attributes, seen: frozenset, path: str):
    """A module by name and by every attribute the code could read from it. An attribute
    that cannot be described is kept in memory only (it is probably not what the code
    reads: numba would not compile a read of it anyway)."""
    if id(module) in seen:
        return ("module", module.__name__, "recursive")
    library = is_library_module(module.__name__)
    if library:  # versioned with the toolchain, never patched by users: described once
        found = _library_modules.get((id(module), attributes))
        if found is not None:
            return found
    seen = seen | {id(module)}
    namespace = module.__dict__
    parts = []
    for name in attributes:
        value = namespace.get(name, _MISSING)
        if value is _MISSING:
            if "__getattr__" not in namespace:
                continue
            try:
                value = getattr(module, name)
            except Exception:  # noqa: BLE001 - an attribute the module does not have
                continue
        try:
            parts.append((name, _fingerprint(value, attributes, seen, f"{path}.{name}")))
        except _Refused:
            parts.append((name, (VOLATILE, id(value))))
    description = ("module", module.__name__, tuple(parts))
    if library and len(_library_modules) < 4096:
        _library_modules[(id(module), attributes)] = description
    return description


def _class_fingerprint(cls: type, seen: frozenset, path: str):
    """Named tuple classes by their fields, enums by their members, other classes by name."""
    fields = getattr(cls, "_fields", None)
    if issubclass(cls, tuple) and fields is not None:
        return ("tuple class", cls.__module__, cls.__qualname__, tuple(fields))
    if issubclass(cls, enum.Enum):
        members = tuple((member.name, _fingerprint(member.value, (), seen, f"{path}.{member.name}"))
                        for member in cls)
        return ("enum class", cls.__module__, cls.__qualname__, members)
    return ("class", cls.__module__, cls.__qualname__)


_settings_memo: dict[int, tuple] = {}


def _dispatcher_settings(dispatcher) -> tuple:
    """A numba device function's options (fastmath, opt, ...) and, when it was declared with
    signatures (`cuda.jit("float32(float32)", device=True)`), those: both change its code."""
    def describe():
        options = tuple(sorted((name, repr(option)) for name, option in dispatcher.targetoptions.items()))
        declared = (tuple(str(signature) for signature in dispatcher.nopython_signatures)
                    if not getattr(dispatcher, "_can_compile", True) else None)
        return (options, declared)

    return _memoised(_settings_memo, dispatcher, describe)


# ---- functions ----------------------------------------------------------------------------


def _static_digest(func: types.FunctionType) -> tuple:
    defaults = func.__defaults__  # every call pays this: no defaults, no fingerprint to build
    if not defaults:
        return (_code_static_digest(func.__code__), _NO_DEFAULTS)
    names = func.__code__.co_varnames[func.__code__.co_argcount - len(defaults):]
    return (_code_static_digest(func.__code__),
            ("tuple",) + tuple(_fingerprint(value, (), frozenset(), f"the default of {name}")
                               for name, value in zip(names, defaults)))


def _dynamic_values(func: types.FunctionType, seen: frozenset) -> tuple:
    seen = seen | {id(func)}
    code = func.__code__
    global_names, attributes = _code_names(code)
    values = []
    for name, cell in zip(code.co_freevars, func.__closure__ or ()):
        try:
            contents = cell.cell_contents
        except ValueError:  # empty cell
            values.append((name, ("empty",)))
            continue
        values.append((name, ("recursive",) if id(contents) in seen
                       else _fingerprint(contents, attributes, seen, name)))
    namespace = func.__globals__
    for name in global_names:
        value = namespace.get(name, _MISSING)
        if value is _MISSING:
            if not hasattr(builtins, name):
                values.append((name, ("missing",)))
            continue
        values.append((name, ("recursive",) if id(value) in seen
                       else _fingerprint(value, attributes, seen, name)))
    return tuple(values)


def _function_fingerprint(func: types.FunctionType, seen: frozenset = frozenset()):
    return (_static_digest(func), _dynamic_values(func, seen))


def disk_cacheable(identity) -> bool:
    """False when the identity holds a value known only to this process."""
    if isinstance(identity, tuple):
        if len(identity) == 2 and identity[0] == VOLATILE:
            return False
        return all(disk_cacheable(item) for item in identity)
    return True


class Op:
    """A Python function usable as a device operator by every algorithm (`func`: the
    function, `name`: how errors and the cache name it).

    Calling it runs the plain Python function (handy for testing on the host). It compiles,
    through numba-cuda, the first time an algorithm needs it for new argument types.

    >>> @op
    ... def saxpy(x, y, alpha):
    ...     return alpha * x + y
    >>> saxpy(1.0, 2.0, 3.0)
    5.0
    """

    __slots__ = ("func", "name", "_has_dynamic", "_nparams", "_static_for", "_last_libraries",
                 "_code_memo", "_transform_plan", "_reduce_plan", "__weakref__")

    def __init__(self, func):
        if isinstance(func, Op):
            func = func.func
        self._setup(func, "op")

    @classmethod
    def _checked(cls, func, argument: str) -> Op:
        """Op(func), its checks naming `argument` (as_op: one check, not two)."""
        made = object.__new__(cls)
        made._setup(func, argument)
        return made

    def _setup(self, func, argument: str) -> None:
        # the checks and the facts below depend on the code only: one cached lookup per call
        # of a new function object (a lambda written in the call makes one each time)
        if type(func) is not types.FunctionType:
            _check_function(func, argument)  # raises
        facts = _code_facts(func.__code__)
        if not facts[0]:
            _check_function(func, argument)  # raises
        self.func = func
        self.name = func.__qualname__  # a function always has one (a str)
        # Code that names no global and captures nothing has no dynamic part beyond its
        # defaults; anything else is re-read at every call (a global may be defined after
        # decoration).
        self._has_dynamic = bool(func.__closure__) or facts[1]
        self._nparams = facts[4]
        # (code, static digest) of the last identity of a function with no defaults: the
        # digest depends on the code alone then, so it is reused while func.__code__ is that
        # code (one tuple, read and written whole, so threads never see a mixed pair; the
        # first is the code's own, shared by its operators and never written)
        self._static_for = (None, None) if func.__defaults__ else facts[5]
        # compiler.kernel_libraries' memo of this operator's last call (checked against the
        # call's identity before use, so one of another operator of the same code is safe)
        memo = self._code_memo = facts[3]
        self._last_libraries = memo[0]
        # algorithms/transform.py's plan of this operator's last transform with `out` (checked
        # against the call's identity and arguments before use)
        self._transform_plan = None
        # algorithms/reduce.py's plan of its last reduce to a host value, checked the same way
        self._reduce_plan = None

    def __call__(self, *args):
        return self.func(*args)

    @property
    def num_params(self) -> int:
        """Number of parameters the operator takes."""
        return self._nparams

    def check_arity(self, count: int, what: str) -> None:
        """TypeError (before any compile) when the operator takes another number of args."""
        if count != self._nparams:
            raise TypeError(
                f"operator {self.name} takes {self._nparams} argument"
                f"{'' if self._nparams == 1 else 's'}, but {what} passes {count}"
            )

    def identity(self) -> tuple:
        """(static digest, dynamic values): equal identities compile to the same code.

        TypeError when the operator reads a value no identity can describe."""
        func = self.func
        try:
            code, cached = func.__code__, self._static_for
            if code is cached[0] and not func.__defaults__:
                static = cached[1]
            else:
                static = _static_digest(func)
                if not func.__defaults__:
                    self._static_for = (code, static)
            return (static, _dynamic_values(func, frozenset()) if self._has_dynamic else ())
        except _Refused as refused:
            raise TypeError(f"operator {self.name} reads {refused.path}: {refused.reason}; "
                            f"{refused.hint}") from None

    def __repr__(self) -> str:
        return f"<sharded.op {self.name}>"


class LibraryOp(Op):
    """An operator the library defines for itself (ShardedArray's `a + b`, `a < b`, ...).

    Its code and everything it reads (numpy, the library's own helpers, the values its
    closure was made with) are fixed for the life of the process, so its identity is
    computed at first use and reused: operators called once per `a + 1` must not pay for
    re-reading their globals and closure cells on every call, as a user's operator does.
    """

    __slots__ = ("_identity",)

    def identity(self) -> tuple:
        try:
            return self._identity
        except AttributeError:
            self._identity = identity = super().identity()
            return identity


def _check_function(func, argument: str) -> None:
    """TypeError naming `argument` unless `func` is a plain Python function an operator can be."""
    if not inspect.isfunction(func):
        raise TypeError(f"{argument}: expected a Python function (def or lambda), got {type(func).__name__}")
    code, name = func.__code__, getattr(func, "__qualname__", func.__name__)
    if code.co_flags & _NOT_GENERATOR:
        kind = ("an async function" if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR)
                else "a generator function")
        raise TypeError(f"{argument}: {name} is {kind}; an operator returns one value per call "
                        f"(use return, not yield or async)")
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_kwonlyargcount:
        raise TypeError(f"{argument}: {name} must take plain positional parameters")


def op(func=None):
    """Mark a Python function as a device operator: `@sharded.op` or `sharded.op(fn)`.

    Nothing compiles at decoration time.

    >>> square = op(lambda x: x * x)
    >>> square(3)
    9
    """
    if func is None:
        return op
    return Op(func)


# as_op's last plain function with no closure and its Op: another call with a function of
# the same code, globals, defaults and name (the same function passed again, or the same
# lambda written in a loop) gets that Op back: its checks and facts come from the code, it
# reads globals and defaults exactly as a new one would, and it keeps its kernel-cache memo.
# The Op reads its own function live, so a hit also asks that function to be unchanged (its
# code or defaults reassigned since, it is no longer what the new function is). The memo
# keeps that function (its defaults, attributes and globals) alive until another replaces
# it. One tuple, read and written whole.
_last_plain: tuple = (None, None, None, None)


def identity_or_none(op: Op):
    """op.identity(), or None where it raises (whatever it raises: an operator's globals may be
    any object): a plan's check (algorithms/transform.py) then leaves the error to the full
    path, which raises it in its own order."""
    try:
        return op.identity()
    except Exception:  # noqa: BLE001 - raised again by the full path
        return None


def as_op(func, argument: str = "op") -> Op:
    """An Op from an Op or a plain callable (wrapped for you)."""
    global _last_plain
    if isinstance(func, Op):
        return func
    if type(func) is types.FunctionType and func.__closure__ is None:
        code, defaults = func.__code__, func.__defaults__
        last = _last_plain
        if code is last[0] and func.__globals__ is last[1] and defaults is last[2]:
            made = last[3]
            held = made.func
            if held.__code__ is code and held.__defaults__ is defaults and func.__qualname__ is made.name:
                return made
        made = Op._checked(func, argument)
        _last_plain = (code, func.__globals__, defaults, made)
        return made
    if callable(func):
        return Op._checked(func, argument)
    raise TypeError(f"{argument}: expected an operator (function), got {type(func).__name__}")
