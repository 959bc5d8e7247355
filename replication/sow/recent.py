"""The SOW rows of the txlog's latest commits, kept in memory for the next compaction.

A compaction folds the txlog rows written since the SOW table's base. The
ingest writer has just committed those rows and still holds them: it hands
each batch's SOW rows here (after the commit), and the compactor takes them
from here instead of reading and decompressing the txlog files it just wrote
(~0.2 s of a ~0.7 s compaction of 200k rows).

The txlog stays the source of truth: anything not held here (rows from
before this process started, a batch replayed after a crash, rows dropped
to stay under the memory bound) is read from the txlog, so a compaction's
input is the same rows either way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

#: Rows held at most (~300 B each; a 5 s compaction interval at 60k msg/s holds ~300k): past it the oldest
#: batches are let go (a compaction reads them from the txlog).
MAX_ROWS = 500_000


class RecentRows:
    """Every SOW row with ``held_from < seq <= held_through``, in seq order (see the module docstring)."""

    def __init__(self, schema: pa.Schema, *, max_rows: int = MAX_ROWS) -> None:
        self.schema = schema
        """The columns held (a compaction's projection of the txlog)."""
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._parts: list[tuple[int, pa.Table]] = []
        """(last seq of the batch, its SOW rows), oldest first."""
        self._rows = 0
        self._from: int | None = None
        self._through: int | None = None

    def add(self, rows: pa.Table, first_seq: int, last_seq: int) -> None:
        """A committed batch: its txlog rows (``first_seq`` .. ``last_seq``; none when ``last_seq < first_seq``),
        kept as they are (no copy on the writer's path: :meth:`rows` picks and casts). A batch that does not
        follow the last one (a gap: rows committed some other way) starts the held range again."""
        picked = rows.select(self.schema.names)
        with self._lock:
            if self._through is None or first_seq != self._through + 1:
                self._parts, self._rows, self._from = [], 0, first_seq - 1
            self._through = max(last_seq, first_seq - 1)
            if picked["sow_key"].null_count < picked.num_rows:  # (a batch on no SOW topic: nothing to keep)
                self._parts.append((self._through, picked))
                self._rows += picked.num_rows
            while self._rows > self.max_rows:
                last, part = self._parts.pop(0)
                self._rows -= part.num_rows
                self._from = last

    def rows(self, since: int, through: int, read_txlog: Callable[[int, int], pa.Table]) -> pa.Table:
        """The rows with ``since < seq <= through`` in seq order (those of no SOW may be left out): those
        held, and the txlog's (``read_txlog(a, b)``: rows ``a < seq <= b``) for the part of the range not held."""
        with self._lock:
            held_from, held_through, parts = self._from, self._through, list(self._parts)
        if held_from is None or held_from >= through or held_through is None or held_through < through:
            return read_txlog(since, through)
        pieces = [read_txlog(since, held_from).select(self.schema.names)] if held_from > since else []
        for last, part in parts:
            if last <= since:
                continue
            seq = part["seq"]
            keep = pc.is_valid(part["sow_key"])  # rows of no SOW topic change no SOW
            if not (seq[0].as_py() > since and last <= through):
                keep = pc.and_(keep, pc.and_(pc.greater(seq, since), pc.less_equal(seq, through)))
            pieces.append((part if pc.all(keep).as_py() else part.filter(keep)).cast(self.schema))
        return pa.concat_tables(pieces) if pieces else self.schema.empty_table()

    def drop_through(self, seq: int) -> None:
        """Let go of the batches every SOW table's base holds (``seq``: the lowest table position)."""
        with self._lock:
            while self._parts and self._parts[0][0] <= seq:
                _, part = self._parts.pop(0)
                self._rows -= part.num_rows
            if self._from is not None and self._from < seq:
                self._from = min(seq, self._through if self._through is not None else seq)
