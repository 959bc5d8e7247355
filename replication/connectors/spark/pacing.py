"""Pacing a replayed stream at a multiple of the speed its rows were first published (AMPS ``Rate``, e.g. ``2x``).

A paced stream source asks :meth:`Pacer.due_through` how far a micro-batch may
go: the first row it is asked about anchors the replay (that row's original
time = now), and from then on a row is due once ``rate`` times the wall time
elapsed since the anchor covers its distance from the anchor's original time.
Rows are released in order: a row published earlier than the row before it
(rows replicated from elsewhere carry their origin's time) goes with that row.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import numpy as np

from replication.errors import ConfigError

#: Rows whose times are read ahead at once (a window; the next is read when the stream passes its end).
WINDOW_ROWS = 10_000

_RATE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*[xX]?\s*")

#: ``read(after, through)`` -> (positions, original times in microseconds) of the rows ``after < position <= through``.
Reader = Callable[[int, int], "tuple[np.ndarray, np.ndarray]"]


def parse_rate(raw: str | float | None, *, where: str = "rate") -> float | None:
    """``"2x"``, ``"0.5x"`` or a number: the speed-up over the original pace; None or empty: not paced."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    match = _RATE.fullmatch(str(raw))
    value = float(match.group(1)) if match else 0.0
    if value <= 0:
        raise ConfigError(
            f"{where}: {raw!r} is not a replay rate; write a positive multiple of the original speed, "
            "e.g. '2x' (twice as fast), '1x' (as published) or '0.5x', or leave it out (as fast as possible)"
        )
    return value


class Pacer:
    """Lets rows through no faster than ``rate`` times the pace of their original times.

    ``clock`` (seconds, monotonic) is there for tests.
    """

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._anchor: tuple[float, int] | None = None
        self._positions: np.ndarray = np.zeros(0, dtype=np.int64)
        self._times: np.ndarray = np.zeros(0, dtype=np.int64)

    def due_through(self, after: int, latest: int, read: Reader) -> int:
        """The highest position in ``(after, latest]`` whose row is due now (``after``: none is)."""
        if latest <= after:
            return after
        if not self._positions.size or after < self._positions[0] - 1 or after >= self._positions[-1]:
            self._positions, self._times = read(after, min(latest, after + WINDOW_ROWS))
        first = int(np.searchsorted(self._positions, after, side="right"))
        ahead = self._positions[first:]
        ahead = ahead[ahead <= latest]
        if not ahead.size:
            return after
        times = self._times[first:first + ahead.size]
        now = self._clock()
        if self._anchor is None:
            self._anchor = (now, int(times[0]))
        started, original = self._anchor
        reached = original + (now - started) * self.rate * 1_000_000
        # a row is due when it and every row before it are: the first row not yet due stops the batch
        late = np.flatnonzero(np.maximum.accumulate(times) > reached)
        count = int(late[0]) if late.size else ahead.size
        return int(ahead[count - 1]) if count else after
