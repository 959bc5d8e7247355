"""The embedded Apache Kafka broker (KRaft): starts, serves Kafka clients, creates topics, reports failures."""

from __future__ import annotations

import socket

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from support.kafka import unique_topic

from replication.connectors.kafka.broker import EmbeddedBroker, ensure_topics
from replication.errors import BrokerError


def test_bootstrap_is_a_loopback_address(broker):
    host, port = broker.bootstrap.split(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert broker.running


def test_ensure_topics_creates_missing_and_keeps_existing(broker):
    a, b = unique_topic("broker"), unique_topic("broker")
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
    topic = unique_topic("broker")
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


@pytest.mark.e2e  # a broker (a JVM) of its own
def test_a_broker_that_cannot_bind_says_why_with_its_log_and_close_removes_its_folder():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        b = EmbeddedBroker(port=port, startup_timeout=60)
        home = b.home
        with pytest.raises(BrokerError) as err:
            b.start()
    message = str(err.value)
    assert f"127.0.0.1:{port}" in message
    assert "Address already in use" in message  # the broker's own words, from its log
    assert not b.running
    assert (home / "data" / "meta.properties").is_file()  # the storage was formatted before the start
    b.close()
    assert not home.exists()
    with pytest.raises(BrokerError, match="not started"):
        _ = EmbeddedBroker().bootstrap


def test_the_session_broker_is_apache_kafka_in_kraft_mode(broker):
    props = dict(line.split("=", 1) for line in (broker.home / "server.properties").read_text().splitlines())
    assert props["process.roles"] == "broker,controller"
    assert props["log.dirs"].startswith(str(broker.home))
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    assert [b["broker_id"] for b in cluster["brokers"]] == [1]
    assert cluster["controller_id"] == 1  # the same node is the KRaft controller
