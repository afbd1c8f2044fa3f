"""nvJitLink back end: kernel LTO-IR (built by nvcc, shipped in _kernels/) + operator LTO-IR
(numba) -> SASS cubin for one architecture. Also the toolchain versions the caches key on."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import sys
from pathlib import Path

_KERNEL_DIR = Path(__file__).with_name("_kernels")


class VersionSkewError(RuntimeError):
    """nvJitLink is older than the NVVM that produced the operator's LTO-IR.

    The message names both versions and the package to upgrade (nvidia-nvjitlink).

    >>> try:                                                              # doctest: +SKIP
    ...     sharded.transform(f, a)
    ... except sharded.VersionSkewError as error:
    ...     print(error)
    """


# The shared libraries the JIT path loads at its first compile: what each does, and the
# wheel that ships it (a CUDA 13 toolkit has them all).
_LIBRARIES = {
    "nvjitlink": ("nvJitLink (it links operators into the library's kernels)", "nvidia-nvjitlink>=13,<14"),
    "nvvm": ("NVVM (it compiles operators to LTO-IR)", "nvidia-nvvm>=13,<14"),
    "nvrtc": ("NVRTC (numba-cuda asks it which architectures it can compile for)",
              "nvidia-cuda-nvrtc>=13,<14"),
}
_SUPPORT_ERRORS = {"NvvmSupportError": "nvvm", "NvrtcSupportError": "nvrtc"}


def missing_library_error(error: BaseException) -> RuntimeError | None:
    """A RuntimeError naming the package to install when `error`, or an exception it wraps,
    says a CUDA library could not be loaded (cuda.pathfinder's DynamicLibNotFoundError,
    numba-cuda's NvvmSupportError / NvrtcSupportError); None for any other error."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        kind = type(error).__name__
        text = str(error)
        library = _SUPPORT_ERRORS.get(kind)
        if library is None and kind == "DynamicLibNotFoundError":
            library = next((name for name in _LIBRARIES if name in text.lower()), None)
        if library is not None:
            what, package = _LIBRARIES[library]
            return RuntimeError(
                f"{what} could not be loaded: {text}. Install it: pip install '{package}' "
                f"(or install the CUDA 13 toolkit)"
            )
        error = error.__cause__ or error.__context__
    return None


@functools.lru_cache(maxsize=None)
def kernel_module(name: str) -> bytes:
    """The LTO-IR fatbin of one kernel module, e.g. "transform_o4_i4_4"."""
    path = _KERNEL_DIR / f"{name}.fatbin"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise RuntimeError(
            f"kernel module {name} is missing from {_KERNEL_DIR}: the installation is incomplete"
        ) from None


@functools.lru_cache(maxsize=None)
def build_info() -> dict:
    """What the build recorded about the shipped kernels: the LTO architectures."""
    try:
        return json.loads((_KERNEL_DIR / "build_info.json").read_text())
    except (OSError, ValueError):
        raise RuntimeError(f"{_KERNEL_DIR}/build_info.json is missing: the installation is incomplete") from None


def lto_archs() -> tuple[int, ...]:
    """Architectures (as 90, 100, ...) the shipped kernel LTO-IR was built for."""
    return tuple(sorted(build_info()["lto_archs"]))


def check_arch(arch: str) -> None:
    """LTO-IR links for its own or a newer architecture, never an older one: a target newer
    than some built LTO architecture links from it (the default build carries 80 and 90, and
    Blackwell links from 90); one older than every built LTO architecture is refused."""
    target = int(arch[3:])
    if not any(built <= target for built in lto_archs()):
        built = ", ".join(f"sm_{a}" for a in lto_archs())
        raise ValueError(
            f"arch: {arch} is older than every architecture this build carries ({built}); "
            f"rebuild with CMAKE_ARGS='-DCMAKE_CUDA_ARCHITECTURES=<list including {arch[3:]}>' "
            f"(or -DCSJ_LTO_ARCHITECTURES=<list including {arch[3:]} or an older one>)"
        )


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _toolkit_nvvm_version() -> str | None:
    """CUDA release of a toolkit's libnvvm (when it does not come from the nvidia-nvvm wheel)."""
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if not root:
            continue
        try:
            info = json.loads((Path(root) / "version.json").read_text())
        except (OSError, ValueError):
            continue
        for component in ("libnvvm", "cuda_nvcc", "cuda"):
            if component in info:
                return info[component]["version"]
    return None


@functools.lru_cache(maxsize=None)
def nvvm_release() -> tuple[int, int] | None:
    """(major, minor) CUDA release of the NVVM that numba-cuda uses, when it can be told."""
    version = _package_version("nvidia-nvvm") or _toolkit_nvvm_version()
    if not version:
        return None
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


@functools.lru_cache(maxsize=None)
def nvjitlink_release() -> tuple[int, int]:
    from cuda.bindings import nvjitlink

    return tuple(nvjitlink.version())


@functools.lru_cache(maxsize=None)
def kernels_digest() -> str:
    """Digest of every shipped kernel module as built (an incremental rebuild changes it)."""
    digest = hashlib.sha256()
    for path in sorted(_KERNEL_DIR.glob("*.fatbin")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def toolchain_archs() -> tuple[int, ...]:
    """The SASS architectures (as 90, 100, ...) the toolchain compiles for, from NVRTC (the
    same CUDA release as NVVM and nvJitLink); empty when NVRTC cannot be asked."""
    try:
        from cuda.bindings import nvrtc

        status, archs = nvrtc.nvrtcGetSupportedArchs()
        return tuple(sorted(int(arch) for arch in archs)) if status == nvrtc.nvrtcResult.NVRTC_SUCCESS else ()
    except Exception:  # noqa: BLE001 - no NVRTC: linking reports what is missing
        return ()


@functools.lru_cache(maxsize=None)
def package_digest() -> str:
    """Digest of this package's Python sources: they generate the operator wrappers and the
    keys, and the version string does not change with them."""
    digest = hashlib.sha256()
    root = Path(__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def numba_settings() -> dict:
    """The numba settings that reach code generation: every NUMBA_* environment variable
    (NUMBA_OPT, NUMBA_BOUNDSCHECK, NUMBA_CUDA_DEBUGINFO, ...; all are kept, so none can be
    missed) and a .numba_config.yaml in the working directory, which numba also reads."""
    settings = {name: value for name, value in sorted(os.environ.items()) if name.startswith("NUMBA_")}
    try:
        settings[".numba_config.yaml"] = hashlib.sha256(Path(".numba_config.yaml").read_bytes()).hexdigest()
    except OSError:
        pass
    return settings


@functools.lru_cache(maxsize=None)
def _toolchain_versions() -> str:
    linker = _package_version("nvidia-nvjitlink")
    if linker is None:  # a toolkit's nvJitLink: ask the library itself
        try:
            linker = "%d.%d" % nvjitlink_release()
        except Exception:  # noqa: BLE001 - reported when linking is attempted
            linker = "unavailable"
    parts = {
        "python": sys.version.split()[0],
        "numba": _package_version("numba"),
        "numba-cuda": _package_version("numba-cuda"),
        "cuda-bindings": _package_version("cuda-bindings"),
        "nvvm": _package_version("nvidia-nvvm") or _toolkit_nvvm_version(),
        "nvjitlink": linker,
        "shim": _package_version("cuda-sharded-jit"),
        "kernels": kernels_digest(),
        "package": package_digest(),
    }
    return json.dumps(parts, sort_keys=True)


def toolchain_fingerprint() -> str:
    """Everything outside the operator that changes generated code (part of disk keys):
    the versions of the compilers and linkers, the shipped kernels, this package's sources,
    and numba's settings. The settings are read at every disk lookup: numba takes them when
    it is imported, which may come after this process's first lookup (a later change of the
    environment then only costs a miss)."""
    return _toolchain_versions() + json.dumps(numba_settings(), sort_keys=True)


def check_version_skew() -> None:
    """Raise before linking when nvJitLink cannot read the operator's LTO-IR."""
    nvvm = nvvm_release()
    linker = nvjitlink_release()
    if nvvm is not None and tuple(linker) < nvvm:
        raise VersionSkewError(
            f"nvJitLink {linker[0]}.{linker[1]} is older than NVVM {nvvm[0]}.{nvvm[1]}, which "
            f"compiles the operators: it cannot link their LTO-IR. Upgrade nvJitLink to at "
            f"least {nvvm[0]}.{nvvm[1]}: pip install -U 'nvidia-nvjitlink>={nvvm[0]}.{nvvm[1]}'"
        )


def link(module: str, operator_ltoirs, arch: str) -> bytes:
    """Link a kernel module with operator wrappers into a SASS cubin for `arch` ("sm_90")."""
    from cuda.bindings import nvjitlink

    check_arch(arch)
    check_version_skew()
    kernel = kernel_module(module)
    handle = nvjitlink.create(3, [f"-arch={arch}", "-lto", "-O3"])
    try:
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.FATBIN, kernel, len(kernel), module)
            for index, ltoir in enumerate(operator_ltoirs):
                nvjitlink.add_data(handle, nvjitlink.InputType.LTOIR, ltoir, len(ltoir),
                                   f"operator{index}")
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as error:
            log = ""
            try:
                size = nvjitlink.get_error_log_size(handle)
                buffer = bytearray(size)
                nvjitlink.get_error_log(handle, buffer)
                log = buffer.decode(errors="replace").rstrip("\x00").strip()
            except nvjitlink.nvJitLinkError:
                pass
            if "OUTDATED" in str(error) or "outdated" in log.lower():
                linker = nvjitlink_release()
                raise VersionSkewError(
                    f"nvJitLink {linker[0]}.{linker[1]} is too old for the operator's LTO-IR "
                    f"({error}); pip install -U nvidia-nvjitlink\n{log}"
                ) from None
            raise RuntimeError(f"nvJitLink failed to link {module} for {arch}: {error}\n{log}") from None
        size = nvjitlink.get_linked_cubin_size(handle)
        cubin = bytearray(size)
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin)
    finally:
        nvjitlink.destroy(handle)
