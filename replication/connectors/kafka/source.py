"""Kafka as a Spark streaming source: a PySpark Python data source over kafka-python.

Spark's own Kafka connector comes from Maven, which the project cannot reach, so
this module reads Kafka with kafka-python inside Spark's Python workers.

Options (:class:`KafkaSourceOptions`): ``bootstrap.servers``, ``topics`` (comma
list), ``maxOffsetsPerTrigger``, ``minPartitions``.

Offsets are explicit per-partition positions kept in Spark's checkpoint, as JSON
``{"topic": {"partition": next_offset}}``; no consumer group is used and nothing
is committed to Kafka. A new query starts at the *earliest* retained offset of
every partition, so it sees everything the topics hold. Topics that do not exist
yet contribute no partitions; partitions that appear later (a topic created, or
partitions added) are read from offset 0 (in practice: the earliest retained).
Records are read uncommitted: a transaction's records are delivered whether it
commits or aborts (the project's publishers do not use transactions).

Example:
    >>> from replication.connectors.kafka.source import register                    # doctest: +SKIP
    >>> register(spark)
    >>> df = (spark.readStream.format("replication-kafka")
    ...       .option("bootstrap.servers", "127.0.0.1:9092")
    ...       .option("topics", "amps-1.publish")
    ...       .option("maxOffsetsPerTrigger", 100000)
    ...       .load())

Output columns (:data:`SCHEMA`): ``kafka_topic``, ``kafka_partition``,
``kafka_offset``, ``kafka_timestamp`` (record timestamp, UTC), ``key``, ``value``,
``headers`` (``array<struct<key string, value binary>>``: Kafka allows repeated
header keys and their order matters, a map would lose both), and the publish
headers of DESIGN §7 decoded to strings for the ingest code: ``h_client``,
``h_seq``, ``h_topic``, ``h_command``, ``h_type``, ``h_sow_key``,
``h_sow_keys``, ``h_filter`` (null when absent; when a key
repeats, the last value wins, as Kafka's ``lastHeader``; bytes that are not
UTF-8 are decoded with U+FFFD replacements, the raw value stays in ``headers``).
Within a micro-batch, the rows of one Kafka partition come in offset order.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
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

from replication.connectors.kafka.records import RecordColumns
from replication.connectors.spark.options import int_option
from replication.connectors.spark.prefetch import (
    PREFETCH_MAX_ROWS,
    prefetch_rows_option,
    prefetching,
)
from replication.errors import ConfigError, ReplicationError

if TYPE_CHECKING:
    import pyarrow as pa
    from kafka import KafkaConsumer, TopicPartition
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FORMAT = "replication-kafka"

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
#: How often the driver refreshes topic metadata to notice new topics/partitions.
METADATA_REFRESH_S = 1.0


class KafkaSourceError(ReplicationError):
    """Kafka could not be read as asked (stalled partition, lost data); retrying may help."""

    transient = True


# -- options -------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaSourceOptions:
    """The source's options, parsed once from Spark's ``.option(...)`` strings.

    Attributes:
        bootstrap_servers: ``host:port[,host:port...]`` (option ``bootstrap.servers``,
            or ``kafka.bootstrap.servers`` as in Spark's Kafka connector).
        topics: topics to read (option ``topics``, comma separated, or ``subscribe``).
        max_offsets_per_trigger: upper bound of offsets per micro-batch over all
            partitions (option ``maxOffsetsPerTrigger``); ``None``: no bound.
            Offsets, not records: transaction markers occupy offsets too.
        min_partitions: split the work of a micro-batch into at least this many
            Spark tasks (option ``minPartitions``, as in Spark's Kafka connector):
            decoding is CPU-bound in Python, so a busy Kafka partition can use
            several cores. Sub-ranges of one Kafka partition are planned in
            offset order. ``None``: one task per Kafka partition.
        prefetch_rows: a micro-batch of at most this many offsets is read by the
            source's planner process instead of Spark tasks (option
            ``prefetchRows``, default :data:`replication.connectors.spark.prefetch.PREFETCH_MAX_ROWS`;
            0: always tasks). See :mod:`replication.connectors.spark.prefetch`.
    """

    bootstrap_servers: str
    topics: tuple[str, ...]
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    prefetch_rows: int = PREFETCH_MAX_ROWS

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaSourceOptions:
        # Spark passes options in a case-insensitive dict; normalise for plain dicts too.
        opts = {k.lower(): v for k, v in options.items()}
        servers = opts.get("bootstrap.servers") or opts.get("kafka.bootstrap.servers")
        if not servers:
            raise ConfigError(
                f"{FORMAT}: option 'bootstrap.servers' is required, e.g. "
                f".option('bootstrap.servers', '127.0.0.1:9092')"
            )
        topics = tuple(t.strip() for t in (opts.get("topics") or opts.get("subscribe") or "").split(",") if t.strip())
        if not topics:
            raise ConfigError(
                f"{FORMAT}: option 'topics' is required (comma-separated Kafka topics), e.g. "
                f".option('topics', 'amps-1.publish')"
            )
        return cls(
            servers.strip(),
            topics,
            int_option(opts, "maxOffsetsPerTrigger", FORMAT, minimum=1, example=100000),
            int_option(opts, "minPartitions", FORMAT, minimum=1, example=4),
            prefetch_rows_option(opts, FORMAT),
        )


# -- offsets -------------------------------------------------------------------

#: In memory, offsets are ``{(topic, partition): next_offset}``.
Positions = dict[tuple[str, int], int]


def decode_offset(offset: Mapping[str, Mapping[str, int]] | None) -> Positions:
    """Spark's JSON offset ``{"topic": {"0": 5}}`` to ``{("topic", 0): 5}``."""
    return {(t, int(p)): int(o) for t, parts in (offset or {}).items() for p, o in parts.items()}


def encode_offset(positions: Positions) -> dict[str, dict[str, int]]:
    """``{("topic", 0): 5}`` to the JSON-friendly ``{"topic": {"0": 5}}`` (sorted, stable)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(positions.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def limit_positions(start: Positions, latest: Positions, max_offsets: int) -> Positions:
    """End positions that advance at most ``max_offsets`` in total beyond ``start``.

    The budget is shared in proportion to each partition's backlog (largest
    remainders get the leftover), so a busy partition cannot starve the others.
    """
    backlog = {tp: latest[tp] - start.get(tp, 0) for tp in latest}
    backlog = {tp: n for tp, n in backlog.items() if n > 0}
    total = sum(backlog.values())
    end = {tp: max(latest[tp], start.get(tp, 0)) for tp in latest}
    if total <= max_offsets:
        return end
    shares = {tp: max_offsets * n // total for tp, n in backlog.items()}
    leftover = max_offsets - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda tp: (-(max_offsets * backlog[tp] % total), tp))
    for tp in by_remainder[:leftover]:
        shares[tp] += 1
    for tp, share in shares.items():
        end[tp] = start.get(tp, 0) + share
    return end


def split_ranges(ranges: list[KafkaInputPartition], min_count: int) -> list[KafkaInputPartition]:
    """Cut offset ranges into about ``min_count`` pieces, in proportion to their sizes.

    Pieces of one Kafka partition stay adjacent and in offset order, so rows
    collected in partition order keep Kafka's order.
    """
    if len(ranges) >= min_count:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    out: list[KafkaInputPartition] = []
    for r in ranges:
        size = r.end - r.start
        pieces = max(1, min(size, round(min_count * size / total)))
        bounds = [r.start + size * i // pieces for i in range(pieces + 1)]
        out += [KafkaInputPartition(r.topic, r.partition, a, b) for a, b in zip(bounds, bounds[1:])]
    return out


# -- Spark data source ---------------------------------------------------------


class KafkaSource(DataSource):
    """``spark.readStream.format("replication-kafka")``: Kafka topics as a stream (see module doc)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = KafkaSourceOptions.parse(self.options)
        return prefetching(KafkaStreamReader(options), _spark_arrow_schema(), options.prefetch_rows)


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """Offsets ``[start, end)`` of one Kafka partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over Kafka offsets (driver side) and reads them (executor side).

    Lifecycle, as Spark drives it: ``initialOffset`` once for a new query;
    ``prepareForTriggerAvailableNow`` once with ``Trigger.AvailableNow``; then per
    micro-batch ``latestOffset(start, limit)``, ``partitions(start, end)`` and, in
    the executors, ``read(partition)``; ``commit(end)`` after each batch;
    ``stop()`` at the end (closes the driver's consumer).
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._probe: _OffsetProbe | None = None  # driver only, created on first use
        self._target: Positions | None = None  # availableNow: never read beyond this
        self._latest: Positions | None = None

    # driver side

    def initialOffset(self) -> dict:
        return encode_offset(self._offsets().earliest())

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return super().getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._offsets().latest(refresh=True)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = decode_offset(start)
        latest = self._offsets().latest()
        if self._target is not None:
            # Partitions born after prepareForTriggerAvailableNow are not part of this run.
            latest = {tp: min(o, self._target[tp]) for tp, o in latest.items() if tp in self._target}
        for tp, offset in latest.items():
            if offset < begin.get(tp, 0):
                # The log is shorter than our checkpoint: topic re-created or a
                # broker lost data. Do not go backwards; wait until it is past us.
                log.warning("%s[%d]: latest offset %d is below the checkpointed %d; holding",
                            tp[0], tp[1], offset, begin[tp])
        self._latest = {tp: max(o, begin.get(tp, 0)) for tp, o in latest.items()}
        end = dict(begin)  # keep partitions that vanished from metadata
        if isinstance(limit, ReadMaxRows):
            end.update(limit_positions(begin, self._latest, limit.max_rows))
        else:
            end.update(self._latest)
        return encode_offset(end)

    def reportLatestOffset(self) -> dict | None:
        return encode_offset(self._latest) if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> list[KafkaInputPartition]:
        begin = decode_offset(start)
        ranges = [
            KafkaInputPartition(topic, partition, begin.get((topic, partition), 0), stop)
            for (topic, partition), stop in sorted(decode_offset(end).items())
            if stop > begin.get((topic, partition), 0)
        ]
        return split_ranges(ranges, self.options.min_partitions or 0)

    def rows_between(self, start: dict, end: dict, at_most: int) -> int:
        begin = decode_offset(start)
        return sum(max(0, stop - begin.get(tp, 0)) for tp, stop in decode_offset(end).items())

    def commit(self, end: dict) -> None:
        pass  # offsets live in Spark's checkpoint; nothing to tell Kafka

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def _offsets(self) -> _OffsetProbe:
        if self._probe is None:
            self._probe = _OffsetProbe(self.options)
        return self._probe

    # executor side

    def read(self, partition: KafkaInputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_partition(self.options, partition)


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("replication-kafka")`` available in this session."""
    spark.dataSource.register(KafkaSource)


# -- driver: where the partitions start and end --------------------------------


class _OffsetProbe:
    """The driver's view of the topics: their partitions, earliest and latest offsets.

    Keeps one consumer (no group) for the life of the stream reader.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        from kafka import KafkaConsumer

        self.options = options
        self._consumer: KafkaConsumer = KafkaConsumer(
            bootstrap_servers=options.bootstrap_servers.split(","),
            group_id=None,
            enable_auto_commit=False,
            allow_auto_create_topics=False,
            # Read uncommitted, as the range reads: the latest offset is the high watermark.
            isolation_level="read_uncommitted",
        )
        self._refreshed_at = float("-inf")
        self._existing: set[str] = set()

    def close(self) -> None:
        self._consumer.close()

    def topic_partitions(self, refresh: bool = False) -> list[TopicPartition]:
        """Partitions of the configured topics that exist now (missing topics: none)."""
        from kafka import TopicPartition

        now = time.monotonic()
        if refresh or now - self._refreshed_at >= METADATA_REFRESH_S:
            # A full metadata refresh sees new topics and partitions. Asking
            # partitions_for_topic() about a missing topic would refresh again,
            # and kafka-python spaces refreshes 100 ms apart: so ask only about
            # the topics this refresh found.
            self._existing = self._consumer.topics()
            self._refreshed_at = now
        return [
            TopicPartition(topic, p)
            for topic in self.options.topics
            if topic in self._existing
            for p in sorted(self._consumer.partitions_for_topic(topic) or ())
        ]

    def earliest(self) -> Positions:
        tps = self.topic_partitions(refresh=True)
        if not tps:
            return {}
        return {(tp.topic, tp.partition): o for tp, o in self._consumer.beginning_offsets(tps).items()}

    def latest(self, refresh: bool = False) -> Positions:
        """The high watermark (offset of the next record) of every partition: one ListOffsets request."""
        tps = self.topic_partitions(refresh)
        if not tps:
            return {}
        return {(tp.topic, tp.partition): o for tp, o in self._consumer.end_offsets(tps).items()}


# -- executor: reading one partition -------------------------------------------


def _range_consumer(options: KafkaSourceOptions) -> KafkaConsumer:
    """A consumer (no group) for reading offset ranges."""
    from kafka import KafkaConsumer

    return KafkaConsumer(
        bootstrap_servers=options.bootstrap_servers.split(","),
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
    options: KafkaSourceOptions, part: KafkaInputPartition, *, fast: bool = True
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

    For micro-batches read in the driver (``ingest.inputs.ReadHere``): a consumer per
    partition per batch costs a connection and several metadata round trips,
    and in a driver process busy with other Python threads each round trip
    also waits for the interpreter lock. Each read starts from a clean slate:
    records kafka-python fetched for an earlier read are dropped and every
    partition is sought to its start, so the rows are exactly those of
    :func:`read_partition`. When the installed kafka-python does not expose
    what that needs, each read uses a new consumer instead.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
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

    def __init__(self, options: KafkaSourceOptions, ranges: dict, targets: dict, *,
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
    if base is None or not callable(getattr(base, "_unpack_records", None)) or not hasattr(base, "drain"):
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
