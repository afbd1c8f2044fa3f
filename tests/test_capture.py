"""sharded.capture: a function of the library's calls recorded into one CUDA graph, whose
replays compute bit for bit what the same calls compute eagerly (against the eager run, on 1
to 4 places of one GPU, and a replay after eager work against numpy); nothing runs while
recording; what cannot be captured (a wait on the host, a new array, a second group, a
nested capture) is refused and leaves the group working."""

from __future__ import annotations

import numpy as np
import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _shim

from conftest import sample, uneven
from test_errors import stand_in_array, stand_in_group

gpu = pytest.mark.gpu


def _state(places, seed):
    """x, y (float64, uneven shards), s (a DeviceScalar): one iteration's state."""
    n = 40_001
    sizes = uneven(places, n)
    x = sharded.ShardedArray.from_numpy(places, sample(np.float64, n, seed), sizes=sizes)
    y = sharded.ShardedArray.from_numpy(places, sample(np.float64, n, seed + 1), sizes=sizes)
    return x, y, sharded.DeviceScalar(places, np.float64, value=0.5)


def _iteration(x, y, s):
    """y = y + s x; s = sum(y) / n (a ratio read on the device); x = x * s - y."""
    sharded.transform(lambda a, b, c: b + c * a, x, y, s, out=y)
    sharded.reduce(y, lambda a, b: a + b, 0.0, out=s)
    sharded.transform(lambda a, b, c, n: a * (c / n) - b, x, y, s, float(x.size), out=x)


@gpu
def test_replays_match_the_eager_calls_bit_for_bit(places):
    eager, replayed = _state(places, 1), _state(places, 1)
    before = [array.to_numpy() for array in replayed[:2]]
    step = sharded.capture(lambda: _iteration(*replayed))
    for array, host in zip(replayed[:2], before):  # recording ran nothing
        np.testing.assert_array_equal(array.to_numpy(), host)
    assert replayed[2].value == 0.5
    for _ in range(5):
        _iteration(*eager)
        step()
    for mine, theirs in zip(replayed[:2], eager[:2]):
        assert mine.to_numpy().tobytes() == theirs.to_numpy().tobytes()
    assert replayed[2].value.tobytes() == eager[2].value.tobytes()
    assert "graph nodes on" in repr(step)


@gpu
def test_a_replay_follows_the_work_queued_before_it(places):
    x, y, s = _state(places, 3)
    step = sharded.capture(lambda: sharded.transform(lambda a, c: a * c, x, s, out=x))
    host = x.to_numpy()
    sharded.fill(x, 2.0)  # eager work on every place, then the replay reads it
    sharded.reduce(y, "max", out=s)
    step()
    np.testing.assert_array_equal(x.to_numpy(), np.full(host.size, 2.0) * y.to_numpy().max())


@gpu
def test_scans_replay_bit_for_bit(places):
    """A scan in a captured function (on one place its single pass's draw word lives with the
    place and the graph has tile states of its own; on several places the totals are folded
    between the passes), replayed with eager scans of other sizes in between, a larger one
    among them: every replay matches the eager calls bit for bit, and follows numpy."""
    n = 300_007
    host = sample(np.float64, n, 7)
    sizes = uneven(places, n)
    state = [sharded.ShardedArray.from_numpy(places, host, sizes=sizes) for _ in range(2)]
    outs = [sharded.ShardedArray.allocate(places, sizes, np.float64) for _ in range(2)]
    others = [sharded.ShardedArray.from_numpy(places, sample(np.float64, size, 8)) for size in (5_003, 3_000_001)]

    def halve_the_running_sum(x, y):
        sharded.inclusive_scan(x, lambda a, b: a + b, out=y)
        sharded.transform(lambda a: a * 0.5, y, out=x)

    step = sharded.capture(lambda: halve_the_running_sum(state[0], outs[0]))
    expected = host
    for _ in range(3):
        step()
        halve_the_running_sum(state[1], outs[1])
        for other in others:  # eager scans of other sizes between replays (a larger one among them)
            sharded.inclusive_scan(other, "sum")
        expected = np.cumsum(expected) * 0.5
    assert state[0].to_numpy().tobytes() == state[1].to_numpy().tobytes()
    np.testing.assert_allclose(state[0].to_numpy(), expected, rtol=1e-9, atol=1e-12 * np.abs(expected).max())


@gpu
def test_what_cannot_be_captured_is_refused(three_places):
    x, y, s = _state(three_places, 5)
    with pytest.raises(ValueError, match="a reduction to a host value waits on the host"):
        sharded.capture(lambda: (sharded.transform(lambda a: a + 1.0, x, out=x), sharded.reduce(x, "sum")))
    with pytest.raises(ValueError, match="to_numpy waits on the host"):
        sharded.capture(lambda: (sharded.transform(lambda a: a + 1.0, x, out=x), x.to_numpy()))
    with pytest.raises(ValueError, match="fn makes a new array"):
        sharded.capture(lambda: sharded.transform(lambda a: a + 1.0, x))
    other = sharded.ShardedArray.from_numpy(sharded.PlaceGroup.by_devices([0]), np.zeros(4))
    with pytest.raises(ValueError, match="fn calls on a second PlaceGroup"):
        sharded.capture(lambda: (sharded.transform(lambda a: a + 1.0, x, out=x),
                                 sharded.transform(lambda a: a + 1.0, other, out=other)))
    step = sharded.capture(lambda: sharded.transform(lambda a: a + 1.0, y, out=y))
    with pytest.raises(ValueError, match="replayed inside another capture"):
        sharded.capture(lambda: (sharded.transform(lambda a: a + 1.0, x, out=x), step()))
    with pytest.raises(ValueError, match="already capturing"):
        sharded.capture(lambda: (sharded.transform(lambda a: a + 1.0, x, out=x),
                                 sharded.capture(lambda: None)))
    host = x.to_numpy()  # nothing of either ran, and the group still works
    np.testing.assert_array_equal(sharded.transform(lambda a: a + 1.0, x).to_numpy(), host + 1.0)
    assert float(sharded.reduce(x, "sum")) == pytest.approx(host.sum())


def test_capture_checks_its_function_first(monkeypatch):
    calls = []
    for name in ("capture_begin", "capture_end", "capture_abandon"):
        monkeypatch.setattr(_shim, name, lambda *args, _name=name: calls.append(_name))
    with pytest.raises(TypeError, match="fn: expected a callable of no arguments, got int"):
        sharded.capture(42)
    with pytest.raises(ValueError, match="fn made no call of the library on a PlaceGroup"):
        sharded.capture(lambda: None)
    group = stand_in_group()
    a = stand_in_array(group)
    with pytest.raises(ValueError, match="fn makes a new array"):
        sharded.capture(lambda: sharded.empty_like(a))
    assert calls in ([], ["capture_begin", "capture_abandon"])  # nothing recorded, nothing left open
    assert sharded._capture._collective.capturing == {}
