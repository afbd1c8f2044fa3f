"""Transform cases: unary (x + x) and binary (a + b); ours with a user operator and with a
built-in descriptor, vs CuPy, torch and cuda.compute. Bytes counted: every input read and
the output written."""

from __future__ import annotations

import cuda_sharded_jit as sharded

from sweep import Case, Impl, assert_equal, check_each_shard, cuda_compute, shard_view

# The targets' "user lambda": a Python lambda the library JIT-compiles, as a user would write it.
USER_ADD = sharded.op(lambda a, b: a + b)
USER_DOUBLE = sharded.op(lambda a: a + a)


# cuda.compute's operators: module-level functions, so that its build cache sees one operator.
def add(a, b):
    return a + b


def double(a):
    return a + a


# ---- unary: out = x + x -----------------------------------------------------------------------

def _ours_unary(data) -> Impl:
    x, out = data.arrays["x"], data.arrays["out"]
    return Impl(lambda: sharded.transform(USER_DOUBLE, x, out=out))


def _cupy_unary(data) -> Impl:
    cp, x, out = data.cp, data.x[0], data.out[0]
    return Impl(lambda: cp.add(x, x, out=out))


def _torch_unary(data) -> Impl:
    import torch

    x, out = data.tensors["x"], data.tensors["out"]
    return Impl(lambda: torch.add(x, x, out=out))


def _cccl_unary(data) -> Impl:
    x, out, stream = data.x[0], data.out[0], data.stream
    size = int(x.size)
    build = cuda_compute().make_unary_transform(d_in=x, d_out=out, op=double)
    return Impl(lambda: build(d_in=x, d_out=out, op=double, num_items=size, stream=stream))


TRANSFORM_UNARY = Case(
    "transform_unary", 2,
    ours={"ours": _ours_unary},
    peers={"cupy": _cupy_unary, "torch": _torch_unary, "cuda.compute": _cccl_unary},
    check=lambda data, value: check_each_shard(data, lambda x, y: x + x, "x + x"), note="x + x")


# ---- binary: out = a + b ----------------------------------------------------------------------

def _ours_binary(data) -> Impl:
    x, y, out = data.arrays["x"], data.arrays["y"], data.arrays["out"]
    return Impl(lambda: sharded.transform(USER_ADD, x, y, out=out))


def _ours_binary_builtin(data) -> Impl:
    x, y, out = data.arrays["x"], data.arrays["y"], data.arrays["out"]
    return Impl(lambda: sharded.transform(sharded.ops.add, x, y, out=out))


def _cupy_binary(data) -> Impl:
    cp, x, y, out = data.cp, data.x[0], data.y[0], data.out[0]
    return Impl(lambda: cp.add(x, y, out=out))


def _torch_binary(data) -> Impl:
    import torch

    x, y, out = data.tensors["x"], data.tensors["y"], data.tensors["out"]
    return Impl(lambda: torch.add(x, y, out=out))


def _cccl_binary(data) -> Impl:
    x, y, out, stream = data.x[0], data.y[0], data.out[0], data.stream
    size = int(x.size)
    build = cuda_compute().make_binary_transform(d_in1=x, d_in2=y, d_out=out, op=add)
    return Impl(lambda: build(d_in1=x, d_in2=y, d_out=out, op=add, num_items=size, stream=stream))


TRANSFORM_BINARY = Case(
    "transform_binary", 3,
    ours={"ours": _ours_binary, "ours built-in": _ours_binary_builtin},
    peers={"cupy": _cupy_binary, "torch": _torch_binary, "cuda.compute": _cccl_binary},
    check=lambda data, value: check_each_shard(data, lambda x, y: x + y, "a + b"),
    note="a + b; built-in: sharded.ops.add")



# ---- a + b, which allocates its result, against the transform call that also does -------------
# Host time only (benchmarks/run.py's host suite): at 2^28 elements a new array per call would
# time the allocator, not the transform.

def _ours_operator(data) -> Impl:
    x, y = data.arrays["x"], data.arrays["y"]
    return Impl(lambda: x + y)


def _ours_builtin_new_array(data) -> Impl:
    x, y = data.arrays["x"], data.arrays["y"]
    return Impl(lambda: sharded.transform(sharded.ops.add, x, y))


def _check_returned(data, value) -> None:
    """The returned array's every shard equals x + y."""
    for place, (x, y) in enumerate(zip(data.x, data.y)):
        with data.cp.cuda.Device(data.devices[place]):
            assert_equal(data.cp, shard_view(data.cp, value, place), x + y, f"a + b, shard {place}")


TRANSFORM_BINARY_NEW_ARRAY = Case(
    "transform_binary", 3,
    ours={"ours a + b": _ours_operator, "ours built-in, new array": _ours_builtin_new_array},
    peers={}, check=_check_returned, note="a + b and transform(sharded.ops.add, a, b): a new array per call")

CASES = [TRANSFORM_UNARY, TRANSFORM_BINARY]  # the throughput sweep's (TRANSFORM_BINARY_NEW_ARRAY: host time only)
