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
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from replication.storage import read_json, write_json_atomic

if TYPE_CHECKING:
    from replication.ingest import Classified, Logon
    from replication.storage import StorageLayout

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


@dataclass
class _Pending:
    """One committed ingest batch whose acks are not all released yet."""

    first_seq: int
    last_seq: int
    publishers: dict[str, int]
    links: dict[str, int]
    committed_at: float
    durable: bool = False


class Durability:
    """Tracks committed-but-not-yet-durable batches; releases persisted acks and upstream acks.

    A batch is durable when no sync destination (not downgraded) still holds
    one of its rows (see :meth:`replication.links.Link.holds`). Releasing it
    (a) sends publishers their persisted acks and (b) writes
    ``_control/acks/<upstream>.json`` for each upstream whose rows it held:
    sync chains are transitive because a downstream acknowledges only what is
    durable at its own sync destinations.

    Batches become durable out of order (a row received from a sync partner
    is not sent back to it, so nothing holds it), but each publisher's and
    each upstream's position is released in order: a position waits for every
    earlier batch that holds a position of the same key.

    Thread-safe: the ingest batch thread calls :meth:`on_commit`; destination
    threads call :meth:`release` when acknowledgements move.
    """

    def __init__(
        self,
        sender: AckSender | None,
        *,
        layout: "StorageLayout",
        committed_seq: int,
        publishers: dict[str, int],
        links: dict[str, int],
        holds: Callable[[int, int], bool] | None = None,
    ) -> None:
        self._sender = sender
        self._layout = layout
        self._lock = threading.Lock()
        self._holds = holds or (lambda first, last: False)
        saved = read_json(layout.durable_json) or {}
        self.persisted: dict[str, int] = {k: int(v) for k, v in saved.get("publishers", {}).items()}
        self.upstream_acks: dict[str, int] = {k: int(v) for k, v in saved.get("upstreams", {}).items()}
        self.durable_seq = int(saved.get("durable_seq", 0))
        self.committed_seq = committed_seq
        self._pending: list[_Pending] = []
        # After a restart, what was committed but not known durable is one conservative batch.
        if committed_seq > self.durable_seq or publishers != self.persisted or links != self.upstream_acks:
            self._pending.append(_Pending(self.durable_seq + 1, committed_seq, dict(publishers), dict(links), time.time()))

    def announce(self) -> None:
        """Re-send every publisher's persisted position (at start: acks lost in a crash resume)."""
        self.release()
        if self._sender and self.persisted:
            self._sender.send(dict(self.persisted), [], self.persisted)

    def on_commit(self, last_seq: int, result: "Classified") -> None:
        with self._lock:
            first_seq = self.committed_seq + 1
            if result.publishers or result.links or last_seq > self.committed_seq:
                self._pending.append(
                    _Pending(first_seq, last_seq, dict(result.publishers), dict(result.links), time.time())
                )
            self.committed_seq = max(self.committed_seq, last_seq)
        self.release(result.logons)

    def oldest_waiting_age(self, held_by: Callable[[int, int], bool], now: float | None = None) -> float:
        """Seconds since the oldest pending batch that ``held_by`` still holds (0 when none)."""
        with self._lock:
            batches = [(p.first_seq, p.last_seq, p.committed_at) for p in self._pending if not p.durable]
        for first, last, committed_at in batches:
            if last >= first and held_by(first, last):
                return (now or time.time()) - committed_at
        return 0.0

    def release(self, logons: list["Logon"] | None = None) -> dict[str, int]:
        """Release what became durable: persisted acks to publishers, acks to upstreams."""
        released: dict[str, int] = {}
        upstreams: dict[str, int] = {}
        with self._lock:
            blocked_publishers: set[str] = set()
            blocked_links: set[str] = set()
            keep: list[_Pending] = []
            for batch in self._pending:
                if not batch.durable:
                    batch.durable = batch.last_seq < batch.first_seq or not self._holds(batch.first_seq, batch.last_seq)
                if not batch.durable:
                    blocked_publishers.update(batch.publishers)
                    blocked_links.update(batch.links)
                    keep.append(batch)
                    continue
                for client in [c for c in batch.publishers if c not in blocked_publishers]:
                    seq = batch.publishers.pop(client)
                    if seq > self.persisted.get(client, 0):
                        self.persisted[client] = released[client] = seq
                for upstream in [u for u in batch.links if u not in blocked_links]:
                    seq = batch.links.pop(upstream)
                    if seq > self.upstream_acks.get(upstream, 0):
                        self.upstream_acks[upstream] = upstreams[upstream] = seq
                if batch.publishers or batch.links:
                    blocked_publishers.update(batch.publishers)
                    blocked_links.update(batch.links)
                    keep.append(batch)
            self._pending = keep
            waiting = [b.first_seq for b in keep if not b.durable]
            self.durable_seq = (min(waiting) - 1) if waiting else self.committed_seq
            persisted = dict(self.persisted)
            if released or upstreams:
                write_json_atomic(self._layout.durable_json, {
                    "durable_seq": self.durable_seq, "publishers": persisted, "upstreams": dict(self.upstream_acks),
                })
        for upstream, seq in upstreams.items():
            write_json_atomic(self._layout.ack_file(upstream), {"seq": seq, "time": time.time()})
        if self._sender and (released or logons):
            self._sender.send(released, logons or [], persisted)
        return released

    def close(self) -> None:
        if self._sender:
            self._sender.close()
