"""A progress bar for long commands (bootstrap, backfill): done of total, rate, time left, on stderr.

On a terminal it redraws one line; otherwise (a log file, CI) it prints a line
every few seconds, so the output stays readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

#: Seconds between two lines when stderr is not a terminal.
LOG_EVERY_S = 5.0


class ProgressBar:
    """``bar.update(done, total)`` as work goes; ``bar.close()`` at the end."""

    def __init__(self, label: str, unit: str = "rows", *, stream: TextIO | None = None, width: int = 30,
                 start: int = 0) -> None:
        """``start``: what was done before this bar (a wait's rows stored already): not in its rate."""
        self.label = label
        self.start = start
        self.unit = unit
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self._last_line = 0.0
        self._done = 0
        self._total = 0
        self._drawn = False

    def update(self, done: int, total: int) -> None:
        self._done, self._total = done, total
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r" + self.line(now) + "\x1b[K")
            self.stream.flush()
            self._drawn = True
        elif now - self._last_line >= LOG_EVERY_S:
            self._last_line = now
            self.stream.write(self.line(now) + "\n")
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.started, 1e-9)
        rate = max(0, self._done - self.start) / elapsed
        fraction = min(1.0, self._done / self._total) if self._total else 1.0
        filled = int(fraction * self.width)
        if self._total <= self._done:
            left = _clock(0)
        else:  # (nothing done yet: no rate to say it from)
            left = _clock((self._total - self._done) / rate) if rate > 0 else "-:--:--"
        return (f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {self._done:,}/{self._total:,} "
                f"{self.unit}  {rate:,.0f} {self.unit}/s  {left} left")

    def note(self, text: str) -> None:
        """A line of its own under the bar (a terminal's bar is drawn again below it)."""
        self.stream.write(("\r\x1b[K" if self.tty and self._drawn else "") + text + "\n")
        if self.tty and self._drawn:
            self.stream.write(self.line())
        self.stream.flush()

    def close(self) -> None:
        self.stream.write(("\r" if self.tty else "") + self.line() + ("\x1b[K\n" if self.tty else "\n"))
        self.stream.flush()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, kind, error, trace) -> None:
        """Closed at the end of the work; cut short by an error, a bar drawn on a terminal ends its line, so the
        error is said on a line of its own (and nothing else is added)."""
        if kind is None:
            self.close()
        elif self._drawn:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
