"""Bit-for-bit comparisons of large arrays whose failures read well: the first differing
element and how many differ, instead of pytest's diff of two long byte strings (difflib on
megabytes runs for minutes and looks like a hang)."""

from __future__ import annotations

import numpy as np


def bit_difference(got: np.ndarray, expected: np.ndarray) -> str | None:
    """None when `got` and `expected` hold the same bytes; else what differs, in words."""
    got, expected = np.ascontiguousarray(got), np.ascontiguousarray(expected)
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return f"{got.dtype}{got.shape} against {expected.dtype}{expected.shape}"
    if got.tobytes() == expected.tobytes():
        return None
    width = got.dtype.itemsize
    mine = np.frombuffer(got.tobytes(), np.uint8).reshape(-1, width)
    theirs = np.frombuffer(expected.tobytes(), np.uint8).reshape(-1, width)
    differ = np.flatnonzero((mine != theirs).any(axis=1))
    at = int(differ[0])
    return (f"{differ.size} of {got.size} elements differ; the first at {at}: "
            f"{got.reshape(-1)[at]!r} against {expected.reshape(-1)[at]!r}")
