"""The txlog rows of the ingest's latest commits, held in memory for this instance's replicators.

A replicator follows its own instance's ingest a batch or so behind: each of
its batches is rows the ingest writer committed a moment before, in the same
process. Reading them back means decompressing and decoding the Parquet file
just written (about 100 ms of a 166k-row batch's time in the replicator,
bench/replicate.py). The ingest writer hands each committed
batch here instead (after its commit, so only rows the txlog holds are ever
served), and a replicator takes a range from here when every row of it is
held.

The txlog stays the source of truth: a range not wholly held (rows from
before this process started, a batch whose commit was not this writer's,
rows let go to stay under the memory bound) is read from the txlog's files,
which give the same rows: both are the table the writer committed, cast to
:data:`~replication.txlog.schema.TXLOG_SCHEMA`.

Memory: a batch is let go once every running replicator has read past it.
What is held is counted as the Arrow buffers it keeps alive, whole (a
column sliced out of a larger buffer, such as Spark's Kafka batch, keeps
all of it): at most :data:`MAX_BYTES` while a replicator runs, and
:data:`IDLE_MAX_BYTES` while none does (its destination down or not reached
yet), so that a stopped link pins little.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

import pyarrow as pa

from replication.txlog.schema import TXLOG_SCHEMA

log = logging.getLogger(__name__)

#: The most held while a replicator runs, in bytes of the buffers kept alive (a 200k-row batch of the bench's
#: orders keeps ~120 MB alive, 72 MB of it its own): past it the oldest batches are let go, and a replicator
#: that far behind reads its rows from the txlog's files.
MAX_BYTES = 256 * 1024 * 1024
#: The most held while no replicator runs: a live stream's last batches, for a destination that comes back.
IDLE_MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class _Batch:
    after: int
    through: int
    rows: pa.Table
    size: int


class RecentTxlog:
    """Committed txlog rows with ``after < seq <= through`` of a few recent batches (see the module docstring).

    Thread-safe: the ingest writer adds on its thread, replicators read on theirs, and wait there for the next
    hand-over (:meth:`wait_past`). A batch is let go once every attached reader has read past it, or to stay
    under ``max_bytes`` (``idle_max_bytes`` while no reader is attached).
    """

    def __init__(self, *, max_bytes: int = MAX_BYTES, idle_max_bytes: int = IDLE_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.idle_max_bytes = idle_max_bytes
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        """Notified at each hand-over: replicators waiting for rows past their position."""
        self._latest = 0
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

    @property
    def latest(self) -> int:
        """The last seq of the latest commit handed over, held or not (0: none yet)."""
        with self._lock:
            return self._latest

    def wait_past(self, seq: int, timeout: float) -> bool:
        """Wait until a commit past ``seq`` has been handed over (True) or ``timeout`` seconds passed (False)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._latest > seq, timeout)

    def committed(self, rows: pa.Table) -> None:
        """The ingest writer committed ``rows`` (its txlog rows, in seq order). Rows that do not follow the
        last batch held without a gap (stored backfill parts before them, a commit replayed) start again.
        Never raises: the batch is committed, and what is not held is read from the txlog's files."""
        if rows.num_rows == 0:
            return  # (a commit of no row leaves no gap)
        last = None
        try:
            last = rows.column("seq")[-1].as_py()
            batch = _batch_of(rows)
        except Exception:  # noqa: BLE001 - holding rows is an optimisation; the txlog has them
            log.warning("txlog rows of seqs after %s not held in memory; replicators read them from the files",
                        self.held, exc_info=True)
            batch = None
        with self._lock:
            if batch is None or (self._batches and self._batches[-1].through != batch.after):
                self._drop_all()
            if batch is not None:
                self._batches.append(batch)
                self._bytes += batch.size
            self._trim()
            if last is not None:
                self._latest = max(self._latest, last)
                self._changed.notify_all()

    def attach(self, reader: str, after: int) -> None:
        """``reader`` (a replicator) starts reading after seq ``after``."""
        with self._lock:
            self._readers[reader] = after
            self._trim()

    def detach(self, reader: str) -> None:
        """``reader`` stopped: what only it would still read is let go."""
        with self._lock:
            self._readers.pop(reader, None)
            self._trim()

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
        """``reader`` (an attached replicator) has read every row through ``through``."""
        with self._lock:
            if reader in self._readers:
                self._readers[reader] = through
                self._trim()

    def _trim(self) -> None:
        """Let go of what every attached reader has read, and the oldest batches past the bound."""
        if self._readers:
            slowest = min(self._readers.values())
            while self._batches and self._batches[0].through <= slowest:
                self._drop_oldest()
        bound = self.max_bytes if self._readers else self.idle_max_bytes
        while self._bytes > bound and self._batches:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        self._bytes -= self._batches.popleft().size

    def _drop_all(self) -> None:
        self._batches.clear()
        self._bytes = 0


def _batch_of(rows: pa.Table) -> _Batch:
    """``rows`` to hold; ValueError when they are not one run of seqs (never expected: a commit's seqs are)."""
    seq = rows.column("seq")
    first, last = seq[0].as_py(), seq[-1].as_py()
    if last - first + 1 != rows.num_rows:
        raise ValueError(f"seqs {first}..{last} are not {rows.num_rows} consecutive values")
    rows = rows if rows.schema == TXLOG_SCHEMA else rows.cast(TXLOG_SCHEMA)
    return _Batch(first - 1, last, rows, pinned_bytes(rows))


def pinned_bytes(table: pa.Table) -> int:
    """Bytes of the buffers ``table`` keeps alive: a slice counts as the whole buffer it was cut from, once."""
    roots: dict[int, int] = {}
    for column in table.columns:
        for chunk in column.chunks:
            for buffer in chunk.buffers():
                while buffer is not None and buffer.parent is not None:
                    buffer = buffer.parent
                if buffer is not None:
                    roots[buffer.address] = buffer.size
    return sum(roots.values())
