"""The in-memory kernel caches: bounded maps whose misses are built once per key.

Each holds at most `$CUDA_SHARDED_JIT_MEMORY_CACHE_ENTRIES` values (default 1024), dropping
the least recently used; a hit takes no lock, so the hot path of every algorithm call stays a
dict lookup.
"""

from __future__ import annotations

import heapq
import os
import threading

from ._files import _warn_once

ENV_MEMORY_ENTRIES = "CUDA_SHARDED_JIT_MEMORY_CACHE_ENTRIES"
DEFAULT_MEMORY_ENTRIES = 1024


def _default_memory_entries() -> int:
    text = os.environ.get(ENV_MEMORY_ENTRIES, "").strip()
    if not text:
        return DEFAULT_MEMORY_ENTRIES
    if text.isdigit() and int(text) > 0:
        return int(text)
    _warn_once(ENV_MEMORY_ENTRIES, text,
               f"{ENV_MEMORY_ENTRIES}={text!r} is not a positive number of entries; "
               f"using the default, {DEFAULT_MEMORY_ENTRIES}")
    return DEFAULT_MEMORY_ENTRIES


class MemoryCache:
    """A bounded map whose misses are built once even when many threads miss at the same time.

    Holds at most `max_entries` values (default `$CUDA_SHARDED_JIT_MEMORY_CACHE_ENTRIES`, else
    DEFAULT_MEMORY_ENTRIES), dropping the least recently used. A build that raises (a type
    error, KeyboardInterrupt) stores nothing: the next call builds again.

    >>> cache = MemoryCache(max_entries=2)
    >>> cache.get_or_build("a", lambda: 1), cache.get_or_build_reporting("a", lambda: 2)
    (1, (1, False))
    """

    def __init__(self, max_entries: int | None = None):
        if max_entries is None:
            max_entries = _default_memory_entries()
        elif isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries: expected a positive int, got {max_entries!r}")
        self.max_entries = max_entries
        # key -> [value, last use]. A hit takes no lock: a dict lookup and a store into the
        # entry's own list. Only a miss (under _lock) adds or removes keys, so the dict never
        # changes size under a reader; two racing hits may lose a clock tick, which only
        # blurs which entry counts as oldest.
        self._entries: dict = {}
        self._clock = 0
        self._lock = threading.Lock()  # inserts, evictions and the per-key build locks
        self._building: dict = {}

    def get(self, key):
        """The value for `key` (now the most recently used), or None."""
        slot = self._entries.get(key)
        if slot is None:
            return None
        self._clock += 1
        slot[1] = self._clock
        return slot[0]

    def values(self) -> list:
        """Every value held now (a snapshot)."""
        with self._lock:
            return [slot[0] for slot in self._entries.values()]

    def get_or_build(self, key, build):
        """The value for `key`, from `build()` on a miss: called once however many threads miss."""
        return self.get_or_build_reporting(key, build)[0]

    def get_or_build_reporting(self, key, build) -> tuple[object, bool]:
        """(value, built_here): built_here is True only in the thread whose `build()` made it
        (a thread that waited for another's build, or found it cached, gets False)."""
        value = self.get(key)
        if value is not None:
            return value, False
        with self._lock:
            key_lock = self._building.setdefault(key, threading.Lock())
        with key_lock:  # a KeyboardInterrupt while waiting here leaves the builder's lock be
            try:
                value = self.get(key)
                if value is not None:
                    return value, False
                value = build()
                self._store(key, value)
                return value, True
            finally:
                with self._lock:
                    if self._building.get(key) is key_lock:
                        del self._building[key]

    def _store(self, key, value) -> None:
        with self._lock:
            self._clock += 1
            slot = [value, self._clock]
            self._entries[key] = slot
            excess = len(self._entries) - self.max_entries
            if excess > 0:
                others = (item for item in self._entries.items() if item[1] is not slot)
                for old_key, _ in heapq.nsmallest(excess, others, key=lambda item: item[1][1]):
                    del self._entries[old_key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
