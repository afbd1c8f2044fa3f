"""`python -m cuda_sharded_jit info`: what this machine can do with the library.

Works without a GPU (it then says what is missing). Exits 0 when kernels can run here (a
GPU and a working compile path), 1 when nothing can run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _driver_version() -> str:
    try:
        from cuda.bindings import driver

        status, version = driver.cuDriverGetVersion()
        if status != driver.CUresult.CUDA_SUCCESS:
            return f"unavailable ({status.name})"
        return f"CUDA {version // 1000}.{version % 1000 // 10}"
    except Exception as error:  # noqa: BLE001 - no libcuda: said as such
        return f"none found ({type(error).__name__})"


def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception as error:  # noqa: BLE001
        return f"unavailable ({type(error).__name__}: {error})"


def info() -> tuple[list[str], bool]:
    """(the report's lines, whether kernels can run here: a GPU and a working JIT path)."""
    from . import __version__, _link, _shim
    from .compiler import _find_cuobjdump, cache_info

    lines = [f"cuda_sharded_jit {__version__}", f"  Python: {sys.version.split()[0]}"]
    problems, can_compile = [], True
    try:
        lines.append(f"  kernel LTO-IR built for: {', '.join(f'sm_{a}' for a in _link.lto_archs())}")
    except RuntimeError as error:
        problems.append(str(error))
        can_compile = False
    for package in ("numba", "numba-cuda", "cuda-bindings", "nvidia-nvjitlink", "nvidia-nvvm", "numpy"):
        lines.append(f"  {package}: {_version(package)}")
    nvvm = _link.nvvm_release()
    lines.append(f"  NVVM (CUDA release): {'%d.%d' % nvvm if nvvm else 'unknown'}")
    lines.append(f"  NVRTC: {_nvrtc_version()}")
    try:
        linker = _link.nvjitlink_release()
        lines.append(f"  nvJitLink: {linker[0]}.{linker[1]}")
        try:
            _link.check_version_skew()
            lines.append("  nvJitLink can link NVVM's output: yes")
        except _link.VersionSkewError as error:
            problems.append(str(error))
            can_compile = False
    except Exception as error:  # no nvJitLink library at all
        problems.append(f"nvJitLink unavailable: {error}")
        can_compile = False
    try:
        lines.append(f"  CompiledKernel.sass(): works (cuobjdump at {_find_cuobjdump()})")
    except RuntimeError as error:
        lines.append(f"  CompiledKernel.sass(): unavailable ({error})")
    cache = cache_info()
    lines.append(f"  kernel cache: {cache['directory'] or 'disabled'} "
                 f"({cache['disk_entries']} entries, {cache['disk_bytes'] / 1e6:.1f} MB of at most "
                 f"{cache['disk_max_bytes'] / 1e6:.0f} MB)")
    lines.append(f"  driver: {_driver_version()}")
    has_gpu = False
    try:
        count = _shim.visible_device_count()
        group = _shim.PlaceGroup.by_devices(None)
        has_gpu = count > 0
        lines.append(f"  GPUs: {count}")
        for place in range(count):
            major, minor = group.compute_capability(place)
            lines.append(f"    cuda:{place}: sm_{major}{minor}, NUMA domain {group.locality_domain(place)}")
        if count > 1:
            lines.append("  peer access (row reads column):")
            for reader in range(count):
                row = " ".join("Y" if group.can_access_peer(reader, owner) else "." for owner in range(count))
                lines.append(f"    cuda:{reader}: {row}")
    except RuntimeError as error:
        problems.append(f"no GPU usable: {error}")
    runs = has_gpu and can_compile
    if not problems:
        verdict = "everything works"
    elif can_compile:
        verdict = ("operators compile (pass arch='sm_XX' to sharded.compile), but nothing can run here: "
                   + "; ".join(problems))
    else:
        verdict = "nothing can run here: " + "; ".join(problems)
    lines.append("verdict: " + verdict)
    return lines, runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cuda_sharded_jit")
    parser.add_argument("command", choices=["info"], help="info: versions, GPUs, caches, verdict")
    parser.parse_args(argv)
    lines, runs = info()
    print("\n".join(lines))
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
