"""Resource usage of linked kernels, read from their cubins with cuobjdump (the
nvidia-cuda-cuobjdump wheel or PATH), for the CPU tests that hold a kernel to a budget of
registers and shared memory: its blocks a multiprocessor, with no local memory."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess


def cuobjdump() -> str | None:
    try:
        import nvidia.cu13

        found = pathlib.Path(next(iter(nvidia.cu13.__path__))) / "bin" / "cuobjdump"
        if found.exists():
            return str(found)
    except (ImportError, StopIteration):
        pass
    return shutil.which("cuobjdump")


def _usage(tool: str, cubin: bytes) -> str:
    """cuobjdump's resource usage of every function in the cubin."""
    path = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"csj_usage_{os.getpid()}.cubin"
    path.write_bytes(cubin)
    try:
        return subprocess.run([tool, "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    finally:
        path.unlink()


def resource_usage(tool: str, cubin: bytes) -> dict[str, tuple[int, int]]:
    """{kernel name: (registers, stack bytes)} of every function in the cubin."""
    pattern = r"Function (\w+):\s*\n\s*REG:(\d+) STACK:(\d+)"
    return {name: (int(registers), int(stack)) for name, registers, stack in re.findall(pattern, _usage(tool, cubin))}


def static_shared(tool: str, cubin: bytes) -> dict[str, int]:
    """{kernel name: static shared memory bytes} of every function in the cubin."""
    pattern = r"Function (\w+):\s*\n\s*REG:\d+ STACK:\d+ SHARED:(\d+)"
    return {name: int(shared) for name, shared in re.findall(pattern, _usage(tool, cubin))}


def shared_fits_sm90(shared: int, blocks: int) -> bool:
    """Whether `blocks` blocks of `shared` bytes of static shared memory fit an sm_90
    multiprocessor: 228 KiB, 1 KiB of it reserved a block."""
    return blocks * (shared + 1024) <= 228 * 1024
