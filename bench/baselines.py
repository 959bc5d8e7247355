"""The ingest benchmark's baselines: what a user would build instead of an instance, measured on the same topic.

(a) the instance's own Kafka source writing the same rows to Delta (``foreachBatch``: ``toArrow`` +
``write_deltalake``), no dedupe, seq or acks; (b) one kafka-python consumer writing to Delta with
deltalake, no Spark; (c) the pipeline a Databricks user writes by hand: Spark's Kafka source
(``readStream.format("kafka")``, with headers) into ``writeStream.format("delta")`` (delta-spark),
no dedupe.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    data_batches,
    delta_options,
    kafka_client_kwargs,
    kafka_security,
    offsets_moved,
    poll_for,
    spark_table_location,
    table_location,
    wait_until,
)
from timing import tree_cpu_seconds


@dataclass
class Run:
    """One measured pass over the same messages."""

    label: str
    rows: int
    seconds: float
    batches: int
    parts: dict[str, float] = field(default_factory=dict)
    batch_seconds: float | None = None
    """Spark's ``triggerExecution`` summed over the batches with rows: the query's start-up left out."""
    cpu_seconds: float | None = None
    """CPU time of every process of the benchmark (driver, JVM, Python workers, broker) during the run."""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds



# -- baselines -----------------------------------------------------------------------


def spark_baseline(spark, cfg, rows: int, workdir: Path) -> Run:
    """(a): the instance's Kafka source and rows, ``toArrow`` + ``write_deltalake``, nothing else."""
    from deltalake import write_deltalake

    from replication.ingest.inputs import publish_stream, spark_candidates

    target = table_location(workdir, f"{cfg.name}-baseline-a")
    options = delta_options(target)
    parts = {"toArrow": 0.0, "write_deltalake": 0.0}
    written = [0]
    done = threading.Event()

    def sink(df, _batch_id: int) -> None:
        t0 = time.perf_counter()
        table = spark_candidates(df.toArrow())
        t1 = time.perf_counter()
        write_deltalake(target, table, mode="append", storage_options=options)
        parts["toArrow"] += t1 - t0
        parts["write_deltalake"] += time.perf_counter() - t1
        written[0] += table.num_rows
        if written[0] >= rows:
            done.set()

    query = (
        publish_stream(spark, cfg).writeStream.foreachBatch(sink)
        .option("checkpointLocation", spark_table_location(workdir, f"{cfg.name}-baseline-a-checkpoint"))
        .trigger(processingTime="0 seconds").start()
    )
    started, cpu = time.perf_counter(), tree_cpu_seconds()
    try:
        wait_until(lambda: done.is_set() or query.exception(), timeout=120 + rows / 2000, interval=0.05,
                   what="baseline (a) to write every row")
        seconds, cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu
        if not done.is_set():
            raise SystemExit(f"baseline (a) failed: {query.exception()}")
        batch_seconds = spark_batch_seconds(query, rows)  # also lets the last batch end before stop()
        batches = len(data_batches(query.recentProgress))
    finally:
        query.stop()
    parts["Spark (plan, offsets, checkpoint)"] = seconds - sum(parts.values())
    return Run("(a) Spark source -> toArrow -> Delta", rows, seconds, batches, parts, batch_seconds, cpu)


def plain_baseline(bootstrap: str, topic: str, rows: int, partitions: int, batch_rows: int, workdir: Path) -> Run:
    """(b): one kafka-python consumer decoding DESIGN §7 headers, ``write_deltalake`` every ``batch_rows``."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=5,
        max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024, max_poll_records=20_000,
        **kafka_client_kwargs(),
    )
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    target = table_location(workdir, "baseline-b")
    pending: list = []
    parts = {"poll + decode": 0.0, "write_deltalake": 0.0}
    seen = batches = 0
    started, cpu = time.perf_counter(), tree_cpu_seconds()
    while seen < rows:
        t0 = time.perf_counter()
        polled = consumer.poll(timeout_ms=10)
        for records in polled.values():
            pending.extend(records)
            seen += len(records)
        t1 = time.perf_counter()
        parts["poll + decode"] += t1 - t0
        if len(pending) >= batch_rows or (pending and seen >= rows):
            _write_records(target, pending)
            pending = []
            batches += 1
            parts["write_deltalake"] += time.perf_counter() - t1
    seconds, cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu
    consumer.close()
    return Run("(b) kafka-python -> Delta, no Spark", seen, seconds, batches, parts, cpu_seconds=cpu)


def _write_records(target: str, records: list) -> None:
    """kafka-python records -> the publish columns (headers decoded) -> one Delta append."""
    import pyarrow as pa
    from deltalake import write_deltalake

    clients, seqs, topics = [], [], []
    for record in records:
        headers = dict(record.headers)
        clients.append(headers.get("amps-client"))
        seqs.append(headers.get("amps-seq"))
        topics.append(headers.get("amps-topic"))
    table = pa.table({
        "kafka_partition": pa.array([r.partition for r in records], pa.int32()),
        "kafka_offset": pa.array([r.offset for r in records], pa.int64()),
        "publisher": pa.array(clients, pa.binary()).cast(pa.string()),
        "publisher_seq": pa.array(seqs, pa.binary()).cast(pa.string()),
        "topic": pa.array(topics, pa.binary()).cast(pa.string()),
        "data": pa.array([r.value for r in records], pa.binary()),
        "publish_time": pa.array([r.timestamp * 1000 for r in records], pa.timestamp("us", tz="UTC")),
    })
    write_deltalake(target, table, mode="append", storage_options=delta_options(target))


def spark_batch_seconds(query, rows: int) -> float | None:
    """Sum of ``triggerExecution`` of the batches that brought ``rows`` rows (None: progress not kept)."""

    def batches() -> list[dict] | None:
        with_rows = data_batches(query.recentProgress)
        return with_rows if sum(offsets_moved(p) for p in with_rows) >= rows else None

    found = poll_for(batches, timeout=10, interval=0.05)
    return sum(p["durationMs"]["triggerExecution"] for p in found) / 1000 if found else None


def spark_kafka_delta_baseline(spark, bootstrap: str, topic: str, rows: int, workdir: Path,
                               max_offsets: int) -> Run:
    """(c): ``readStream.format("kafka")`` with headers -> ``writeStream.format("delta")``, with the instance's
    trigger and batch cap."""
    target = spark_table_location(workdir, "baseline-c")
    checkpoint = spark_table_location(workdir, "baseline-c-checkpoint")
    source = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .options(**kafka_security().spark_kafka())
              .option("subscribe", topic).option("startingOffsets", "earliest").option("includeHeaders", "true")
              .option("maxOffsetsPerTrigger", max_offsets).load()
              .selectExpr("topic AS kafka_topic", "partition AS kafka_partition", "offset AS kafka_offset",
                          "timestamp AS kafka_timestamp", "key", "value", "headers"))
    query = (source.writeStream.format("delta").option("checkpointLocation", checkpoint)
             .trigger(processingTime="0 seconds").start(target))
    started, cpu = time.perf_counter(), tree_cpu_seconds()
    try:
        wait_until(lambda: sum(p["numInputRows"] for p in query.recentProgress) >= rows or query.exception(),
                   timeout=120 + rows / 2000, interval=0.05, what="baseline (c) to write every row")
        seconds, cpu = time.perf_counter() - started, tree_cpu_seconds() - cpu
        if query.exception():
            raise SystemExit(f"baseline (c) failed: {query.exception()}")
        batches = len(data_batches(query.recentProgress))
        spent = spark_batch_seconds(query, rows)
    finally:
        query.stop()
    return Run("(c) Spark Kafka source -> Delta sink (delta-spark)", rows, seconds, batches, {}, spent, cpu)
