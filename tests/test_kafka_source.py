"""The "replication-kafka" Spark source, against a real Apache Kafka broker and a real SparkSession."""

from __future__ import annotations

import threading
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from support.kafka import publish_numbered, source_options, unique_topic
from support.streams import run_available_now

from replication.connectors.kafka import source as kafka_source
from replication.connectors.kafka.broker import ensure_topics
from replication.connectors.kafka.offsets import KafkaInputPartition, _OffsetProbe, limit_positions
from replication.connectors.kafka.ranges import read_partition
from replication.connectors.kafka.source import (
    FORMAT,
    KafkaSourceOptions,
    register,
)
from replication.errors import ConfigError

# -- helpers -------------------------------------------------------------------


def collect(df) -> list:
    """A micro-batch's rows (Spark's ``Row`` objects)."""
    return df.collect()


def _seqs(rows) -> list[int]:
    return sorted(int(r.h_seq) for r in rows)


# -- options and offset arithmetic ---------------------------------------------


def test_options_accept_ours_and_spark_kafka_names():
    ours = KafkaSourceOptions.parse({"bootstrap.servers": "h:1", "topics": "a, b", "maxOffsetsPerTrigger": "7"})
    spark_style = KafkaSourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "a,b"})
    assert ours == KafkaSourceOptions("h:1", ("a", "b"), 7)
    assert spark_style == KafkaSourceOptions("h:1", ("a", "b"), None)


@pytest.mark.parametrize(
    "options, fix",
    [
        ({"topics": "a"}, "bootstrap.servers"),
        ({"bootstrap.servers": "h:1"}, "topics"),
        ({"bootstrap.servers": "h:1", "topics": "a", "maxOffsetsPerTrigger": "ten"}, "positive integer, got 'ten'"),
    ],
)
def test_bad_options_say_what_to_write(options, fix):
    with pytest.raises(ConfigError, match=fix):
        KafkaSourceOptions.parse(options)


def test_limit_shares_budget_by_backlog_and_never_exceeds_it():
    start = {("t", 0): 0, ("t", 1): 100}
    latest = {("t", 0): 900, ("t", 1): 200, ("t", 2): 3}  # t/2 is new: starts at 0
    end = limit_positions(start, latest, 100)
    advanced = {tp: end[tp] - start.get(tp, 0) for tp in end}
    assert sum(advanced.values()) == 100
    assert advanced[("t", 0)] > advanced[("t", 1)] > 0
    assert limit_positions(start, latest, 10_000) == latest


# -- high watermarks -------------------------------------------------------------


def test_latest_offset_counts_every_record_of_a_multi_record_zstd_batch(broker):
    topic = unique_topic("hw")
    ensure_topics(broker.bootstrap, [topic], partitions=2)
    publish_numbered(broker.bootstrap, topic, 10, partitions=2)  # one batch of 5 records per partition

    probe = _OffsetProbe(KafkaSourceOptions.parse(source_options(broker, topic)))
    try:
        assert probe.latest() == {(topic, 0): 5, (topic, 1): 5}
        assert probe.latest() == {(topic, 0): 5, (topic, 1): 5}  # nothing new: the last probe stands
        publish_numbered(broker.bootstrap, topic, 6, partitions=2, first_seq=11)  # one more batch of 3 per partition
        assert probe.latest() == {(topic, 0): 8, (topic, 1): 8}
        assert probe.latest() == {(topic, 0): 8, (topic, 1): 8}
    finally:
        probe.close()



@pytest.mark.parametrize("fast", [True, False], ids=["columnar", "kafka-python-records"])
def test_read_stops_at_end_when_the_last_offset_is_a_transaction_marker(broker, fast):
    topic = unique_topic("txn")
    ensure_topics(broker.bootstrap, [topic])
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=topic, compression_type="zstd")
    producer.init_transactions()
    producer.begin_transaction()
    for seq in range(1, 4):
        producer.send(topic, value=b"x", headers=[("amps-client", b"tx"), ("amps-seq", str(seq).encode())])
    producer.commit_transaction()
    producer.close()

    options = KafkaSourceOptions.parse(source_options(broker, topic))
    probe = _OffsetProbe(options)
    end = probe.latest()[(topic, 0)]
    probe.close()
    assert end == 4  # 3 records + the commit marker

    part = KafkaInputPartition(topic, 0, 0, end)
    rows = [row for batch in read_partition(options, part, fast=fast) for row in batch.to_pylist()]
    assert [r["h_seq"] for r in rows] == ["1", "2", "3"]


@pytest.mark.parametrize("start, end", [(0, 40), (7, 33), (39, 40)])
def test_both_read_paths_agree_on_any_offset_range(broker, start, end):
    topic = unique_topic("paths")
    ensure_topics(broker.bootstrap, [topic])
    publish_numbered(broker.bootstrap, topic, 20)
    publish_numbered(broker.bootstrap, topic, 20, first_seq=21)  # a second batch
    options = KafkaSourceOptions.parse(source_options(broker, topic))
    part = KafkaInputPartition(topic, 0, start, end)
    fast = [b for b in read_partition(options, part, fast=True)]
    portable = [b for b in read_partition(options, part, fast=False)]
    assert [r["kafka_offset"] for b in fast for r in b.to_pylist()] == list(range(start, end))
    assert [b.to_pylist() for b in fast] == [b.to_pylist() for b in portable]


def test_the_installed_kafka_python_takes_the_columnar_path(broker):
    # If this fails after a kafka-python upgrade, reads silently got ~3x slower:
    # adapt _decode_into to the new Fetcher.

    from replication.connectors.kafka.ranges import _decode_into
    from replication.connectors.kafka.records import RecordColumns

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        assert _decode_into(consumer, RecordColumns("t", 0, 1, None, []))
    finally:
        consumer.close()


def test_missing_topic_has_no_partitions_until_it_is_created(broker):
    topic = unique_topic("late")
    probe = _OffsetProbe(KafkaSourceOptions.parse(source_options(broker, topic)))
    try:
        assert probe.earliest() == {} and probe.latest() == {}
        ensure_topics(broker.bootstrap, [topic], partitions=2)
        publish_numbered(broker.bootstrap, topic, 3, partitions=2)
        assert probe.latest(refresh=True) == {(topic, 0): 1, (topic, 1): 2}
    finally:
        probe.close()


# -- the stream ----------------------------------------------------------------


# driverReadRows: every batch read in the driver by the planner (default), by tasks (0), or both (100: the last,
# 60-row batch)
@pytest.mark.parametrize("driver_read", [{}, {"driverReadRows": "0"}, {"driverReadRows": "100"}],
                         ids=["planner", "tasks", "mixed"])
def test_available_now_delivers_each_message_once_within_the_batch_limit_and_resumes(spark, broker, tmp_path,
                                                                                     driver_read):
    topic = unique_topic("stream")
    ensure_topics(broker.bootstrap, [topic], partitions=3)
    publish_numbered(broker.bootstrap, topic, 300, partitions=3)
    options = source_options(broker, topic, maxOffsetsPerTrigger="120", **driver_read)
    checkpoint = str(tmp_path / "checkpoint")

    batches = run_available_now(spark, kafka_source, None, checkpoint, take=collect, **options)
    rows = [row for batch in batches for row in batch]
    assert _seqs(rows) == list(range(1, 301))
    assert [len(batch) for batch in batches] == [120, 120, 60]
    assert len({(r.kafka_partition, r.kafka_offset) for r in rows}) == 300

    row = next(r for r in rows if r.h_seq == "42")
    assert (row.kafka_topic, row.kafka_partition, row.key, row.value) == (topic, 0, b"pub1", b'{"seq":42}')
    assert (row.h_client, row.h_topic, row.h_command, row.h_type) == ("pub1", "/orders/42", None, None)
    assert [(h.key, h.value) for h in row.headers] == [
        ("amps-client", b"pub1"), ("amps-seq", b"42"), ("amps-topic", b"/orders/42"), ("x-extra", b"\xff\x00"),
    ]
    assert row.kafka_timestamp is not None

    # Restart from the checkpoint: only what was published since.
    publish_numbered(broker.bootstrap, topic, 50, partitions=3, first_seq=301)
    again = [row for batch in run_available_now(spark, kafka_source, None, checkpoint, take=collect, **options)
             for row in batch]
    assert _seqs(again) == list(range(301, 351))


def test_processing_time_trigger_follows_new_messages_and_late_topics(spark, broker, tmp_path):
    existing, late = unique_topic("live"), unique_topic("live-late")
    ensure_topics(broker.bootstrap, [existing], partitions=2)
    publish_numbered(broker.bootstrap, existing, 20, partitions=2)
    register(spark)

    seen: list = []
    lock = threading.Lock()

    def collect(df, _id):
        rows = df.collect()
        with lock:
            seen.extend(rows)

    query = (
        spark.readStream.format(FORMAT).options(**source_options(broker, existing, late)).load()
        .writeStream.trigger(processingTime="200 milliseconds")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .foreachBatch(collect)
        .start()
    )
    try:
        _wait_for(lambda: len(seen) >= 20, query)
        publish_numbered(broker.bootstrap, existing, 20, partitions=2, first_seq=21)
        ensure_topics(broker.bootstrap, [late])  # created after the query started
        publish_numbered(broker.bootstrap, late, 5, first_seq=1000)
        _wait_for(lambda: len(seen) >= 45, query)
        time.sleep(1)  # a few more triggers: nothing may arrive twice
    finally:
        query.stop()
    assert query.exception() is None
    by_topic = {t: sorted(int(r.h_seq) for r in seen if r.kafka_topic == t) for t in (existing, late)}
    assert by_topic == {existing: list(range(1, 41)), late: list(range(1000, 1005))}


def _wait_for(condition, query, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, "the stream did not deliver in time"
        time.sleep(0.1)


def test_a_kept_range_reader_reads_each_range_as_read_partition_does(broker):
    """One consumer across reads: forward, overlapping, backwards and split ranges, several partitions at once."""
    from replication.connectors.kafka.ranges import RangeReader

    topic = unique_topic("ranges")
    ensure_topics(broker.bootstrap, [topic], partitions=2)
    publish_numbered(broker.bootstrap, topic, 60, partitions=2)
    publish_numbered(broker.bootstrap, topic, 40, partitions=2, first_seq=61)
    options = KafkaSourceOptions.parse(source_options(broker, topic))
    reader = RangeReader(options)
    plans = [
        [(0, 0, 10), (1, 0, 5)],
        [(0, 10, 30), (1, 5, 50)],  # picks up where the last read stopped
        [(0, 30, 50)],  # one partition only
        [(0, 3, 12), (1, 40, 45)],  # back to earlier offsets
        [(1, 45, 47), (1, 47, 50)],  # one partition split in two ranges (minPartitions)
        [(0, 0, 50), (1, 0, 50)],  # everything
    ]
    try:
        for plan in plans:
            parts = [KafkaInputPartition(topic, p, start, end) for p, start, end in plan]
            got = [row for batch in reader.read(parts) for row in batch.to_pylist()]
            expected = [row for part in parts for batch in read_partition(options, part) for row in batch.to_pylist()]
            key = lambda r: (r["kafka_partition"], r["kafka_offset"])  # noqa: E731
            assert sorted(got, key=key) == sorted(expected, key=key), plan
            assert len(got) == sum(end - start for _p, start, end in plan), plan
    finally:
        reader.close()


def _publish_one_batch_each(bootstrap: str, topic: str, count: int) -> None:
    """``count`` publishes, each its own record batch (so a read takes many polls)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    for seq in range(1, count + 1):
        producer.send(topic, key=b"pub1", value=b'{"seq":%d}' % seq, partition=0,
                      headers=[("amps-client", b"pub1"), ("amps-seq", str(seq).encode())])
        producer.flush()
    producer.close()


def test_a_read_that_gets_no_records_fails_with_what_the_consumer_saw(broker, monkeypatch):
    """Polls that bring nothing while the range has data (a broker that stopped answering) fail the read after the
    stall timeout, naming the partition, the offsets and the consumer's state: Spark retries the task."""
    from replication.connectors.kafka import ranges as kafka_ranges
    from replication.connectors.kafka.ranges import KafkaSourceError, RangeReader

    topic = unique_topic("dead")
    ensure_topics(broker.bootstrap, [topic])
    _publish_one_batch_each(broker.bootstrap, topic, 10)
    options = KafkaSourceOptions.parse(source_options(broker, topic))
    real = kafka_ranges._range_consumer

    def silent(opts):
        consumer = real(opts)
        consumer.poll = lambda *args, **kwargs: {}
        return consumer

    monkeypatch.setattr(kafka_ranges, "_range_consumer", silent)
    reader = RangeReader(options)
    with pytest.raises(KafkaSourceError) as failure:
        reader.read([KafkaInputPartition(topic, 0, 0, 10)], stall_timeout=2)
    message = str(failure.value)
    assert f"{topic}[0]: no records for 2s at offset 0, expected data up to offset 10" in message
    assert "is the broker up?" in message
    reader.close()


def test_a_consumer_reset_to_an_earlier_offset_fails_the_read_instead_of_repeating_rows(broker, monkeypatch):
    """kafka-python answers an out-of-range fetch by moving to the log start (auto_offset_reset); rows from there
    would repeat earlier batches. Simulated with the real client: its position is moved back mid-read."""

    from replication.connectors.kafka.ranges import KafkaSourceError

    topic = unique_topic("reset")
    ensure_topics(broker.bootstrap, [topic])
    _publish_one_batch_each(broker.bootstrap, topic, 60)
    options = KafkaSourceOptions.parse(source_options(broker, topic))
    from replication.connectors.kafka import ranges as kafka_ranges

    real = kafka_ranges._range_consumer

    def resetting(opts, *args):
        c = real(opts, *args)
        real_poll, calls = c.poll, [0]

        def poll(*args, **kwargs):
            calls[0] += 1
            if calls[0] == 2:
                c.seek(TopicPartition(topic, 0), 0)  # what a reset to "earliest" does
            return real_poll(*args, **kwargs)

        c.poll = poll
        return c

    monkeypatch.setattr(kafka_ranges, "_range_consumer", resetting)
    with pytest.raises(KafkaSourceError, match=r"\[0\]: the broker says offset \d+ is out of range "
                                               r"\(the consumer went back to \d+\)"):
        list(read_partition(options, KafkaInputPartition(topic, 0, 20, 60)))


def test_a_range_beyond_the_brokers_data_fails_saying_how_far_the_data_goes(broker):
    from replication.connectors.kafka.ranges import KafkaSourceError, RangeReader

    topic = unique_topic("short")
    ensure_topics(broker.bootstrap, [topic])
    publish_numbered(broker.bootstrap, topic, 10)
    reader = RangeReader(KafkaSourceOptions.parse(source_options(broker, topic)))
    try:
        with pytest.raises(KafkaSourceError, match=r"no records for 2s at offset 10, expected data up to offset 30; "
                                                   r"is the broker up\? \(high watermark 10,"):
            reader.read([KafkaInputPartition(topic, 0, 5, 30)], stall_timeout=2)
    finally:
        reader.close()
