"""The embedded tansu broker: starts, serves Kafka clients, creates topics, reports failures."""

from __future__ import annotations

import socket
import uuid

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from replication.connectors.kafka.broker import EmbeddedBroker, ensure_topics
from replication.errors import BrokerError


def _topic() -> str:
    return f"broker-{uuid.uuid4().hex[:8]}"


def test_bootstrap_is_a_loopback_address(broker):
    host, port = broker.bootstrap.split(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert broker.running


def test_ensure_topics_creates_missing_and_keeps_existing(broker):
    a, b = _topic(), _topic()
    ensure_topics(broker.bootstrap, [a], partitions=3)
    ensure_topics(broker.bootstrap, [a, b], partitions=2)  # a exists: left as it is

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert {a, b} <= set(admin.list_topics())
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        assert consumer.partitions_for_topic(a) == {0, 1, 2}
        assert consumer.partitions_for_topic(b) == {0, 1}
    finally:
        consumer.close()


def test_records_with_headers_round_trip(broker):
    topic = _topic()
    ensure_topics(broker.bootstrap, [topic])
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="zstd")
    producer.send(topic, key=b"pub1", value=b'{"id":1}', headers=[("amps-client", b"pub1"), ("amps-seq", b"1")])
    producer.close()

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, fetch_max_wait_ms=5)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    records = []
    for _ in range(200):
        records += consumer.poll(timeout_ms=10).get(tp, [])
        if records:
            break
    consumer.close()
    assert [(r.key, r.value, r.headers) for r in records] == [
        (b"pub1", b'{"id":1}', [("amps-client", b"pub1"), ("amps-seq", b"1")])
    ]


def test_stop_ends_the_process_and_context_manager_stops_it():
    with EmbeddedBroker() as b:
        assert b.running
    assert not b.running
    with pytest.raises(BrokerError, match="not started"):
        b.bootstrap


def test_start_failure_raises_broker_error_with_log_tail():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        b = EmbeddedBroker(port=port, startup_timeout=10)
        with pytest.raises(BrokerError) as err:
            b.start()
    message = str(err.value)
    assert f"127.0.0.1:{port}" in message
    assert "Address in use" in message  # tansu's own words, from its log
    assert not b.running
