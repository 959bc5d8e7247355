"""Kafka as a Spark streaming source: a PySpark Python data source over kafka-python.

The ingest query reads through Spark's own ``format("kafka")``, faster and
lighter once warm (:mod:`replication.ingest.spark_kafka`). This source's
planning and range reads (:class:`~replication.connectors.kafka.ranges.RangeReader`)
read the ingest's small batches in the driver; the source itself serves Spark
users who want the DESIGN §7 headers as columns without the JVM client.

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

The driver's offsets are worked out in :mod:`replication.connectors.kafka.offsets`;
the reads of offset ranges, and :data:`SCHEMA`, are in :mod:`replication.connectors.kafka.ranges`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from replication.connectors.kafka.offsets import (
    KafkaInputPartition,
    Positions,
    _OffsetProbe,
    decode_offset,
    encode_offset,
    limit_positions,
    split_ranges,
)
from replication.connectors.kafka.ranges import SCHEMA, _spark_arrow_schema, read_partition
from replication.connectors.kafka.security import PLAINTEXT, KafkaSecurity
from replication.connectors.spark.driver_read import (
    DRIVER_READ_MAX_ROWS,
    driver_read_rows_option,
    with_driver_reads,
)
from replication.connectors.spark.options import int_option
from replication.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

FORMAT = "replication-kafka"


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
        driver_read_rows: a micro-batch of at most this many offsets is read by the
            source's planner process instead of Spark tasks (option
            ``driverReadRows``, default :data:`replication.connectors.spark.driver_read.DRIVER_READ_MAX_ROWS`;
            0: always tasks). See :mod:`replication.connectors.spark.driver_read`.
        security: TLS and SASL settings (options ``kafka.security.protocol``, ``kafka.ssl.*``,
            ``kafka.sasl.*``; see :mod:`replication.connectors.kafka.security`).
    """

    bootstrap_servers: str
    topics: tuple[str, ...]
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    driver_read_rows: int = DRIVER_READ_MAX_ROWS
    security: KafkaSecurity = PLAINTEXT

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
            driver_read_rows_option(opts, FORMAT),
            KafkaSecurity.from_options(opts),
        )


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
        return with_driver_reads(KafkaStreamReader(options), _spark_arrow_schema(), options.driver_read_rows)


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

    def read(self, partition: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)


def register(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("replication-kafka")`` available in this session."""
    spark.dataSource.register(KafkaSource)
