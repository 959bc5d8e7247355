"""Kafka topics for the tests of the Kafka source: unique names, numbered publishes with AMPS headers, options."""

from __future__ import annotations

import uuid

from kafka import KafkaProducer


def unique_topic(prefix: str = "src") -> str:
    """A topic name no other test uses (the session's broker is shared)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def publish_numbered(bootstrap: str, topic: str, count: int, *, partitions: int = 1, first_seq: int = 1) -> None:
    """``count`` publishes with AMPS headers, zstd, round-robin over partitions, batched."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, compression_type="zstd", linger_ms=20, batch_size=256 * 1024
    )
    for seq in range(first_seq, first_seq + count):
        producer.send(
            topic,
            key=b"pub1",
            value=b'{"seq":%d}' % seq,
            partition=seq % partitions,
            headers=[
                ("amps-client", b"pub1"),
                ("amps-seq", str(seq).encode()),
                ("amps-topic", b"/orders/" + str(seq).encode()),
                ("x-extra", b"\xff\x00"),  # not UTF-8: stays raw in `headers`
            ],
        )
    producer.flush()
    producer.close()


def source_options(broker, *topics: str, **extra: str) -> dict[str, str]:
    """The Kafka source's options reading ``topics`` from ``broker``."""
    return {"bootstrap.servers": broker.bootstrap, "topics": ",".join(topics), **extra}
