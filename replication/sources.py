"""Streaming inputs of the ingest query, mapped onto the candidate columns of :mod:`replication.ingest`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from replication.config import InstanceConfig
from replication.ingest import CANDIDATE_SCHEMA

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
        )
        if transport.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(transport.max_offsets_per_trigger))
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
    if not frames:
        return None
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    assert out.columns == CANDIDATE_SCHEMA.names, out.columns
    return out
