"""An instance's inbox as a Spark stream of newly appended rows (format ``replication-inbox``).

Upstream replicators append to the inbox (DESIGN §3), several at once, one
commit per upstream batch; the ingest query reads it with this source. The
offset is the Delta version: ``{"version": V}`` means "every row committed
through version V". A new query starts at ``{"version": -1}`` (everything);
while the table does not exist the offset stays there.

A micro-batch ``(start, end]`` reads exactly the files the commits of those
versions added with ``dataChange=true``, so compaction is skipped and the cost
follows the batch, not the table: when every one of those commits is a plain
append on local storage (what upstream replicators write), straight from the
files their commit files name (:mod:`replication.connectors.delta.log`); otherwise with
Delta's change data feed (``DeltaTable.load_cdf``), keeping its inserts. Rows
come out ordered by ``(inbox_version, link, upstream_seq)``: per link, in the
upstream's order.

Example:
    >>> from replication import inbox_source                             # doctest: +SKIP
    >>> inbox_source.create_inbox(Path("/var/lib/replication/amps-2/inbox"))
    >>> inbox_source.register(spark)
    >>> df = (spark.readStream.format("replication-inbox")
    ...       .option("path", "/var/lib/replication/amps-2/inbox")
    ...       .option("maxRowsPerTrigger", 50000)  # optional, whole commits
    ...       .load())

Columns: :data:`INBOX_SCHEMA` (what upstreams write) plus ``inbox_version``.
With ``.option("versionsOnly", "true")`` the stream carries one row per
version instead (column ``inbox_version``): Spark then tracks the position
exactly once while the reader fetches the rows itself with
:func:`read_versions` (the ingest query does: message bodies need not travel
through the JVM).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from replication.connectors.delta.log import (
    appends_after,
    local_log_dir,
    newest_version,
)
from replication.connectors.delta.tables import open_or_create
from replication.connectors.delta.txlog_stream import int_option
from replication.connectors.spark.prefetch import (
    PREFETCH_MAX_ROWS,
    prefetch_rows_option,
    prefetching,
)
from replication.errors import ConfigError, StorageError
from replication.txlog import TXLOG_SCHEMA

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FORMAT = "replication-inbox"

#: Columns of the inbox table: a txlog row of the upstream without its local
#: ``seq``, which becomes ``upstream_seq``, and the link it came by.
INBOX_SCHEMA = pa.schema(
    [f for f in TXLOG_SCHEMA if f.name != "seq"]
    + [
        pa.field("upstream_seq", pa.int64(), nullable=False),  # the row's seq in the upstream's txlog
        pa.field("link", pa.string(), nullable=False),  # upstream instance name
        pa.field("link_group", pa.string(), nullable=False),  # upstream instance group
    ]
)

#: Columns of the stream: :data:`INBOX_SCHEMA` plus the Delta version that committed the row.
STREAM_SCHEMA = INBOX_SCHEMA.append(pa.field("inbox_version", pa.int64(), nullable=False))

#: Columns of a ``versionsOnly`` stream: one row per inbox version.
VERSIONS_SCHEMA = pa.schema([pa.field("inbox_version", pa.int64(), nullable=False)])

#: Table properties of an inbox. The change data feed is what Delta readers
#: (delta-spark, Databricks) require before they stream changes by version.
INBOX_TABLE_CONFIGURATION: dict[str, str] = {"delta.enableChangeDataFeed": "true"}

#: commitInfo key of an inbox commit that hands the instance a backfill part staged beside the inbox (its
#: descriptor, JSON; the commit adds no rows): see :mod:`replication.ingest.staged_parts`.
STAGED_PART_KEY = "replication.staged_part"

#: Rows per Arrow batch handed to Spark.
ARROW_BATCH_ROWS = 20_000
#: Versions per Spark task: a backlog of many commits is read by several tasks.
VERSIONS_PER_PARTITION = 64


class InboxSourceError(StorageError):
    """The inbox could not be read for the versions a committed offset names."""


def create_inbox(path: Path) -> DeltaTable:
    """Open the inbox at ``path``, creating it (with the change data feed on) if absent."""
    return open_or_create(path, INBOX_SCHEMA, name="inbox", configuration=INBOX_TABLE_CONFIGURATION)


# -- options -------------------------------------------------------------------


@dataclass(frozen=True)
class InboxSourceOptions:
    """The source's options, parsed once from Spark's ``.option(...)`` strings.

    Attributes:
        path: the inbox table's directory or URI (option ``path``, or ``.load(path)``).
        max_rows_per_trigger: about this many rows per micro-batch (option
            ``maxRowsPerTrigger``), in whole commits: a batch takes at least one
            commit, and never a commit that would take it past the limit.
            ``None``: no bound.
        versions_per_partition: a micro-batch is read by one Spark task per this
            many versions (option ``versionsPerPartition``, default
            :data:`VERSIONS_PER_PARTITION`).
        prefetch_rows: a micro-batch of at most this many rows is read by the
            source's planner process instead of Spark tasks (option
            ``prefetchRows``; 0: always tasks). See :mod:`replication.connectors.spark.prefetch`.
        versions_only: one row per version, column ``inbox_version`` (option
            ``versionsOnly``, ``true``/``false``); the reader fetches the rows
            with :func:`read_versions`. ``maxRowsPerTrigger`` still counts rows.
    """

    path: str
    max_rows_per_trigger: int | None = None
    versions_per_partition: int = VERSIONS_PER_PARTITION
    prefetch_rows: int = PREFETCH_MAX_ROWS
    versions_only: bool = False

    @property
    def arrow_schema(self) -> pa.Schema:
        return VERSIONS_SCHEMA if self.versions_only else STREAM_SCHEMA

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> InboxSourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        path = (opts.get("path") or "").strip()
        if not path:
            raise ConfigError(
                f"{FORMAT}: option 'path' is required (the inbox table), e.g. "
                f".option('path', '/var/lib/replication/amps-2/inbox')"
            )
        return cls(
            path,
            int_option(opts, "maxRowsPerTrigger", FORMAT, minimum=1, example=50000),
            int_option(opts, "versionsPerPartition", FORMAT, minimum=1, example=VERSIONS_PER_PARTITION)
            or VERSIONS_PER_PARTITION,
            prefetch_rows_option(opts, FORMAT),
            _bool_option(opts, "versionsOnly"),
        )


def _bool_option(opts: Mapping[str, str], name: str) -> bool:
    raw = str(opts.get(name.lower(), "false")).strip().lower()
    if raw not in ("true", "false"):
        raise ConfigError(f"{FORMAT}: {name} must be true or false, got {raw!r}; e.g. .option('{name}', 'true')")
    return raw == "true"


# -- driver: versions and their sizes ------------------------------------------


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

        On local storage the commit files after the last known version are
        probed (a few ``stat`` calls); elsewhere the delta-rs table is updated.
        """
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if self._table is None:
            try:
                self._table = DeltaTable(self.path)
            except TableNotFoundError:
                return -1
            self._version = self._table.version()
            return self._version
        log_dir = local_log_dir(self._table.table_uri)
        if log_dir is not None:
            self._version = newest_version(log_dir, self._version)
        else:
            self._table.update_incremental()
            self._version = self._table.version()
        return self._version

    def rows_in(self, version: int) -> int:
        """Rows committed by ``version`` (an unreadable commit counts as large: a batch of its own)."""
        if version not in self._rows:
            self._rows[version] = _count_rows(self._commit_file(version))
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

    def _commit_file(self, version: int) -> str:
        assert self._table is not None
        return f"{self._table.table_uri.rstrip('/')}/_delta_log/{version:020d}.json"


def _count_rows(uri: str) -> int:
    from pyarrow import fs

    try:
        filesystem, path = fs.FileSystem.from_uri(uri)
        with filesystem.open_input_stream(path) as stream:
            text = stream.read().decode("utf-8")
    except (FileNotFoundError, OSError):
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


# -- executor: reading versions ------------------------------------------------


@dataclass(frozen=True)
class InboxInputPartition(InputPartition):
    """Rows appended to the inbox at ``path`` in versions ``first..last`` (inclusive): one Spark task."""

    path: str
    first: int
    last: int
    versions_only: bool = False


#: Per Python worker: the inbox tables opened by earlier tasks (workers are reused).
_TABLES: dict[str, DeltaTable] = {}


def read_versions(path: str, first: int, last: int) -> pa.Table:
    """Rows appended in versions ``first..last`` of the inbox at ``path`` (STREAM_SCHEMA, ordered).

    Only inserted rows count: the inbox is append-only; a row someone deleted
    or updated by hand is not replayed.
    """
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    rows = _read_appended(path, first, last)
    if rows is not None:
        return rows
    table = _TABLES.get(path)
    if table is None:
        table = _TABLES[path] = DeltaTable(path)
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
    part (:data:`STAGED_PART_KEY`), in version order."""
    if last < first:
        return []
    log_dir = local_log_dir(path)
    out = []
    if log_dir is not None:
        for version in range(first, last + 1):
            try:
                text = (log_dir / f"{version:020d}.json").read_text(encoding="utf-8")
            except FileNotFoundError:
                continue  # (cleaned up: the change feed could not give its rows either)
            if STAGED_PART_KEY not in text:
                continue
            for line in text.splitlines():
                part = json.loads(line).get("commitInfo", {}).get(STAGED_PART_KEY) if STAGED_PART_KEY in line else None
                if part:
                    out.append((version, part))
        return out
    from deltalake import DeltaTable

    table = DeltaTable(path)
    for entry in table.history(limit=max(1, table.version() - first + 1)):
        if first <= entry.get("version", -1) <= last and entry.get(STAGED_PART_KEY):
            out.append((entry["version"], entry[STAGED_PART_KEY]))
    return sorted(out)


def read_appended_version(path: str, version: int) -> pa.Table | None:
    """The rows ``version`` appended (STREAM_SCHEMA, ordered) when it is a committed plain append on local
    storage; None when it is not committed yet, or not that (:func:`read_versions` asks the change feed)."""
    return _read_appended(path, version, version)


def _read_appended(path: str, first: int, last: int) -> pa.Table | None:
    """Versions ``first..last`` read from the files their commits added, when every one of them is a
    plain append on local storage (what upstream replicators write); None: ask the change data feed.

    The same rows as the change feed's inserts, without building a snapshot: the
    live inbox's next few versions cost a few small reads.
    """
    import pyarrow.parquet as pq

    log_dir = local_log_dir(path)
    if log_dir is None or last < first:
        return None
    appended = appends_after(log_dir, first - 1, column=None, through=last)
    if appended is None:
        return None
    parts = []
    for file, version in zip(appended.paths, appended.versions, strict=True):
        if "://" in file:
            return None
        try:
            # schema=: a file written before a column was added reads it as null
            part = pq.read_table(log_dir.parent / unquote(file), schema=INBOX_SCHEMA, columns=INBOX_SCHEMA.names,
                                 partitioning=None)
        except FileNotFoundError:
            return None  # vacuumed: the change feed says what it can
        parts.append(part.cast(INBOX_SCHEMA).append_column(
            "inbox_version", pa.array(np.full(part.num_rows, version, dtype=np.int64))))
    if not parts:
        return STREAM_SCHEMA.empty_table()
    return _in_stream_order(pa.concat_tables(parts).cast(STREAM_SCHEMA))


def read_partition(part: InboxInputPartition) -> Iterator[pa.RecordBatch]:
    schema = _spark_arrow_schema(part.versions_only)
    if part.versions_only:
        yield pa.RecordBatch.from_arrays([_int64_range(part.first, part.last)], schema=schema)
        return
    rows = read_versions(part.path, part.first, part.last)
    for batch in rows.to_batches(max_chunksize=ARROW_BATCH_ROWS):
        yield batch.cast(schema)


def _int64_range(first: int, last: int) -> pa.Array:
    """``first`` .. ``last`` as an int64 array, from a numpy buffer.

    ``pa.array`` of Python or numpy values imports pandas on its first call in a
    process (~0.2 CPU-s). In the source's planner process that import would
    hold up the first inbox batch after every start; nothing else there needs pandas.
    """
    values = np.arange(first, last + 1, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


@functools.cache
def _spark_arrow_schema(versions_only: bool = False) -> pa.Schema:
    return to_arrow_schema(from_arrow_schema(VERSIONS_SCHEMA if versions_only else STREAM_SCHEMA), timezone="UTC")


# -- Spark data source ---------------------------------------------------------


class InboxSource(DataSource):
    """``spark.readStream.format("replication-inbox")``: rows appended to an inbox (see module doc)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return from_arrow_schema(InboxSourceOptions.parse(self.options).arrow_schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = InboxSourceOptions.parse(self.options)
        return prefetching(InboxStreamReader(options), _spark_arrow_schema(options.versions_only),
                           options.prefetch_rows)


class InboxStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over Delta versions (driver side) and reads them (executor side).

    Lifecycle, as Spark drives it: ``initialOffset`` once for a new query
    (``{"version": -1}``); ``prepareForTriggerAvailableNow`` once with
    ``Trigger.AvailableNow`` (the target: the latest version then); per
    micro-batch ``latestOffset(start, limit)``, ``partitions(start, end)``
    (runs of ``versionsPerPartition`` versions) and, in the executors,
    ``read(partition)``; ``commit(end)`` (nothing to do); ``stop()``.
    """

    def __init__(self, options: InboxSourceOptions) -> None:
        self.options = options
        self._view: InboxLog | None = None
        self._target: int | None = None
        self._latest: int | None = None

    def _log(self) -> InboxLog:
        if self._view is None:
            self._view = InboxLog(self.options.path)
        return self._view

    def initialOffset(self) -> dict:
        return {"version": -1}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_trigger:
            return ReadMaxRows(self.options.max_rows_per_trigger)
        return super().getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._log().latest_version()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["version"])
        latest = self._log().latest_version()
        if self._target is not None:
            latest = min(latest, self._target)
        if latest < begin and latest >= 0:
            log.warning("inbox %s: latest version %d is below the checkpointed %d; holding",
                        self.options.path, latest, begin)
        latest = max(latest, begin)
        self._latest = latest
        if isinstance(limit, ReadMaxRows) and latest > begin:
            latest = self._log().end_within(begin, latest, limit.max_rows)
        return {"version": latest}

    def reportLatestOffset(self) -> dict | None:
        return {"version": self._latest} if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> list[InboxInputPartition]:
        first, last = int(start["version"]) + 1, int(end["version"])
        step = self.options.versions_per_partition
        return [
            InboxInputPartition(self.options.path, v, min(v + step - 1, last), self.options.versions_only)
            for v in range(first, last + 1, step)
        ]

    def rows_between(self, start: dict, end: dict, at_most: int) -> int:
        if self.options.versions_only:
            return int(end["version"]) - int(start["version"])
        total = 0
        for version in range(int(start["version"]) + 1, int(end["version"]) + 1):
            total += self._log().rows_in(version)
            if total > at_most:
                break
        return total

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        self._view = None

    def read(self, partition: InboxInputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_partition(partition)


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("replication-inbox")`` available in this session."""
    spark.dataSource.register(InboxSource)
