"""Captured iterations against eager calls: one iteration of ten calls (transforms and
reductions into DeviceScalars, a conjugate-gradient step on a diagonal system) on --n
float64 elements, called eagerly, then replayed from one sharded.capture, each --iterations
times after a warm-up, on --places places of GPU 0. Target: the replay ≥ 5× faster than the
eager calls at 2^16 elements. Both runs start from the same state and must end bit for bit
equal, which is checked before any figure is printed.

    python benchmarks/captured.py [--n 65536] [--places 1 4] [--iterations 200] [--repeats 7]

Prints, per place count, the median over the repeats of the time per iteration (wall
clock, the group synchronised before and after), both ways, and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

TARGET = 5.0


def _add(u, v):
    return u + v


def _state(group, n: int):
    import cuda_sharded_jit as sharded

    rng = np.random.default_rng(0)
    d = sharded.ShardedArray.from_numpy(group, rng.uniform(1.0, 50.0, n))
    x = sharded.zeros(group, n, np.float64)
    r = sharded.ShardedArray.from_numpy(group, rng.standard_normal(n))
    p = r.copy()
    ap, products = sharded.zeros(group, n, np.float64), sharded.zeros(group, n, np.float64)
    rr, rr_next, pap = (sharded.DeviceScalar(group, np.float64) for _ in range(3))
    sharded.transform(lambda u: u * u, r, out=products)
    sharded.reduce(products, _add, 0.0, out=rr)

    def iteration():  # ten calls
        sharded.transform(lambda di, pi: di * pi, d, p, out=ap)
        sharded.transform(lambda pi, api: pi * api, p, ap, out=products)
        sharded.reduce(products, _add, 0.0, out=pap)
        sharded.transform(lambda xi, pi, a, b: xi + (a / b) * pi, x, p, rr, pap, out=x)
        sharded.transform(lambda ri, api, a, b: ri - (a / b) * api, r, ap, rr, pap, out=r)
        sharded.transform(lambda ri: ri * ri, r, out=products)
        sharded.reduce(products, _add, 0.0, out=rr_next)
        sharded.transform(lambda ri, pi, a, b: ri + (a / b) * pi, r, p, rr_next, rr, out=p)
        sharded.reduce(products, _add, 0.0, out=rr)
        sharded.transform(lambda di, xi: di * xi, d, x, out=ap)  # A x, the residual's check

    return (x, r, p, rr), iteration


def _per_iteration(step, group, iterations: int) -> float:
    group.sync()
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    group.sync()
    return (time.perf_counter() - start) / iterations


def main() -> None:
    import cuda_sharded_jit as sharded

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 16)
    parser.add_argument("--places", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"| places | eager µs / iteration | replayed µs / iteration | ratio | target ≥ {TARGET:g} |")
    print("| ---: | ---: | ---: | ---: | --- |")
    for places in args.places:
        group = sharded.PlaceGroup.by_devices([0] * places)
        eager_state, eager = _state(group, args.n)
        graph_state, iteration = _state(group, args.n)
        step = sharded.capture(iteration)
        eager(), step()  # warm-up: every kernel compiled and loaded
        eager_times = [_per_iteration(eager, group, args.iterations) for _ in range(args.repeats)]
        graph_times = [_per_iteration(step, group, args.iterations) for _ in range(args.repeats)]
        for mine, theirs in zip(graph_state, eager_state):
            mine_host = mine.value if isinstance(mine, sharded.DeviceScalar) else mine.to_numpy()
            theirs_host = theirs.value if isinstance(theirs, sharded.DeviceScalar) else theirs.to_numpy()
            if np.asarray(mine_host).tobytes() != np.asarray(theirs_host).tobytes():
                raise SystemExit("captured: the replayed iterations differ from the eager ones")
        eager_us, graph_us = statistics.median(eager_times) * 1e6, statistics.median(graph_times) * 1e6
        ratio = eager_us / graph_us
        print(f"| {places} | {eager_us:.1f} | {graph_us:.1f} | {ratio:.2f} | "
              f"{'pass' if ratio >= TARGET else 'miss'} |")


if __name__ == "__main__":
    main()
