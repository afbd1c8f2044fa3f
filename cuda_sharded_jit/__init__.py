"""cuda_sharded_jit: multi-GPU sharded arrays whose algorithms run operators written in Python.

Importing this package touches no GPU and does not import numba; the JIT compiler loads at
the first operator that needs compiling.

>>> import cuda_sharded_jit as sharded
>>> g = sharded.PlaceGroup.by_devices()                                   # doctest: +SKIP
>>> a = sharded.ShardedArray.from_numpy(g, np.arange(8, dtype=np.float32))  # doctest: +SKIP
>>> sharded.transform(lambda x: x * x, a).to_numpy()                       # doctest: +SKIP
"""

from . import ops
from ._cache import CacheWarning, cache_dir
from ._dtypes import SUPPORTED_DTYPES
from ._link import VersionSkewError
from .algorithms.reduce import (
    adjacent_difference,
    argmax,
    argmin,
    count_if,
    exclusive_scan,
    inclusive_scan,
    max,
    min,
    reduce,
    sum,
    transform_exclusive_scan,
    transform_inclusive_scan,
    transform_reduce,
)
from .algorithms.by_key import (
    exclusive_scan_by_key,
    inclusive_scan_by_key,
    reduce_by_key,
    unique,
    unique_by_key,
)
from .algorithms.opaque import count, fill, histogram_even, sequence
from .algorithms.search import searchsorted, top_k
from .algorithms.select import partition, redistribute, select, three_way_partition
from .algorithms.segmented import segmented_reduce
from .algorithms.sort import argsort, sort, sort_by_key
from .algorithms.transform import transform
from .array import ShardedArray, ShardView
from .compiler import CompiledKernel, cache_info, clear_cache, compile
from .constructors import arange, asarray, empty, empty_like, full, full_like, linspace, ones, zeros, zeros_like
from .op import Op, op
from .places import PlaceGroup
from .scalar import DeviceScalar
from ._capture import capture

__version__ = "0.1.0"

# sharded.sum / min / max are public, but not exported by `from cuda_sharded_jit import *`,
# which would shadow the builtins of the same names.

__all__ = [
    "PlaceGroup", "ShardedArray", "ShardView", "DeviceScalar", "capture", "SUPPORTED_DTYPES",
    "op", "Op", "compile", "CompiledKernel", "transform", "ops",
    "reduce", "transform_reduce", "count_if", "argmin", "argmax",
    "inclusive_scan", "exclusive_scan", "transform_inclusive_scan", "transform_exclusive_scan",
    "adjacent_difference", "segmented_reduce",
    "fill", "sequence", "count", "histogram_even", "sort", "sort_by_key", "argsort",
    "top_k", "searchsorted",
    "select", "partition", "three_way_partition", "redistribute",
    "inclusive_scan_by_key", "exclusive_scan_by_key", "reduce_by_key", "unique_by_key", "unique",
    "empty", "zeros", "ones", "full", "arange", "linspace", "asarray", "empty_like", "zeros_like", "full_like",
    "cache_dir", "cache_info", "clear_cache", "CacheWarning", "VersionSkewError",
    "__version__",
]
