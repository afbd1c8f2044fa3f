"""GPU tests of PlaceGroup."""

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from conftest import DEVICE_COUNT, needs_devices

pytestmark = pytest.mark.gpu


def test_by_devices_defaults_to_every_device():
    group = sharded.PlaceGroup.by_devices()
    assert len(group) == DEVICE_COUNT
    assert group.devices == tuple(range(DEVICE_COUNT))


def test_repeated_device_gets_one_stream_per_place():
    group = sharded.PlaceGroup.by_devices([0, 0, 0])
    assert len(group) == 3 and group.devices == (0, 0, 0)
    streams = [group.stream(place) for place in range(3)]
    assert len(set(streams)) == 3 and all(isinstance(s, int) and s > 2 for s in streams)
    group.sync()


def test_errors():
    with pytest.raises(ValueError, match="devices: unknown device id 4096"):
        sharded.PlaceGroup.by_devices([0, 4096])
    with pytest.raises(ValueError, match="devices: unknown device id -1"):
        sharded.PlaceGroup.by_devices([-1])
    with pytest.raises(ValueError, match="empty list"):
        sharded.PlaceGroup.by_devices([])
    group = sharded.PlaceGroup.by_devices([0])
    with pytest.raises(IndexError):
        group.stream(1)


def test_locality_domains_keep_each_domain_adjacent():
    group = sharded.PlaceGroup.by_locality_domains()
    assert sorted(group.devices) == list(range(DEVICE_COUNT))
    domains = group.locality_domains
    assert len(domains) == DEVICE_COUNT
    assert list(domains) == sorted(domains)  # one run per domain
    for domain in set(domains):
        devices = [d for d, dom in zip(group.devices, domains) if dom == domain]
        assert devices == sorted(devices)


def test_repr_shows_places_and_devices():
    text = repr(sharded.PlaceGroup.by_devices([0, 0]))
    assert text.startswith("PlaceGroup([0: cuda:0") and "1: cuda:0" in text


def test_archs():
    group = sharded.PlaceGroup.by_devices([0])
    assert group.archs[0].startswith("sm_")


@needs_devices(2)
def test_distinct_devices_have_peer_access():
    group = sharded.PlaceGroup.by_devices([0, 1])
    assert group._impl.can_access_peer(0, 1) and group._impl.can_access_peer(1, 0)
