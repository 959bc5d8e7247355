"""The ingest's inputs: Kafka rows mapped to candidate rows in the driver, the same as Spark maps them."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from replication.config.model import KafkaTransport
from replication.connectors.kafka.ranges import _spark_arrow_schema
from replication.ingest.classify import CANDIDATE_SCHEMA
from replication.ingest.inputs import _spark_columns, kafka_candidate_columns, kafka_candidates


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
