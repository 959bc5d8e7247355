"""An instance on the real Apache Kafka broker, as users reach it: librdkafka and kafka-python publishers and
ack consumers, and the broker itself stopped and restarted under a running pair."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer as RdProducer
from kafka import KafkaProducer

from fabric_support import ONE_WAY, AckListener, PacedPublisher
from factories import assert_exactly_once, destination_xml, raw_publish, replication_xml, wait_until
from replication.durability import acks_topic


def test_librdkafka_and_kafka_python_publishers_get_every_persisted_ack_on_long_lived_consumers(fabric):
    fabric.configure("a")
    inst = fabric.start("a")
    topic = f"{inst.name}.publish"
    listeners = [AckListener(kind, fabric.broker.bootstrap, acks_topic(inst.name))
                 for kind in ("librdkafka", "kafka-python")]
    for listener in listeners:
        listener.start()
    for listener in listeners:
        assert listener.ready.wait(60), f"the {listener.kind} consumer was not assigned the acks topic"
    count = 3000
    try:
        rd = RdProducer({"bootstrap.servers": fabric.broker.bootstrap, "compression.type": "zstd",
                         "linger.ms": 5})
        for seq in range(1, count + 1):
            rd.produce(topic, key=b"rdkafka-pub", value=json.dumps({"n": seq}).encode(),
                       headers=[("amps-client", b"rdkafka-pub"), ("amps-seq", str(seq).encode()),
                                ("amps-topic", b"/orders")])
            rd.poll(0)
        assert rd.flush(60) == 0
        producer = KafkaProducer(bootstrap_servers=fabric.broker.bootstrap, compression_type="gzip")
        for seq in range(1, count + 1):
            raw_publish(producer, topic, json.dumps({"n": seq}).encode(), amps_client="python-pub",
                        amps_seq=str(seq), amps_topic="/orders")
        producer.flush()
        producer.close()
        expected = {"rdkafka-pub": count, "python-pub": count}
        for listener in listeners:
            wait_until(lambda lis=listener: lis.persisted == expected, timeout=180,
                       what=f"every persisted ack at the {listener.kind} consumer")
    finally:
        for listener in listeners:
            listener.stop()
    assert_exactly_once(fabric.rows("a"), {"rdkafka-pub": count, "python-pub": count})


@pytest.mark.slow
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # no thread may die of it
def test_a_broker_stopped_and_restarted_under_a_replicating_pair_loses_and_duplicates_nothing(fabric):
    """The session's broker goes down (a clean shutdown) and comes back on its log directories while A ingests
    and replicates to B (sync): every message in both txlogs once, every publisher acknowledged."""
    fabric.configure("b")
    fabric.configure("a", replication=replication_xml(destination_xml(fabric.name("b"), [fabric.storage("b")],
                                                                      topics=ONE_WAY)))
    fabric.start("b")
    fabric.start("a")
    pub = fabric.publisher("through-restart", "a", resend_after=3.0)
    paced = PacedPublisher(pub, rate=150)
    try:
        wait_until(lambda: fabric.count("b") >= 300, what="replication under way before the restart")
        fabric.broker.stop()
        try:
            time.sleep(3)  # publishes meanwhile wait in the producer; the publisher's logons fail
        finally:
            fabric.broker.start()
        resumed = paced.published + 300
        wait_until(lambda: fabric.count("b") >= resumed, timeout=180, what="replication going on after the restart")
    finally:
        published = paced.stop()
    pub.flush(timeout=180)
    assert pub.persisted_seq == published
    for short in ("a", "b"):
        wait_until(lambda s=short: fabric.count(s) >= published, timeout=120, what=f"{short} to hold every message")
        assert_exactly_once(fabric.rows(short), {"through-restart": published})


def test_a_send_the_broker_refuses_for_good_makes_flush_say_which_message_and_why(fabric, tmp_path):
    """A retry cannot mend a message larger than the topic takes: the publisher says so instead of waiting."""
    from kafka.admin import KafkaAdminClient, NewTopic

    from replication.errors import ReplicationError

    fabric.configure("a")
    name = fabric.name("a")
    admin = KafkaAdminClient(bootstrap_servers=fabric.broker.bootstrap)
    try:
        admin.create_topics([NewTopic(f"{name}.publish", 1, 1, topic_configs={"max.message.bytes": "2000"})])
    finally:
        admin.close()
    fabric.start("a")
    pub = fabric.publisher("oversized", "a", compression=None)
    pub.publish("/orders", json.dumps({"id": 1}).encode())
    pub.publish("/orders", json.dumps({"id": 2, "pad": "x" * 5000}).encode())
    with pytest.raises(ReplicationError, match=r"message 2 could not be sent to .*MessageSizeTooLarge"):
        pub.flush(timeout=60)
