"""Acknowledgements seen on Kafka before the ingest stores them: a consumer's backlog room freed a batch sooner.

A consumer at its ``max_backlog`` gets its next delivery once one of its
acknowledgements reaches the queue's state. Through the ingest that is its next
micro-batch (:meth:`QueueDispatcher.check`): on average half a batch of wait,
then the batch's read and classify, for every round trip a consumer makes.
:class:`AckWatch` reads the instance's publish topics beside the ingest, from
their end and with no consumer group, and hands each acknowledgement (a
``sow_delete`` on a queue topic) to the dispatcher as soon as Kafka has it.

Only room is freed (:meth:`QueueState.seen_acks`), for bookmarks leased to the
client that sent the acknowledgement, as the check does. Nothing leaves the
queue here: the txlog stays the authority, the message stays leased until the
acknowledgement is stored, and one the ingest refuses or never stores gives
its room back when the lease ends, as a checked one does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from replication.connectors.kafka.librdkafka import take_waiting
from replication.connectors.kafka.security import KafkaSecurity
from replication.messages import HEADER_CLIENT, HEADER_COMMAND, HEADER_SOW_KEYS, HEADER_TOPIC

log = logging.getLogger(__name__)

#: ``(client, queue topic, sow keys)`` of one acknowledgement, as :meth:`QueueBook.check_acks` takes them.
Seen = tuple[str, str, str]


class AckWatch:
    """A thread reading ``topics`` from their end and passing their acknowledgements to ``seen``."""

    def __init__(self, name: str, topics: tuple[str, ...], *, bootstrap: tuple[str, ...], security: KafkaSecurity,
                 queues: frozenset[str], seen: Callable[[list[Seen]], None]) -> None:
        self.name, self.topics, self.queues, self._seen = name, topics, queues, seen
        self._bootstrap, self._security = bootstrap, security
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> AckWatch:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-ack-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(10)

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer({"bootstrap.servers": ",".join(self._bootstrap), **self._security.librdkafka(),
                         # (assigned, never subscribed: the id only names the client, no group is joined)
                         "group.id": f"{self.name}-ack-watch", "enable.auto.commit": False,
                         "enable.partition.eof": False, "fetch.wait.max.ms": 20, "logger": log})

    def _assign(self, consumer: Any, assigned: set[str], first: bool) -> None:
        """Read the topics not assigned yet that exist now: from their end at start, from their start when
        they appear later (a publish topic Kafka creates on its first record)."""
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, TopicPartition

        metadata = consumer.list_topics(timeout=30)
        found = {t: sorted(metadata.topics[t].partitions) for t in self.topics
                 if t not in assigned and t in metadata.topics and metadata.topics[t].partitions}
        if found:
            where = OFFSET_END if first else OFFSET_BEGINNING
            consumer.incremental_assign([TopicPartition(t, p, where) for t, parts in found.items() for p in parts])
            assigned.update(found)

    def _run(self) -> None:
        consumer: Any = None
        assigned: set[str] = set()
        looked = 0.0
        while not self._closed.is_set():
            try:
                if consumer is None:
                    consumer, assigned = self._consumer(), set()
                    self._assign(consumer, assigned, first=True)
                    looked = time.monotonic()
                elif len(assigned) < len(self.topics) and time.monotonic() - looked >= 1.0:
                    self._assign(consumer, assigned, first=False)
                    looked = time.monotonic()
                records = take_waiting(consumer, 0.1)
                if not records:
                    continue
                acks = self._acks(records)
                if acks:
                    self._seen(acks)
            except Exception as exc:  # only a shortcut: the ingest's check frees the room anyway
                log.warning("%s: the acknowledgement watch stopped (%s); starting it again in 1 s", self.name, exc)
                if consumer is not None:
                    consumer.close()
                consumer = None
                self._closed.wait(1.0)
        if consumer is not None:
            consumer.close()

    def _acks(self, records: list) -> list[Seen]:
        out: list[Seen] = []
        for record in records:
            headers = record.headers()
            if not headers or record.error() is not None:
                continue
            values = dict(headers)
            if values.get(HEADER_COMMAND) != b"sow_delete":
                continue
            topic, client, keys = (values.get(h) for h in (HEADER_TOPIC, HEADER_CLIENT, HEADER_SOW_KEYS))
            if topic is None or client is None or keys is None:
                continue
            queue = topic.decode(errors="replace")
            if queue in self.queues:
                out.append((client.decode(errors="replace"), queue, keys.decode(errors="replace")))
        return out
