"""Streaming inputs of the ingest query, mapped onto the candidate columns of :mod:`replication.ingest`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from replication import routing
from replication.config import DEFAULT_BATCH_ROWS, InstanceConfig
from replication.ingest import CANDIDATE_SCHEMA
from replication.storage import StorageLayout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def publish_stream(spark: "SparkSession", cfg: InstanceConfig) -> "DataFrame":
    """Kafka publishes of every ``kafka`` transport, as candidate rows (DESIGN §7 wire format)."""
    from pyspark.sql import functions as F

    from replication import kafka_source

    kafka_source.register(spark)
    frames = []
    for transport in cfg.kafka_transports:
        reader = (
            spark.readStream.format(kafka_source.FORMAT)
            .option("bootstrap.servers", ",".join(transport.bootstrap_servers))
            .option("topics", ",".join(transport.topics))
            .option("maxOffsetsPerTrigger", str(transport.max_offsets_per_trigger))
        )
        raw = reader.load()
        frames.append(
            raw.select(
                F.lit("kafka").alias("source"),
                F.col("kafka_topic"),
                F.col("kafka_partition").cast("int").alias("kafka_partition"),
                F.col("kafka_offset"),
                F.col("h_client").alias("publisher"),
                F.col("h_seq").alias("publisher_seq"),
                F.coalesce(F.col("h_topic"), F.col("kafka_topic")).alias("topic"),
                F.coalesce(F.col("h_type"), F.lit(transport.message_type)).alias("message_type"),
                F.coalesce(F.col("h_command"), F.lit("publish")).alias("command"),
                F.lit(None).cast("string").alias("sow_key"),
                F.col("value").alias("data"),
                F.lit(None).cast("string").alias("origin"),
                F.lit(None).cast("string").alias("received_from"),
                F.lit(None).cast("string").alias("received_from_group"),
                F.lit(None).cast("array<string>").alias("path"),
                F.col("kafka_timestamp").alias("publish_time"),
                F.lit(None).cast("long").alias("upstream_seq"),
                F.lit(None).cast("long").alias("inbox_version"),
            )
        )
    return _union(frames)


def inbox_stream(spark: "SparkSession", cfg: InstanceConfig, layout: StorageLayout) -> "DataFrame":
    """The versions upstream instances committed to this instance's inbox, one candidate row each.

    Spark tracks the inbox position exactly once (Delta versions in the ingest
    query's checkpoint); the rows of those versions are fetched by the ingest
    writer with :class:`InboxRows`, so message bodies do not travel through the JVM.
    """
    from pyspark.sql import functions as F

    from replication import inbox_source

    inbox_source.register(spark)
    raw = (
        spark.readStream.format(inbox_source.FORMAT).option("path", str(layout.inbox))
        .option("versionsOnly", "true")
        .option("maxRowsPerTrigger", str(DEFAULT_BATCH_ROWS)).load()
    )
    return raw.select(
        *[F.lit(INBOX_MARK if name == "source" else None).cast(_spark_type(name)).alias(name)
          for name in CANDIDATE_SCHEMA.names if name != "inbox_version"],
        F.col("inbox_version"),
    )


#: ``source`` of a candidate row that stands for one inbox version.
INBOX_MARK = "inbox-version"


class InboxRows:
    """The ingest writer's ``expand``: inbox version rows replaced by the rows those versions hold.

    The rows are read with :func:`replication.inbox_source.read_versions` and
    mapped onto the candidate columns: ``source`` ``inbox:<upstream>``,
    ``received_from``/``received_from_group`` from the upstream, ``path`` the
    upstream's path plus this instance. They follow the batch's other rows,
    per upstream in the upstream's order.
    """

    def __init__(self, cfg: InstanceConfig, inbox: str) -> None:
        self.instance = cfg.name
        self.inbox = inbox

    def __call__(self, batch: pa.Table) -> pa.Table:
        marks = pc.equal(batch["source"], INBOX_MARK)
        if not pc.any(marks).as_py():
            return batch
        from replication.inbox_source import read_versions

        versions = pc.filter(batch["inbox_version"], marks)
        first, last = pc.min(versions).as_py(), pc.max(versions).as_py()
        rows = read_versions(self.inbox, first, last)
        rows = rows.filter(pc.is_in(rows["inbox_version"], versions.combine_chunks()))
        others = batch.filter(pc.invert(pc.fill_null(marks, False)))
        return pa.concat_tables([others.select(CANDIDATE_SCHEMA.names).cast(CANDIDATE_SCHEMA),
                                 self.candidates(rows)])

    def candidates(self, rows: pa.Table) -> pa.Table:
        """Inbox rows (``inbox_source.STREAM_SCHEMA``) as candidate rows."""
        n = rows.num_rows
        link = rows["link"]
        columns = {
            "source": pc.binary_join_element_wise(pa.scalar("inbox:"), link, ""),
            "kafka_topic": pa.nulls(n, pa.string()),
            "kafka_partition": pa.nulls(n, pa.int32()),
            "kafka_offset": pa.nulls(n, pa.int64()),
            "publisher_seq": pc.cast(rows["publisher_seq"], pa.string()),
            "received_from": link,
            "received_from_group": rows["link_group"],
            "path": routing.received_paths(rows["path"], self.instance),
        }
        return pa.table(
            {name: columns[name] if name in columns else rows[name] for name in CANDIDATE_SCHEMA.names},
            schema=CANDIDATE_SCHEMA,
        )


def _spark_type(name: str) -> str:
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(CANDIDATE_SCHEMA.field(name).type).simpleString()


def ingest_stream(spark: "SparkSession", cfg: InstanceConfig, layout: StorageLayout) -> "DataFrame | None":
    """Everything the ingest query reads: Kafka publishes and, with an incoming replication transport, the inbox."""
    frames = []
    if cfg.kafka_transports:
        frames.append(publish_stream(spark, cfg))
    if cfg.replication_transport is not None:
        frames.append(inbox_stream(spark, cfg, layout))
    return _union(frames)


def _union(frames: list["DataFrame"]) -> "DataFrame | None":
    if not frames:
        return None
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    assert out.columns == CANDIDATE_SCHEMA.names, out.columns
    return out
