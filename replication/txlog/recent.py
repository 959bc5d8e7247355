"""The txlog rows of the ingest's latest commits, held in memory for this instance's replicators.

A replicator follows its own instance's ingest a batch or so behind: each of
its batches is rows the ingest writer committed a moment before, in the same
process. Reading them back means decompressing and decoding the Parquet file
just written (~250 ms per 166k rows, about a tenth of an instance's CPU
while it replicates at full rate). The ingest writer hands each committed
batch here instead (after its commit, so only rows the txlog holds are ever
served), and a replicator takes a range from here when every row of it is
held.

The txlog stays the source of truth: a range not wholly held (rows from
before this process started, a batch whose commit was not this writer's,
rows let go to stay under the memory bound) is read from the txlog's files,
which give the same rows: both are the table the writer committed, cast to
:data:`~replication.txlog.schema.TXLOG_SCHEMA`.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import pyarrow as pa

from replication.txlog.schema import TXLOG_SCHEMA

#: The most held, in Arrow buffer bytes (a batch of 200k bench rows is ~60 MB): past it the oldest batches are
#: let go, and a replicator that far behind reads its rows from the txlog's files.
MAX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class _Batch:
    after: int
    through: int
    rows: pa.Table
    size: int


class RecentTxlog:
    """Committed txlog rows with ``after < seq <= through`` of a few recent batches (see the module docstring).

    Thread-safe: the ingest writer adds on its thread, replicators read on theirs (and on their read-ahead
    threads). A batch is let go once every registered reader has read past it, or to stay under ``max_bytes``.
    """

    def __init__(self, *, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._batches: deque[_Batch] = deque()
        self._bytes = 0
        self._readers: dict[str, int] = {}
        self.hits = 0
        """Ranges served from memory."""
        self.misses = 0
        """Ranges asked for and not wholly held (read from the txlog's files)."""

    @property
    def held(self) -> tuple[int, int] | None:
        """(after, through) of the rows held; None when nothing is."""
        with self._lock:
            return (self._batches[0].after, self._batches[-1].through) if self._batches else None

    def committed(self, rows: pa.Table) -> None:
        """The ingest writer committed ``rows`` (its txlog rows, in seq order). Rows that do not follow the
        last batch held without a gap (stored backfill parts before them, a commit replayed) start again."""
        if rows.num_rows == 0:
            return
        seq = rows.column("seq")
        first, last = seq[0].as_py(), seq[-1].as_py()
        if last - first + 1 != rows.num_rows:  # (seq is contiguous and ascending in a commit: never expected)
            self.clear()
            return
        rows = rows if rows.schema == TXLOG_SCHEMA else rows.cast(TXLOG_SCHEMA)
        batch = _Batch(first - 1, last, rows, rows.get_total_buffer_size())
        with self._lock:
            if self._batches and self._batches[-1].through != batch.after:
                self._drop_all()
            self._batches.append(batch)
            self._bytes += batch.size
            while self._bytes > self.max_bytes and self._batches:
                self._drop_oldest()

    def read(self, after: int, through: int) -> pa.Table | None:
        """Rows ``after < seq <= through`` in seq order, when every one of them is held; else None."""
        with self._lock:
            if not self._batches or self._batches[0].after > after or self._batches[-1].through < through:
                self.misses += 1
                return None
            self.hits += 1
            batches = [b for b in self._batches if b.through > after and b.after < through]
        pieces = []
        for b in batches:  # (seq is contiguous: a row's offset in its batch is seq - after - 1)
            start = max(after, b.after) - b.after
            pieces.append(b.rows.slice(start, min(through, b.through) - b.after - start))
        return pa.concat_tables(pieces) if pieces else TXLOG_SCHEMA.empty_table()

    def passed(self, reader: str, through: int) -> None:
        """``reader`` (a destination) has read every row through ``through``: what every reader has read is let
        go."""
        with self._lock:
            self._readers[reader] = through
            slowest = min(self._readers.values())
            while self._batches and self._batches[0].through <= slowest:
                self._drop_oldest()

    def clear(self) -> None:
        with self._lock:
            self._drop_all()

    def _drop_oldest(self) -> None:
        self._bytes -= self._batches.popleft().size

    def _drop_all(self) -> None:
        self._batches.clear()
        self._bytes = 0
