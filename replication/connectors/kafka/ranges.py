"""Reading offset ranges of Kafka partitions as Arrow batches, for the source's Spark tasks and the engine's driver."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from replication.connectors.kafka.offsets import KafkaInputPartition, KafkaTopics
from replication.connectors.kafka.records import RecordColumns
from replication.errors import ReplicationError

if TYPE_CHECKING:
    import pyarrow as pa
    from kafka import KafkaConsumer

#: Publish headers (DESIGN §7) exposed as top-level string columns, in column order.
PUBLISH_HEADERS: tuple[tuple[str, str], ...] = (
    ("amps-client", "h_client"),
    ("amps-seq", "h_seq"),
    ("amps-topic", "h_topic"),
    ("amps-command", "h_command"),
    ("amps-type", "h_type"),
    ("amps-sow-key", "h_sow_key"),
    ("amps-sow-keys", "h_sow_keys"),
    ("amps-filter", "h_filter"),
    ("amps-session", "h_session"),
)

HEADER_TYPE = StructType([
    StructField("key", StringType(), False),
    StructField("value", BinaryType(), True),
])

SCHEMA = StructType(
    [
        StructField("kafka_topic", StringType(), False),
        StructField("kafka_partition", IntegerType(), False),
        StructField("kafka_offset", LongType(), False),
        StructField("kafka_timestamp", TimestampType(), True),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("headers", ArrayType(HEADER_TYPE, False), False),
    ]
    + [StructField(column, StringType(), True) for _, column in PUBLISH_HEADERS]
)

#: Rows per Arrow batch handed to Spark; bigger batches amortise per-batch cost.
ARROW_BATCH_ROWS = 20_000
#: Fetch sizes of the executor consumers: large, so one round trip brings many
#: zstd batches (measured in bench/kafka_source.py).
FETCH_MAX_BYTES = 64 * 1024 * 1024
MAX_PARTITION_FETCH_BYTES = 16 * 1024 * 1024
MAX_POLL_RECORDS = 20_000
MAX_POLL_BATCHES = 32
#: Short polls: kafka-python may sleep a whole long poll timeout (DESIGN §9).
POLL_TIMEOUT_MS = 10
FETCH_MAX_WAIT_MS = 5
#: A read() that makes no progress this long fails the task (Spark retries it).
STALL_TIMEOUT_S = 120.0
#: Range consumers give up on an unanswered request (and its connection) after this.
RANGE_REQUEST_TIMEOUT_MS = 10_000


class KafkaSourceError(ReplicationError):
    """Kafka could not be read as asked (stalled partition, lost data); retrying may help."""

    transient = True


# -- reading offset ranges -----------------------------------------------------


def _range_consumer(options: KafkaTopics) -> KafkaConsumer:
    """A consumer (no group) for reading offset ranges."""
    from kafka import KafkaConsumer

    return KafkaConsumer(
        bootstrap_servers=options.bootstrap_servers.split(","),
        **options.security.kafka_python(),
        group_id=None,
        enable_auto_commit=False,
        allow_auto_create_topics=False,
        # Records below the log start were deleted by retention: continue from there.
        auto_offset_reset="earliest",
        # The fast path replaces kafka-python's transaction filtering: read everything.
        isolation_level="read_uncommitted",
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        fetch_max_bytes=FETCH_MAX_BYTES,
        max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
        max_poll_records=MAX_POLL_RECORDS,
        request_timeout_ms=RANGE_REQUEST_TIMEOUT_MS,
    )


def read_partition(
    options: KafkaTopics, part: KafkaInputPartition, *, fast: bool = True
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``part`` (offsets ``[start, end)``) as Arrow batches of :data:`SCHEMA`.

    Stops when the consumer's position reaches ``end``, not on the offset of a
    record: transaction markers and compacted-away records occupy offsets but are
    never returned. ``fast`` decodes fetched bytes straight into columns when the
    installed kafka-python allows it (see :func:`_decode_into`).
    """
    from kafka import TopicPartition

    schema = _spark_arrow_schema()
    columns = RecordColumns(part.topic, part.partition, part.end, schema, [key for key, _ in PUBLISH_HEADERS])
    tp = TopicPartition(part.topic, part.partition)
    poll = _RangePoll(options, {tp: (part.start, part.end)}, {tp: columns}, fast=fast)
    try:
        for _ in poll.run(STALL_TIMEOUT_S):
            if len(columns) >= ARROW_BATCH_ROWS:
                yield columns.flush()
        if len(columns):
            yield columns.flush()
    finally:
        poll.consumer.close()


class RangeReader:
    """Reads the ranges of a micro-batch, all partitions at once, with one consumer kept between reads.

    For micro-batches read in the driver (``ingest.inputs.DriverRead``): a consumer per
    partition per batch costs a connection and several metadata round trips,
    and in a driver process busy with other Python threads each round trip
    also waits for the interpreter lock. Each read starts from a clean slate:
    records kafka-python fetched for an earlier read are dropped and every
    partition is sought to its start, so the rows are exactly those of
    :func:`read_partition`. When the installed kafka-python does not expose
    what that needs, each read uses a new consumer instead.
    """

    def __init__(self, options: KafkaTopics) -> None:
        self.options = options
        self._consumer: KafkaConsumer | None = None
        self._targets: dict = {}

    def read(self, parts: Sequence[KafkaInputPartition], *,
             stall_timeout: float = STALL_TIMEOUT_S) -> list[pa.RecordBatch]:
        """The records of ``parts`` (offsets ``[start, end)`` each), one Arrow batch per partition with rows.

        Raises :class:`KafkaSourceError` when no records come for ``stall_timeout`` seconds.
        """
        from kafka import TopicPartition

        ranges: dict = {}
        for part in parts:  # sub-ranges of one partition (minPartitions) are contiguous: merge them
            tp = TopicPartition(part.topic, part.partition)
            start, end = ranges.get(tp, (part.start, part.end))
            ranges[tp] = (min(start, part.start), max(end, part.end))
        if not ranges:
            return []
        schema = _spark_arrow_schema()
        headers = [key for key, _ in PUBLISH_HEADERS]
        self._targets = {tp: RecordColumns(tp.topic, tp.partition, end, schema, headers)
                         for tp, (_start, end) in ranges.items()}
        if self._consumer is None:
            self._consumer = _range_consumer(self.options)
        poll = _RangePoll(self.options, ranges, self._targets, consumer=self._consumer)
        try:
            for _ in poll.run(stall_timeout):
                pass
        except BaseException:
            self.close()
            raise
        out = [columns.flush() for columns in self._targets.values() if len(columns)]
        self._targets = {}
        if not _discard_fetched(self._consumer):
            self.close()
        return out

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()


class _RangePoll:
    """Polls partitions from their starts until every position reaches its end.

    ``ranges``: TopicPartition -> (start, end); ``targets``: TopicPartition ->
    the :class:`RecordColumns` its records go to. Stops on positions, not record
    offsets: transaction markers and compacted-away records occupy offsets but
    are never returned. ``consumer``: the one to read with (``RangeReader``'s),
    else a new one.
    """

    def __init__(self, options: KafkaTopics, ranges: dict, targets: dict, *,
                 consumer: KafkaConsumer | None = None, fast: bool = True) -> None:
        self.options, self.ranges, self.targets = options, ranges, targets
        self.consumer = consumer if consumer is not None else _range_consumer(options)
        self.fast = fast and _decode_into(self.consumer, lambda tp: self.targets[tp])

    def run(self, stall_timeout: float = STALL_TIMEOUT_S) -> Iterator[None]:
        """Yield after each poll that brought records; :class:`KafkaSourceError` after ``stall_timeout`` without."""
        consumer = self.consumer
        reached = {tp: start for tp, (start, _end) in self.ranges.items()}
        consumer.assign(list(reached))
        for tp, offset in reached.items():
            consumer.seek(tp, offset)
        stalled_since = time.monotonic()
        while True:
            behind = []
            for tp, (_start, end) in self.ranges.items():
                # Bounded: a position being reset waits for a ListOffsets answer that may never come.
                position = consumer.position(tp, timeout_ms=RANGE_REQUEST_TIMEOUT_MS)
                if position is None:  # still unresolved: counts as no progress
                    behind.append(tp)
                    continue
                if position < reached[tp]:
                    # auto_offset_reset moved it back: re-reading from there would repeat rows.
                    raise KafkaSourceError(
                        f"{tp.topic}[{tp.partition}]: the broker says offset {reached[tp]} is out of range "
                        f"(the consumer went back to {position}); were records lost or the topic recreated?"
                    )
                reached[tp] = position
                if position < end:
                    behind.append(tp)
            if not behind:
                return
            # On the fast path poll() returns one mark per record *batch*; a few batches
            # per poll bound the rows held in Python lists between two Arrow flushes.
            records = consumer.poll(timeout_ms=POLL_TIMEOUT_MS, max_records=MAX_POLL_BATCHES if self.fast else None)
            if not records:
                if time.monotonic() - stalled_since > stall_timeout:
                    tp = behind[0]
                    raise KafkaSourceError(
                        f"{tp.topic}[{tp.partition}]: no records for {stall_timeout:.0f}s at offset "
                        f"{reached[tp]}, expected data up to offset {self.ranges[tp][1]}; is the broker up? "
                        f"({_fetch_state(consumer, tp)})"
                    )
                continue
            stalled_since = time.monotonic()
            if not self.fast:
                for tp, batch in records.items():
                    self.targets[tp].add_records(batch)
            yield


def _fetch_state(consumer: KafkaConsumer, tp: Any) -> str:
    """What a consumer knows of ``tp``'s fetching, for a stall report (kafka-python internals, best effort)."""
    facts = [f"high watermark {consumer.highwater(tp)}"]
    fetcher = getattr(consumer, "_fetcher", None)
    pending = getattr(fetcher, "_nodes_with_pending_fetch_requests", None)
    if pending is not None:
        facts.append(f"fetch requests in flight to nodes {sorted(pending)}")
    completed = getattr(fetcher, "_completed_fetches", None)
    if completed is not None:
        facts.append(f"{len(completed)} fetched responses not yet taken")
    state = getattr(getattr(consumer, "_subscription", None), "assignment", {}).get(tp)
    for flag in ("paused", "awaiting_reset", "awaiting_validation"):
        if getattr(state, flag, False):
            facts.append(flag.replace("_", " "))
    return ", ".join(facts)


def _discard_fetched(consumer: KafkaConsumer | None) -> bool:
    """Drop what ``consumer`` fetched but did not hand out (kafka-python internals); False if it cannot."""
    fetcher = getattr(consumer, "_fetcher", None)
    names = ("_next_partition_records", "_completed_fetches", "_paused_partition_records", "_paused_completed_fetches")
    if fetcher is None or not all(hasattr(fetcher, name) for name in names):
        return False
    current = fetcher._next_partition_records
    if current is not None:
        current.drain()
    fetcher._next_partition_records = None
    fetcher._completed_fetches.clear()
    for parked in fetcher._paused_partition_records.values():
        parked.drain()
    fetcher._paused_partition_records.clear()
    fetcher._paused_completed_fetches.clear()
    return True


@functools.cache
def _spark_arrow_schema() -> pa.Schema:
    # Spark rejects a batch whose schema differs in any detail (field names,
    # nullability): derive it the way Spark does.
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SCHEMA, timezone="UTC")


def _decode_into(consumer: KafkaConsumer, columns: RecordColumns | Callable[[Any], RecordColumns]) -> bool:
    """Make ``consumer`` decode fetched record batches straight into ``columns``.

    kafka-python keeps doing everything else (connections, fetch sessions, leader
    changes, positions); only its per-record decoding, ~3/4 of a read's CPU, is
    replaced. Its ``Fetcher.PartitionRecords`` is not public API, so this checks
    what it relies on and returns False (use the portable path) if the installed
    kafka-python differs.

    How: kafka-python turns each fetch response into a ``PartitionRecords`` whose
    ``_unpack_records`` generator yields records, lazily, as ``poll()`` takes
    them, and advances ``next_fetch_offset`` which becomes the position. Ours
    decodes one batch into ``columns`` per item and yields a :class:`BatchMark`
    instead of the batch's records, so rows reach ``columns`` exactly when
    kafka-python would have returned them (never for a fetch it discards).
    """
    fetcher = getattr(consumer, "_fetcher", None)
    base = getattr(fetcher, "PartitionRecords", None)
    if fetcher is None or base is None or not callable(getattr(base, "_unpack_records", None)) \
            or not hasattr(base, "drain"):
        return False

    class ColumnarPartitionRecords(base):  # type: ignore[misc, valid-type]
        def _unpack_records(self, tp, records, key_deserializer, value_deserializer):
            buffer = getattr(records, "_buffer", None)
            if buffer is None:
                raise KafkaSourceError(
                    "kafka-python's fetched records have no raw buffer; use read_partition(fast=False)"
                )
            target = columns if isinstance(columns, RecordColumns) else columns(tp)
            for mark in target.add_batches(buffer, self.fetch_offset, check_crcs=self.check_crcs):
                if mark.leader_epoch >= 0:
                    self.leader_epoch = mark.leader_epoch
                self.next_fetch_offset = max(self.next_fetch_offset, mark.offset + 1)
                yield mark
            self.drain()

    fetcher.PartitionRecords = ColumnarPartitionRecords
    return True
