"""An instance's txlog read by ``seq`` without Spark: which files hold which seqs, and reading a range.

The driver side of the ``replication-txlog`` stream
(:mod:`replication.txlog.stream`) and every reader outside
Spark (``replication replay``/``sow``/``verify``, bootstrap, the SOW) share
this view. ``seq`` is contiguous (the ingest writer assigns ``max_seq + 1
...`` in each commit), so a range ``(a, b]`` holds exactly ``b - a`` rows and
every read checks that it got all of them. The table's file list (with each
file's ``min``/``max`` of ``seq`` from the Delta statistics) picks the few
files a range needs; nothing here imports PySpark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from replication.connectors.delta.log import appends_after, local_log_dir
from replication.connectors.delta.tables import COMMIT_METADATA_KEY, open_table
from replication.connectors.s3.access import S3Address, arrow_location
from replication.errors import StorageError
from replication.txlog.schema import TXLOG_SCHEMA

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from deltalake import DeltaTable

#: A range larger than this is cut into several parts (Spark tasks), at file boundaries.
ROWS_PER_PARTITION = 200_000
#: Index bounds of a file without statistics: it may hold any seq.
_MIN, _MAX = -(2**63), 2**63 - 1


class TxlogSourceError(StorageError):
    """The txlog did not hold the rows a committed offset promises (transient: a retry re-plans)."""


@dataclass(frozen=True)
class TxlogRange:
    """Rows ``start < seq <= end`` of the txlog at ``path``, found in ``files`` (one Spark task's worth)."""

    path: str
    start: int
    end: int
    files: tuple[str, ...]
    columns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TxlogFile:
    """One data file of the current snapshot; ``lo``/``hi`` None when it has no statistics."""

    uri: str
    lo: int | None
    hi: int | None

    def overlaps(self, start: int, end: int) -> bool:
        """Whether the file may hold a row with ``start < seq <= end``."""
        if self.lo is None or self.hi is None:
            return True
        return self.lo <= end and self.hi > start


class TxlogFiles:
    """A long-lived view of one txlog table: its highest committed ``seq`` and its files by seq range.

    :meth:`refresh` follows the Delta log incrementally; when the version
    changed, the file index is rebuilt from the snapshot's add actions with
    vectorised Arrow/numpy code (about 3 ms for 20,000 files). Nothing here
    reads data files.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._table: DeltaTable | None = None
        self._version: int | None = None
        self._root = ""
        # The index, sorted by lo; files without statistics get lo=_MIN, hi=_MAX.
        self._paths: pa.Array | None = None
        self._lo: np.ndarray | None = None
        self._hi: np.ndarray | None = None
        self.committed_seq = 0
        """Highest seq in a committed file (0: empty or absent table)."""

    @property
    def version(self) -> int | None:
        """Delta version of the snapshot (None: the table does not exist yet)."""
        return self._version

    @property
    def file_count(self) -> int:
        return 0 if self._lo is None else len(self._lo)

    @property
    def first_seq(self) -> int:
        """The lowest seq the table still holds (1 unless old rows were removed; 1 when unknown or empty)."""
        if self._lo is None or not self._lo.size or self._lo[0] == _MIN:
            return 1
        return int(self._lo[0])

    def refresh(self) -> None:
        from deltalake.exceptions import TableNotFoundError

        if self._follow_commits():
            return
        if self._table is None:
            try:
                self._table = open_table(self.path)
            except TableNotFoundError:
                return
        else:
            self._table.update_incremental()
        version = self._table.version()
        if version != self._version:
            self._load_files()
            self._version = version

    def _follow_commits(self) -> bool:
        """Bring the index up to date from the new commit files alone (see :mod:`replication.connectors.delta.log`).

        False when that is not possible (no snapshot yet, storage neither local
        nor S3, a commit other than a plain append): the caller refreshes the
        snapshot instead, which also brings the delta-rs table up to date.
        """
        import numpy as np
        import pyarrow as pa

        if self._table is None or self._version is None or self._paths is None or self._lo is None \
                or self._hi is None:
            return False
        log_dir = local_log_dir(self._root)
        if log_dir is not None:
            appended = appends_after(log_dir, self._version)
        elif S3Address.parse(self._root) is not None:
            appended = appends_after(self._root, self._version)  # (one GET per commit object)
        else:
            appended = None
        if appended is None:
            return False
        if appended.paths:
            lo, hi = np.array(appended.lo, dtype=np.int64), np.array(appended.hi, dtype=np.int64)
            if self._lo.size and lo.min() < self._lo[-1]:
                return False  # not after every known file: let the snapshot order them
            order = np.argsort(lo, kind="stable")  # (a commit may add its files in any order: the index is by lo)
            lo, hi = lo[order], hi[order]
            self._paths = pa.concat_arrays([self._paths, pa.array(appended.paths, self._paths.type).take(order)])
            self._lo, self._hi = np.concatenate([self._lo, lo]), np.concatenate([self._hi, hi])
            self.committed_seq = max(self.committed_seq, int(hi.max()))
        self.committed_seq = max(self.committed_seq, appended.last_seq)
        self._version = appended.version
        return True

    def _load_files(self) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        table = self._table
        assert table is not None
        actions = pa.table(table.get_add_actions(flatten=True))
        self._root = table.table_uri.rstrip("/")
        if "min.seq" in actions.column_names and "max.seq" in actions.column_names:
            lo = pc.fill_null(actions.column("min.seq"), _MIN).to_numpy()
            hi = pc.fill_null(actions.column("max.seq"), _MAX).to_numpy()
        else:  # no file has statistics
            lo = np.full(actions.num_rows, _MIN, dtype=np.int64)
            hi = np.full(actions.num_rows, _MAX, dtype=np.int64)
        order = np.argsort(lo, kind="stable")
        self._paths = actions.column("path").combine_chunks().take(pa.array(order))
        self._lo, self._hi = lo[order], hi[order]
        known = self._hi[self._hi != _MAX]
        committed = int(known.max()) if known.size else 0
        if known.size < self._hi.size:
            # A writer without statistics: its commit records say how far the log goes.
            committed = max(committed, _last_seq_from_commits(table))
        # Never move backwards: a snapshot only adds seqs (compaction rewrites the same rows).
        self.committed_seq = max(self.committed_seq, committed)

    def overlapping(self, start: int, end: int) -> list[TxlogFile]:
        """Files that may hold a row with ``start < seq <= end``, lowest seqs first."""
        return self._files_at(self._hits(start, end))

    def read(self, start: int, end: int, *, schema: pa.Schema | None = None) -> pa.Table:
        """Rows ``start < seq <= end`` in seq order, checked complete, from the current snapshot.

        A file listed earlier may have gone (compacted, then vacuumed): the
        snapshot is followed once more and the range read again.
        """
        def attempt() -> pa.Table | None:
            self.refresh()
            try:
                return read_files([f.uri for f in self.overlapping(start, end)], start, end, schema=schema)
            except FileNotFoundError:
                return None

        rows = attempt()
        if rows is None or rows.num_rows != end - start:
            rows = attempt()
        if rows is None:
            raise FileNotFoundError(f"txlog {self.path}: files of seq ({start}, {end}] vanished twice while read")
        return _checked(rows, start, end, self.path)

    def plan(self, start: int, end: int, *, rows_per_partition: int = ROWS_PER_PARTITION,
             columns: tuple[str, ...] | None = None) -> list[TxlogRange]:
        """Cut ``(start, end]`` into tasks of about ``rows_per_partition`` rows, at file boundaries."""
        import numpy as np

        if end <= start:
            return []
        hits = self._hits(start, end)
        cuts = [start]
        if hits.size and self._lo is not None and self._hi is not None:
            lo, hi = self._lo[hits], self._hi[hits]
            known = hi != _MAX
            lo, hi = lo[known], np.minimum(hi[known], end)
            # Rows of each file inside the range (seq is contiguous), then a cut
            # after each file where the running total passes a multiple of the target.
            running = np.cumsum(hi - np.maximum(lo - 1, start))
            steps = np.flatnonzero(np.diff(running // rows_per_partition, prepend=0) > 0)
            cuts += sorted({int(hi[i]) for i in steps if start < hi[i] < end})
        cuts.append(end)
        out = []
        for a, b in zip(cuts, cuts[1:]):
            inside = hits[(self._lo[hits] <= b) & (self._hi[hits] > a)] \
                if hits.size and self._lo is not None and self._hi is not None else hits  # (hits: only with an index)
            out.append(TxlogRange(self.path, a, b, tuple(f.uri for f in self._files_at(inside)), columns))
        return out

    def _hits(self, start: int, end: int) -> np.ndarray:
        import numpy as np

        if self._lo is None or self._hi is None:
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero((self._lo <= end) & (self._hi > start))

    def _files_at(self, index: np.ndarray) -> list[TxlogFile]:
        if self._paths is None or self._lo is None or self._hi is None or not index.size:
            return []
        import pyarrow as pa

        paths = self._paths.take(pa.array(index)).to_pylist()
        return [
            TxlogFile(file_uri(self._root, p), None if lo == _MIN else int(lo), None if hi == _MAX else int(hi))
            for p, lo, hi in zip(paths, self._lo[index], self._hi[index], strict=True)
        ]


def file_uri(root: str, path: str) -> str:
    """Where a file of the table is: add-action paths are relative to the table root, or absolute URIs."""
    if "://" in path:
        return path
    return f"{root}/{path}"


def local_or_uri(uri: str) -> str:
    """pyarrow reads local files by path; keep other URIs (s3://...) as they are."""
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else uri


def _last_seq_from_commits(table: DeltaTable, look_back: int = 100) -> int:
    """``last_seq`` of the newest of the last ``look_back`` commits that records one (0: none)."""
    import json

    for entry in table.history(limit=look_back):  # newest first
        raw = entry.get(COMMIT_METADATA_KEY)
        if raw:
            return int(json.loads(raw).get("last_seq", 0))
    return 0


def read_files(
    files: tuple[str, ...] | list[str], start: int, end: int, *, schema: pa.Schema | None = None
) -> pa.Table:
    """The rows with ``start < seq <= end`` of these Parquet files, in seq order.

    Columns: those of ``schema`` (default :data:`TXLOG_SCHEMA`; Spark's variant
    differs in list field names; a projection reads only its columns).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = [("seq", ">", start), ("seq", "<=", end)]
    parts = []
    for uri in files:
        path, filesystem = arrow_location(local_or_uri(uri))
        # schema=: a file written before a column was added reads it as null
        parts.append(pq.read_table(path, schema=TXLOG_SCHEMA, columns=(schema or TXLOG_SCHEMA).names,
                                   filters=where, partitioning=None, filesystem=filesystem))
    schema = schema or TXLOG_SCHEMA
    parts = [p if p.schema == schema else p.cast(schema) for p in parts if p.num_rows]
    if not parts:
        return schema.empty_table()
    rows = pa.concat_tables(parts)
    seq = rows.column("seq").to_numpy()
    if len(seq) > 1 and not bool(np.all(seq[1:] > seq[:-1])):
        rows = rows.take(np.argsort(seq, kind="stable"))
    return rows


def read_range(path: str, start: int, end: int, *, schema: pa.Schema | None = None) -> pa.Table:
    """Rows ``start < seq <= end`` of the txlog at ``path``, in seq order, checked complete.

    For use outside Spark (tools, tests); the stream's tasks do the same with
    the file list planned on the driver.
    """
    return TxlogFiles(path).read(start, end, schema=schema)


def _checked(rows: pa.Table, start: int, end: int, path: str) -> pa.Table:
    if rows.num_rows != end - start:
        raise TxlogSourceError(
            f"txlog {path}: expected {end - start} rows with seq in ({start}, {end}], found {rows.num_rows}. "
            "seq is contiguous, so rows are missing or duplicated: was the txlog written by another writer, "
            "truncated, or vacuumed below this position?"
        )
    return rows
