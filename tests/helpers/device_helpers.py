"""Device helpers reached through a module (`device_helpers.scaled(x)`), whose own global
changes between compiles (cache-key tests)."""

from numba import cuda

FACTOR = 2.0


@cuda.jit(device=True)
def scaled(x):
    return x * FACTOR
