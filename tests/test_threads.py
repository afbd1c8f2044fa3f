"""Threads: one PlaceGroup shared by many threads, each with its own arrays; concurrent
read-only calls on one array; concurrent first calls of a new operator; free() racing with
calls; a pool of threads hammering small calls. Every result is checked against numpy.
"""

from __future__ import annotations

import concurrent.futures
import gc
import threading
import time

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import compiler

from conftest import sample

pytestmark = pytest.mark.gpu

THREADS = 8
JOIN_SECONDS = 300  # a deadlock fails the test instead of hanging the suite


def run_together(worker, count: int = THREADS) -> list:
    """worker(index) on `count` threads released at once; their results, or the first error."""
    barrier = threading.Barrier(count)

    def start(index):
        barrier.wait()
        return worker(index)

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(start, index) for index in range(count)]
        done, pending = concurrent.futures.wait(futures, timeout=JOIN_SECONDS)
        assert not pending, "threads did not finish: deadlock?"
        return [future.result() for future in futures]


def _add(x, y):
    return x + y


def _square(x):
    return x * x


def _is_positive(x):
    return x > 0


def _running_max(x, y):
    return x if x > y else y


def _every_algorithm(group, seed: int) -> None:
    """Each tier-1 algorithm on this thread's own arrays, checked against numpy."""
    n = 50_000 + 977 * seed
    host = sample(np.int64, n, seed)
    a = sharded.ShardedArray.from_numpy(group, host)

    np.testing.assert_array_equal(sharded.transform(lambda x: x * 3 + 1, a).to_numpy(), host * 3 + 1)
    assert sharded.reduce(a, _add) == host.sum()
    assert sharded.sum(a) == host.sum()
    assert sharded.transform_reduce(a, _square, _add, 0) == np.sum(host * host)
    np.testing.assert_array_equal(sharded.inclusive_scan(a, _add).to_numpy(), np.cumsum(host))
    np.testing.assert_array_equal(sharded.inclusive_scan(a, _running_max).to_numpy(),
                                  np.maximum.accumulate(host))
    exclusive = sharded.exclusive_scan(a, "sum", 5).to_numpy()
    np.testing.assert_array_equal(exclusive, 5 + np.concatenate([[0], np.cumsum(host)[:-1]]))
    np.testing.assert_array_equal(sharded.adjacent_difference(a).to_numpy(),
                                  np.concatenate([host[:1], np.diff(host)]))
    assert sharded.count_if(a, _is_positive) == int(np.count_nonzero(host > 0))
    assert sharded.count(a, int(host[seed])) == int(np.count_nonzero(host == host[seed]))
    counts = sharded.histogram_even(a, 37, -1000.0, 1000.0)
    np.testing.assert_array_equal(counts, np.histogram(host, bins=37, range=(-1000.0, 1000.0))[0])

    b = sharded.ShardedArray.allocate(group, n, np.float64)
    sharded.fill(b, float(seed))
    np.testing.assert_array_equal(b.to_numpy(), np.full(n, float(seed)))
    sharded.sequence(b, start=seed, step=0.5)
    np.testing.assert_array_equal(b.to_numpy(), seed + 0.5 * np.arange(n))

    if hasattr(sharded, "sort"):  # being written on main; runs once merged
        sorted_copy = sharded.ShardedArray.from_numpy(group, host)
        sharded.sort(sorted_copy)
        np.testing.assert_array_equal(sorted_copy.to_numpy(), np.sort(host))


@pytest.mark.parametrize("places", ["three", "all"])
def test_every_algorithm_on_a_shared_group(three_places, all_devices, places):
    group = three_places if places == "three" else all_devices

    def worker(index):
        for repeat in range(3):
            _every_algorithm(group, seed=index + THREADS * repeat)
        return index

    assert run_together(worker) == list(range(THREADS))
    group.sync()


def test_concurrent_read_only_calls_on_one_array(three_places):
    host = sample(np.float64, 300_001, seed=42)
    shared = sharded.ShardedArray.from_numpy(three_places, host)
    total = sharded.reduce(shared, _add)  # the deterministic reference for every thread
    expected_scan = sharded.inclusive_scan(shared, _add).to_numpy()
    np.testing.assert_allclose(total, host.sum(), rtol=1e-10)

    def worker(index):
        for _ in range(10):
            assert sharded.reduce(shared, _add).tobytes() == total.tobytes()  # bitwise
            np.testing.assert_array_equal(sharded.inclusive_scan(shared, _add).to_numpy(), expected_scan)
            np.testing.assert_array_equal(sharded.transform(lambda x: x * 2.0, shared).to_numpy(), host * 2.0)
            assert sharded.count(shared, host[index]) == int(np.count_nonzero(host == host[index]))
            np.testing.assert_array_equal(sharded.histogram_even(shared, 16, -2.0, 2.0),
                                          np.histogram(host, bins=16, range=(-2.0, 2.0))[0])
            assert sharded.max(shared) == host.max()
        return True

    assert all(run_together(worker))
    np.testing.assert_array_equal(shared.to_numpy(), host)  # read-only calls wrote nothing


def test_concurrent_first_calls_of_a_new_operator_compile_once(one_place, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_SHARDED_JIT_CACHE_DIR", str(tmp_path / "cache"))
    sharded.clear_cache(memory=True, disk=False)
    builds = []
    real_build = compiler._build

    def counting_build(*args, **kwargs):
        builds.append(threading.get_ident())
        return real_build(*args, **kwargs)

    monkeypatch.setattr(compiler, "_build", counting_build)
    offset = 11.0 + time.time() % 1  # a value no earlier test compiled with (a closure value)
    new_op = sharded.op(lambda x: x * 4.0 - offset)
    host = sample(np.float64, 10_000, seed=3)
    arrays = [sharded.ShardedArray.from_numpy(one_place, host + index) for index in range(THREADS)]
    entries_before = sharded.cache_info()["memory_entries"]

    results = run_together(lambda index: sharded.transform(new_op, arrays[index]).to_numpy())

    assert len(builds) == 1  # one compile; the other seven threads waited for it
    assert sharded.cache_info()["memory_entries"] == entries_before + 1
    for index, result in enumerate(results):
        np.testing.assert_array_equal(result, (host + index) * 4.0 - offset)


def test_free_waits_for_calls_in_flight_and_later_calls_raise(three_places):
    """free() on one thread while others call on the array: every call either completes with
    the right answer or raises ValueError naming the freed array; nothing crashes."""
    host = np.arange(1 << 20, dtype=np.int64)
    expected = host.sum()
    for _ in range(5):
        array = sharded.ShardedArray.from_numpy(three_places, host)
        started = threading.Event()
        outcomes = []

        def caller():
            started.set()
            while True:
                try:
                    total = sharded.reduce(array, _add)
                    scanned = sharded.inclusive_scan(array, "sum")
                except ValueError as error:
                    assert "freed" in str(error)
                    outcomes.append("freed")
                    return
                assert total == expected
                assert scanned.to_numpy()[-1] == expected
                outcomes.append("ok")

        callers = [threading.Thread(target=caller) for _ in range(3)]
        for thread in callers:
            thread.start()
        started.wait()
        time.sleep(0.01)
        array.free()
        for thread in callers:
            thread.join(JOIN_SECONDS)
        assert not any(thread.is_alive() for thread in callers)
        assert outcomes.count("freed") == 3
    three_places.sync()


def test_thread_pool_hammering_small_calls(three_places):
    """A pool of threads running many small calls for a few seconds (bounded), each checked."""
    deadline = time.monotonic() + 4.0
    calls = {"count": 0}
    lock = threading.Lock()

    def small_call(index):
        n = 1 + index % 2000
        host = sample(np.int32 if index % 2 else np.float32, n, seed=index)
        a = sharded.ShardedArray.from_numpy(three_places, host)
        kind = index % 6
        if kind == 0:
            np.testing.assert_array_equal(sharded.transform(sharded.ops.negate, a).to_numpy(), -host)
        elif kind == 1:
            assert sharded.max(a) == host.max()
        elif kind == 2:
            np.testing.assert_array_equal(sharded.inclusive_scan(a, "max").to_numpy(),
                                          np.maximum.accumulate(host))
        elif kind == 3:
            assert sharded.count(a, host[0]) == int(np.count_nonzero(host == host[0]))
        elif kind == 4:
            sharded.fill(a, 3)
            np.testing.assert_array_equal(a.to_numpy(), np.full(n, 3, host.dtype))
        else:
            np.testing.assert_array_equal(sharded.transform(lambda x: x + 1, a).to_numpy(),
                                          host.astype(np.float64 if host.dtype.kind == "f" else np.int64) + 1)
        with lock:
            calls["count"] += 1

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        index = 0
        pending = set()
        while time.monotonic() < deadline:
            while len(pending) < 4 * THREADS:
                pending.add(pool.submit(small_call, index))
                index += 1
            done, pending = concurrent.futures.wait(pending, timeout=JOIN_SECONDS,
                                                    return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                future.result()
        done, pending = concurrent.futures.wait(pending, timeout=JOIN_SECONDS)
        assert not pending
        for future in done:
            future.result()
    assert calls["count"] >= 6 * THREADS  # every kind ran, many times over
    three_places.sync()


def test_dropping_a_contiguous_array_does_not_stall_other_threads(three_places):
    """The last reference to a contiguous array waits for the places' streams before unmapping;
    it does so with the GIL released, so other Python threads keep running meanwhile."""
    busy = sharded.ShardedArray.allocate(three_places, 3 << 26, np.float32)
    sharded.fill(busy, 0.0)
    contiguous = sharded.ShardedArray.allocate_contiguous(three_places, 1 << 20, np.float32)
    sharded.fill(contiguous, 1.0)
    gc.collect()  # nothing else to collect during the drop
    stamps = []
    stop = threading.Event()

    def ticker():  # pure Python: runs only while it can take the GIL
        ticks = 0
        while not stop.is_set():
            ticks += 1
            if ticks % 1000 == 0:
                stamps.append(time.monotonic())

    for _ in range(1000):  # a fraction of a second of work queued on every place
        sharded.transform(sharded.ops.add_scalar(1.0), busy, out=busy)
    thread = threading.Thread(target=ticker)
    thread.start()
    time.sleep(0.01)
    started = time.monotonic()
    del contiguous  # the finalizer frees it: waits for the queued work
    waited = time.monotonic() - started
    stop.set()
    thread.join(JOIN_SECONDS)
    np.testing.assert_array_equal(busy.to_numpy()[:5], np.full(5, 1000.0, np.float32))
    if waited > 0.05:  # the drop really waited: the ticker must have run in the middle of it
        middle = [t for t in stamps if started + 0.25 * waited < t < started + 0.75 * waited]
        assert middle, (waited, len(stamps))
