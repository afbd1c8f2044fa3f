"""Descriptor operators: precompiled into the shim (no JIT), same kernels as user operators.

| operator | computes |
| --- | --- |
| `ops.negate` | `out = -x` |
| `ops.add` | `out = x + y` |
| `ops.mul` | `out = x * y` |
| `ops.scale(a)` | `out = a * x` |
| `ops.add_scalar(c)` | `out = x + c` |
| `ops.axpy(a)` | `out = a * x + y` |

All arrays of one number dtype (records are refused); the scalar must fit that dtype.

>>> sharded.transform(sharded.ops.axpy(2.0), x, y, out=y)   # y = 2 x + y   # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Descriptor:
    """A built-in elementwise operator, with at most one scalar parameter."""

    name: str
    arity: int
    scalar: object = None

    def __repr__(self) -> str:
        return f"sharded.ops.{self.name}" + ("" if self.scalar is None else f"({self.scalar!r})")


negate = Descriptor("negate", 1)
"""out = -x"""
add = Descriptor("add", 2)
"""out = x + y"""
mul = Descriptor("mul", 2)
"""out = x * y"""


def scale(a) -> Descriptor:
    """out = a * x"""
    return Descriptor("scale", 1, a)


def add_scalar(c) -> Descriptor:
    """out = x + c"""
    return Descriptor("add_scalar", 1, c)


def axpy(a) -> Descriptor:
    """out = a * x + y"""
    return Descriptor("axpy", 2, a)


__all__ = ["Descriptor", "negate", "add", "mul", "scale", "add_scalar", "axpy"]
