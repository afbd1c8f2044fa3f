"""`sharded.op`: a Python function marked as a device operator, and its identity.

Nothing compiles here. The identity (what the compile caches key on) has a static part,
computed once (bytecode, constants with their types, defaults, nested code), and a dynamic
part re-read at every call (closure cell values and referenced globals), so that changing a
captured value or a global changes the result on the next call.
"""

from __future__ import annotations

import builtins
import dis
import enum
import functools
import hashlib
import inspect
import types

import numpy as np

_SIMPLE = (type(None), bool, int, complex, str, bytes)
# Marks a value we cannot describe across processes: the kernel is cached in memory only.
VOLATILE = "volatile"


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


def _fingerprint(value, seen: frozenset = frozenset()):
    """A hashable, process-independent description of a value an operator may read."""
    if isinstance(value, float) and not isinstance(value, np.generic):
        return ("float", value.hex())  # tells -0.0 from 0.0 and keeps NaN equal to itself
    if isinstance(value, _SIMPLE) and not isinstance(value, enum.Enum):
        return (type(value).__qualname__, value)
    if isinstance(value, np.generic):
        return ("np", value.dtype.str, value.tobytes())
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape,
                hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest())
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    if isinstance(value, enum.Enum):
        return ("enum", type(value).__module__, type(value).__qualname__, value.name,
                _fingerprint(value.value, seen))
    if isinstance(value, tuple):
        return ("tuple",) + tuple(_fingerprint(item, seen) for item in value)
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, Op):
        value = value.func
    py_func = getattr(value, "py_func", None)  # numba dispatchers (device helpers)
    if py_func is not None and inspect.isfunction(py_func):
        return ("dispatcher", _function_fingerprint(py_func, seen))
    if inspect.isfunction(value):
        return ("function", _function_fingerprint(value, seen))
    if isinstance(value, (types.BuiltinFunctionType, type)):
        return ("builtin", getattr(value, "__module__", None), value.__qualname__)
    if isinstance(value, np.ufunc):
        return ("ufunc", value.__name__)
    return ("object", type(value).__module__, type(value).__qualname__, (VOLATILE, id(value)))


@functools.lru_cache(maxsize=4096)
def _code_static_digest(code: types.CodeType) -> str:
    digest = hashlib.sha256()
    _code_digest(code, digest)
    return digest.hexdigest()


_NO_DEFAULTS = _fingerprint(())


def _static_digest(func: types.FunctionType) -> tuple:
    defaults = func.__defaults__  # every call pays this: no defaults, no fingerprint to build
    return (_code_static_digest(func.__code__), _fingerprint(defaults) if defaults else _NO_DEFAULTS)


_LOAD_ATTRIBUTE = {"LOAD_ATTR", "LOAD_METHOD"}


@functools.lru_cache(maxsize=4096)
def _chains(code: types.CodeType, opname: str) -> tuple[tuple[str, ...], ...]:
    """Every `name.attr.attr` chain the code (and nested code) starts from a variable loaded
    with `opname` (LOAD_GLOBAL: globals, LOAD_DEREF: captured cells)."""
    chains, current = [], None
    for instruction in dis.get_instructions(code):
        if instruction.opname == opname:
            current = [instruction.argval]
            chains.append(current)
        elif instruction.opname in _LOAD_ATTRIBUTE and current is not None:
            current.append(instruction.argval)
        else:
            current = None
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            chains.extend(_chains(constant, opname))
    return tuple(dict.fromkeys(tuple(chain) for chain in chains))


def _global_chains(code: types.CodeType) -> tuple[tuple[str, ...], ...]:
    return _chains(code, "LOAD_GLOBAL")


def _global_names(code: types.CodeType) -> tuple[str, ...]:
    names = list(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names.extend(_global_names(constant))
    return tuple(dict.fromkeys(names))


def _resolve(value, chain: tuple[str, ...]):
    """The value a chain reads from its root: through modules, down to the first non-module."""
    for attribute in chain[1:]:
        if not isinstance(value, types.ModuleType):
            break
        value = getattr(value, attribute, None)
    return value


def _dynamic_values(func: types.FunctionType, seen: frozenset):
    seen = seen | {id(func)}
    values = []
    code = func.__code__
    for name, cell in zip(code.co_freevars, func.__closure__ or ()):
        try:
            contents = cell.cell_contents
        except ValueError:  # empty cell
            values.append(("empty",))
            continue
        if isinstance(contents, types.ModuleType):  # what is read through it, not its name
            for chain in _chains(code, "LOAD_DEREF"):
                if chain[0] == name:
                    values.append((chain, _fingerprint(_resolve(contents, chain), seen)))
        values.append(("recursive",) if id(contents) in seen else _fingerprint(contents, seen))
    namespace = func.__globals__
    for chain in _global_chains(code):
        if chain[0] in namespace:
            value = _resolve(namespace[chain[0]], chain)
            values.append((chain, ("recursive",) if id(value) in seen else _fingerprint(value, seen)))
        elif not hasattr(builtins, chain[0]):
            values.append((chain, ("missing",)))
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

    __slots__ = ("func", "name", "_has_dynamic", "_nparams", "__weakref__")

    def __init__(self, func):
        if isinstance(func, Op):
            func = func.func
        if not inspect.isfunction(func):
            raise TypeError(
                f"op: expected a Python function (def or lambda), got {type(func).__name__}"
            )
        self.func = func
        self.name = getattr(func, "__qualname__", func.__name__)
        code = func.__code__
        # Code that names no global and captures nothing has no dynamic part; anything else
        # is re-read at every call (a global may be defined after decoration).
        self._has_dynamic = bool(func.__closure__) or bool(_global_names(code))
        if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS) or code.co_kwonlyargcount:
            raise TypeError(f"op: {self.name} must take plain positional parameters")
        self._nparams = code.co_argcount

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
        """(static digest, dynamic values): equal identities compile to the same code."""
        func = self.func
        return (_static_digest(func), _dynamic_values(func, frozenset()) if self._has_dynamic else ())

    def __repr__(self) -> str:
        return f"<sharded.op {self.name}>"


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


def as_op(func, argument: str = "op") -> Op:
    """An Op from an Op or a plain callable (wrapped for you)."""
    if isinstance(func, Op):
        return func
    if callable(func):
        try:
            return Op(func)
        except TypeError as error:
            raise TypeError(f"{argument}: {error}") from None
    raise TypeError(f"{argument}: expected an operator (function), got {type(func).__name__}")
