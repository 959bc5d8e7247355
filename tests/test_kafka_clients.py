"""An instance reached by real Kafka clients: librdkafka and kafka-python publishers and ack consumers.

Also a send the broker refuses for good. (The broker restarted under a pair: faults/test_broker_restart.py.)"""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer as RdProducer
from kafka import KafkaProducer
from support.fabric import AckListener
from support.factories import assert_exactly_once, raw_publish, wait_until

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
    assert pub.flush(timeout=60) == []  # (the broker refuses a batch whole: message 1 goes alone)
    pub.publish("/orders", json.dumps({"id": 2, "pad": "x" * 5000}).encode())
    with pytest.raises(ReplicationError,
                       match=r"message 2 could not be sent to .*Message size too large \(MSG_SIZE_TOO_LARGE\)"):
        pub.flush(timeout=60)
