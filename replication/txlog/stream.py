"""An instance's txlog as a Spark stream in local ``seq`` order (format ``replication-txlog``).

Replays (``replication replay``) read the txlog with this source. The offset
is the local sequence number: ``{"seq": N}`` means "every row through seq N".
``seq`` is contiguous (the ingest writer assigns ``max_seq + 1 ...`` in each
commit), so a range ``(a, b]`` holds exactly ``b - a`` rows: the read limit is
exact, and every read checks that it got all of them.

Reads cost what the range holds, not what the log holds: the driver keeps the
table's file list (with each file's ``min``/``max`` of ``seq`` from the Delta
statistics, :mod:`replication.txlog.files`) and hands each
task the few files that overlap its range; the task reads them with
``pyarrow.parquet`` (row groups pruned by their own statistics) and never
opens the Delta log. Compaction (files rewritten with
``dataChange=false``) needs nothing special: the current snapshot lists each
row once, whatever the files.

Example:
    >>> from replication.connectors.delta import txlog_stream            # doctest: +SKIP
    >>> txlog_stream.register(spark)
    >>> df = (spark.readStream.format("replication-txlog")
    ...       .option("path", "/var/lib/replication/amps-1/txlog")
    ...       .option("startSeq", 0)               # rows with seq > startSeq
    ...       .option("maxRowsPerTrigger", 50000)  # optional
    ...       .load())

A replay (:mod:`replication.replay`) adds three options: ``endSeq`` (never
past this seq), ``durableFile`` (never past the ``durable_seq`` of the
instance's ``_control/durable.json``: ``fully_durable``) and ``rate`` (paced at
a multiple of the rows' original ``publish_time`` spacing, e.g. ``2x``).

Output columns: :data:`replication.txlog.TXLOG_SCHEMA`, rows in ``seq`` order
(within a micro-batch, Spark partitions are planned in ``seq`` order too).
A table that does not exist yet reads as empty until it appears.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
from replication.connectors.spark.options import int_option
from replication.connectors.spark.pacing import Pacer, parse_rate
from replication.errors import ConfigError
from replication.storage.control import DurableState
from replication.storage.layout import storage_path
from replication.txlog.files import ROWS_PER_PARTITION, TxlogFiles, TxlogRange, read_files, read_range
from replication.txlog.schema import TXLOG_SCHEMA

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FORMAT = "replication-txlog"

#: Spark schema of the stream: the txlog's columns, with their nullability.
SCHEMA: StructType = from_arrow_schema(TXLOG_SCHEMA)

#: Rows per Arrow batch handed to Spark.
ARROW_BATCH_ROWS = 20_000


# -- options -------------------------------------------------------------------


@dataclass(frozen=True)
class TxlogSourceOptions:
    """The source's options, parsed once from Spark's ``.option(...)`` strings.

    Attributes:
        path: the txlog table's directory or URI (option ``path``, or ``.load(path)``).
        start_seq: a new query reads the rows with ``seq > start_seq`` (option
            ``startSeq``, default 0: everything). A query restarted from its
            checkpoint continues from the checkpoint instead.
        max_rows_per_trigger: at most this many rows per micro-batch (option
            ``maxRowsPerTrigger``); ``None``: no bound.
        rows_per_partition: a micro-batch is read by one Spark task per about
            this many rows, cut at file boundaries (option ``rowsPerPartition``,
            default :data:`ROWS_PER_PARTITION`).
        driver_read_rows: a micro-batch of at most this many rows is read by the
            source's planner process instead of Spark tasks (option
            ``driverReadRows``; 0: always tasks). See :mod:`replication.connectors.spark.driver_read`.
        columns: only these txlog columns, ``seq`` always among them (option
            ``columns``, comma separated; default: all). A reader that needs
            only a few columns (headers for routing, say) moves far less data
            through Spark.
        end_seq: never read rows past this seq (option ``endSeq``; default: no end).
        durable_file: the instance's ``_control/durable.json`` (option
            ``durableFile``): never read past its ``durable_seq``, the rows every
            sync destination has acknowledged; the stream waits while it does not move.
        rate: replay no faster than this multiple of the pace the rows were
            published at, by their ``publish_time`` (option ``rate``, e.g. ``2x``;
            default: as fast as possible). See :mod:`replication.connectors.spark.pacing`.
    """

    path: str
    start_seq: int = 0
    max_rows_per_trigger: int | None = None
    rows_per_partition: int = ROWS_PER_PARTITION
    driver_read_rows: int = DRIVER_READ_MAX_ROWS
    columns: tuple[str, ...] | None = None
    end_seq: int | None = None
    durable_file: str | None = None
    rate: float | None = None

    @property
    def arrow_schema(self) -> pa.Schema:
        """The txlog's Arrow schema, or its projection on :attr:`columns`."""
        return project(self.columns)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> TxlogSourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        path = (opts.get("path") or "").strip()
        if not path:
            raise ConfigError(
                f"{FORMAT}: option 'path' is required (the txlog table), e.g. "
                f".option('path', '/var/lib/replication/amps-1/txlog')"
            )
        return cls(
            path,
            int_option(opts, "startSeq", FORMAT, minimum=0, example=0) or 0,
            int_option(opts, "maxRowsPerTrigger", FORMAT, minimum=1, example=50000),
            int_option(opts, "rowsPerPartition", FORMAT, minimum=1, example=ROWS_PER_PARTITION) or ROWS_PER_PARTITION,
            driver_read_rows_option(opts, FORMAT),
            _columns_option(opts.get("columns")),
            int_option(opts, "endSeq", FORMAT, minimum=0, example=1000),
            (opts.get("durablefile") or "").strip() or None,
            parse_rate(opts.get("rate"), where=f"{FORMAT}: rate"),
        )


def _columns_option(raw: str | None) -> tuple[str, ...] | None:
    if raw is None or not raw.strip():
        return None
    names = [name.strip() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in TXLOG_SCHEMA.names]
    if unknown:
        raise ConfigError(
            f"{FORMAT}: columns lists {', '.join(repr(u) for u in unknown)}, not a txlog column; "
            f"choose from {', '.join(TXLOG_SCHEMA.names)}, e.g. .option('columns', 'seq,topic'), or leave it out"
        )
    return tuple(dict.fromkeys(["seq", *names]))  # seq: the offset, always there


def project(columns: tuple[str, ...] | None) -> pa.Schema:
    """:data:`TXLOG_SCHEMA`, or its fields ``columns`` (in txlog order)."""
    import pyarrow as pa

    if columns is None:
        return TXLOG_SCHEMA
    return pa.schema([f for f in TXLOG_SCHEMA if f.name in columns])


# -- executor: reading one range -----------------------------------------------


@dataclass(frozen=True)
class TxlogInputPartition(TxlogRange, InputPartition):
    """One Spark task: a :class:`TxlogRange`."""


def read_partition(part: TxlogInputPartition) -> Iterator[pa.RecordBatch]:
    """Yield ``part``'s rows as Arrow batches in Spark's schema.

    The files were listed by the driver. If one has gone since (compacted, then
    vacuumed) or rows are missing, the range is planned again from the
    table's current snapshot; if rows are still missing, the task fails.
    """
    schema = _spark_arrow_schema(part.columns)
    try:
        rows = read_files(part.files, part.start, part.end, schema=schema)
    except FileNotFoundError:
        rows = None
    if rows is None or rows.num_rows != part.end - part.start:
        log.info("%s: re-planning seq (%d, %d] from the current snapshot", part.path, part.start, part.end)
        rows = read_range(part.path, part.start, part.end, schema=schema)
    yield from rows.to_batches(max_chunksize=ARROW_BATCH_ROWS)


@functools.cache
def _spark_arrow_schema(columns: tuple[str, ...] | None = None) -> pa.Schema:
    # Spark refuses a batch whose schema differs in any detail (list field
    # names, nullability): derive it the way Spark does.
    return to_arrow_schema(from_arrow_schema(project(columns)), timezone="UTC")


# -- Spark data source ---------------------------------------------------------


class TxlogSource(DataSource):
    """``spark.readStream.format("replication-txlog")``: a txlog in seq order (see module doc)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return from_arrow_schema(TxlogSourceOptions.parse(self.options).arrow_schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = TxlogSourceOptions.parse(self.options)
        return with_driver_reads(TxlogStreamReader(options), _spark_arrow_schema(options.columns),
                                 options.driver_read_rows)


class TxlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over ``seq`` (driver side) and reads them (executor side).

    Lifecycle, as Spark drives it: ``initialOffset`` once for a new query
    (``{"seq": startSeq}``); ``prepareForTriggerAvailableNow`` once with
    ``Trigger.AvailableNow`` (fixes the target: the highest seq committed then);
    per micro-batch ``latestOffset(start, limit)`` (follows the Delta log),
    ``partitions(start, end)`` (picks the files by their seq statistics) and, in
    the executors, ``read(partition)``; ``commit(end)`` after each batch (nothing
    to do: the position lives in Spark's checkpoint); ``stop()`` at the end.
    The driver-side state is created on first use, never pickled to executors.
    """

    def __init__(self, options: TxlogSourceOptions) -> None:
        self.options = options
        self._view: TxlogFiles | None = None
        self._target: int | None = None
        self._latest: int | None = None
        self._pacer = Pacer(options.rate) if options.rate else None

    def _files(self) -> TxlogFiles:
        if self._view is None:
            self._view = TxlogFiles(self.options.path)
        self._view.refresh()
        return self._view

    def initialOffset(self) -> dict:
        return {"seq": self.options.start_seq}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_trigger:
            return ReadMaxRows(self.options.max_rows_per_trigger)
        return super().getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._files().committed_seq

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["seq"])
        latest = self._files().committed_seq
        if self._target is not None:
            latest = min(latest, self._target)
        if self.options.end_seq is not None:
            latest = min(latest, self.options.end_seq)
        if self.options.durable_file:
            saved = DurableState.read(storage_path(self.options.durable_file))  # (local, or an object on S3)
            latest = min(latest, saved.durable_seq if saved else 0)
        latest = max(latest, begin)  # a log behind the start (absent, or startSeq ahead): hold
        self._latest = latest
        if self._pacer is not None:
            latest = self._pacer.due_through(begin, latest, self._publish_times)
        if isinstance(limit, ReadMaxRows):
            latest = min(latest, begin + limit.max_rows)
        return {"seq": latest}

    def _publish_times(self, after: int, through: int) -> tuple[np.ndarray, np.ndarray]:
        """seq and publish_time (microseconds; a missing time takes its neighbour's) of rows ``(after, through]``."""
        import pyarrow.compute as pc

        rows = self._files().read(after, through, schema=project(("seq", "publish_time")))
        times = pc.fill_null_backward(pc.fill_null_forward(rows.column("publish_time").cast("int64")))
        return rows.column("seq").to_numpy(), pc.fill_null(times, 0).to_numpy()

    def reportLatestOffset(self) -> dict | None:
        return {"seq": self._latest} if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> list[TxlogInputPartition]:
        # After a restart Spark replans the last batch from the offset log: the
        # refresh in _files() brings the snapshot up to (at least) that batch.
        ranges = self._files().plan(int(start["seq"]), int(end["seq"]),
                                    rows_per_partition=self.options.rows_per_partition, columns=self.options.columns)
        return [TxlogInputPartition(r.path, r.start, r.end, r.files, r.columns) for r in ranges]

    def rows_between(self, start: dict, end: dict, at_most: int) -> int:
        return max(0, int(end["seq"]) - int(start["seq"]))  # seq is contiguous

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        self._view = None

    def read(self, partition: TxlogInputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("replication-txlog")`` available in this session."""
    spark.dataSource.register(TxlogSource)
