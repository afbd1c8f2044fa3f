"""CPU tests: the package imports anywhere, without numba and without a GPU."""

import builtins
import subprocess
import sys

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim

from conftest import DEVICE_COUNT


def test_import_does_not_import_numba(tmp_path):
    code = "import sys, cuda_sharded_jit; print('numba' in sys.modules, 'numba_cuda' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=tmp_path)
    assert result.stdout.split() == ["False", "False"]


def test_import_does_not_import_mpi4py(tmp_path):
    code = "import sys, cuda_sharded_jit; print('mpi4py' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=tmp_path)
    assert result.stdout.split() == ["False"]


def test_public_names():
    for name in ["PlaceGroup", "ShardedArray", "op", "compile", "transform", "ops",
                 "cache_dir", "clear_cache"]:
        assert hasattr(sharded, name), name


@pytest.mark.skipif(DEVICE_COUNT > 0, reason="a GPU is visible")
def test_no_gpu_is_a_clear_runtime_error():
    with pytest.raises(RuntimeError, match="no usable NVIDIA driver and GPU|no CUDA GPU"):
        sharded.PlaceGroup.by_devices()
    with pytest.raises(RuntimeError, match="GPU"):
        sharded.PlaceGroup.by_locality_domains()


def test_even_split_puts_extra_elements_first():
    assert _shim.ShardedArray.even_sizes(10, 3) == [4, 3, 3]
    assert _shim.ShardedArray.even_sizes(2, 4) == [1, 1, 0, 0]
    assert _shim.ShardedArray.even_sizes(0, 2) == [0, 0]
    with pytest.raises(ValueError, match="n: expected a non-negative"):
        _shim.ShardedArray.even_sizes(-1, 2)


def test_device_list_validation_needs_no_gpu():
    with pytest.raises(TypeError, match="devices"):
        sharded.PlaceGroup.by_devices("0")
    with pytest.raises(TypeError, match=r"devices\[1\]"):
        sharded.PlaceGroup.by_devices([0, 1.5])


def test_dtype_validation():
    from cuda_sharded_jit._dtypes import as_dtype

    assert as_dtype("float32") == np.float32
    with pytest.raises(TypeError, match="dtype: unsupported dtype float16"):
        as_dtype(np.float16)
    with pytest.raises(TypeError, match="dtype: .* is not a dtype"):
        as_dtype(object())


def test_operators_validate_before_compiling():
    with pytest.raises(TypeError, match="expected a Python function"):
        sharded.op(42)
    with pytest.raises(TypeError, match="plain positional"):
        sharded.op(lambda *xs: xs[0])
    square = sharded.op(lambda x: x * x)
    assert square(3) == 9
    with pytest.raises(TypeError, match="takes 1 argument, but transform passes 2"):
        square.check_arity(2, "transform")


def test_array_constructors_reject_non_groups():
    with pytest.raises(TypeError, match="group: expected a PlaceGroup"):
        sharded.ShardedArray.allocate(None, 10, np.float32)
    with pytest.raises(TypeError, match="use ShardedArray.allocate"):
        sharded.ShardedArray(None, None)


def test_descriptor_repr():
    assert repr(sharded.ops.axpy(2.0)) == "sharded.ops.axpy(2.0)"
    assert sharded.ops.add.arity == 2 and sharded.ops.negate.arity == 1


def test_info_runs_without_a_gpu(tmp_path):
    result = subprocess.run([sys.executable, "-m", "cuda_sharded_jit", "info"], capture_output=True,
                            text=True, cwd=tmp_path)
    assert "cuda_sharded_jit" in result.stdout and "numba-cuda:" in result.stdout
    for line in ("  Python: " + sys.version.split()[0], "  NVRTC: ", "  driver: ", "  CompiledKernel.sass(): "):
        assert line in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("verdict: ")
    if DEVICE_COUNT == 0:  # compiles, but nothing can run: a non-zero exit
        assert "nothing can run here" in result.stdout and "no GPU usable" in result.stdout
        assert result.returncode == 1
    else:
        assert result.returncode == 0, result.stdout


def test_star_import_does_not_shadow_builtins():
    namespace = {}
    exec("from cuda_sharded_jit import *", namespace)  # noqa: S102 - what a user's star import does
    assert "sum" not in namespace and "min" not in namespace and "max" not in namespace
    assert "transform" in namespace and "PlaceGroup" in namespace
    assert sharded.sum is not builtins.sum  # still public under the package's name


def test_scalars_that_do_not_fit_are_value_errors():
    from cuda_sharded_jit._dtypes import exact_cast
    from cuda_sharded_jit.algorithms.transform import pack_scalars

    assert exact_cast(3, np.uint32, "init") == 3
    with pytest.raises(ValueError, match="init: -1 does not fit uint32"):
        exact_cast(-1, np.uint32, "init")
    with pytest.raises(ValueError, match="2.5 does not fit int32"):
        exact_cast(2.5, np.int32, "ops.scale")
    with pytest.raises(ValueError, match="does not fit"):
        exact_cast(2 ** 70, np.int64, "init")
    assert exact_cast(2.5, np.float32, "init") == np.float32(2.5)
    with pytest.raises(ValueError, match="args: a scalar does not fit"):
        pack_scalars([2 ** 70], [np.dtype(np.uint64)])
