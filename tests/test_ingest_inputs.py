"""The ingest's inputs: Kafka rows mapped to candidate rows in the driver, the same as Spark maps them, and
Spark's own Kafka source giving the same rows as the driver's reader."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
from confluent_kafka import Producer
from support.kafka import unique_topic

from replication.config.model import KafkaTransport
from replication.config.parser import parse_string
from replication.connectors.kafka.broker import ensure_topics
from replication.connectors.kafka.offsets import KafkaInputPartition
from replication.connectors.kafka.ranges import RangeReader, _spark_arrow_schema
from replication.connectors.kafka.source import KafkaSourceOptions
from replication.ingest.classify import CANDIDATE_SCHEMA
from replication.ingest.inputs import (
    _spark_columns,
    kafka_candidate_columns,
    kafka_candidates,
    kafka_options,
    publish_stream,
    spark_candidates,
)


def kafka_rows() -> pa.Table:
    """Source rows as the Kafka source yields them: headers present, missing, empty."""
    schema = _spark_arrow_schema()
    now = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)
    rows = [
        dict(kafka_topic="t", kafka_partition=0, kafka_offset=5, kafka_timestamp=now, key=None, value=b'{"a":1}',
             headers=[], h_client="pub-1", h_seq="7", h_topic="/orders", h_command="delta_publish", h_type="json"),
        dict(kafka_topic="t", kafka_partition=1, kafka_offset=6, kafka_timestamp=None, key=b"k", value=None,
             headers=[{"key": "amps-client", "value": b"pub-2"}], h_client="pub-2", h_seq=None, h_topic=None,
             h_command=None, h_type=None),
        dict(kafka_topic="u", kafka_partition=0, kafka_offset=0, kafka_timestamp=now, key=None, value=b"<x/>",
             headers=[], h_client=None, h_seq="x", h_topic="", h_command="logon", h_type="xml"),
    ]
    return pa.Table.from_pylist(rows, schema=schema)


def test_kafka_rows_map_to_the_same_candidates_without_spark(spark):
    transport = KafkaTransport("kafka", ("127.0.0.1:9092",), ("t", "u"), message_type="fix")
    rows = kafka_rows()
    by_spark = spark.createDataFrame(rows).select(*_spark_columns(kafka_candidate_columns(transport))).toArrow()
    here = kafka_candidates(rows, transport)
    assert here.schema == CANDIDATE_SCHEMA
    assert by_spark.cast(CANDIDATE_SCHEMA).to_pylist() == here.to_pylist()
    first, second = here.to_pylist()[:2]
    assert (first["topic"], first["message_type"], first["command"]) == ("/orders", "json", "delta_publish")
    assert (second["topic"], second["message_type"], second["command"]) == ("t", "fix", "publish")


def test_spark_s_kafka_source_and_the_driver_s_reader_give_the_same_candidates(spark, broker, tmp_path):
    """The ingest reads big batches through Spark's ``format("kafka")`` (headers taken out in Arrow) and small
    ones in the driver with the project's reader: the same candidate rows for the same records, whatever their
    headers (repeated, not UTF-8, missing, unknown, none)."""
    topic = unique_topic("headers")
    ensure_topics(broker.bootstrap, [topic], partitions=2)
    records = [
        [("amps-client", b"pub-1"), ("amps-seq", b"1"), ("amps-topic", b"/orders"), ("amps-command", b"publish"),
         ("amps-type", b"json"), ("amps-sow-key", b"k1"), ("amps-sow-keys", b"k1,k2"), ("amps-filter", b"/a > 1"),
         ("amps-session", b"s-1")],
        [("amps-client", b"first"), ("x-trace", b"1"), ("amps-client", b"last"), ("amps-seq", b"2")],
        [("amps-client", b"pub-\xff"), ("amps-seq", b"3"), ("amps-topic", b"")],
        [("amps-topic", None), ("amps-command", b"logon")],
        [],
    ]
    producer = Producer({"bootstrap.servers": broker.bootstrap})  # (librdkafka: a header may have no value)
    for i, headers in enumerate(records * 3):
        producer.produce(topic, value=b'{"i":%d}' % i, headers=headers, partition=i % 2)
    assert producer.flush(30) == 0
    cfg = parse_string(f"<AMPSConfig><Name>h</Name><Storage>{tmp_path}</Storage><Transports><Transport>"
                       f"<Name>k</Name><Type>kafka</Type><InetAddr>{broker.bootstrap}</InetAddr><Topic>{topic}"
                       "</Topic><MessageType>fix</MessageType></Transport></Transports></AMPSConfig>")
    transport = cfg.kafka_transports[0]
    collected: list[pa.Table] = []
    query = (publish_stream(spark, cfg).writeStream.foreachBatch(lambda df, _id: collected.append(
        spark_candidates(df.toArrow()))).option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True).start())
    query.awaitTermination(120)
    by_spark = pa.concat_tables(collected)
    options = KafkaSourceOptions.parse(kafka_options(transport))
    reader = RangeReader(options)
    parts = [KafkaInputPartition(topic, p, 0, 8 if p == 0 else 7) for p in (0, 1)]
    by_driver = kafka_candidates(pa.Table.from_batches(reader.read(parts)), transport)
    reader.close()

    def ordered(table: pa.Table) -> list[dict]:
        return sorted(table.to_pylist(), key=lambda row: (row["kafka_partition"], row["kafka_offset"]))

    assert [(f.name, f.type) for f in by_spark.schema] == [(f.name, f.type) for f in CANDIDATE_SCHEMA]
    assert by_spark.num_rows == 15
    assert ordered(by_spark) == ordered(by_driver)
    kinds = {json.loads(row["data"])["i"] % len(records): row for row in by_spark.to_pylist()}
    first, repeated, not_utf8, no_client, bare = (kinds[k] for k in range(len(records)))
    assert (first["publisher"], first["sow_keys"], first["filter"], first["session"]) == ("pub-1", "k1,k2",
                                                                                          "/a > 1", "s-1")
    assert repeated["publisher"] == "last"
    assert (not_utf8["publisher"], not_utf8["topic"]) == ("pub-\ufffd", "")
    assert (no_client["publisher"], no_client["topic"], no_client["command"]) == (None, topic, "logon")
    assert (bare["topic"], bare["message_type"], bare["command"]) == (topic, "fix", "publish")


def test_headers_are_taken_out_of_any_slice_and_rows_without_headers_keep_their_columns():
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    headers = pa.array([[{"key": "amps-client", "value": b"x0"}], [{"key": "amps-client", "value": b"x1"}], None,
                        [{"key": "amps-client", "value": b"x3"}, {"key": "amps-seq", "value": b"9"}]],
                       type=pa.list_(header))
    columns = {f.name: pa.nulls(4, f.type) for f in CANDIDATE_SCHEMA}
    columns["topic"] = pa.array(["kt", "kt", "/inbox", "kt"])  # what Spark put there: the default, or an inbox row's
    batch = pa.table(columns, schema=CANDIDATE_SCHEMA).append_column("kafka_headers", headers)
    for start in range(3):
        out = spark_candidates(pa.concat_tables([batch.slice(start, 1), batch.slice(start + 1)]))
        assert out.column_names == CANDIDATE_SCHEMA.names
        assert out["publisher"].to_pylist() == ["x0", "x1", None, "x3"][start:]
        assert out["publisher_seq"].to_pylist() == [None, None, None, "9"][start:]
        assert out["topic"].to_pylist() == ["kt", "kt", "/inbox", "kt"][start:]
