"""CPU tests of the JIT path: numba -> LTO-IR -> nvJitLink -> sm_90 SASS, and its caches.
None of these needs a GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _cache, _link, compiler

from helpers.sass import cuobjdump, resource_usage, shared_fits_sm90, static_shared

ARCH = "sm_90"



def test_operator_is_inlined_in_sass(fresh_cache):
    @sharded.op
    def saxpy(x, y, alpha):
        return alpha * x + y

    kernel = sharded.compile(saxpy, "transform", (np.float32, np.float32, np.float32),
                             arch=ARCH, scalars=(2,))
    assert kernel.cubin[:4] == b"\x7fELF"
    assert kernel.ltoir and kernel.out_dtype == np.float32 and not kernel.cache_hit
    sass = kernel.sass()
    assert "csj_transform" in sass
    assert "CALL" not in sass
    assert "FFMA" in sass
    assert "LDG.E.128" in sass  # vectorised loads survive linking


@pytest.mark.parametrize("arity", [1, 2, 3, 4])
def test_every_arity_links(fresh_cache, arity):
    op = [None, lambda a: a, lambda a, b: a - b, lambda a, b, c: a * b + c,
          lambda a, b, c, d: a + b + c + d][arity]
    dtypes = [np.float32, np.int64, np.uint32, np.float64][:arity]
    kernel = sharded.compile(op, "transform", dtypes, arch=ARCH)
    expected = np.result_type(*dtypes) if arity > 1 else np.dtype(dtypes[0])
    assert kernel.out_dtype == expected
    assert "CALL" not in kernel.sass()


def test_inferred_and_requested_result_types(fresh_cache):
    assert sharded.compile(lambda x: x + 1.0, "transform", (np.int32,), arch=ARCH).out_dtype == np.float64
    assert sharded.compile(lambda x: x * 2, "transform", (np.uint32,), arch=ARCH).out_dtype == np.int64
    requested = sharded.compile(lambda x: x + 1.0, "transform", (np.int32,), arch=ARCH,
                                out_dtype=np.int32)
    assert requested.out_dtype == np.int32 and requested.module == "transform_o4_i4"
    with pytest.raises(TypeError, match="returns bool"):
        sharded.compile(lambda x: x > 0, "transform", (np.float32,), arch=ARCH)


def test_untypable_operator_is_a_type_error_with_numba_message(fresh_cache):
    def broken(x):
        return x.no_such_attribute

    with pytest.raises(TypeError) as info:
        sharded.compile(broken, "transform", (np.float32,), arch=ARCH)
    message = str(info.value)
    assert "broken" in message and "(float32)" in message and "no_such_attribute" in message


def test_wrong_arity_fails_before_compiling(fresh_cache):
    with pytest.raises(TypeError, match="takes 2 arguments"):
        sharded.compile(lambda x, y: x, "transform", (np.float32,), arch=ARCH)
    assert len(compiler._kernels) == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="algorithm"):
        sharded.compile(lambda x: x, "no-such-algorithm", (np.float32,), arch=ARCH)
    with pytest.raises(ValueError, match="arch"):
        sharded.compile(lambda x: x, "transform", (np.float32,), arch="hopper")
    with pytest.raises(TypeError, match=r"dtypes\[0\]"):
        sharded.compile(lambda x: x, "transform", (np.float16,), arch=ARCH)


def _key(op, dtypes=(np.float32,)):
    return sharded.compile(op, "transform", dtypes, arch=ARCH).cache_key


def test_key_tells_int_and_float_constants_apart(fresh_cache):
    assert _key(lambda x: x + 1) != _key(lambda x: x + 1.0)
    assert _key(lambda x: x + 1) != _key(lambda x: x + True)
    assert _key(lambda x: x + 1) == _key(lambda x: x + 1)


def test_key_follows_closure_values(fresh_cache):
    def make(k):
        return lambda x: x * k

    assert _key(make(2.0)) != _key(make(3.0))
    assert _key(make(2.0)) == _key(make(2.0))


SCALE = 2.0


def _uses_global(x):
    return x * SCALE


def test_key_follows_globals(fresh_cache):
    global SCALE
    before = _key(_uses_global)
    SCALE = 5.0
    try:
        after = _key(_uses_global)
    finally:
        SCALE = 2.0
    assert before != after
    assert _key(_uses_global) == before


def test_key_follows_dtypes_and_arch(fresh_cache):
    assert _key(lambda x: x, (np.float32,)) != _key(lambda x: x, (np.float64,))
    a = sharded.compile(lambda x: x, "transform", (np.float32,), arch="sm_90")
    b = sharded.compile(lambda x: x, "transform", (np.float32,), arch="sm_120")
    assert a.cache_key != b.cache_key and a.cubin != b.cubin


def test_too_old_arch_names_the_built_ones(fresh_cache):
    with pytest.raises(ValueError, match="sm_75 is older than every architecture"):
        sharded.compile(lambda x: x, "transform", (np.float32,), arch="sm_75")


_CHILD = textwrap.dedent("""
    import numpy as np, cuda_sharded_jit as sharded
    k = sharded.compile(lambda x, y: x * y + 1.0, "transform", (np.float32, np.float32), arch="sm_90")
    print(k.cache_key, k.cache_hit)
""")


def _child(cache: Path) -> tuple[str, bool]:
    env = dict(os.environ, CUDA_SHARDED_JIT_CACHE_DIR=str(cache))
    result = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                            env=env, check=True, cwd=cache.parent)
    key, hit = result.stdout.split()
    return key, hit == "True"


def test_disk_cache_is_shared_across_processes(fresh_cache):
    key1, hit1 = _child(fresh_cache)
    key2, hit2 = _child(fresh_cache)
    assert key1 == key2
    assert (hit1, hit2) == (False, True)
    assert len(list(fresh_cache.glob("*.kernel"))) == 1


def test_two_processes_racing_leave_one_valid_entry(fresh_cache):
    env = dict(os.environ, CUDA_SHARDED_JIT_CACHE_DIR=str(fresh_cache))
    children = [subprocess.Popen([sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE,
                                 text=True, cwd=fresh_cache.parent) for _ in range(2)]
    keys = {child.communicate()[0].split()[0] for child in children}
    assert all(child.returncode == 0 for child in children)
    assert len(keys) == 1
    entries = list(fresh_cache.glob("*.kernel"))
    assert len(entries) == 1 and not list(fresh_cache.glob(".*.tmp"))
    assert _cache.read_entry(entries[0].name[: -len(".kernel")]) is not None


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip"])
def test_corrupt_entry_is_recompiled_and_replaced(fresh_cache, damage):
    op = sharded.op(lambda x: x - 3.0)
    first = sharded.compile(op, "transform", (np.float64,), arch=ARCH)
    path = fresh_cache / f"{first.cache_key}.kernel"
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"not a kernel at all")
    else:
        path.write_bytes(data[:-10] + bytes(b ^ 0xFF for b in data[-10:]))
    sharded.clear_cache(memory=True, disk=False)
    with pytest.warns(sharded.CacheWarning, match="corrupt"):
        again = sharded.compile(op, "transform", (np.float64,), arch=ARCH)
    assert not again.cache_hit and again.cubin == first.cubin
    sharded.clear_cache(memory=True, disk=False)
    assert sharded.compile(op, "transform", (np.float64,), arch=ARCH).cache_hit


def test_unwritable_cache_directory_only_warns(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(_cache.ENV_CACHE_DIR, str(blocker / "cache"))
    sharded.clear_cache(memory=True, disk=False)
    with pytest.warns(sharded.CacheWarning, match="not writable"):
        kernel = sharded.compile(lambda x: x + 7, "transform", (np.int32,), arch=ARCH)
    assert kernel.cubin


def test_disk_cache_can_be_disabled(tmp_path, monkeypatch):
    monkeypatch.setenv(_cache.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.setenv(_cache.ENV_DISABLE, "1")
    sharded.clear_cache(memory=True, disk=False)
    assert sharded.cache_dir() is None
    sharded.compile(lambda x: x + 8, "transform", (np.int32,), arch=ARCH)
    assert not (tmp_path / "cache").exists()


def test_clear_cache_and_cache_info(fresh_cache):
    sharded.compile(lambda x: x + 9, "transform", (np.int32,), arch=ARCH)
    info = sharded.cache_info()
    assert info["directory"] == str(fresh_cache)
    assert info["disk_entries"] == 1 and info["memory_entries"] == 1 and info["disk_bytes"] > 0
    assert info["disk_bytes"] == sum(path.stat().st_size for path in fresh_cache.glob("*.kernel"))
    assert info["disk_max_bytes"] == 1 << 30 and info["memory_max_entries"] == 1024  # the defaults
    assert sharded.clear_cache() == 1
    assert sharded.cache_info()["disk_entries"] == 0 and sharded.cache_info()["memory_entries"] == 0


def test_memory_hit_is_fast_and_reported(fresh_cache):
    op = sharded.op(lambda x: x * 4)
    assert not sharded.compile(op, "transform", (np.int64,), arch=ARCH).cache_hit
    assert sharded.compile(op, "transform", (np.int64,), arch=ARCH).cache_hit


def test_concurrent_first_calls_compile_once(fresh_cache, monkeypatch):
    builds = []
    original = compiler._build

    def counting_build(*args, **kwargs):
        builds.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(compiler, "_build", counting_build)
    op = sharded.op(lambda x, y: x * y - x)
    results, barrier = [], threading.Barrier(8)

    def worker():
        barrier.wait()
        results.append(sharded.compile(op, "transform", (np.float32, np.float32), arch=ARCH).cubin)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert len(results) == 8 and len(set(results)) == 1


def test_version_skew_is_detected_before_linking(fresh_cache, monkeypatch):
    monkeypatch.setattr(_link, "nvvm_release", lambda: (99, 1))
    with pytest.raises(sharded.VersionSkewError, match=r"nvJitLink \d+\.\d+ is older than NVVM 99\.1.*nvidia-nvjitlink"):
        sharded.compile(lambda x: x + 10, "transform", (np.int32,), arch=ARCH)


def test_debug_dump(fresh_cache, tmp_path, monkeypatch):
    monkeypatch.setenv(compiler.ENV_DUMP, str(tmp_path / "dump"))
    sharded.compile(lambda x: x + 11, "transform", (np.int32,), arch=ARCH)
    suffixes = sorted(path.suffix for path in (tmp_path / "dump").iterdir())
    assert suffixes == [".cubin", ".ltoir"]


# the kernels each reduction module holds: only those its calls launch
MODULE_KERNELS = {"reduce": {"csj_reduce", "csj_fold"},
                  "segmented_reduce": {"csj_segmented_reduce", "csj_fold", "csj_segmented_fold"},
                  "scan": {"csj_reduce", "csj_fold", "csj_scan"},
                  "scan_one_pass": {"csj_scan_one_pass"}}
REDUCTION_KERNELS = set().union(*MODULE_KERNELS.values())


def sass_kernels(kernel) -> set:
    """The kernel functions a cubin's SASS holds (cuobjdump's `Function : name` lines)."""
    return set(re.findall(r"Function : (\w+)", kernel.sass()))


@pytest.mark.parametrize("algorithm", sorted(MODULE_KERNELS))
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_reduction_operators_are_inlined(fresh_cache, algorithm, dtype):
    kernel = sharded.compile(lambda a, b: max(abs(a), abs(b)), algorithm, (dtype,), arch=ARCH)
    prefix = {"reduce": "reduce", "segmented_reduce": "segmented", "scan": "scan", "scan_one_pass": "scan1"}
    assert kernel.module == f"{prefix[algorithm]}_a{np.dtype(dtype).itemsize}_i{np.dtype(dtype).itemsize}"
    assert sass_kernels(kernel) & REDUCTION_KERNELS == MODULE_KERNELS[algorithm]
    assert set(compiler._entry_points(kernel)) == MODULE_KERNELS[algorithm]  # what the load resolves
    assert "CALL" not in kernel.sass()
    assert kernel.out_dtype == np.dtype(dtype) and kernel.map_ltoir


@pytest.mark.parametrize("dtype, out_dtype", [(np.float32, None), (np.int32, None), (np.float64, None),
                                              (np.int32, np.int64)])
def test_one_pass_scan_blocks_a_multiprocessor(dtype, out_dtype):
    """Linked with a user add, the single pass fits its launch bounds. Inputs and accumulators
    of one size stage their tile in shared memory: 256 threads at most 40 registers (six
    blocks a multiprocessor) with six blocks' shared memory in 228 KiB, the tile arriving by
    asynchronous copies (LDGSTS); otherwise the tile goes through registers, 512 threads and two
    blocks. cuobjdump from the nvidia-cuda-cuobjdump wheel or PATH."""
    tool = cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    options = {} if out_dtype is None else {"out_dtype": out_dtype}
    kernel = sharded.compile(lambda x, y: x + y, "scan_one_pass", (dtype,), arch=ARCH, **options)
    registers, _ = resource_usage(tool, kernel.cubin)["csj_scan_one_pass"]
    if out_dtype is None:
        shared = static_shared(tool, kernel.cubin)["csj_scan_one_pass"]
        assert registers <= 40 and shared_fits_sm90(shared, 6), (registers, shared)
        assert "LDGSTS" in kernel.sass()
    else:
        assert registers * 512 * 2 <= 65536, registers


@pytest.mark.parametrize("in_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("acc_dtype", [np.int32, np.int64])
def test_every_one_pass_scan_module_links(fresh_cache, in_dtype, acc_dtype):
    """Each single-pass module (4- and 8-byte inputs and accumulators) links, its tile within
    the static shared memory (8-byte inputs into a 4-byte accumulator once were not)."""
    kernel = sharded.compile(lambda a, b: a + b, "scan_one_pass", (in_dtype,), arch=ARCH, out_dtype=acc_dtype)
    assert kernel.module == f"scan1_a{np.dtype(acc_dtype).itemsize}_i{np.dtype(in_dtype).itemsize}"
    assert sass_kernels(kernel) & REDUCTION_KERNELS == set(compiler._entry_points(kernel)) == {"csj_scan_one_pass"}


def test_a_segmented_reduce_of_records_links_its_own_module(fresh_cache):
    """Records of any size reach the segmented kernels through their own module per
    accumulator (the map addresses each record from the shard's base)."""
    point = np.dtype([("x", np.float32), ("y", np.float32), ("z", np.float32)], align=True)
    kernel = sharded.compile(lambda a, b: a + b, "segmented_reduce", point, arch=ARCH, map_op=lambda p: p.x)
    assert kernel.module == "segmented_a4_irec" and kernel.out_dtype == np.float32
    kernels = sass_kernels(kernel) & REDUCTION_KERNELS
    assert kernels == set(compiler._entry_points(kernel)) == MODULE_KERNELS["segmented_reduce"]


def test_a_single_pass_of_wider_values_links_the_two_passes(fresh_cache):
    """An accumulator over 8 bytes has no single pass: "scan_one_pass" links the two passes'
    module."""
    kernel = sharded.compile(lambda p, q: (p[0] + q[0], p[1] + q[1], p[2] + q[2]), "scan_one_pass", (np.float32,),
                             arch=ARCH, map_op=lambda x: (x, x, x))
    assert kernel.module == "scan_a12_i4" and len(kernel.out_dtype.names) == 3
    assert sass_kernels(kernel) & REDUCTION_KERNELS == set(compiler._entry_points(kernel)) == MODULE_KERNELS["scan"]


def test_reduce_with_map_infers_accumulator(fresh_cache):
    kernel = sharded.compile(lambda a, b: a + b, "reduce", (np.int32,), arch=ARCH,
                             map_op=lambda x: x * 0.5)
    assert kernel.out_dtype == np.float64 and kernel.module == "reduce_a8_i4"
    assert "CALL" not in kernel.sass()
    with pytest.raises(TypeError, match="takes 1 argument"):
        sharded.compile(lambda a: a, "reduce", (np.int32,), arch=ARCH)


FACTOR = 2.0


def test_changed_global_inside_a_helper_recompiles(fresh_cache):
    from numba import cuda

    global FACTOR

    @cuda.jit(device=True)
    def helper(x):
        return x * FACTOR

    op = sharded.op(lambda x: helper(x))
    before = sharded.compile(op, "transform", (np.float64,), arch=ARCH)
    FACTOR = 3.0
    try:
        after = sharded.compile(op, "transform", (np.float64,), arch=ARCH)
    finally:
        FACTOR = 2.0
    assert before.cache_key != after.cache_key
    assert before.cubin != after.cubin  # the helper really was recompiled with 3.0


def test_operators_may_call_other_operators(fresh_cache):
    square = sharded.op(lambda x: x * x)
    kernel = sharded.compile(lambda x, y: square(x) + square(y), "transform", (np.float32, np.float32),
                             arch=ARCH)
    assert kernel.out_dtype == np.float32 and "CALL" not in kernel.sass()


def _late(x):
    return x + LATE_OFFSET  # noqa: F821 - defined after the operator is made


def test_global_defined_after_decoration_is_tracked(fresh_cache):
    global LATE_OFFSET
    op = sharded.op(_late)
    LATE_OFFSET = 1.0
    first = op.identity()
    LATE_OFFSET = 2.0
    try:
        assert op.identity() != first
    finally:
        del LATE_OFFSET


def test_module_attributes_and_enums_are_tracked():
    import enum

    from helpers import config

    op = sharded.op(lambda x: x * config.SCALE)
    before = op.identity()
    config.SCALE = 5.0
    try:
        assert op.identity() != before
    finally:
        config.SCALE = 2.0
    assert op.identity() == before

    class Mode(enum.Enum):
        A = 1
        B = 2

    choice = Mode.A
    picked = sharded.op(lambda x: x * choice.value)
    first = picked.identity()
    choice = Mode.B
    assert picked.identity() != first


def test_negative_zero_is_not_zero():
    def make(value):
        return sharded.op(lambda x: x + value)

    assert make(0.0).identity() != make(-0.0).identity()
    assert _key(lambda x: x + 0.0) != _key(lambda x: x + -0.0)


def test_values_no_key_can_describe_are_refused_before_anything_is_cached(fresh_cache):
    class Settings:
        pass

    settings = Settings()
    op = sharded.op(lambda x: x if settings is not None else x)
    with pytest.raises(TypeError, match=r"reads settings: a .*Settings object"):
        op.identity()
    with pytest.raises(TypeError, match=r"reads settings"):
        sharded.compile(op, "transform", (np.float32,), arch=ARCH)
    assert not list(fresh_cache.glob("*.kernel"))


def test_bad_header_is_recompiled(fresh_cache):
    op = sharded.op(lambda x: x * 6)
    kernel = sharded.compile(op, "transform", (np.int32,), arch=ARCH)
    # an authentic entry (signed by this cache) whose header describes no kernel
    _cache.write_entry(kernel.cache_key, {}, b"x")
    assert _cache.read_entry(kernel.cache_key) == ({"body_size": 1}, b"x")
    sharded.clear_cache(memory=True, disk=False)
    with pytest.warns(sharded.CacheWarning, match="bad header"):
        again = sharded.compile(op, "transform", (np.int32,), arch=ARCH)
    assert again.cubin == kernel.cubin


@pytest.mark.parametrize("field, value, reason", [
    ("out_dtype", "float32", "out_dtype float32 differs from this call's float64"),  # a smaller output
    ("out_dtype", "object", "out_dtype"),
    ("module", "transform_o4_i8", "module 'transform_o4_i8' differs"),
    ("algorithm", "reduce", "holds a 'reduce' kernel"),
    ("arch", "sm_120", "for 'sm_120'"),
    ("cubin_size", 10 ** 9, "do not fit"),
    ("cubin_size", True, "do not fit"),
    ("ltoir_size", -1, "do not fit"),
])
def test_header_that_disagrees_with_the_call_is_recompiled(fresh_cache, field, value, reason):
    """An authenticated entry whose header says something this call does not compute (an
    entry of another build, or a bug) is corrupt: warned about, recompiled and replaced."""
    op = sharded.op(lambda x: x * 0.5 + 2.0)
    kernel = sharded.compile(op, "transform", (np.float64,), arch=ARCH, out_dtype=np.float64)
    header, body = _cache.read_entry(kernel.cache_key)
    _cache.write_entry(kernel.cache_key, dict(header, **{field: value}), body)
    sharded.clear_cache(memory=True, disk=False)
    with pytest.warns(sharded.CacheWarning, match=f"bad header.*{re.escape(reason)}"):
        again = sharded.compile(op, "transform", (np.float64,), arch=ARCH, out_dtype=np.float64)
    assert not again.cache_hit and again.cubin == kernel.cubin and again.out_dtype == np.float64
    sharded.clear_cache(memory=True, disk=False)
    assert sharded.compile(op, "transform", (np.float64,), arch=ARCH, out_dtype=np.float64).cache_hit


def test_a_scan_picks_the_single_pass_for_a_lone_shard_of_its_sizes():
    """A scan links the single pass where at most one shard holds elements and the input and
    accumulator are 4 or 8 bytes (an accumulator the operator's typing decides: None), the two
    passes otherwise."""
    from types import SimpleNamespace

    from cuda_sharded_jit.algorithms.reduce import _scan_algorithm

    f4, f8 = np.dtype(np.float32), np.dtype(np.float64)
    rec = np.dtype([("a", np.float32), ("b", np.float32), ("c", np.float32)])
    cases = [((0, 0), f4, f4, "scan_one_pass"), ((5,), f4, f8, "scan_one_pass"), ((0, 7, 0), f8, None, "scan_one_pass"),
             ((3, 4), f4, f4, "scan"), ((7,), f4, rec, "scan"), ((7,), rec, rec, "scan"), ((1, 0, 1), f8, None, "scan")]
    for sizes, in_dtype, acc, expected in cases:
        assert _scan_algorithm(SimpleNamespace(shard_sizes=sizes), in_dtype, acc) == expected, (sizes, in_dtype, acc)
