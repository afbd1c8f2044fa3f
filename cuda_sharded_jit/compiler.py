"""The build step: operator + algorithm + dtypes + arch -> a linked kernel, cached.

`compile` is the public, inspectable form (works with no GPU). Algorithms call
`kernel_libraries`, whose hit path is one dict lookup.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from . import _cache, _link, _shim
from ._dtypes import as_dtype
from .op import Op, as_op

ALGORITHMS = ("transform",)
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
    ltoir: bytes = field(repr=False)
    cache_key: str
    cache_hit: bool
    compile_seconds: float

    @property
    def dtypes(self) -> tuple[np.dtype, ...]:
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


def _arch_cc(arch: str) -> tuple[int, int]:
    if not (isinstance(arch, str) and arch.startswith("sm_") and arch[3:].isdigit() and len(arch) >= 5):
        raise ValueError(f"arch: expected a SASS architecture like 'sm_90', got {arch!r}")
    digits = arch[3:]
    return int(digits[:-1]), int(digits[-1])


def _transform_module(arg_kinds, out_dtype) -> str:
    sizes = "_".join(str(dtype.itemsize) for kind, dtype in arg_kinds if kind == "array")
    return f"transform_o{np.dtype(out_dtype).itemsize}_i{sizes}"


def _build(op: Op, algorithm: str, arg_kinds: tuple, out_request, arch: str, key: str):
    from . import _jit

    cc = _arch_cc(arch)
    started = time.perf_counter()
    if algorithm == "transform":
        arg_dtypes = [dtype for _, dtype in arg_kinds]
        out_dtype = out_request if out_request is not None else _jit.infer_result_dtype(op, arg_dtypes, cc)
        module = _transform_module(arg_kinds, out_dtype)
        ltoir = _jit.compile_transform(op, arg_kinds, out_dtype, cc, _shim.MAX_TRANSFORM_SCALARS)
    else:  # pragma: no cover - guarded by callers
        raise ValueError(f"algorithm: unknown algorithm {algorithm!r}")
    cubin = _link.link(module, ltoir, arch)
    seconds = time.perf_counter() - started
    _dump(op, module, arch, ltoir, cubin)
    return CompiledKernel(algorithm, op.name, arg_kinds, np.dtype(out_dtype), arch, module,
                          cubin, ltoir, key, False, seconds)


def _dump(op: Op, module: str, arch: str, ltoir: bytes, cubin: bytes) -> None:
    directory = os.environ.get(ENV_DUMP)
    if not directory:
        return
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    stem = f"{op.name.replace('<', '').replace('>', '')}.{module}.{arch}"
    (path / f"{stem}.ltoir").write_bytes(ltoir)
    (path / f"{stem}.cubin").write_bytes(cubin)


_kernels = _cache.MemoryCache()     # (algorithm, identity, kinds, out, arch) -> CompiledKernel
_libraries = _cache.MemoryCache()   # (base key, archs) -> (out dtype, [KernelLibrary per place])
_loaded = _cache.MemoryCache()      # kernel key -> KernelLibrary (one load per process)
_ENTRY_POINTS = {"transform": ["csj_transform"]}


def _lookup(op: Op, key: tuple) -> CompiledKernel:
    """The kernel for a full key (memory, then disk, then compile)."""
    algorithm, _, arg_kinds, out_request, arch = key

    def build() -> CompiledKernel:
        digest = _cache.disk_key(repr(key) + _link.toolchain_fingerprint())
        started = time.perf_counter()
        stored = _cache.read_entry(digest)
        if stored is not None:
            header, body = stored
            cubin_size = header["cubin_size"]
            return CompiledKernel(algorithm, op.name, arg_kinds, np.dtype(header["out_dtype"]), arch,
                                  header["module"], body[:cubin_size], body[cubin_size:], digest,
                                  True, time.perf_counter() - started)
        kernel = _build(op, algorithm, arg_kinds, out_request, arch, digest)
        _cache.write_entry(digest, {"algorithm": algorithm, "op": op.name, "arch": arch,
                                    "module": kernel.module, "out_dtype": kernel.out_dtype.name,
                                    "cubin_size": len(kernel.cubin)}, kernel.cubin + kernel.ltoir)
        return kernel

    return _kernels.get_or_build(key, build)


def _normalise_kinds(dtypes, scalars) -> tuple:
    if isinstance(dtypes, (str, np.dtype, type)):
        dtypes = (dtypes,)
    dtypes = tuple(dtypes)
    scalar_positions = set(scalars)
    for position in scalar_positions:
        if not 0 <= position < len(dtypes):
            raise ValueError(f"scalars: position {position} is not an argument position")
    return tuple(("scalar" if position in scalar_positions else "array",
                  as_dtype(dtype, f"dtypes[{position}]"))
                 for position, dtype in enumerate(dtypes))


def compile(op, algorithm: str, dtypes, arch: str | None = None, *, scalars=(), out_dtype=None
            ) -> CompiledKernel:  # noqa: A001 - the public name of the build step
    """Build (or fetch from cache) the kernel an algorithm runs for an operator.

    dtypes: the operator's argument dtypes in order; `scalars` lists positions that are
    runtime scalars rather than arrays. `arch` ("sm_90") is required with no GPU; by
    default it is device 0's. Works with no GPU: for inspection, AOT builds and CI.
    `cache_hit` tells whether the kernel came from a cache (memory or disk).

    >>> k = compile(lambda x, a: a * x, "transform", (np.float32, np.float64),
    ...             arch="sm_90", scalars=(1,))                          # doctest: +SKIP
    >>> "CALL" in k.sass()                                               # doctest: +SKIP
    False
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: expected one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    op = as_op(op)
    arg_kinds = _normalise_kinds(dtypes, scalars)
    op.check_arity(len(arg_kinds), f"dtypes ({len(arg_kinds)} entries)")
    if arch is None:
        from .places import PlaceGroup

        arch = PlaceGroup.by_devices([0]).archs[0]
    _arch_cc(arch)
    out_request = None if out_dtype is None else as_dtype(out_dtype, "out_dtype")
    key = (algorithm, op.identity(), arg_kinds, out_request, arch)
    cached = _kernels.get(key)
    if cached is not None:
        return replace(cached, cache_hit=True)
    return _lookup(op, key)


def kernel_libraries(op: Op, algorithm: str, arg_kinds: tuple, out_request, archs: tuple):
    """(out dtype, one loaded KernelLibrary per place) for a group whose places have `archs`.

    The hit path is one identity computation and one dict lookup.
    """
    base = (algorithm, op.identity(), arg_kinds, out_request)
    found = _libraries.get((base, archs))
    if found is not None:
        return found

    def build():
        libraries, out_dtype = [], None
        for arch in archs:
            key = base + (arch,)
            kernel = _lookup(op, key)
            library = _loaded.get_or_build(
                key, lambda: _shim.KernelLibrary(kernel.cubin, _ENTRY_POINTS[algorithm]))
            libraries.append(library)
            out_dtype = kernel.out_dtype
        return out_dtype, libraries

    return _libraries.get_or_build((base, archs), build)


def clear_cache(memory: bool = True, disk: bool = True) -> int:
    """Forget compiled kernels: in this process (`memory`) and on disk (`disk`).

    Returns the number of disk entries removed. Kernels already loaded by running
    algorithms stay valid.
    """
    removed = 0
    if memory:
        _kernels.clear()
        _libraries.clear()
        _loaded.clear()
    if disk:
        removed = _cache.clear_disk()
    return removed


def cache_info() -> dict:
    """Where the disk cache is, how many entries and bytes it holds, and the memory entries."""
    entries = _cache.disk_entries()
    return {
        "directory": str(_cache.cache_dir()) if _cache.cache_dir() else None,
        "disk_entries": len(entries),
        "disk_bytes": sum(path.stat().st_size for path in entries if path.exists()),
        "memory_entries": len(_kernels),
    }
