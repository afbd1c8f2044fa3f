"""`python -m cuda_sharded_jit info`: what this machine can do with the library.

Works without a GPU (it then says what is missing).
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


def info() -> list[str]:
    from . import __version__, _link, _shim
    from .compiler import cache_info

    lines = [f"cuda_sharded_jit {__version__}"]
    problems = []
    try:
        lines.append(f"  kernel LTO-IR built for: {', '.join(f'sm_{a}' for a in _link.lto_archs())}")
    except RuntimeError as error:
        problems.append(str(error))
    for package in ("numba", "numba-cuda", "cuda-bindings", "nvidia-nvjitlink", "nvidia-nvvm", "numpy"):
        lines.append(f"  {package}: {_version(package)}")
    nvvm = _link.nvvm_release()
    lines.append(f"  NVVM (CUDA release): {'%d.%d' % nvvm if nvvm else 'unknown'}")
    try:
        linker = _link.nvjitlink_release()
        lines.append(f"  nvJitLink: {linker[0]}.{linker[1]}")
        try:
            _link.check_version_skew()
            lines.append("  nvJitLink can link NVVM's output: yes")
        except _link.VersionSkewError as error:
            problems.append(str(error))
    except Exception as error:  # no nvJitLink library at all
        problems.append(f"nvJitLink unavailable: {error}")
    cache = cache_info()
    lines.append(f"  kernel cache: {cache['directory'] or 'disabled'} "
                 f"({cache['disk_entries']} entries, {cache['disk_bytes'] / 1e6:.1f} MB of at most "
                 f"{cache['disk_max_bytes'] / 1e6:.0f} MB)")
    try:
        count = _shim.visible_device_count()
        group = _shim.PlaceGroup.by_devices(None)
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
    lines.append("verdict: " + ("everything works" if not problems else "; ".join(problems)))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cuda_sharded_jit")
    parser.add_argument("command", choices=["info"], help="info: versions, GPUs, caches, verdict")
    parser.parse_args(argv)
    print("\n".join(info()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
