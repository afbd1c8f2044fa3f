"""Helpers of the kernel-cache tests: entries built from the documented layout (_cache's
docstring), not with _cache's own code, and a fixture that starts each test as a new process."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
import warnings
from pathlib import Path

import pytest

import cuda_sharded_jit as sharded
from cuda_sharded_jit import _cache, _files

MAGIC = b"CSJKERN2"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
STRANGER = 1234  # a uid that is not ours (root can chown to it)
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root to give a file to another uid")


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    """Each test starts as a new process would: nothing warned yet, no key read yet."""
    monkeypatch.setattr(_files, "_warned", set())
    monkeypatch.setattr(_cache, "_secrets", {})
    monkeypatch.delenv(_cache.ENV_MAX_BYTES, raising=False)
    monkeypatch.delenv(_cache.ENV_MEMORY_ENTRIES, raising=False)


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def entry_path(directory: Path, disk_key: str) -> Path:
    return directory / f"{disk_key}.kernel"


def sign(secret: bytes, disk_key: str, header, body: bytes) -> bytes:
    """An entry in the documented layout; `header` a dict, or raw bytes to plant."""
    encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
    signed = struct.pack("<Q", len(encoded)) + encoded + body
    tag = hmac.new(secret, MAGIC + disk_key.encode() + signed, hashlib.sha256).digest()
    return MAGIC + tag + signed


def tag_verifies(secret: bytes, disk_key: str, data: bytes) -> bool:
    expected = hmac.new(secret, MAGIC + disk_key.encode() + data[40:], hashlib.sha256).digest()
    return data.startswith(MAGIC) and data[8:40] == expected


def secret_of(directory: Path) -> bytes:
    return (directory / "secret.key").read_bytes()


def messages(caught) -> str:
    return "\n".join(str(warning.message) for warning in caught)


def read_quietly(disk_key: str):
    """read_entry with its warnings collected: (result, [messages])."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _cache.read_entry(disk_key)
    assert all(issubclass(warning.category, sharded.CacheWarning) for warning in caught)
    return result, [str(warning.message) for warning in caught]
