"""What a notebook shows of a PlaceGroup and a ShardedArray (_repr_html_): a table a row per
place, with the figures the object holds. The stand-ins need no GPU; the gpu test reads a
real group and array."""

from __future__ import annotations

import re

import numpy as np
import pytest

import cuda_sharded_jit as sharded

from test_errors import stand_in_array, stand_in_group

POINT = np.dtype([("x", np.float32), ("y", np.float64)], align=True)


def rows(table: str) -> list[list[str]]:
    """The cells of each data row of an HTML table."""
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(<td>.*?)</tr>", table)]


def test_group_table_has_a_row_per_place():
    group = stand_in_group(3)
    html = group._repr_html_()
    assert "PlaceGroup</b> of 3 places" in html
    assert rows(html) == [[str(place), "cuda:0", "0", "sm_90"] for place in range(3)]


def test_array_table_has_sizes_bytes_and_offsets():
    group = stand_in_group(3)
    array = stand_in_array(group, [4, 0, 6], np.float64)
    html = array._repr_html_()
    assert "ShardedArray</b> of 10 elements" in html and "separate storage" in html
    assert rows(html) == [["0", "cuda:0", "4", "32", "0"], ["1", "cuda:0", "0", "0", "4"],
                          ["2", "cuda:0", "6", "48", "4"]]


def test_array_table_describes_records_escaped():
    array = stand_in_array(stand_in_group(1), [5], POINT)
    html = array._repr_html_()
    assert "(x: float32, y: float64)" in html and "<x" not in html
    assert rows(html) == [["0", "cuda:0", "5", str(5 * POINT.itemsize), "0"]]


@pytest.mark.gpu
def test_real_group_and_array_display(three_places):
    a = sharded.ShardedArray.from_numpy(three_places, np.arange(7, dtype=np.int32))
    table = rows(a._repr_html_())
    assert [int(row[2]) for row in table] == list(a.shard_sizes)
    assert [int(row[3]) for row in table] == [4 * size for size in a.shard_sizes]
    assert len(rows(three_places._repr_html_())) == 3
