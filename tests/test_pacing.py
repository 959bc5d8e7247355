"""Pacing a replay at a multiple of its rows' original pace (pure: a fake clock, no Spark)."""

from __future__ import annotations

import numpy as np
import pytest

from replication.connectors.spark.pacing import Pacer, parse_rate
from replication.errors import ConfigError

SECOND = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reader(times_s: list[float]):
    """Rows 1..n published at ``times_s`` (seconds); records each read."""
    positions = np.arange(1, len(times_s) + 1, dtype=np.int64)
    times = (np.array(times_s) * SECOND).astype(np.int64)
    reads = []

    def read(after: int, through: int):
        reads.append((after, through))
        keep = (positions > after) & (positions <= through)
        return positions[keep], times[keep]

    return read, reads


def test_rows_come_at_twice_their_original_pace():
    clock = Clock()
    pacer = Pacer(2.0, clock=clock)
    read, reads = reader([10, 11, 12, 14, 18])
    assert pacer.due_through(0, 5, read) == 1, "the first row anchors the replay: due at once"
    clock.now += 0.49
    assert pacer.due_through(1, 5, read) == 1
    clock.now += 0.01  # 0.5 s at 2x = 1 s of original time
    assert pacer.due_through(1, 5, read) == 2
    clock.now += 1.5  # 2 s = 4 s original: rows at 11, 12 and 14
    assert pacer.due_through(2, 5, read) == 4
    clock.now += 100
    assert pacer.due_through(4, 5, read) == 5
    assert pacer.due_through(5, 5, read) == 5
    assert reads == [(0, 5)], "times are read once per window"


def test_a_row_older_than_the_one_before_it_goes_with_it():
    clock = Clock()
    pacer = Pacer(1.0, clock=clock)
    read, _ = reader([10, 20, 12, 21])
    assert pacer.due_through(0, 4, read) == 1
    clock.now += 10
    assert pacer.due_through(1, 4, read) == 3, "row 3 (published at 12, after row 2 in seq) follows row 2"


def test_the_window_moves_with_the_stream_and_stops_at_latest():
    clock = Clock()
    pacer = Pacer(1.0, clock=clock)
    read, reads = reader([float(i) for i in range(25_000)])
    assert pacer.due_through(0, 25_000, read) == 1
    clock.now += 1e6
    assert pacer.due_through(1, 12_000, read) == 10_000, "the end of the window read"
    assert pacer.due_through(10_000, 12_000, read) == 12_000
    assert reads == [(0, 10_000), (10_000, 12_000)]


@pytest.mark.parametrize("raw, value", [("2x", 2.0), ("0.5X", 0.5), (" 3 ", 3.0), (1.5, 1.5), (None, None), ("", None)])
def test_rates(raw, value):
    assert parse_rate(raw) == value


@pytest.mark.parametrize("raw", ["fast", "-2x", "0", "x2"])
def test_a_bad_rate_says_what_to_write(raw):
    with pytest.raises(ConfigError, match="is not a replay rate; write a positive multiple"):
        parse_rate(raw)
