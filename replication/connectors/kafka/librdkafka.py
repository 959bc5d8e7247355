"""Two habits of every ``confluent-kafka`` (librdkafka) client of the project."""

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
