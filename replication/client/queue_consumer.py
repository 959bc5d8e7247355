"""A consumer of one queue: subscribe, take deliveries, acknowledge them.

Example::

    from replication.client import QueueConsumer

    with QueueConsumer("worker-1", bootstrap="127.0.0.1:9092", topic="amps-1.publish", instance="amps-1",
                       queue="/work", max_backlog=10) as consumer:
        for message in consumer.messages(timeout=30):
            handle(message.data)
            message.ack()            # batched; flush() sends and waits for them

The consumer subscribes with a ``subscribe`` record and keeps the subscription
alive by sending it again every ``HEARTBEAT_S`` (a consumer that stops is
unsubscribed after ``SILENT_AFTER_S`` and its messages go to another). Its
acknowledgements are ``sow_delete`` records on the queue topic, published
(by keys: the bookmarks) through a :class:`~replication.client.Publisher` of the same client name: they
are numbered, stored until persisted, and a refused one (a bookmark this
consumer does not hold) comes back from :meth:`QueueConsumer.flush` with the
instance's reason. The wire format is :mod:`replication.queues.wire`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import NoReturn

from replication.client.publisher import FailedMessage, Publisher
from replication.connectors.kafka.librdkafka import partition_count, take_waiting
from replication.connectors.kafka.security import PLAINTEXT, KafkaSecurity
from replication.errors import ReplicationError
from replication.messages import HEADER_TOPIC
from replication.queues.wire import (
    DEFAULT_MAX_BACKLOG,
    HEADER_BOOKMARK,
    HEADER_LEASE_EXPIRES,
    HEADER_UNDERLYING_TOPIC,
    HEARTBEAT_S,
    SUBSCRIBE,
    UNSUBSCRIBE,
    deliveries_topic,
    delivery_partition,
)

#: Acknowledgements sent together (one ``sow_delete`` naming them all) once this many wait, or after ACK_EVERY_S.
ACK_BATCH = 100
ACK_EVERY_S = 0.05


@dataclass
class QueueMessage:
    """One delivery: the queue topic, the message's bookmark, body and underlying topic, and when its lease
    ends (epoch seconds; 0 for an at-most-once queue, whose messages take no acknowledgement)."""

    topic: str
    bookmark: str
    data: bytes
    underlying_topic: str
    lease_expires: float
    consumer: QueueConsumer | None = field(default=None, repr=False, compare=False)

    def ack(self) -> None:
        """Acknowledge this message (batched: :meth:`QueueConsumer.flush` waits for the instance's answer)."""
        if self.consumer is None:
            raise ReplicationError("this message came from no consumer: acknowledge it with QueueConsumer.ack()")
        self.consumer.ack(self.bookmark)


class QueueConsumer:
    """Subscribes ``name`` to ``queue`` at ``instance`` and yields its deliveries."""

    def __init__(self, name: str, *, bootstrap: str, topic: str, instance: str, queue: str,
                 filter: str | None = None, max_backlog: int = DEFAULT_MAX_BACKLOG,
                 store_path: str | Path | None = None, security: KafkaSecurity = PLAINTEXT) -> None:
        """``topic``: the instance's publish topic (commands and acknowledgements go there); ``filter``: a
        content filter on the queue's messages; ``max_backlog``: how many unacknowledged messages it holds."""
        from confluent_kafka import Consumer, TopicPartition

        self.name, self.queue, self.instance = name, queue, instance
        self._subscription = json.dumps({"filter": filter, "max_backlog": max_backlog}).encode()
        self.publisher = Publisher(name, bootstrap=bootstrap, topic=topic, instance=instance, store_path=store_path,
                                   security=security)
        # librdkafka, not kafka-python: each delivery is a record with five headers, and decoding them in
        # Python was most of a consumer's time (bench/queues.py)
        self._consumer = Consumer({"bootstrap.servers": bootstrap, **security.librdkafka(),
                                   "group.id": f"queue-consumer-{name}", "enable.auto.commit": False,
                                   "fetch.wait.max.ms": 100, "enable.partition.eof": False,
                                   "logger": logging.getLogger(__name__)})
        deliveries = deliveries_topic(instance)
        deadline = time.monotonic() + 30
        while not (parts := partition_count(self._consumer, deliveries, timeout=10)):
            if time.monotonic() > deadline:
                self._abandon(f"queue consumer {name}: topic {deliveries} does not exist; is {instance} running "
                              "with a queue defined?")
            time.sleep(0.2)
        mine = TopicPartition(deliveries, delivery_partition(name, parts))
        # from the end, resolved now (before the subscribe goes out): earlier deliveries are no longer leased
        # to this session, and any made from now on are read
        marks = self._consumer.get_watermark_offsets(mine, timeout=30)
        if marks is None:
            self._abandon(f"queue consumer {name}: Kafka did not say where {deliveries} ends within 30 s")
        self._consumer.assign([TopicPartition(deliveries, mine.partition, marks[1])])
        self._ready: deque[QueueMessage] = deque()
        self._acks: list[str] = []
        self._acks_since = time.monotonic()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.received = 0
        self.publisher.send_command(SUBSCRIBE, queue, self._subscription)
        self._heartbeat = threading.Thread(target=self._beat, name=f"{name}-subscription", daemon=True)
        self._heartbeat.start()

    # -- taking messages ---------------------------------------------------------------------------------

    def receive(self, timeout: float = 1.0) -> QueueMessage | None:
        """The next delivery, or None when none comes within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self._ready:
            self._raise_refused()
            self._send_acks(due=True)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._take(take_waiting(self._consumer, min(remaining, 0.2)))
        return self._ready.popleft()

    def messages(self, timeout: float = 5.0) -> Iterator[QueueMessage]:
        """Deliveries until none comes for ``timeout`` seconds."""
        while (message := self.receive(timeout)) is not None:
            yield message

    def _abandon(self, reason: str) -> NoReturn:
        """A start that cannot go on: close both clients, then raise ``reason``."""
        self.publisher.close()
        self._consumer.close()
        raise ReplicationError(reason)

    def _take(self, records: list) -> None:
        me = self.name.encode()
        for record in records:
            if record.error() is not None or record.key() != me:
                continue  # (a transient fetch error is retried by the client; another client's delivery)
            headers = {k: (v or b"").decode() for k, v in record.headers() or ()}
            if headers.get(HEADER_TOPIC) != self.queue:
                continue
            self.received += 1
            self._ready.append(QueueMessage(self.queue, headers[HEADER_BOOKMARK], record.value() or b"",
                                            headers.get(HEADER_UNDERLYING_TOPIC, ""),
                                            int(headers.get(HEADER_LEASE_EXPIRES, "0")) / 1000, self))

    # -- acknowledging -----------------------------------------------------------------------------------

    def ack(self, bookmark: str) -> None:
        """Acknowledge the message ``bookmark`` (sent with the next batch of acknowledgements)."""
        with self._lock:
            self._acks.append(bookmark)
        self._send_acks(due=False)

    def flush(self, timeout: float = 60.0) -> list[FailedMessage]:
        """Send the acknowledgements waiting, and wait until the instance has persisted or refused every one;
        the refused ones, with the instance's reason."""
        self._send_acks(due=True, force=True)
        return self.publisher.flush(timeout)

    def _send_acks(self, *, due: bool, force: bool = False) -> None:
        with self._lock:
            late = due and time.monotonic() - self._acks_since >= ACK_EVERY_S
            if not self._acks or not (force or late or len(self._acks) >= ACK_BATCH):
                return
            batch, self._acks = self._acks, []
            self._acks_since = time.monotonic()
        self.publisher.sow_delete(self.queue, keys=batch)

    # -- the subscription --------------------------------------------------------------------------------

    def _beat(self) -> None:
        while not self._closed.wait(HEARTBEAT_S):
            try:
                self.publisher.send_command(SUBSCRIBE, self.queue, self._subscription)
            except Exception:  # the broker is away or the publisher closed: the next beat tries again
                if self._closed.is_set():
                    return

    def _raise_refused(self) -> None:
        reason = self.publisher.refused_subscriptions.get(self.queue)
        if reason is not None:
            raise ReplicationError(f"queue consumer {self.name}: {self.instance} refused the subscription to "
                                   f"{self.queue!r}: {reason}")

    def close(self, *, unsubscribe: bool = True) -> None:
        """Send the acknowledgements waiting, unsubscribe (messages still held return to the queue at once),
        and close. ``unsubscribe=False``: just stop, as a crashed consumer would (its leases run out)."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._send_acks(due=True, force=True)
            if unsubscribe:
                self.publisher.send_command(UNSUBSCRIBE, self.queue)
        finally:
            self._consumer.close()
            self.publisher.close()

    def __enter__(self) -> QueueConsumer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
