"""The build step: operator + algorithm + dtypes + arch -> a linked kernel, cached.

`compile` is the public, inspectable form (works with no GPU). Algorithms call
`kernel_libraries`, whose hit path is one dict lookup.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from . import _cache, _link, _shim
from ._dtypes import as_array_dtype, as_dtype, as_flag, is_integer
from ._layout import dtype_from_key, layout_of
from .op import Op, as_op, disk_cacheable

ALGORITHMS = ("transform", "reduce", "segmented_reduce", "scan", "scan_one_pass", "merge_sort")
# the module kind of each reduction's kernels (reduce_jit.cu): a module holds only the kernels
# its calls launch, since each new operator links (compiles) every kernel of its module
_REDUCTION_MODULES = {"reduce": "reduce", "segmented_reduce": "segmented", "scan": "scan", "scan_one_pass": "scan1"}
VALUE_MAP = ("value", None)
INDEX_MAP = ("index", None)  # transform: the operator also receives each element's global index
# merge_sort: the order the comparator's wrapper bakes in, in the place of a map: ("ascending"
# or "descending", the key operator or None)
SORT_ORDERS = ("ascending", "descending")
MERGE_SORT_SIZES = (4, 8, 12, 16, 24, 32)  # element sizes with a merge_sort module
# select (internal: select, partition, three_way_partition): the first predicate is the op;
# the map specification holds whether the predicates take the index and the second predicate
# (three_way_partition) or None. Modules exist for the merge sort's element sizes.
SELECT_KINDS = ("select", "select_index")
# by_key_<call> (internal: the scans by key and reduce_by_key; unique_by_key's run heads): the
# op combines values; the keys' equality takes the map's place, ("equal", op). Modules exist
# per call, key size (4, 8) and value size of the merge sort's element sizes (the run heads:
# per key size, values of the keys' dtype), each with only that call's kernels.
BY_KEY_MAP = "equal"
BY_KEY_CALLS = ("inclusive", "exclusive", "reduce", "heads")
BY_KEY_ALGORITHMS = frozenset(f"by_key_{call}" for call in BY_KEY_CALLS)
ENV_DUMP = "CUDA_SHARDED_JIT_DUMP"


@dataclass(frozen=True)
class CompiledKernel:
    """A linked kernel: SASS for one architecture, and the operator LTO-IR it was built from.

    >>> k = compile(lambda x, y: x + y, "transform", (np.float32, np.float32), arch="sm_90")  # doctest: +SKIP
    >>> len(k.cubin) > 0, k.cache_hit                                                         # doctest: +SKIP
    (True, False)
    """

    algorithm: str
    op_name: str
    arg_kinds: tuple
    out_dtype: np.dtype
    arch: str
    module: str
    cubin: bytes = field(repr=False)
    ltoir: bytes = field(repr=False)  # the operator's wrapper
    cache_key: str
    cache_hit: bool
    compile_seconds: float
    map_ltoir: bytes = field(default=b"", repr=False)  # reduce / scan: the map wrapper; by_key: the equality

    @property
    def dtypes(self) -> tuple[np.dtype, ...]:
        """The argument dtypes the kernel was built for, in order."""
        return tuple(dtype for _, dtype in self.arg_kinds)

    def sass(self) -> str:
        """Disassembly of the cubin (cuobjdump, from the CUDA toolkit or the
        nvidia-cuda-cuobjdump wheel)."""
        return disassemble(self.cubin)


def _find_cuobjdump() -> str:
    try:
        from cuda.pathfinder import find_nvidia_binary_utility

        found = find_nvidia_binary_utility("cuobjdump")
        if found:
            return found
    except (ImportError, AttributeError):
        pass
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "cuobjdump").exists():
            return str(Path(root) / "bin" / "cuobjdump")
    raise RuntimeError("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")


def disassemble(cubin: bytes) -> str:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        result = subprocess.run([_find_cuobjdump(), "-sass", file.name],
                                capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {result.stderr.strip()}")
    return result.stdout


_ARCH = re.compile(r"sm_([1-9][0-9]{1,2})", re.ASCII)


def _arch_cc(arch: str) -> tuple[int, int]:
    """(major, minor) of a SASS architecture name ("sm_90" -> (9, 0)); ValueError for a
    name that is no architecture or one the toolchain cannot build for."""
    match = _ARCH.fullmatch(arch) if isinstance(arch, str) else None
    if match is None:
        raise ValueError(f"arch: expected a SASS architecture like 'sm_90', got {arch!r}")
    number = int(match.group(1))
    known = _link.toolchain_archs()
    if known and number not in known:
        raise ValueError(f"arch: {arch} is not an architecture this toolchain builds for "
                         f"(it knows {', '.join(f'sm_{value}' for value in known)})")
    _link.check_arch(arch)
    return number // 10, number % 10


@functools.lru_cache(maxsize=1024)  # asked on every transform call
def is_indexed_transform(arg_kinds, out_dtype, map_spec) -> bool:
    """Whether a transform runs the indexed module (records in or out, or the element's index
    wanted) rather than the vectorised one for 4- and 8-byte numbers."""
    return (map_spec == INDEX_MAP or layout_of(out_dtype).is_record
            or any(kind == "array" and layout_of(dtype).is_record for kind, dtype in arg_kinds))


def _transform_module(arg_kinds, out_dtype, map_spec) -> str:
    arrays = [dtype for kind, dtype in arg_kinds if kind == "array"]
    if is_indexed_transform(arg_kinds, out_dtype, map_spec):
        return f"transform_indexed_n{len(arrays)}"
    sizes = "_".join(str(dtype.itemsize) for dtype in arrays)
    return f"transform_o{np.dtype(out_dtype).itemsize}_i{sizes}"


def one_pass_scans(in_size: int, acc_size: int | None = None) -> bool:
    """Whether the single-pass scan takes these sizes (4- and 8-byte inputs and accumulators;
    an accumulator of None, not yet typed, is not ruled out)."""
    return in_size in (4, 8) and acc_size in (None, 4, 8)


def _reduction_module(op: Op, algorithm: str, map_spec, in_dtype: np.dtype, acc: np.dtype) -> tuple[str, bool]:
    """(LTO module, whether its map addresses the input from the global base)."""
    in_layout = layout_of(in_dtype)
    kind = _REDUCTION_MODULES[algorithm]
    if kind == "scan1" and not one_pass_scans(in_dtype.itemsize, acc.itemsize):
        kind = "scan"  # sizes the single pass does not take: the two passes
    if not in_layout.is_record:
        return f"{kind}_a{acc.itemsize}_i{in_dtype.itemsize}", False
    if algorithm in ("reduce", "segmented_reduce"):  # one module per accumulator for records of any size
        return f"{kind}_a{acc.itemsize}_irec", True
    # a scan of records runs over the records themselves, into their own layout
    if map_spec[0] != "value":
        raise TypeError(f"map_op: a scan of records ({in_layout.description}) takes no map; "
                        f"transform_inclusive_scan / transform_exclusive_scan map it first")
    acc_layout = layout_of(acc)
    if not in_layout.casts_to(acc_layout):
        raise TypeError(f"operator {op.name}: a scan of records of {in_layout.description} "
                        f"accumulates and writes that layout, not {acc_layout.description}")
    return f"{kind}_a{acc.itemsize}_i{in_dtype.itemsize}", False


def sort_spec(key_op: Op | None, descending: bool) -> tuple:
    """The map specification of a merge_sort kernel: its direction and its key operator."""
    return (SORT_ORDERS[descending], key_op)


def _element_size(dtype: np.dtype, argument: str, takes: str) -> int:
    """The itemsize of `dtype` where it is one of MERGE_SORT_SIZES (the sizes the per-element
    modules are built for); TypeError naming `argument` otherwise ("<argument>: <takes> of
    4, 8, ... bytes, not ...")."""
    layout = layout_of(dtype)
    if layout.itemsize not in MERGE_SORT_SIZES:
        raise TypeError(f"{argument}: {takes} of "
                        f"{', '.join(map(str, MERGE_SORT_SIZES))} bytes, not {layout.description} "
                        f"({layout.itemsize} bytes)")
    return layout.itemsize


def _element_module(prefix: str, what: str, dtype: np.dtype, argument: str) -> str:
    """The module `<prefix>_e<size>` built per element size (those of MERGE_SORT_SIZES);
    TypeError naming `argument` for another size."""
    return f"{prefix}_e{_element_size(dtype, argument, f'{what} takes elements')}"


def _merge_sort_module(dtype: np.dtype, argument: str = "a") -> str:
    return _element_module("merge_sort", "a sort with a comparator", dtype, argument)


def select_spec(second: Op | None, with_index: bool) -> tuple:
    """The map specification of a select kernel: whether its predicates take the index, and
    the second predicate (three_way_partition) or None."""
    return (SELECT_KINDS[with_index], second)


def _select_module(dtype: np.dtype, argument: str = "a") -> str:
    return _element_module("select", "a selection", dtype, argument)


def by_key_module(call: str, key_dtype: np.dtype, value_dtype: np.dtype, argument: str = "values") -> str:
    """The module of a by-key call (one of BY_KEY_CALLS): `by_key_<call>_k<key size>_v<value
    size>`, or `by_key_heads_k<key size>`; TypeError naming `argument` for values of another
    size."""
    size = _element_size(value_dtype, argument, "the by-key algorithms take values")
    if call == "heads":
        return f"by_key_heads_k{np.dtype(key_dtype).itemsize}"
    return f"by_key_{call}_k{np.dtype(key_dtype).itemsize}_v{size}"


def _build(op: Op, key: tuple, map_spec) -> CompiledKernel:
    try:
        return _build_kernel(op, key, map_spec)
    except Exception as error:
        missing = _link.missing_library_error(error)
        if missing is None:
            raise
        raise missing from error


def _build_kernel(op: Op, key: tuple, map_spec) -> CompiledKernel:
    from . import _jit

    algorithm, _, _, arg_kinds, out_request, arch = key
    cc = _arch_cc(arch)
    started = time.perf_counter()
    map_ltoir = b""
    if algorithm == "select":  # one wrapper: the element's class from the predicates
        out_dtype = arg_kinds[0][1]
        module = _select_module(out_dtype)
        kind, second = map_spec
        ltoirs = [_jit.compile_select(op, second, kind == "select_index", out_dtype, cc)]
    elif algorithm == "merge_sort":  # one wrapper: key, comparator and direction
        out_dtype = arg_kinds[0][1]
        module = _merge_sort_module(out_dtype)
        order, key_op = map_spec
        ltoirs = [_jit.compile_compare(op, key_op, order == "descending", out_dtype, cc)]
    elif algorithm in BY_KEY_ALGORITHMS:  # the values' operator, and the keys' equality as the map
        key_dtype, out_dtype = arg_kinds[0][1], arg_kinds[1][1]
        module = by_key_module(algorithm[len("by_key_"):], key_dtype, out_dtype)
        ltoirs = [_jit.compile_reduction(op, VALUE_MAP, out_dtype, out_dtype, cc)[0]]
        map_ltoir = _jit.compile_equal(map_spec[1], key_dtype, cc)
    elif algorithm == "transform":
        with_index = map_spec == INDEX_MAP
        arg_dtypes = [dtype for _, dtype in arg_kinds] + ([np.dtype(np.int64)] if with_index else [])
        out_dtype = (out_request if out_request is not None
                     else _jit.infer_result_dtype(op, arg_dtypes, cc, tuples=True))
        module = _transform_module(arg_kinds, out_dtype, map_spec)
        if is_indexed_transform(arg_kinds, out_dtype, map_spec):
            ltoirs = [_jit.compile_transform_indexed(op, arg_kinds, out_dtype, cc,
                                                     _shim.MAX_TRANSFORM_SCALARS, with_index)]
        else:
            ltoirs = [_jit.compile_transform(op, arg_kinds, out_dtype, cc, _shim.MAX_TRANSFORM_SCALARS)]
    else:  # reduce, scan: one input array, accumulator = out_request or the map's type
        in_dtype = arg_kinds[0][1]
        out_dtype = out_request if out_request is not None else _jit.infer_map_dtype(map_spec, in_dtype, cc)
        module, by_base = _reduction_module(op, algorithm, map_spec, in_dtype, out_dtype)
        op_ltoir, map_ltoir = _jit.compile_reduction(op, map_spec, in_dtype, out_dtype, cc, by_base)
        ltoirs = [op_ltoir, map_ltoir]
    cubin = _link.link(module, ltoirs + ([map_ltoir] if algorithm in BY_KEY_ALGORITHMS else []), arch)
    seconds = time.perf_counter() - started
    _dump(op, module, arch, ltoirs, cubin)
    return CompiledKernel(algorithm, op.name, arg_kinds, np.dtype(out_dtype), arch, module,
                          cubin, ltoirs[0], "", False, seconds, map_ltoir)


def _dump(op: Op, module: str, arch: str, ltoirs, cubin: bytes) -> None:
    """`CUDA_SHARDED_JIT_DUMP=dir`: the operator's LTO-IR and the linked cubin, as files a
    user inspects (written without following links or replacing files; failures warn)."""
    directory = os.environ.get(ENV_DUMP)
    if not directory:
        return
    stem = f"{op.name.replace('<', '').replace('>', '')}.{module}.{arch}"
    files = [(f"{stem}{'' if index == 0 else f'.{index}'}.ltoir", ltoir) for index, ltoir in enumerate(ltoirs)]
    _cache.write_dump(directory, files + [(f"{stem}.cubin", cubin)])


# key: (algorithm, operator identity, map identity, arg kinds, out request, arch)
_kernels = _cache.MemoryCache()     # key -> CompiledKernel
_libraries = _cache.MemoryCache()   # (key less arch, archs) -> (out dtype, [KernelLibrary per place])
_loaded = _cache.MemoryCache()      # key -> KernelLibrary (one load per process)
_generation = 0  # clear_cache's count: an operator's memo of its last libraries holds it
_ENTRY_POINTS = {
    "transform": ["csj_transform"],
    "transform_indexed": ["csj_transform_indexed"],
    "reduce": ["csj_reduce", "csj_fold"],
    "segmented": ["csj_segmented_reduce", "csj_fold", "csj_segmented_fold"],
    "scan": ["csj_reduce", "csj_fold", "csj_scan"],
    "scan1": ["csj_scan_one_pass"],  # an array with at most one non-empty shard, in one pass
    "merge_sort": ["csj_merge_sort_block", "csj_merge_partition", "csj_merge", "csj_merge_search"],
    "select": ["csj_select_count", "csj_select_scatter", "csj_select_keep", "csj_select_single"],
    **{f"by_key_{mode}": ["csj_by_key_reduce", "csj_by_key_chunks", "csj_by_key_groups", "csj_by_key_carry",
                          f"csj_by_key_sweep_{mode}", f"csj_by_key_one_pass_{mode}", f"csj_by_key_one_pass_fix_{mode}"]
       + (["csj_by_key_one_pass_gather"] if mode == "reduce" else []) for mode in BY_KEY_CALLS if mode != "heads"},
    "by_key_heads": ["csj_by_key_heads_count", "csj_by_key_heads_scatter"],
}


def _entry_points(kernel: CompiledKernel) -> list[str]:
    if kernel.module.startswith("transform_indexed"):
        return _ENTRY_POINTS["transform_indexed"]
    if kernel.algorithm == "transform":
        sizes = kernel.module.rpartition("_i")[2].split("_")
        if len(sizes) == 2 and sizes[0] == sizes[1]:  # two inputs of one size: adjacent_difference's pass too
            return _ENTRY_POINTS["transform"] + ["csj_adjacent"]
    if kernel.algorithm in _REDUCTION_MODULES:  # the module's kind: scan_one_pass may link two passes
        return _ENTRY_POINTS[kernel.module.partition("_")[0]]
    return _ENTRY_POINTS[kernel.algorithm]


def _map_identity(map_spec) -> tuple:
    kind, map_op = map_spec
    return (kind, None if map_op is None else map_op.identity())


def _module_for(op: Op, algorithm: str, arg_kinds: tuple, out_dtype: np.dtype, map_spec) -> str:
    """The kernel module a call links, given its result (or accumulator) dtype."""
    if algorithm == "transform":
        return _transform_module(arg_kinds, out_dtype, map_spec)
    if algorithm == "merge_sort":
        return _merge_sort_module(out_dtype)
    if algorithm == "select":
        return _select_module(out_dtype)
    if algorithm in BY_KEY_ALGORITHMS:
        return by_key_module(algorithm[len("by_key_"):], arg_kinds[0][1], out_dtype)
    return _reduction_module(op, algorithm, map_spec, arg_kinds[0][1], out_dtype)[0]


def _known_out_dtype(algorithm: str, arg_kinds: tuple, out_request, map_spec) -> np.dtype | None:
    """The result dtype a call gets without typing the operator, where the call fixes it."""
    if out_request is not None:
        return out_request
    if algorithm in BY_KEY_ALGORITHMS:
        return arg_kinds[1][1]
    if algorithm in ("merge_sort", "select") or (algorithm != "transform" and map_spec[0] == "value"):
        return arg_kinds[0][1]
    if map_spec[0] == "predicate":
        return np.dtype(np.int64)
    return None


def _stored_kernel(op: Op, key: tuple, map_spec, digest: str, header: dict, body: bytes,
                   seconds: float) -> CompiledKernel:
    """The kernel a disk entry holds, once its header agrees with what this call computes;
    ValueError (a corrupt entry) otherwise. The entry is authenticated (see _cache): this
    guards against entries of another build or a bug, and keeps a header from sizing an
    output smaller than the kernel writes."""
    algorithm, _, _, arg_kinds, out_request, arch = key
    if not isinstance(header, dict):
        raise ValueError("the header is not an object")
    if header.get("algorithm") != algorithm or header.get("arch") != arch:
        raise ValueError(f"it holds a {header.get('algorithm')!r} kernel for {header.get('arch')!r}")
    if not isinstance(header.get("out_dtype"), str):
        raise ValueError("out_dtype is missing")
    out_dtype = as_array_dtype(dtype_from_key(header["out_dtype"]), "out_dtype")
    expected = _known_out_dtype(algorithm, arg_kinds, out_request, map_spec)
    if expected is not None and out_dtype != expected:
        raise ValueError(f"out_dtype {out_dtype} differs from this call's {expected}")
    module = _module_for(op, algorithm, arg_kinds, out_dtype, map_spec)
    if header.get("module") != module:
        raise ValueError(f"module {header.get('module')!r} differs from this call's {module!r}")
    sizes = [header.get("cubin_size"), header.get("ltoir_size")]
    if not all(type(size) is int and size >= 0 for size in sizes) or sum(sizes) > len(body):
        raise ValueError(f"sizes {sizes} do not fit the {len(body)}-byte body")
    cubin_end, ltoir_end = sizes[0], sizes[0] + sizes[1]
    map_ltoir = body[ltoir_end:]
    mapped = algorithm in _REDUCTION_MODULES or algorithm in BY_KEY_ALGORITHMS
    if body[:4] != b"\x7fELF" or not sizes[1] or bool(map_ltoir) != mapped:
        raise ValueError("the body is not a cubin with its operator LTO-IR")
    return CompiledKernel(algorithm, op.name, arg_kinds, out_dtype, arch, module, body[:cubin_end],
                          body[cubin_end:ltoir_end], digest, True, seconds, map_ltoir)


def _lookup(op: Op, key: tuple, map_spec=VALUE_MAP) -> CompiledKernel:
    """The kernel for a full key: memory, then disk, then a compile. `cache_hit` is False
    only for the call that compiled it (a thread that waited for that build gets a hit)."""

    def build() -> CompiledKernel:
        started = time.perf_counter()
        digest = _cache.disk_key(repr(key) + _link.toolchain_fingerprint())
        # values known only to this process (arbitrary objects) keep the kernel in memory
        on_disk = disk_cacheable(key)
        stored = _cache.read_entry(digest) if on_disk else None
        if stored is not None:
            try:
                return _stored_kernel(op, key, map_spec, digest, *stored, time.perf_counter() - started)
            except (KeyError, TypeError, ValueError) as error:
                warnings.warn(f"kernel cache entry {digest} has a bad header ({error}); "
                              f"recompiling and replacing it", _cache.CacheWarning, stacklevel=4)
        kernel = replace(_build(op, key, map_spec), cache_key=digest)
        if on_disk:
            _cache.write_entry(digest, {"algorithm": kernel.algorithm, "op": op.name, "arch": kernel.arch,
                                        "module": kernel.module, "out_dtype": layout_of(kernel.out_dtype).key,
                                        "cubin_size": len(kernel.cubin),
                                        "ltoir_size": len(kernel.ltoir)},
                               kernel.cubin + kernel.ltoir + kernel.map_ltoir)
        return kernel

    kernel, built_here = _kernels.get_or_build_reporting(key, build)
    return kernel if built_here else replace(kernel, cache_hit=True)


def _positions(scalars, count: int) -> set[int]:
    """The argument positions `scalars` names (a tuple or list of ints)."""
    if not isinstance(scalars, (tuple, list)):
        raise TypeError(f"scalars: expected a tuple of argument positions, got {type(scalars).__name__}")
    positions = set()
    for index, position in enumerate(scalars):
        if not is_integer(position):
            raise TypeError(f"scalars[{index}]: expected an int position, got {type(position).__name__}")
        if not 0 <= position < count:
            raise ValueError(f"scalars: position {position} is not an argument position "
                             f"(dtypes has {count} entries)")
        positions.add(int(position))
    return positions


def _normalise_kinds(dtypes, scalars) -> tuple:
    if isinstance(dtypes, (str, np.dtype, type)):
        dtypes = (dtypes,)
    elif not isinstance(dtypes, (tuple, list)):
        raise TypeError(f"dtypes: expected a dtype or a tuple of dtypes, got {type(dtypes).__name__}")
    dtypes = tuple(dtypes)
    scalar_positions = _positions(scalars, len(dtypes))
    return tuple(("scalar", as_dtype(dtype, f"dtypes[{position}]")) if position in scalar_positions
                 else ("array", as_array_dtype(dtype, f"dtypes[{position}]"))
                 for position, dtype in enumerate(dtypes))


def compile(op, algorithm: str, dtypes, arch: str | None = None, *, scalars=(), out_dtype=None,  # noqa: A001
            map_op=None, with_index: bool = False, descending: bool = False) -> CompiledKernel:  # the build step
    """Build (or fetch from cache) the kernel an algorithm runs for an operator.

    transform: `dtypes` are the operator's argument dtypes in order (records included);
    `scalars` lists the positions that are runtime scalars rather than arrays; `out_dtype`
    fixes the result type (an operator returning a tuple makes a record); `with_index` passes
    each element's global index as a last argument.
    reduce / segmented_reduce / scan / scan_one_pass: `dtypes` is the input dtype; `out_dtype`
    the accumulator (default: the input's, or `map_op`'s result, the map applied to each
    element first: `map_op(x)`, or `map_op(x, global_index)` with `with_index`; a map returning
    a tuple makes a record accumulator, and `op` then takes and returns tuples). A scan of
    records takes no map. Each is its own module: "scan" is the two passes a scan takes
    across shards, "scan_one_pass" the single pass it takes where the array has at most one
    non-empty shard (4- and 8-byte inputs and accumulators; other sizes get the two passes).
    merge_sort: `op` is a comparator, `op(x, y)` True when x goes strictly before y, and
    `dtypes` the element dtype; `map_op` is the sort's key (elements are ordered by
    `op(map_op(x), map_op(y))`) and `descending` reverses the order, stably.
    `arch` ("sm_90") is required with no GPU; by default it is device 0's. Works with no
    GPU: for inspection, AOT builds and CI. `cache_hit` tells whether the kernel came from a
    cache (memory or disk).

    >>> k = compile(lambda x, a: a * x, "transform", (np.float32, np.float64),
    ...             arch="sm_90", scalars=(1,))                          # doctest: +SKIP
    >>> "CALL" in k.sass()                                               # doctest: +SKIP
    False
    >>> k = compile(lambda x, y: abs(x) < abs(y), "merge_sort", np.int64, arch="sm_90")  # doctest: +SKIP
    """
    started = time.perf_counter()
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: expected one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    op = as_op(op)
    arg_kinds = _normalise_kinds(dtypes, scalars)
    map_spec = VALUE_MAP
    with_index = as_flag(with_index, "with_index")
    descending = as_flag(descending, "descending")
    if descending and algorithm != "merge_sort":
        raise ValueError("descending: only merge_sort takes a direction")
    if algorithm == "merge_sort":
        if len(arg_kinds) != 1 or scalars:
            raise ValueError("dtypes: merge_sort takes one element dtype")
        if out_dtype is not None:
            raise ValueError("out_dtype: merge_sort writes elements of their own dtype")
        if with_index:
            raise ValueError("with_index: merge_sort's operators take no index")
        op.check_arity(2, "sort (compare)")
        key_op = None
        if map_op is not None:
            key_op = as_op(map_op, "map_op")
            key_op.check_arity(1, "sort (key)")
        _merge_sort_module(arg_kinds[0][1], "dtypes")
        map_spec = sort_spec(key_op, descending)
    elif algorithm == "transform":
        if map_op is not None:
            raise ValueError("map_op: only reductions and scans take a map")
        arrays = sum(kind == "array" for kind, _ in arg_kinds)
        if not arrays:
            raise ValueError("dtypes: a transform needs at least one array argument")
        check_transform_counts(arrays, len(arg_kinds) - arrays, "dtypes", "scalars")
        op.check_arity(len(arg_kinds) + with_index,
                       f"dtypes ({len(arg_kinds)} entries{' and the index' if with_index else ''})")
        if with_index:
            map_spec = INDEX_MAP
    else:
        if len(arg_kinds) != 1 or scalars:
            raise ValueError(f"dtypes: {algorithm} takes one input dtype")
        op.check_arity(2, algorithm)
        if map_op is not None:
            map_op = as_op(map_op, "map_op")
            map_op.check_arity(2 if with_index else 1, "the map of a reduction")
            map_spec = ("call_index" if with_index else "call", map_op)
        elif with_index:
            raise ValueError("with_index: needs a map_op (it receives each element's global index)")
    if arch is None:
        arch = _device_arch()
    _arch_cc(arch)
    out_request = None if out_dtype is None else as_array_dtype(out_dtype, "out_dtype")
    key = (algorithm, op.identity(), _map_identity(map_spec), arg_kinds, out_request, arch)
    cached = _kernels.get(key)
    if cached is not None:
        return replace(cached, cache_hit=True, compile_seconds=time.perf_counter() - started)
    return _lookup(op, key, map_spec)


def check_transform_counts(arrays: int, scalars: int, array_argument: str, scalar_argument: str) -> None:
    """ValueError naming the argument when a transform has more arrays or runtime scalars than
    the shim's kernels take."""
    if arrays > _shim.MAX_TRANSFORM_INPUTS:
        raise ValueError(f"{array_argument}: a transform takes at most {_shim.MAX_TRANSFORM_INPUTS} "
                         f"array arguments, got {arrays}")
    if scalars > _shim.MAX_TRANSFORM_SCALARS:
        raise ValueError(f"{scalar_argument}: a transform takes at most {_shim.MAX_TRANSFORM_SCALARS} "
                         f"runtime scalars, got {scalars}")


def _device_arch() -> str:
    """Device 0's architecture, for `compile(..., arch=None)`."""
    from .places import PlaceGroup

    try:
        return PlaceGroup.by_devices([0]).archs[0]
    except RuntimeError as error:
        raise RuntimeError(f"arch: no GPU to take the architecture from ({error}); pass "
                           f"arch='sm_90' (the target's) to compile without one") from None


def kernel_libraries(op: Op, algorithm: str, arg_kinds: tuple, out_request, archs: tuple,
                     map_spec=VALUE_MAP):
    """(out dtype, one loaded KernelLibrary per place) for a group whose places have `archs`.

    The hit path is one identity computation and one dict lookup; a call that repeats the
    last one of the operator, or of its code, (same identity, dtypes, archs, plain map) skips
    the lookup too.
    """
    generation, identity = _generation, op.identity()
    plain = map_spec is VALUE_MAP or map_spec is INDEX_MAP  # their identities are themselves
    if plain:
        last = op._last_libraries
        if (last is not None and last[0] == generation and last[1] is map_spec and last[2] == algorithm
                and last[3] == identity and last[4] == arg_kinds and last[5] == archs
                and (last[6] is out_request or (last[6] is not None and out_request is not None
                                                and last[6] == out_request))):  # dtype == None is True
            return last[7]
    base = (algorithm, identity, map_spec if plain else _map_identity(map_spec), arg_kinds, out_request)
    found = _libraries.get((base, archs))
    if found is None:
        found = _libraries.get_or_build((base, archs), lambda: _build_libraries(op, base, archs, map_spec))
    if plain:  # one tuple, written whole: a thread reads this call's or another's, never a mix
        op._last_libraries = op._code_memo[0] = (generation, map_spec, algorithm, identity, arg_kinds,
                                                 archs, out_request, found)
    return found


def libraries_made_for(op: Op, libraries) -> tuple | None:
    """(generation, identity) under which op's last kernel_libraries call returned
    `libraries` (the list of its answer), or None when its memo now holds another call's (one
    of another thread, or of a map that is not plain). The plans of algorithms/transform.py and
    algorithms/reduce.py pair kernels with exactly this identity: an identity read apart from
    the lookup could differ from the one the kernels were built for."""
    last = op._last_libraries
    if last is not None and last[7][1] is libraries:
        return last[0], last[3]
    return None


def _loaded_libraries() -> list:
    """Every kernel library loaded now: what a captured graph keeps alive (an evicted
    library is unloaded once nothing holds it, and a graph launches its kernels)."""
    return _loaded.values()


def _build_libraries(op: Op, base: tuple, archs: tuple, map_spec):
    """kernel_libraries' miss: the kernel of every place's arch, loaded once per process."""
    libraries, out_dtype = [], None
    for arch in archs:
        key = base + (arch,)
        kernel = _lookup(op, key, map_spec)
        library = _loaded.get_or_build(
            key, lambda: _shim.KernelLibrary(kernel.cubin, _entry_points(kernel)))
        libraries.append(library)
        out_dtype = kernel.out_dtype
    return out_dtype, libraries


def clear_cache(memory: bool = True, disk: bool = True) -> int:
    """Forget compiled kernels: in this process (`memory`) and on disk (`disk`).

    Returns the number of disk entries removed. Kernels already loaded stay loaded for the
    life of the process (work queued with them may still be running).

    >>> sharded.clear_cache(memory=False)   # empty the disk cache only      # doctest: +SKIP
    12
    """
    global _generation
    removed = 0
    if memory:
        _generation += 1  # operators' last-call memos (kernel_libraries) from before go stale
        _kernels.clear()
        _libraries.clear()
    if disk:
        removed = _cache.clear_disk()
    return removed


def cache_info() -> dict:
    """Where the disk cache is, how many entries and bytes it holds and may hold, and the
    memory cache's entries and bound.

    >>> sharded.cache_info()["disk_entries"]                               # doctest: +SKIP
    12
    """
    directory = _cache.cache_dir()
    entries, size = _cache.disk_usage()
    return {
        "directory": str(directory) if directory else None,
        "disk_entries": entries,
        "disk_bytes": size,
        "disk_max_bytes": _cache.max_disk_bytes() if directory else 0,
        "memory_entries": len(_kernels),
        "memory_max_entries": _kernels.max_entries,
    }
