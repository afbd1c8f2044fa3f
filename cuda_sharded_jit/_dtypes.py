"""The element types arrays and operators use, and how Python values map onto them.

This module is the gate: it validates dtypes (as_dtype, as_array_dtype, check_record) and
builds records (record_dtype). What follows from an accepted dtype's layout (its numba
type, how wrappers read and write it, packing, descriptions, cache-header text) lives in
_layout, one class per layout.
"""

from __future__ import annotations

import numbers

import numpy as np

SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(name) for name in ("float32", "float64", "int32", "int64", "uint32", "uint64")
)
_NAMES = ", ".join(dtype.name for dtype in SUPPORTED_DTYPES)


def is_integer(value) -> bool:
    """Whether `value` is a Python or numpy integer that is not a bool (True is an int in
    Python, and no count, position or handle)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def as_flag(value, argument: str) -> bool:
    """`value` as a bool (Python's or numpy's), or TypeError naming `argument`."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{argument}: expected True or False, got {_type_name(value)}")


def _type_name(value) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def as_dtype(dtype, argument: str = "dtype") -> np.dtype:
    """A supported numpy dtype, or TypeError naming `argument`."""
    if dtype is None:  # numpy reads None as float64
        raise TypeError(f"{argument}: expected a dtype (one of {_NAMES}), got None")
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{argument}: {dtype!r} is not a dtype (expected one of {_NAMES})") from None
    if resolved not in SUPPORTED_DTYPES:
        raise TypeError(f"{argument}: unsupported dtype {resolved} (expected one of {_NAMES})")
    return resolved


def scalar_dtype(value, argument: str) -> np.dtype:
    """The dtype a runtime scalar travels as: float -> float64, int -> int64, numpy -> its own."""
    if isinstance(value, np.generic):
        return as_dtype(value.dtype, argument)
    if isinstance(value, bool):
        raise TypeError(f"{argument}: bool scalars are not supported; pass 0 or 1 as an int")
    if isinstance(value, int):
        return np.dtype(np.int64)
    if isinstance(value, float):
        return np.dtype(np.float64)
    raise TypeError(
        f"{argument}: expected a ShardedArray or a scalar (int, float, numpy scalar), "
        f"got {type(value).__name__}"
    )


def is_weak_scalar(value) -> bool:
    """Python scalars (not numpy's, although np.float64 subclasses float) are weakly typed."""
    return isinstance(value, (bool, int, float)) and not isinstance(value, np.generic)


def is_scalar(value) -> bool:
    return isinstance(value, (int, float, np.generic)) and not isinstance(value, bool)


def exact_cast(value, dtype: np.dtype, argument: str):
    """`value` as a numpy scalar of `dtype`; ValueError when it does not fit (an integer out
    of range, a negative for an unsigned type) or would lose its fraction in an integer."""
    dtype = np.dtype(dtype)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if not isinstance(value, (numbers.Real, np.bool_)):
        raise TypeError(f"{argument}: expected a real number, got {type(value).__name__}")
    try:
        with np.errstate(all="ignore"):
            cast = np.asarray(value).astype(dtype)[()]
    except (OverflowError, ValueError, TypeError) as error:
        raise ValueError(f"{argument}: {value!r} does not fit {dtype}: {error}") from None
    if dtype.kind in "iu" and cast != value:
        raise ValueError(f"{argument}: {value!r} does not fit {dtype} (it would become {cast})")
    return cast


# Records: numpy structured dtypes of 1 to 4 supported fields in the aligned layout (a C
# struct: each field at a multiple of its size, the size a multiple of the largest field),
# 4, 8, 12, 16, 24 or 32 bytes, which the shim's kernels move as raw bytes. Tuple
# accumulators are such records with fields f0, f1, ...; record arrays keep their names.
MAX_RECORD_FIELDS = 4
RECORD_SIZES = (4, 8, 12, 16, 24, 32)


def record_dtype(fields, argument: str = "accumulator") -> np.dtype:
    """The aligned record of `fields` (supported dtypes), as a tuple accumulator is laid out."""
    fields = [as_dtype(field, f"{argument}[{index}]") for index, field in enumerate(fields)]
    if not 1 <= len(fields) <= MAX_RECORD_FIELDS:
        raise TypeError(f"{argument}: tuples of 1 to {MAX_RECORD_FIELDS} numbers are supported, "
                        f"got {len(fields)}")
    record = np.dtype([(f"f{index}", field) for index, field in enumerate(fields)], align=True)
    if record.itemsize not in RECORD_SIZES:
        raise TypeError(f"{argument}: a record of {record.itemsize} bytes is not supported "
                        f"(sizes {', '.join(map(str, RECORD_SIZES))})")
    return record


def is_record(dtype) -> bool:
    if not isinstance(dtype, np.dtype):  # asked on every call: dtypes skip the conversion
        dtype = np.dtype(dtype)
    return dtype.names is not None


def check_record(dtype: np.dtype, argument: str) -> np.dtype:
    """`dtype` itself when it is a record arrays can hold, else TypeError naming `argument`.

    Packed layouts (numpy's default for structured dtypes, `align=False`) are refused unless
    they happen to be laid out as the aligned struct: converting would change the bytes the
    caller sees, so the message says how to convert (`astype` to the aligned dtype).
    """
    names = dtype.names
    if not 1 <= len(names) <= MAX_RECORD_FIELDS:
        raise TypeError(f"{argument}: records of 1 to {MAX_RECORD_FIELDS} fields are supported, "
                        f"got {len(names)} in {dtype}")
    fields = []
    for name in names:
        field = dtype.fields[name][0]
        if field.names is not None or field.subdtype is not None:
            raise TypeError(f"{argument}: field {name!r} is {field}; record fields must be "
                            f"numbers ({_NAMES}), not nested records or sub-arrays")
        if field.kind in "fiu" and field.byteorder not in "=|" and field.newbyteorder("=") in SUPPORTED_DTYPES:
            raise TypeError(f"{argument}: field {name!r} is {field.str} (non-native byte order); "
                            f"convert with .astype(dtype.newbyteorder('='))")
        if field not in SUPPORTED_DTYPES:
            raise TypeError(f"{argument}: field {name!r} has unsupported dtype {field} "
                            f"(expected one of {_NAMES})")
        fields.append((name, field))
    aligned = np.dtype(fields, align=True)
    offsets = [dtype.fields[name][1] for name in names]
    if offsets != [aligned.fields[name][1] for name in names] or dtype.itemsize != aligned.itemsize:
        raise TypeError(
            f"{argument}: record dtype {dtype} is not in the aligned (C struct) layout records "
            f"use: offsets {offsets} and itemsize {dtype.itemsize}, expected "
            f"{[aligned.fields[name][1] for name in names]} and {aligned.itemsize}; convert with "
            f".astype(np.dtype({[(name, field.name) for name, field in fields]}, align=True))")
    return dtype


def as_array_dtype(dtype, argument: str = "dtype") -> np.dtype:
    """A dtype an array can hold: a supported scalar or a record (check_record)."""
    if dtype is None:  # numpy reads None as float64
        raise TypeError(f"{argument}: expected a dtype (one of {_NAMES}, or a record of them), got None")
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{argument}: {dtype!r} is not a dtype (expected one of {_NAMES}, "
                        f"or a record of them)") from None
    if is_record(resolved):
        return check_record(resolved, argument)
    return as_dtype(resolved, argument)
