"""Transform: ours (user operator and descriptor) vs cuda.compute, CuPy and the device copy
limit on one GPU; weak scaling over places; host overhead per small call."""

from __future__ import annotations

import numpy as np

import cuda_sharded_jit as sharded

from common import Measure, host_time_per_call, time_events, time_wall


def _cuda_compute():
    try:
        import cuda.compute as cc  # noqa: F401

        return cc
    except Exception:  # not installed or no matching driver: measured only when importable
        return None


def run(cp, log2n: int, reps: int, devices: list[int]) -> list[Measure]:
    n = 1 << log2n
    results = []
    f32 = np.float32
    one = sharded.PlaceGroup.by_devices([devices[0]])
    device = devices[0]

    with cp.cuda.Device(device):
        src = cp.random.random(n, dtype=f32)
        dst = cp.empty_like(src)
        stream = cp.cuda.Stream(non_blocking=True)

        def copy():
            cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, n * 4,
                                        cp.cuda.runtime.memcpyDeviceToDevice, stream.ptr)

        results.append(Measure("device copy (limit)", time_events(cp, stream.ptr, device, copy, reps),
                               2 * n * 4, "read + write"))

        x_cp, y_cp = cp.random.random(n, dtype=f32), cp.random.random(n, dtype=f32)
        z_cp = cp.empty_like(x_cp)

        def cupy_add():
            with stream:
                cp.add(x_cp, y_cp, out=z_cp)

        results.append(Measure("cupy add", time_events(cp, stream.ptr, device, cupy_add, reps), 3 * n * 4))

        cc = _cuda_compute()
        if cc is not None:
            def add(a, b):
                return a + b

            transform = cc.make_binary_transform(d_in1=x_cp, d_in2=y_cp, d_out=z_cp, op=add)

            def cccl_add():
                transform(d_in1=x_cp, d_in2=y_cp, d_out=z_cp, op=add, num_items=n, stream=stream)

            results.append(Measure("cuda.compute binary_transform", time_events(cp, stream.ptr, device, cccl_add, reps),
                                   3 * n * 4))
            np.testing.assert_allclose(cp.asnumpy(z_cp[:1000]), cp.asnumpy(x_cp[:1000] + y_cp[:1000]))
            small = [cp.random.random(1024, dtype=f32) for _ in range(3)]
            small_transform = cc.make_binary_transform(d_in1=small[0], d_in2=small[1], d_out=small[2], op=add)
            host = host_time_per_call(
                lambda: small_transform(d_in1=small[0], d_in2=small[1], d_out=small[2], op=add,
                                        num_items=1024, stream=stream),
                stream.synchronize)
            results.append(Measure("cuda.compute host time per call (1024 elements)", [host]))

    x_host = np.random.default_rng(1).random(n, dtype=f32)
    y_host = np.random.default_rng(2).random(n, dtype=f32)
    x = sharded.ShardedArray.from_numpy(one, x_host)
    y = sharded.ShardedArray.from_numpy(one, y_host)
    z = sharded.ShardedArray.allocate(one, n, f32)
    user_add = sharded.op(lambda a, b: a + b)
    sharded.transform(user_add, x, y, out=z)
    np.testing.assert_array_equal(z.to_numpy()[:1 << 20], (x_host + y_host)[:1 << 20])
    sharded.transform(sharded.ops.add, x, y, out=z)
    np.testing.assert_array_equal(z.to_numpy()[-(1 << 20):], (x_host + y_host)[-(1 << 20):])
    stream_ptr = one.stream(0)
    results.append(Measure("sharded transform, user lambda add (1 GPU)",
                           time_events(cp, stream_ptr, device, lambda: sharded.transform(user_add, x, y, out=z), reps),
                           3 * n * 4))
    results.append(Measure("sharded transform, ops.add descriptor (1 GPU)",
                           time_events(cp, stream_ptr, device, lambda: sharded.transform(sharded.ops.add, x, y, out=z), reps),
                           3 * n * 4))
    one_wall = time_wall(lambda: sharded.transform(user_add, x, y, out=z), one.sync, reps)
    results.append(Measure("sharded transform, user add, wall (1 GPU)", one_wall, 3 * n * 4))
    del x, y, z

    for count in (2, 4):
        if len(devices) < count:
            continue
        group = sharded.PlaceGroup.by_devices(devices[:count])
        xs = sharded.ShardedArray.from_numpy(group, np.full(n * count, 1.5, f32))
        ys = sharded.ShardedArray.from_numpy(group, np.full(n * count, 2.0, f32))
        zs = sharded.ShardedArray.allocate(group, n * count, f32)
        sharded.transform(user_add, xs, ys, out=zs)
        assert np.all(zs.to_numpy() == 3.5)
        wall = time_wall(lambda: sharded.transform(user_add, xs, ys, out=zs), group.sync, reps)
        results.append(Measure(f"sharded transform, user add, wall ({count} GPUs, 2^{log2n} each)",
                               wall, 3 * n * 4 * count))
        del xs, ys, zs

    small = [sharded.ShardedArray.from_numpy(one, np.ones(1024, f32)) for _ in range(3)]
    host = host_time_per_call(lambda: sharded.transform(user_add, small[0], small[1], out=small[2]), one.sync)
    results.append(Measure("sharded host time per call (1024 elements, 1 place)", [host]))
    return results
