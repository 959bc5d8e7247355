"""Benchmark: the "replication-kafka" Spark source versus a plain kafka-python consumer loop.

Publishes N (default 1M) ~200-byte JSON messages with AMPS headers, zstd-compressed,
then reads them all three ways, side by side on the same broker:

1. baseline: one kafka-python consumer, assign + seek + short polls, counting records;
2. the source's ``read()`` alone, called directly (its decoding cost, no Spark);
3. Spark: ``readStream.format("replication-kafka")`` with ``Trigger.AvailableNow`` into
   a ``foreachBatch`` that only counts (the source's cost, nothing downstream).

Prints rows/s of each and their ratio. Runs on a Kafka broker of its own (KRaft) unless
``--bootstrap`` names another::

    .venv/bin/python bench/kafka_source.py                  # 1M messages, 1 partition
    .venv/bin/python bench/kafka_source.py -n 200000 --partitions 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import add_kafka_arguments, kafka_client_kwargs, kafka_security, use_kafka_security  # noqa: E402

from replication.connectors.kafka.broker import EmbeddedBroker, ensure_topics  # noqa: E402


def publish(bootstrap: str, topic: str, count: int, partitions: int) -> float:
    """Publish ``count`` messages; return the publish rate (msg/s)."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, compression_type="zstd", linger_ms=20, batch_size=512 * 1024,
        max_request_size=16 * 1024 * 1024, **kafka_client_kwargs(),
    )
    started = time.perf_counter()
    for seq in range(1, count + 1):
        body = json.dumps({
            "id": seq, "symbol": "ACME", "side": "buy" if seq % 2 else "sell", "qty": seq % 1000,
            "price": 100.0 + seq % 97 / 10, "trader": f"trader-{seq % 50:04d}", "desk": "equities-nyc",
            "note": "benchmark order flow with a realistic body size of about 200B",
        }).encode()
        client = f"pub{seq % partitions}"
        producer.send(
            topic, key=client.encode(), value=body, partition=seq % partitions,
            headers=[("amps-client", client.encode()), ("amps-seq", str(seq).encode()),
                     ("amps-topic", b"/orders")],
        )
    producer.flush()
    producer.close()
    return count / (time.perf_counter() - started)


def plain_consumer(bootstrap: str, topic: str, count: int, partitions: int) -> float:
    """Rows/s of a tight kafka-python loop over all partitions (no Spark)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=5,
        max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024, max_poll_records=20_000,
        **kafka_client_kwargs(),
    )
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    seen = 0
    started = time.perf_counter()
    while seen < count:
        polled = consumer.poll(timeout_ms=10)
        for records in polled.values():
            seen += len(records)
    elapsed = time.perf_counter() - started
    consumer.close()
    return seen / elapsed


def source_read_alone(bootstrap: str, topic: str, count: int, partitions: int) -> float:
    """Rows/s of the source's read() called directly, partition after partition (no Spark)."""
    from replication.connectors.kafka.offsets import KafkaInputPartition
    from replication.connectors.kafka.ranges import read_partition
    from replication.connectors.kafka.source import KafkaSourceOptions

    options = KafkaSourceOptions.parse({"bootstrap.servers": bootstrap, "topics": topic,
                                        **kafka_security().to_options()})
    per_partition = [count // partitions + (1 if p < count % partitions else 0) for p in range(partitions)]
    started = time.perf_counter()
    seen = sum(
        batch.num_rows
        for p, n in enumerate(per_partition)
        for batch in read_partition(options, KafkaInputPartition(topic, p, 0, n))
    )
    elapsed = time.perf_counter() - started
    assert seen == count, (seen, count)
    return seen / elapsed


def spark_source(spark, bootstrap: str, topic: str, count: int, **options: int | None) -> tuple[float, int]:
    """Rows/s of the Spark source into a counting foreachBatch; also the number of micro-batches."""
    from replication.connectors.kafka.source import FORMAT, register

    register(spark)
    reader = (spark.readStream.format(FORMAT).option("bootstrap.servers", bootstrap).option("topics", topic)
              .options(**kafka_security().to_options()))
    for name, value in options.items():
        if value:
            reader = reader.option(name, value)
    counts: list[int] = []
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as checkpoint:
        started = time.perf_counter()
        query = (
            reader.load().writeStream.trigger(availableNow=True)
            .option("checkpointLocation", checkpoint)
            .foreachBatch(lambda df, _id: counts.append(df.count()))
            .start()
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - started
    if sum(counts) != count:
        raise SystemExit(f"Spark source delivered {sum(counts)} rows, expected {count}")
    return count / elapsed, len(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument("--min-partitions", type=int, default=None,
                        help="also measure the source with this minPartitions (Spark tasks per batch)")
    add_kafka_arguments(parser)
    args = parser.parse_args()
    use_kafka_security(parser, args)

    from replication.connectors.spark.session import session

    broker = None if args.bootstrap else EmbeddedBroker().start()
    bootstrap = args.bootstrap or broker.bootstrap
    try:
        spark = session("bench-kafka-source")
        # Warm up the JVM and the Python workers so the measurement is the source, not start-up.
        warm = f"bench-warm-{uuid.uuid4().hex[:6]}"
        ensure_topics(bootstrap, [warm], partitions=args.partitions, security=kafka_security())
        publish(bootstrap, warm, 1000, args.partitions)
        spark_source(spark, bootstrap, warm, 1000, minPartitions=2)

        topic = f"bench-{uuid.uuid4().hex[:6]}"
        ensure_topics(bootstrap, [topic], partitions=args.partitions, security=kafka_security())
        rate = publish(bootstrap, topic, args.messages, args.partitions)
        print(f"published {args.messages} msgs to {args.partitions} partition(s): {rate:,.0f} msg/s")

        baseline = plain_consumer(bootstrap, topic, args.messages, args.partitions)
        print(f"kafka-python consumer loop : {baseline:,.0f} rows/s")
        alone = source_read_alone(bootstrap, topic, args.messages, args.partitions)
        print(f"source read() without Spark: {alone:,.0f} rows/s (ratio {alone / baseline:.2f})")
        limit = args.max_offsets_per_trigger
        ours, batches = spark_source(spark, bootstrap, topic, args.messages, maxOffsetsPerTrigger=limit)
        print(f"Spark replication-kafka    : {ours:,.0f} rows/s ({batches} micro-batches)")
        print(f"ratio Spark / kafka-python : {ours / baseline:.2f}")
        if args.min_partitions:
            split, batches = spark_source(spark, bootstrap, topic, args.messages, maxOffsetsPerTrigger=limit,
                                          minPartitions=args.min_partitions)
            print(f"  with minPartitions={args.min_partitions}     : {split:,.0f} rows/s ({batches} micro-batches),"
                  f" ratio {split / baseline:.2f}")
        spark.stop()
    finally:
        if broker:
            broker.stop()


if __name__ == "__main__":
    main()
