"""A module whose attributes operators read (cache-key tests)."""

SCALE = 2.0
