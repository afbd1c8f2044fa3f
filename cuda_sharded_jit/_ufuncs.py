"""NumPy ufuncs on scalars inside operators: `np.sqrt(x)`, `np.exp(x)`, `np.abs(x)`, ...

numba-cuda 0.30 types NumPy ufuncs called on scalars in device code, but its CUDA target
lowers only the ufuncs of its own table (trigonometry, logarithms, comparisons, bit
operations): `np.sqrt`, `np.exp` or `np.abs` in an operator fail at lowering with a bare
`KeyError: <ufunc 'sqrt'>`. Users write NumPy math, so when numba is first loaded this module
adds the common rest to that table, never replacing an entry it has:
- floating-point loops through the libdevice functions that `math.*` uses on the GPU, so
  `np.sqrt(x)` compiles as `math.sqrt(x)` does (fastmath variants included);
- integer loops and plain arithmetic from numba's generic table, whose implementations are
  LLVM arithmetic with no library call.
The test suite links every entry for every dtype to SASS (no unresolved call) and checks
its values against NumPy on the GPU. A numba-cuda without that table is left as it is.
"""

from __future__ import annotations

import numpy as np

# ufunc name -> (float64 libdevice function, float32 one), for one and two arguments
_LIBDEVICE_UNARY = {
    "sqrt": ("sqrt", "sqrtf"), "exp": ("exp", "expf"), "exp2": ("exp2", "exp2f"),
    "expm1": ("expm1", "expm1f"), "log1p": ("log1p", "log1pf"), "floor": ("floor", "floorf"),
    "ceil": ("ceil", "ceilf"), "trunc": ("trunc", "truncf"), "rint": ("rint", "rintf"),
    "fabs": ("fabs", "fabsf"), "absolute": ("fabs", "fabsf"), "cbrt": ("cbrt", "cbrtf"),
}
_LIBDEVICE_BINARY = {
    "power": ("pow", "powf"), "float_power": ("pow", "powf"), "fmod": ("fmod", "fmodf"),
    "copysign": ("copysign", "copysignf"), "nextafter": ("nextafter", "nextafterf"),
}
# ufuncs whose generic loops (integers; arithmetic on floats) lower to plain LLVM
_GENERIC = ("absolute", "negative", "positive", "sign", "square", "reciprocal", "floor", "ceil",
            "trunc", "add", "subtract", "multiply", "floor_divide", "remainder", "power",
            "isinf", "isfinite", "signbit")
# loop letters of the element types operators see (bool results allowed)
_TYPES = set("iIlLqQfd")

# what was added, for the tests: ufunc name -> loop signatures ("f->f", "dd->d", ...)
ADDED: dict[str, tuple[str, ...]] = {}


def install() -> None:
    """Add the missing ufunc loops to numba-cuda's CUDA table (idempotent)."""
    try:
        from numba.cuda import libdevice, mathimpl
        from numba.cuda import ufuncs as cuda_ufuncs
        from numba.cuda.np import ufunc_db as generic
        from numba.cuda.types import float32, float64
    except ImportError:
        return
    table = cuda_ufuncs.ufunc_db()
    if not isinstance(table, dict) or ADDED:
        return
    for name in sorted(set(_LIBDEVICE_UNARY) | set(_LIBDEVICE_BINARY) | set(_GENERIC)):
        ufunc = getattr(np, name)
        if ufunc in table:
            continue
        loops = {}
        try:
            generic_loops = generic.get_ufunc_info(ufunc)
        except KeyError:
            generic_loops = {}
        if name in _GENERIC:
            for signature, implementation in generic_loops.items():
                inputs, output = signature.split("->")
                if set(inputs) <= _TYPES and set(output) <= _TYPES | {"?"}:
                    loops[signature] = implementation
        for functions, arity, lower in ((_LIBDEVICE_UNARY, 1, mathimpl.get_lower_unary_impl),
                                        (_LIBDEVICE_BINARY, 2, mathimpl.get_lower_binary_impl)):
            if name in functions:
                double, single = functions[name]
                loops["d" * arity + "->d"] = lower(ufunc, float64, getattr(libdevice, double))
                loops["f" * arity + "->f"] = lower(ufunc, float32, getattr(libdevice, single))
        if loops:
            table[ufunc] = loops
            ADDED[name] = tuple(sorted(loops))
