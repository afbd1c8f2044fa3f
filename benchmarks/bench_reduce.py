"""Reduce and scan: ours (user operator and built-in) vs CuPy, torch and cuda.compute on one
GPU, and the cross-place cost on 2 and 4 GPUs (same shard size per GPU)."""

from __future__ import annotations

import numpy as np

import cuda_sharded_jit as sharded

from common import Measure, time_events, time_wall


def run(cp, log2n: int, reps: int, devices: list[int]) -> list[Measure]:
    n = 1 << log2n
    f32 = np.float32
    results = []
    device = devices[0]
    one = sharded.PlaceGroup.by_devices([device])
    host = np.random.default_rng(0).random(n, dtype=f32)
    x = sharded.ShardedArray.from_numpy(one, host)
    out = sharded.ShardedArray.allocate(one, n, f32)
    add = sharded.op(lambda a, b: a + b)
    stream = one.stream(0)

    expected = host.astype(np.float64).sum()
    np.testing.assert_allclose(sharded.reduce(x, add), expected, rtol=1e-3)
    sharded.inclusive_scan(x, add, out=out)
    np.testing.assert_allclose(out.to_numpy()[-1], expected, rtol=1e-3)

    results.append(Measure("sharded reduce, user add (1 GPU)",
                           time_events(cp, stream, device, lambda: sharded.reduce(x, add), reps), n * 4))
    results.append(Measure("sharded reduce, built-in sum (1 GPU)",
                           time_events(cp, stream, device, lambda: sharded.reduce(x, "sum"), reps), n * 4))
    results.append(Measure("sharded inclusive_scan, user add (1 GPU)",
                           time_events(cp, stream, device, lambda: sharded.inclusive_scan(x, add, out=out), reps),
                           2 * n * 4, "2n counted"))
    results.append(Measure("sharded inclusive_scan, built-in sum (1 GPU)",
                           time_events(cp, stream, device, lambda: sharded.inclusive_scan(x, "sum", out=out), reps),
                           2 * n * 4, "2n counted"))
    one_reduce = time_wall(lambda: sharded.reduce(x, add), one.sync, reps)
    one_scan = time_wall(lambda: sharded.inclusive_scan(x, add, out=out), one.sync, reps)
    results.append(Measure("sharded reduce, user add, wall (1 GPU)", one_reduce, n * 4))
    results.append(Measure("sharded inclusive_scan, user add, wall (1 GPU)", one_scan, 2 * n * 4))

    with cp.cuda.Device(device):
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            xc = cp.asarray(host)
            yc = cp.empty_like(xc)
        results.append(Measure("cupy sum", time_events(cp, s.ptr, device, lambda: _on(s, lambda: xc.sum()), reps), n * 4))
        results.append(Measure("cupy cumsum", time_events(cp, s.ptr, device, lambda: _on(s, lambda: cp.cumsum(xc, out=yc)), reps),
                               2 * n * 4, "2n counted"))
        try:
            import torch

            xt = torch.as_tensor(xc, device=f"cuda:{device}")
            yt = torch.empty_like(xt)
            ts = torch.cuda.ExternalStream(s.ptr, device=f"cuda:{device}")

            def torch_cumsum():
                with torch.cuda.stream(ts):
                    torch.cumsum(xt, 0, out=yt)

            results.append(Measure("torch cumsum", time_events(cp, s.ptr, device, torch_cumsum, reps), 2 * n * 4,
                                   "2n counted"))
        except ImportError:
            pass
        try:
            import cuda.compute as cc

            result = cp.empty(1, f32)
            h_init = np.zeros(1, f32)

            def add_cc(a, b):
                return a + b

            reducer = cc.make_reduce_into(d_in=xc, d_out=result, op=add_cc, h_init=h_init)
            scratch = cp.empty(reducer(temp_storage=None, d_in=xc, d_out=result, op=add_cc, num_items=n, h_init=h_init), cp.uint8)
            results.append(Measure("cuda.compute reduce_into", time_events(
                cp, s.ptr, device,
                lambda: reducer(temp_storage=scratch, d_in=xc, d_out=result, op=add_cc, num_items=n, h_init=h_init, stream=s), reps),
                n * 4))
            scanner = cc.make_inclusive_scan(d_in=xc, d_out=yc, op=add_cc, init_value=None)
            scan_scratch = cp.empty(scanner(temp_storage=None, d_in=xc, d_out=yc, op=add_cc, num_items=n, init_value=None), cp.uint8)
            results.append(Measure("cuda.compute inclusive_scan", time_events(
                cp, s.ptr, device,
                lambda: scanner(temp_storage=scan_scratch, d_in=xc, d_out=yc, op=add_cc, num_items=n, init_value=None, stream=s), reps),
                2 * n * 4, "2n counted"))
        except Exception as error:  # measured only where importable and matching this API
            results.append(Measure("cuda.compute reduce/scan", [float("nan")], note=f"not measured: {error!r:.80}"))
    del x, out

    for count in (2, 4):
        if len(devices) < count:
            continue
        group = sharded.PlaceGroup.by_devices(devices[:count])
        xs = sharded.ShardedArray.from_numpy(group, np.tile(host, count))
        outs = sharded.ShardedArray.allocate(group, n * count, f32)
        np.testing.assert_allclose(sharded.reduce(xs, add), expected * count, rtol=1e-3)
        results.append(Measure(f"sharded reduce, user add, wall ({count} GPUs, 2^{log2n} each)",
                               time_wall(lambda: sharded.reduce(xs, add), group.sync, reps), n * 4 * count))
        results.append(Measure(f"sharded inclusive_scan, user add, wall ({count} GPUs, 2^{log2n} each)",
                               time_wall(lambda: sharded.inclusive_scan(xs, add, out=outs), group.sync, reps),
                               2 * n * 4 * count))
        del xs, outs
    return results


def _on(stream, run):
    with stream:
        run()
