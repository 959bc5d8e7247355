"""An instance's inbox as a Spark stream of newly appended rows (format ``replication-inbox``).

Upstream replicators append to the inbox (DESIGN §3), several at once, one
commit per upstream batch; the ingest query reads it with this source. The
offset is the Delta version: ``{"version": V}`` means "every row committed
through version V". A new query starts at ``{"version": -1}`` (everything);
while the table does not exist the offset stays there.

A micro-batch ``(start, end]`` reads exactly the files the commits of those
versions added with ``dataChange=true`` (:mod:`replication.inbox.versions`),
so compaction is skipped and the cost follows the batch, not the table.

Example:
    >>> from replication.inbox import schema, stream                     # doctest: +SKIP
    >>> schema.create_inbox(Path("/var/lib/replication/amps-2/inbox"))
    >>> stream.register(spark)
    >>> df = (spark.readStream.format("replication-inbox")
    ...       .option("path", "/var/lib/replication/amps-2/inbox")
    ...       .option("maxRowsPerTrigger", 50000)  # optional, whole commits
    ...       .load())

Columns: :data:`~replication.inbox.schema.INBOX_SCHEMA` (what upstreams write) plus ``inbox_version``.
With ``.option("versionsOnly", "true")`` the stream carries one row per
version instead (column ``inbox_version``): Spark then tracks the position
exactly once while the reader fetches the rows itself with
:func:`read_versions` (the ingest query does: message bodies need not travel
through the JVM).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from replication.connectors.spark.driver_read import (
    DRIVER_READ_MAX_ROWS,
    driver_read_rows_option,
    with_driver_reads,
)
from replication.connectors.spark.options import bool_option, int_option
from replication.errors import ConfigError
from replication.inbox.schema import STREAM_SCHEMA, VERSIONS_SCHEMA
from replication.inbox.versions import InboxLog, int64_range, read_versions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FORMAT = "replication-inbox"

#: Rows per Arrow batch handed to Spark.
ARROW_BATCH_ROWS = 20_000
#: Versions per Spark task: a backlog of many commits is read by several tasks.
VERSIONS_PER_PARTITION = 64


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
        driver_read_rows: a micro-batch of at most this many rows is read by the
            source's planner process instead of Spark tasks (option
            ``driverReadRows``; 0: always tasks). See :mod:`replication.connectors.spark.driver_read`.
        versions_only: one row per version, column ``inbox_version`` (option
            ``versionsOnly``, ``true``/``false``); the reader fetches the rows
            with :func:`read_versions`. ``maxRowsPerTrigger`` still counts rows.
    """

    path: str
    max_rows_per_trigger: int | None = None
    versions_per_partition: int = VERSIONS_PER_PARTITION
    driver_read_rows: int = DRIVER_READ_MAX_ROWS
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
            driver_read_rows_option(opts, FORMAT),
            bool_option(opts, "versionsOnly", FORMAT),
        )


# -- executor: reading versions ------------------------------------------------


@dataclass(frozen=True)
class InboxInputPartition(InputPartition):
    """Rows appended to the inbox at ``path`` in versions ``first..last`` (inclusive): one Spark task."""

    path: str
    first: int
    last: int
    versions_only: bool = False


def read_partition(part: InboxInputPartition) -> Iterator[pa.RecordBatch]:
    schema = _spark_arrow_schema(part.versions_only)
    if part.versions_only:
        yield pa.RecordBatch.from_arrays([int64_range(part.first, part.last)], schema=schema)
        return
    rows = read_versions(part.path, part.first, part.last)
    for batch in rows.to_batches(max_chunksize=ARROW_BATCH_ROWS):
        yield batch.cast(schema)


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
        return with_driver_reads(InboxStreamReader(options), _spark_arrow_schema(options.versions_only),
                           options.driver_read_rows)


class InboxStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over Delta versions (driver side) and reads them (executor side).

    Lifecycle, as Spark drives it: ``initialOffset`` once for a new query
    (``{"version": -1}``); ``prepareForTriggerAvailableNow`` once with
    ``Trigger.AvailableNow`` (the target: the latest version then); per
    micro-batch ``latestOffset(start, limit)``, ``partitions(start, end)``
    (runs of ``versionsPerPartition`` versions) and, in the executors,
    ``read(partition)``; ``commit(end)`` (nothing to do); ``stop()``.
    """

    #: Where a new query starts: before the table's first version.
    FIRST: ClassVar[dict[str, int]] = {"version": -1}

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
        return dict(self.FIRST)

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

    def read(self, partition: InboxInputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("replication-inbox")`` available in this session."""
    spark.dataSource.register(InboxSource)
