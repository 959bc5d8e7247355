"""When a publisher's message counts as persisted, and telling the publisher (DESIGN §5, §7).

A committed batch is *pending* until the durable watermark (a local ``seq``)
passes its last row. With no sync destinations the watermark is simply the
last committed ``seq``; replication adds sync destinations' acknowledgements
through ``sync_watermark``. Persisted acks go to the Kafka topic
``<instance>.acks``: key = client name, value = JSON
``{"client", "seq", "instance"}`` where ``seq`` is the highest persisted
publisher sequence. A logon is answered on the same topic with
``"logon": true`` and the publisher's ``correlation_id``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    from replication.ingest import Classified, Logon

log = logging.getLogger(__name__)


def acks_topic(instance: str) -> str:
    return f"{instance}.acks"


class AckSender:
    """Publishes persisted acks and logon replies for one instance."""

    def __init__(self, instance: str, bootstrap_servers: Iterable[str]) -> None:
        from kafka import KafkaProducer

        self.instance = instance
        self.topic = acks_topic(instance)
        self._producer = KafkaProducer(
            bootstrap_servers=list(bootstrap_servers),
            acks=1,
            linger_ms=0,
            retries=5,
            key_serializer=str.encode,
            value_serializer=lambda v: json.dumps(v, separators=(",", ":")).encode(),
        )

    def send(self, acks: dict[str, int], logons: list["Logon"], persisted: dict[str, int]) -> None:
        for client, seq in acks.items():
            self._producer.send(self.topic, key=client, value={"client": client, "seq": seq, "instance": self.instance})
        for logon in logons:
            self._producer.send(
                self.topic,
                key=logon.client,
                value={
                    "client": logon.client,
                    "seq": persisted.get(logon.client, 0),
                    "instance": self.instance,
                    "logon": True,
                    "correlation_id": logon.correlation_id,
                },
            )
        if acks or logons:
            self._producer.flush(timeout=30)

    def close(self) -> None:
        self._producer.close(timeout=5)


class Durability:
    """Tracks committed-but-not-yet-persisted batches and releases persisted acks.

    Thread-safe: the ingest batch thread calls :meth:`on_commit`; a driver
    thread calls :meth:`release` when sync destinations acknowledge more.
    """

    def __init__(
        self,
        sender: AckSender | None,
        *,
        persisted: dict[str, int],
        committed_seq: int,
        sync_watermark: Callable[[int], int] | None = None,
    ) -> None:
        self._sender = sender
        self._lock = threading.Lock()
        self._pending: deque[tuple[int, dict[str, int]]] = deque()
        self.persisted: dict[str, int] = dict(persisted)
        self.committed_seq = committed_seq
        self.durable_seq = committed_seq
        self._sync_watermark = sync_watermark or (lambda committed: committed)

    def announce(self) -> None:
        """Re-send every publisher's persisted position (at start: acks lost in a crash resume)."""
        if self._sender and self.persisted:
            self._sender.send(dict(self.persisted), [], self.persisted)

    def on_commit(self, last_seq: int, result: "Classified") -> None:
        with self._lock:
            if result.publishers:
                self._pending.append((last_seq, dict(result.publishers)))
            self.committed_seq = max(self.committed_seq, last_seq)
        self.release(result.logons)

    def release(self, logons: list["Logon"] | None = None) -> dict[str, int]:
        """Move batches under the durable watermark to persisted and send their acks."""
        released: dict[str, int] = {}
        with self._lock:
            self.durable_seq = min(self.committed_seq, self._sync_watermark(self.committed_seq))
            while self._pending and self._pending[0][0] <= self.durable_seq:
                _, publishers = self._pending.popleft()
                for client, seq in publishers.items():
                    if seq > self.persisted.get(client, 0):
                        self.persisted[client] = seq
                        released[client] = seq
            persisted = dict(self.persisted)
        if self._sender and (released or logons):
            self._sender.send(released, logons or [], persisted)
        return released

    def close(self) -> None:
        if self._sender:
            self._sender.close()
