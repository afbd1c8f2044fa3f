"""CPU tests: what an installed wheel carries besides code (typing files, version, kernels)."""

import ast
import importlib.metadata
from pathlib import Path

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _link, _shim

PACKAGE = Path(sharded.__file__).parent


def test_package_is_marked_typed():
    assert (PACKAGE / "py.typed").is_file()


def test_extension_stub_names_what_the_extension_has():
    # The stub is generated from the built module at build time; a stale one would not match.
    tree = ast.parse((PACKAGE / "_shim.pyi").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    public = {name for name in dir(_shim) if not name.startswith("_")}
    assert public <= names, sorted(public - names)
    assert "PlaceGroup" in names and "ShardedArray" in names


def test_version_has_one_source():
    assert importlib.metadata.version("cuda-sharded-jit") == sharded.__version__


def test_lto_architectures_link_every_newer_target():
    built = _link.lto_archs()
    assert built and built == tuple(sorted(set(built)))
    for target in (80, 86, 89, 90, 100, 103, 120):
        if target >= built[0]:
            _link.check_arch(f"sm_{target}")  # links from the newest built LTO-IR not newer
        else:
            with pytest.raises(ValueError, match="older than every architecture"):
                _link.check_arch(f"sm_{target}")


@pytest.mark.parametrize("algorithm, operator", [("transform", lambda x: x * 2.0),
                                                 ("scan", lambda x, y: x + y)])
def test_blackwell_links_from_older_lto_ir(fresh_cache, algorithm, operator):
    # The default build carries LTO-IR for 80 and 90 only: sm_100 and sm_120 link from lto_90.
    kernels = [sharded.compile(operator, algorithm, (np.float32,), arch=arch) for arch in ("sm_100", "sm_120")]
    assert all(kernel.cubin for kernel in kernels)
    assert kernels[0].cubin != kernels[1].cubin
