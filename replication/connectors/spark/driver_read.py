"""Small micro-batches read in the driver (in Spark's planner process), large ones by Spark tasks.

A Python streaming source normally reads every micro-batch in executor tasks:
each task hands the pickled reader to a Python worker, which reads and streams
Arrow back. For the small batches of a live stream that fixed cost (about
70-100 ms per batch on 2 cores, more CPU than reading a few thousand rows)
dominates latency. Spark has a second path, built for its "simple" stream
readers: the source's planner process (a long-lived Python process next to the
driver) reads the rows itself and hands them to Spark with the partition plan;
the task then only copies them out of the block manager, with no Python worker.

:func:`with_driver_reads` gives a source both: a micro-batch of at most
``max_rows`` rows takes the planner path, a larger one (a backlog) is read by
parallel tasks as before. The rows are the same either way: the planner calls
the source's own ``read(partition)`` on the partitions it planned.

Spark offers the planner path only to readers that are instances of its
private ``_SimpleStreamReaderWrapper``; :class:`DriverReadingReader` subclasses
it. When the installed PySpark lacks it, :func:`with_driver_reads` returns the
reader unchanged and every batch is read by tasks (correct, only slower).

Crash safety needs nothing special: the rows read in the driver are a cache of one
planned range. A batch re-planned after a restart finds no cache and is read
by tasks, from the same immutable range (Kafka offsets, txlog seqs, inbox
versions).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from replication.errors import ConfigError

#: Default bound of a micro-batch read on the planner (rows).
DRIVER_READ_MAX_ROWS = 50_000

try:  # PySpark's planner path is offered only to instances of this private class
    from pyspark.sql.datasource_internal import (
        _SimpleStreamReaderWrapper as _PlannerReadable,
    )

    AVAILABLE = all(hasattr(_PlannerReadable, name) for name in ("getCache", "partitions", "latestOffset"))
except ImportError:  # pragma: no cover - depends on the PySpark release
    _PlannerReadable = DataSourceStreamReader
    AVAILABLE = False


class SizedReader(Protocol):
    """What a source tells :class:`DriverReadingReader` beyond the stream reader API."""

    def rows_between(self, start: dict, end: dict, at_most: int) -> int:
        """Rows of the range ``start``..``end``, or any number above ``at_most`` once past it."""
        ...


@dataclass(frozen=True)
class PartitionBundle(InputPartition):
    """The one partition Spark allows for a batch read in the driver: every planned partition, read in turn."""

    parts: tuple[InputPartition, ...]


class DriverReadingReader(_PlannerReadable):
    """Wraps a source's stream reader; see the module docstring.

    Spark's planner calls ``partitions(start, end)`` and then, for readers of
    this kind, ``getCache(start, end)``: rows returned there go to Spark with
    the plan. ``simple_reader`` is the attribute Spark's runner consults for
    ``Trigger.AvailableNow`` support on such readers.
    """

    def __init__(self, inner: DataSourceStreamReader, schema: pa.Schema, max_rows: int = DRIVER_READ_MAX_ROWS) -> None:
        self.simple_reader = inner
        self.schema = schema
        self.max_rows = max_rows
        self._fetched: tuple[str, str, pa.RecordBatch] | None = None

    # The stream reader API, delegated.

    def initialOffset(self) -> dict:
        return self.simple_reader.initialOffset()

    def getDefaultReadLimit(self):  # noqa: ANN201 - pyspark's ReadLimit
        return self.simple_reader.getDefaultReadLimit()

    def latestOffset(self, start: dict, limit) -> dict:  # noqa: ANN001
        return self.simple_reader.latestOffset(start, limit)

    def reportLatestOffset(self) -> dict | None:
        return self.simple_reader.reportLatestOffset()

    def commit(self, end: dict) -> None:
        self.simple_reader.commit(end)

    def stop(self) -> None:
        self._fetched = None
        self.simple_reader.stop()

    # Planning, with the rows of a small range read in the driver.

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        parts = list(self.simple_reader.partitions(start, end))
        self._fetched = None
        if not parts:
            return parts
        if self.simple_reader.rows_between(start, end, self.max_rows) > self.max_rows:
            return parts
        rows = self._read_all(parts)
        if rows.num_rows == 0:
            return parts  # nothing to hand over (e.g. only transaction markers): let tasks confirm it
        self._fetched = (_key(start), _key(end), rows)
        return [PartitionBundle(tuple(parts))]

    def getCache(self, start: dict, end: dict) -> Iterator[pa.RecordBatch] | None:
        fetched = self._fetched
        if fetched is None or fetched[0] != _key(start) or fetched[1] != _key(end):
            return None
        self._fetched = None  # Spark keeps the rows from here on
        return iter([fetched[2]])

    def _read_all(self, parts: list[InputPartition]) -> pa.RecordBatch:
        batches = [batch for part in parts for batch in self.simple_reader.read(part)]
        # One record batch: Spark handles a block of many batches read in the driver markedly slower.
        table = pa.Table.from_batches(batches, schema=self.schema) if batches else self.schema.empty_table()
        combined = table.combine_chunks().to_batches()
        return combined[0] if combined else pa.RecordBatch.from_pylist([], schema=self.schema)

    # Executor side: a task reads what the planner did not.

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, PartitionBundle):
            return (batch for part in partition.parts for batch in self.simple_reader.read(part))
        return self.simple_reader.read(partition)


def with_driver_reads(inner: DataSourceStreamReader, schema: pa.Schema,
                      max_rows: int = DRIVER_READ_MAX_ROWS) -> DataSourceStreamReader:
    """``inner`` with small micro-batches read on the planner when this PySpark allows it."""
    quiet_when_spark_hangs_up()
    if not AVAILABLE or max_rows <= 0:
        return inner
    return DriverReadingReader(inner, schema, max_rows)


def quiet_when_spark_hangs_up() -> None:
    """In this process (a source's planner): exit without a traceback when Spark closes the socket.

    Spark stops a stream source by closing the planner process's socket, then
    killing it. In between, the process wakes with ``EOFError`` and dies on
    ``BrokenPipeError`` replying, and Python prints a traceback that nobody
    reads but the operator (seen in the demo's output on a loaded machine).
    Other exceptions are reported as before.
    """
    previous = sys.excepthook
    if getattr(previous, "replication_quiet", False):
        return

    def hook(kind, value, tb):  # noqa: ANN001
        if issubclass(kind, (EOFError, BrokenPipeError, ConnectionResetError)):
            return
        previous(kind, value, tb)

    hook.replication_quiet = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def driver_read_rows_option(opts: Mapping[str, str], fmt: str) -> int:
    """Option ``driverReadRows`` of source ``fmt`` (keys lower-cased): rows, 0 to read every batch in Spark tasks."""
    raw = opts.get("driverreadrows")
    if raw in (None, ""):
        return DRIVER_READ_MAX_ROWS
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(
            f"{fmt}: driverReadRows must be an integer >= 0 (0 reads every micro-batch in Spark tasks), "
            f"got {raw!r}; e.g. .option('driverReadRows', {DRIVER_READ_MAX_ROWS}), or leave it out"
        )
    return value


def _key(offset: dict) -> str:
    import json

    return json.dumps(offset, sort_keys=True)
