"""Streaming inputs of the ingest query, mapped onto the candidate columns of :mod:`replication.ingest`."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
            )
        )
    return _union(frames)


def inbox_stream(spark: "SparkSession", cfg: InstanceConfig, layout: StorageLayout) -> "DataFrame":
    """Rows upstream instances pushed into this instance's inbox, as candidate rows."""
    from pyspark.sql import functions as F

    from replication import inbox_source, routing

    inbox_source.register(spark)
    raw = (
        spark.readStream.format(inbox_source.FORMAT).option("path", str(layout.inbox))
        .option("maxRowsPerTrigger", str(DEFAULT_BATCH_ROWS)).load()
    )
    return raw.select(
        F.concat(F.lit("inbox:"), F.col("link")).alias("source"),
        F.lit(None).cast("string").alias("kafka_topic"),
        F.lit(None).cast("int").alias("kafka_partition"),
        F.lit(None).cast("long").alias("kafka_offset"),
        F.col("publisher"),
        F.col("publisher_seq").cast("string").alias("publisher_seq"),
        F.col("topic"),
        F.col("message_type"),
        F.col("command"),
        F.col("sow_key"),
        F.col("data"),
        F.col("origin"),
        F.col("link").alias("received_from"),
        F.col("link_group").alias("received_from_group"),
        routing.received_path_column("path", cfg.name).alias("path"),
        F.col("publish_time"),
        F.col("upstream_seq"),
    )


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
