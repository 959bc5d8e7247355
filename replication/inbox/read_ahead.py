"""The ingest writer's inbox reads, with the next batch's versions read while it writes this one.

The ingest writer reads each micro-batch's inbox versions itself
(:func:`replication.inbox.versions.read_versions`), and the
next micro-batch starts at the version after this one's last. So, once a
batch's versions are read, a thread reads the versions committed after them
(plain appends on local storage only, about one batch of rows: the planner's
``maxRowsPerTrigger``) while the writer classifies and commits. Parquet
decoding releases the GIL and the txlog commit mostly waits on deltalake's
Rust writer, so the two overlap; with a backlog (a backfill, a returning
upstream) this takes the read off the ingest's critical path.

The rows are those a read at the time would give: a committed version never
changes, and per-version tables in version order are in stream order
(``inbox_version`` leads the order). Anything the thread did not read, or a
batch that does not start where it expected (a retried or restarted query),
is read as before.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

from replication.inbox.schema import STREAM_SCHEMA
from replication.inbox.versions import read_appended_version, read_versions

log = logging.getLogger(__name__)


class InboxReadAhead:
    """``read(first, last)``: :func:`read_versions` of the inbox at ``path``, the versions after ``last``
    read meanwhile (up to about ``rows`` rows held)."""

    def __init__(self, path: str, rows: int) -> None:
        self.path = path
        self.rows = rows
        self._held: dict[int, pa.Table] = {}
        """Versions read ahead, contiguous, oldest first."""
        self._reading: Future | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self.hits = 0
        """Versions a read took from what was read ahead."""

    def read(self, first: int, last: int) -> pa.Table:
        """Rows appended in versions ``first..last`` (ordered as :func:`read_versions`)."""
        self._collect()
        if first not in self._held:
            self._held.clear()
        for old in [v for v in self._held if v < first]:
            del self._held[old]
        tables, version = [], first
        while version <= last and version in self._held:
            tables.append(self._held.pop(version))
            version += 1
        self.hits += len(tables)
        if version <= last:
            tables.append(read_versions(self.path, version, last))
        self._read_on(last + 1)
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0] if tables else STREAM_SCHEMA.empty_table()

    def close(self) -> None:
        self._closed = True
        self._held.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _collect(self) -> None:
        """Wait for the thread's read (it holds what this batch needs first) and keep what it read."""
        reading, self._reading = self._reading, None
        if reading is None:
            return
        try:
            start, tables = reading.result()
        except Exception:  # noqa: BLE001 - the batch reads these versions itself, and reports a real failure
            log.debug("inbox %s: reading ahead failed; the batch reads its versions itself", self.path,
                      exc_info=True)
            return
        if self._held and start != max(self._held) + 1:
            self._held.clear()
        for offset, table in enumerate(tables):
            self._held[start + offset] = table

    def _read_on(self, after: int) -> None:
        """Start reading the versions after those held (or after ``after``), while fewer than ``rows`` are held."""
        if self._closed:
            return
        held = sum(t.num_rows for t in self._held.values())
        if held >= self.rows:
            return
        start = max(self._held) + 1 if self._held else after
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="inbox-read-ahead")
        self._reading = self._pool.submit(self._read_from, start, self.rows - held)

    def _read_from(self, start: int, budget: int) -> tuple[int, list[pa.Table]]:
        """(In the thread.) Versions ``start, start + 1, ...`` while they are committed plain appends, until
        ``budget`` rows are read."""
        tables: list[pa.Table] = []
        rows = 0
        while rows < budget and not self._closed:
            table = read_appended_version(self.path, start + len(tables))
            if table is None:
                break
            tables.append(table)
            rows += table.num_rows
        return start, tables
