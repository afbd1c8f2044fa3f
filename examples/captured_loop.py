"""Conjugate gradients with every iteration captured into one CUDA graph: the dots reduce
into DeviceScalars, the step sizes are read on the device, and a replay launches the nine
calls of an iteration at once. The replayed solve is checked bit for bit against the same
calls made eagerly, and the solution against numpy.

    python examples/captured_loop.py
"""

import sys
import time

import numpy as np

import cuda_sharded_jit as sharded
from _common import group_or_exit

N = 1 << 16
ITERATIONS = 60


def add(u, v):
    return u + v


def solver(group, d_host, b_host):
    """The state of one solve of diag(d) x = b from x = 0, and its iteration (9 calls)."""
    d = sharded.ShardedArray.from_numpy(group, d_host)
    x = sharded.zeros(group, N, np.float64)
    r = sharded.ShardedArray.from_numpy(group, b_host)
    p = sharded.ShardedArray.from_numpy(group, b_host)
    ap = sharded.zeros(group, N, np.float64)
    products = sharded.zeros(group, N, np.float64)
    rr, rr_next, pap = (sharded.DeviceScalar(group, np.float64) for _ in range(3))
    sharded.reduce(sharded.transform(lambda u: u * u, r), add, 0.0, out=rr)

    def iteration():
        sharded.transform(lambda di, pi: di * pi, d, p, out=ap)
        sharded.transform(lambda pi, api: pi * api, p, ap, out=products)
        sharded.reduce(products, add, 0.0, out=pap)
        sharded.transform(lambda xi, pi, a, b: xi + (a / b) * pi, x, p, rr, pap, out=x)
        sharded.transform(lambda ri, api, a, b: ri - (a / b) * api, r, ap, rr, pap, out=r)
        sharded.transform(lambda ri: ri * ri, r, out=products)
        sharded.reduce(products, add, 0.0, out=rr_next)
        sharded.transform(lambda ri, pi, a, b: ri + (a / b) * pi, r, p, rr_next, rr, out=p)
        sharded.reduce(products, add, 0.0, out=rr)

    return x, rr, iteration


def timed(step, group) -> float:
    group.sync()
    start = time.perf_counter()
    for _ in range(ITERATIONS):
        step()
    group.sync()
    return (time.perf_counter() - start) / ITERATIONS


def main() -> int:
    group = group_or_exit("captured_loop")
    rng = np.random.default_rng(21)
    d_host, b_host = rng.uniform(1.0, 50.0, N), rng.standard_normal(N)

    x_eager, rr_eager, eager = solver(group, d_host, b_host)
    x_graph, rr_graph, iteration = solver(group, d_host, b_host)
    step = sharded.capture(iteration)
    eager_seconds = timed(eager, group)
    graph_seconds = timed(step, group)

    same = x_graph.to_numpy().tobytes() == x_eager.to_numpy().tobytes() and \
        rr_graph.value.tobytes() == rr_eager.value.tobytes()
    error = np.abs(x_graph.to_numpy() - b_host / d_host).max()
    print(f"{step!r}")
    print(f"an iteration of {N} float64 on {len(group)} place(s): eager {eager_seconds * 1e6:.1f} us, "
          f"replayed {graph_seconds * 1e6:.1f} us ({eager_seconds / graph_seconds:.1f}x)")
    print(f"after {ITERATIONS} iterations: |r|^2 = {float(rr_graph):.3e}, max |x - b/d| = {error:.3e}, "
          f"replay bit for bit the eager solve: {same}")
    return 0 if same and error < 1e-5 * np.abs(b_host / d_host).max() else 1


if __name__ == "__main__":
    sys.exit(main())
