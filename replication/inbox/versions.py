"""An inbox read by Delta version without Spark: its newest version, rows per version, the rows of versions.

The ingest query's reads of its inbox (:mod:`replication.inbox.stream` plans the versions, the writer
or a Spark task reads them here). A range of versions that are plain appends, on local storage or S3
(what upstream replicators write), is read from the files their commit files name
(:mod:`replication.connectors.delta.log`); anything else through Delta's change data feed
(``DeltaTable.load_cdf``), keeping its inserts. Rows come out ordered by
``(inbox_version, link, upstream_seq)``: per link, in the upstream's order.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replication.connectors.delta.log import appends_after, commit_text, local_log_dir, newest_version
from replication.connectors.delta.tables import open_table
from replication.connectors.s3.access import S3Address, arrow_location
from replication.errors import StorageError
from replication.inbox.schema import INBOX_SCHEMA, STAGED_PART_KEY, STREAM_SCHEMA

if TYPE_CHECKING:
    from deltalake import DeltaTable


class InboxSourceError(StorageError):
    """The inbox could not be read for the versions a committed offset names."""


class InboxLog:
    """A long-lived view of one inbox's Delta log: the latest version, and rows per version.

    Row counts are read from the commit files (``numRecords`` of the add
    actions with ``dataChange=true``) only when a read limit asks for them,
    once per version.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._table: DeltaTable | None = None
        self._version = -1
        self._rows: dict[int, int] = {}

    def latest_version(self) -> int:
        """The table's latest version; -1 while it does not exist.

        The commit files after the last known version are probed (a few ``stat`` calls on local storage,
        HEAD requests on S3); on other storage the delta-rs table is updated.
        """
        from deltalake.exceptions import TableNotFoundError

        if self._table is None:
            try:
                self._table = open_table(self.path)
            except TableNotFoundError:
                return -1
            self._version = self._table.version()
            return self._version
        uri = self._table.table_uri
        log_dir = local_log_dir(uri)
        if log_dir is not None:
            self._version = newest_version(log_dir, self._version)
            return self._version
        if S3Address.parse(uri) is not None:
            try:
                self._version = newest_version(uri, self._version)
                return self._version
            except StorageError:  # (a probe that failed: delta-rs says what is wrong, or the newest version)
                pass
        self._table.update_incremental()
        self._version = self._table.version()
        return self._version

    def rows_in(self, version: int) -> int:
        """Rows committed by ``version`` (an unreadable commit counts as large: a batch of its own)."""
        if version not in self._rows:
            try:
                text = self._commit_text(version)
            except StorageError:
                text = None
            self._rows[version] = _count_rows(text)
        return self._rows[version]

    def end_within(self, start: int, latest: int, max_rows: int) -> int:
        """The highest version ``e <= latest`` such that versions ``(start, e]`` hold at most ``max_rows`` rows.

        At least ``start + 1`` (one commit, however large) when ``latest > start``.
        """
        for v in [v for v in self._rows if v <= start]:
            del self._rows[v]  # already read: forget
        end, total = start, 0
        while end < latest:
            total += self.rows_in(end + 1)
            if total > max_rows and end > start:
                break
            end += 1
        return end

    def _commit_text(self, version: int) -> str | None:
        assert self._table is not None
        return commit_text(self._table.table_uri, version)


def _count_rows(text: str | None) -> int:
    if text is None:  # (unreadable: counts as large, a batch of its own)
        return 2**62
    rows = 0
    for line in text.splitlines():
        if STAGED_PART_KEY in line:  # (a staged part's rows count as the batch's rows: they may be read)
            part = json.loads(line).get("commitInfo", {}).get(STAGED_PART_KEY)
            rows += int(json.loads(part).get("rows", 0)) if part else 0
            continue
        if '"add"' not in line:
            continue
        add = json.loads(line).get("add")
        if not add or not add.get("dataChange", True):
            continue
        stats = json.loads(add.get("stats") or "{}")
        rows += int(stats.get("numRecords", 0))
    return rows


#: Per Python worker: the inbox tables opened by earlier tasks (workers are reused).
_TABLES: dict[str, DeltaTable] = {}


def read_versions(path: str, first: int, last: int) -> pa.Table:
    """Rows appended in versions ``first..last`` of the inbox at ``path`` (STREAM_SCHEMA, ordered).

    Only inserted rows count: the inbox is append-only; a row someone deleted
    or updated by hand is not replayed.
    """
    import pyarrow.compute as pc

    rows = _read_appended(path, first, last)
    if rows is not None:
        return rows
    table = _TABLES.get(path)
    if table is None:
        table = _TABLES[path] = open_table(path)
    elif table.version() < last:
        table.update_incremental()
    try:
        # load_cdf reads the commit files of the range itself (even past the
        # snapshot's version) and silently stops at the newest: filter on
        # the version below rather than trust the bounds.
        changes = pa.RecordBatchReader.from_stream(
            table.load_cdf(starting_version=first, ending_version=last)
        ).read_all()
    except Exception as exc:  # deltalake raises its own internal error types
        raise InboxSourceError(
            f"inbox {path}: cannot read the changes of versions {first}..{last} ({exc}). If the Delta log "
            "no longer holds these commits (cleaned up after delta.logRetentionDuration), restart the "
            "ingest query without its checkpoint: duplicates are dropped by publisher sequence."
        ) from exc
    version = pc.cast(changes.column("_commit_version"), pa.int64())
    keep = pc.and_(
        pc.equal(pc.cast(changes.column("_change_type"), pa.string()), "insert"),
        pc.and_(pc.greater_equal(version, first), pc.less_equal(version, last)),
    )
    # load_cdf gives string_view columns, which pyarrow cannot filter yet: cast first.
    rows = changes.select(INBOX_SCHEMA.names).append_column("inbox_version", version)
    return _in_stream_order(rows.cast(STREAM_SCHEMA).filter(keep))


def _in_stream_order(rows: pa.Table) -> pa.Table:
    if _already_in_stream_order(rows):
        return rows
    return rows.sort_by([("inbox_version", "ascending"), ("link", "ascending"), ("upstream_seq", "ascending")])


def _already_in_stream_order(rows: pa.Table) -> bool:
    """Whether ``rows`` are in stream order already: versions ascending, one link per version, its upstream
    seqs ascending. Upstream batches and backfill parts are appended so; seeing it takes a few vectorised
    passes, where the sort would copy every column (bodies included: ~0.15 s per million rows)."""
    n = rows.num_rows
    if n < 2:
        return True
    link, upstream_seq = rows["link"], rows["upstream_seq"]
    if link.null_count or upstream_seq.null_count:
        return False
    version = rows["inbox_version"].to_numpy()
    if (version[1:] < version[:-1]).any():
        return False
    same_version = version[1:] == version[:-1]
    same_link = pc.equal(link.slice(1), link.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    if (same_version & ~same_link).any():
        return False
    seqs = upstream_seq.to_numpy()
    return not (same_version & (seqs[1:] < seqs[:-1])).any()


def staged_parts(path: str, first: int, last: int) -> list[tuple[int, str]]:
    """``(version, descriptor)`` of each commit of versions ``first..last`` that hands over a staged backfill
    part (:data:`STAGED_PART_KEY`), in version order: from the commit files (local or S3), else the history."""
    if last < first:
        return []
    out = []
    log_dir = local_log_dir(path)
    if log_dir is not None or S3Address.parse(path) is not None:
        for version in range(first, last + 1):
            if log_dir is not None:
                try:
                    text: str | None = (log_dir / f"{version:020d}.json").read_text(encoding="utf-8")
                except FileNotFoundError:
                    text = None
            else:
                text = commit_text(path, version)  # (one GET each on S3; no snapshot)
            if text is None or STAGED_PART_KEY not in text:
                continue  # (cleaned up: the change feed could not give its rows either)
            for line in text.splitlines():
                part = json.loads(line).get("commitInfo", {}).get(STAGED_PART_KEY) if STAGED_PART_KEY in line else None
                if part:
                    out.append((version, part))
        return out
    table = open_table(path)
    for entry in table.history(limit=max(1, table.version() - first + 1)):
        if first <= entry.get("version", -1) <= last and entry.get(STAGED_PART_KEY):
            out.append((entry["version"], entry[STAGED_PART_KEY]))
    return sorted(out)


def read_appended_version(path: str, version: int) -> pa.Table | None:
    """The rows ``version`` appended (STREAM_SCHEMA, ordered) when it is a committed plain append (on local
    storage or S3); None when it is not committed yet, or not that (:func:`read_versions` asks the change feed)."""
    return _read_appended(path, version, version)


def _read_appended(path: str, first: int, last: int) -> pa.Table | None:
    """Versions ``first..last`` read from the files their commits added, when every one of them is a
    plain append (what upstream replicators write), on local storage or S3; None: ask the change data feed.

    The same rows as the change feed's inserts, without building a snapshot: the
    live inbox's next few versions cost a few small reads.
    """
    import pyarrow.parquet as pq

    log_dir = local_log_dir(path)
    on_s3 = log_dir is None and S3Address.parse(path) is not None
    if (log_dir is None and not on_s3) or last < first:
        return None
    appended = appends_after(log_dir if log_dir is not None else path, first - 1, column=None, through=last,
                             removals=True)
    if appended is None:
        return None
    parts = []
    for file, version in zip(appended.paths, appended.versions, strict=True):
        if "://" in file:
            return None
        if log_dir is not None:
            where, filesystem = str(log_dir.parent / unquote(file)), None
        else:
            where, filesystem = arrow_location(f"{path.rstrip('/')}/{unquote(file)}")
        try:
            # schema=: a file written before a column was added reads it as null
            part = pq.read_table(where, schema=INBOX_SCHEMA, columns=INBOX_SCHEMA.names, partitioning=None,
                                 filesystem=filesystem)
        except FileNotFoundError:
            return None  # vacuumed: the change feed says what it can
        parts.append(part.cast(INBOX_SCHEMA).append_column(
            "inbox_version", pa.array(np.full(part.num_rows, version, dtype=np.int64))))
    if not parts:
        return STREAM_SCHEMA.empty_table()
    return _in_stream_order(pa.concat_tables(parts).cast(STREAM_SCHEMA))


def int64_range(first: int, last: int) -> pa.Array:
    """``first`` .. ``last`` as an int64 array, from a numpy buffer.

    ``pa.array`` of Python or numpy values imports pandas on its first call in a
    process (~0.2 CPU-s). In the source's planner process that import would
    hold up the first inbox batch after every start; nothing else there needs pandas.
    """
    values: np.ndarray = np.arange(first, last + 1, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])
