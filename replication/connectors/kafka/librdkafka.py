"""What every ``confluent-kafka`` (librdkafka) client of the project does alike: wait for the first record,
produce while the local queue is full, and count a topic's partitions."""

from __future__ import annotations

from typing import Any


def take_waiting(consumer: Any, timeout: float) -> list:
    """The first record within ``timeout`` seconds, and every record already fetched behind it (empty: none
    came). ``consume()`` with a count waits for the whole count or the whole timeout, so it would hold back
    every record short of the count."""
    first = consumer.poll(timeout)
    return [] if first is None else [first, *consumer.consume(num_messages=999, timeout=0)]


def produce_waiting(producer: Any, topic: str, **record: Any) -> None:
    """``producer.produce(topic, **record)``, waiting for room while the client's local queue is full (the
    brokers away), as a blocking send does."""
    while True:
        try:
            producer.produce(topic, **record)
            return
        except BufferError:
            producer.poll(0.05)


def partition_count(client: Any, topic: str, timeout: float = 30.0) -> int:
    """How many partitions ``topic`` has by the metadata a confluent-kafka ``client`` (producer or consumer)
    gets; 0 when the topic is not there (yet) or its metadata came with an error."""
    found = client.list_topics(topic, timeout=timeout).topics.get(topic)
    return 0 if found is None or found.error is not None else len(found.partitions)
