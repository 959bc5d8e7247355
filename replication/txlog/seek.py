"""Finding one row of a txlog by its Delta file statistics: the row with a given bookmark, the first row
persisted at or after a time.

A replay that starts at a bookmark or a time must not read the whole log to
find where to start. Each data file's add action carries the minimum and
maximum of its columns (delta-rs writes them for every txlog column), so the
files that can hold the row are known from the Delta log alone:

- a bookmark's ``publisher_seq`` lies between a file's ``min`` and ``max`` of
  ``publisher_seq`` (publishers advance together, so that is a few files);
- ``persist_time`` is the commit time, non-decreasing with ``seq``: the first
  row persisted at or after ``t`` is in the first file, in seq order, whose
  maximum reaches ``t``.

Candidates are read in seq order, two or three columns each, and the search
stops at the first file that holds the row. A file without statistics is
always a candidate (correct, just not pruned). :attr:`TxlogSeek.files_read`
counts the files opened, for tests and benchmarks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, SupportsIndex

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replication.connectors.s3.access import arrow_location
from replication.txlog.files import file_uri, local_or_uri

if TYPE_CHECKING:
    from deltalake import DeltaTable

#: Bounds of a file without statistics: it may hold any value.
_MIN, _MAX = -(2**63), 2**63 - 1
#: Delta writers may truncate timestamp statistics to milliseconds: a file's true maximum can be up to 1 ms above.
_TRUNCATION_US = 1000


class TxlogSeek:
    """The data files of one txlog snapshot with the statistics a seek needs, in seq order."""

    def __init__(self, table: DeltaTable) -> None:
        actions = pa.table(table.get_add_actions(flatten=True))
        root = table.table_uri.rstrip("/")
        lo_seq = _bound(actions, "min.seq", _MIN)
        order = np.argsort(lo_seq, kind="stable")
        paths = actions.column("path").to_pylist()
        self.uris = [file_uri(root, paths[i]) for i in order]
        self._pseq_lo = _bound(actions, "min.publisher_seq", _MIN)[order]
        self._pseq_hi = _bound(actions, "max.publisher_seq", _MAX)[order]
        self._seq_lo, self._seq_hi = lo_seq[order], _bound(actions, "max.seq", _MAX)[order]
        self._types = [_strings(actions, f"{side}.message_type", order) for side in ("min", "max")]
        persisted_hi = _bound(actions, "max.persist_time", _MAX)[order]
        self._persisted_hi = np.where(persisted_hi == _MAX, _MAX, persisted_hi + _TRUNCATION_US)
        self.files_read = 0

    def seq_of_bookmark(self, bookmark: str, publisher_seq: int) -> int | None:
        """``seq`` of the row whose ``bookmark`` column is ``bookmark`` (None: no such row)."""
        candidates = np.flatnonzero((self._pseq_lo <= publisher_seq) & (self._pseq_hi >= publisher_seq))
        for index in candidates:
            rows = self._read(index, ["seq", "bookmark"], [("publisher_seq", "=", publisher_seq)])
            hits = rows.filter(pc.equal(rows.column("bookmark"), bookmark))
            if hits.num_rows:
                return int(hits.column("seq")[0].as_py())
        return None

    def first_seq_persisted_at(self, micros: int) -> int | None:
        """``seq`` of the first row (in seq order) persisted at or after ``micros`` since the epoch (None: none yet)."""
        at = pa.scalar(micros, pa.timestamp("us", tz="UTC"))
        for index in np.flatnonzero(self._persisted_hi >= micros):
            rows = self._read(index, ["seq", "persist_time"], [("persist_time", ">=", at)])
            if rows.num_rows:
                return int(pc.min(rows.column("seq")).as_py())
        return None

    def message_types(self, after: int, through: int) -> set[str] | None:
        """The message types of rows ``after < seq <= through``, by the files' statistics (None: a file has none)."""
        hits = np.flatnonzero((self._seq_lo <= through) & (self._seq_hi > after))
        low, high = (self._types[0][i] for i in hits), (self._types[1][i] for i in hits)
        found: set[str] = set()
        for lo, hi in zip(low, high, strict=True):
            if lo is None or hi is None:
                return None
            found |= {lo, hi}  # between two types may lie others: only lo == hi is exact, which is what matters
        return found

    def _read(self, index: SupportsIndex, columns: list[str], where: list[tuple]) -> pa.Table:
        self.files_read += 1
        path, filesystem = arrow_location(local_or_uri(self.uris[index]))
        return pq.read_table(path, columns=columns, filters=where, partitioning=None, filesystem=filesystem)


def _strings(actions: pa.Table, name: str, order: np.ndarray) -> list[str | None]:
    if name not in actions.column_names:
        return [None] * actions.num_rows
    values = actions.column(name).to_pylist()
    return [values[i] for i in order]


def _bound(actions: pa.Table, name: str, missing: int) -> np.ndarray:
    """A statistics column as int64 (timestamps in microseconds); ``missing`` where a file has none."""
    if name not in actions.column_names:
        return np.full(actions.num_rows, missing, dtype=np.int64)
    column = actions.column(name)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return pc.fill_null(column, missing).to_numpy().astype(np.int64)
