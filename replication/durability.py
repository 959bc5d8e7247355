"""When a publisher's message counts as persisted, and telling the publisher (DESIGN §5, §7).

A committed row is durable once no sync destination still waits to
acknowledge it; with no sync destinations, at once. Persisted acks go to the
Kafka topic ``<instance>.acks``: key = client name, value = JSON
``{"client", "seq", "instance"}`` where ``seq`` is the highest persisted
publisher sequence. A logon is answered on the same topic with
``"logon": true``, the publisher's ``correlation_id`` and ``stored``, the
highest sequence of the client in the txlog (persisted or still waiting for
sync destinations): a publisher need not resend what is stored.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from replication.storage.control import Ack, DurableState
from replication.txlog import Runs, runs_by_value

if TYPE_CHECKING:
    import pyarrow as pa

    from replication.ingest.classify import Classified, Logon
    from replication.storage.layout import StorageLayout

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
        )

    def send(self, acks: dict[str, int], logons: list["Logon"], persisted: dict[str, int],
             stored: dict[str, int] | None = None) -> None:
        """Persisted acks, then logon replies: the client's persisted and stored (received) positions."""
        for client, seq in acks.items():
            self._send(client, {"client": client, "seq": seq, "instance": self.instance})
        for logon in logons:
            self._send(
                logon.client,
                {
                    "client": logon.client,
                    "seq": persisted.get(logon.client, 0),
                    "stored": max((stored or {}).get(logon.client, 0), persisted.get(logon.client, 0)),
                    "instance": self.instance,
                    "logon": True,
                    "correlation_id": logon.correlation_id,
                },
            )
        if acks or logons:
            self._producer.flush(timeout=30)

    def _send(self, client: str, value: dict) -> None:
        self._producer.send(self.topic, key=client.encode(), value=json.dumps(value, separators=(",", ":")).encode())

    def close(self) -> None:
        self._producer.close(timeout=5)


@dataclass
class _Batch:
    """A committed ingest batch some of whose rows may still wait for a sync destination."""

    first_seq: int
    last_seq: int
    committed_at: float


@dataclass
class _Position:
    """A publisher's or an upstream's position, acknowledged once the local rows it covers are durable."""

    value: int
    runs: Runs
    """The local seqs of the rows that carry this position."""


def _span(first: int, last: int) -> Runs:
    """Rows ``first..last`` as one run (none when ``last < first``)."""
    if last < first:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.array([first], np.int64), np.array([last], np.int64)


#: A key none of whose rows wait: released as soon as it is first in line.
_NO_ROWS = _span(1, 0)


class Durability:
    """Tracks committed-but-not-yet-durable rows; releases persisted acks and upstream acks.

    A row is durable when no sync destination (not downgraded) still holds it
    (see :meth:`replication.destination.link.Link.holds_any`). Acknowledgements follow rows,
    not batches: a publisher's position is released when the rows that
    publisher's messages got are durable, an upstream's when the rows received
    from it are. Releasing (a) sends publishers their persisted acks and (b)
    writes ``_control/acks/<upstream>.json``: sync chains are transitive because
    a downstream acknowledges only what is durable at its own sync destinations.

    Rows, not batches, is what keeps a two-way sync pair from waiting on
    itself: a row received from the partner is never sent back (loop rule), so
    the ack to the partner never waits for the partner, even when the same
    batch holds our own rows that the partner has yet to acknowledge. Each
    publisher's and each upstream's positions are released in order.

    ``durable_seq`` is the prefix watermark: every local row through it is
    durable. ``_control/durable.json`` records it each time it moves (and the
    acks given), which is what ``fully_durable`` replays read.

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
        holds: Callable[[Runs], bool] | None = None,
        rows_since: Callable[[int, int], "pa.Table"] | None = None,
    ) -> None:
        """``publishers``/``links``: the txlog's positions at start. ``holds(runs)``: does a sync
        destination still hold a row of ``runs``? ``rows_since(after, through)``
        reads the txlog's ``seq``, ``publisher`` and ``received_from`` of rows ``after < seq <=
        through``: after a restart, the rows not yet known durable are matched to their keys
        again (without it, every key waits for the whole range)."""
        self._sender = sender
        self._layout = layout
        self._lock = threading.Lock()
        self._holds = holds or (lambda runs: False)
        saved = DurableState.read(layout.durable_json) or DurableState()
        self.persisted: dict[str, int] = {k: int(v) for k, v in saved.publishers.items()}
        self.upstream_acks: dict[str, int] = {k: int(v) for k, v in saved.upstreams.items()}
        self.durable_seq = int(saved.durable_seq)
        self._saved_durable_seq = self.durable_seq
        self.committed_seq = committed_seq
        self.stored = dict(publishers)
        """client -> highest sequence in the txlog, persisted or not (told to publishers at logon)."""
        self._batches: list[_Batch] = []
        self._publishers: dict[str, deque[_Position]] = {}
        self._upstreams: dict[str, deque[_Position]] = {}
        if committed_seq > self.durable_seq or publishers != self.persisted or links != self.upstream_acks:
            self._recover(publishers, links, rows_since)

    def _recover(self, publishers: dict[str, int], links: dict[str, int],
                 rows_since: Callable[[int, int], "pa.Table"] | None) -> None:
        """After a restart: what was committed but not known durable waits again."""
        after, through = self.durable_seq, self.committed_seq
        self._batches.append(_Batch(after + 1, through, time.time()))
        whole = _span(after + 1, through)
        by_publisher: dict[str, Runs] = {}
        by_upstream: dict[str, Runs] = {}
        exact = False
        if rows_since is not None and through > after:
            try:
                rows = rows_since(after, through)
            except Exception as exc:  # e.g. files vacuumed: waiting for the whole range is still right
                log.warning("rows %d-%d of the txlog could not be read (%s); their acks wait for all of them",
                            after + 1, through, exc)
            else:
                seqs = rows["seq"].to_numpy()
                by_publisher = runs_by_value(rows["publisher"], seqs)
                by_upstream = runs_by_value(rows["received_from"], seqs)
                exact = True
        for client, seq in publishers.items():
            if seq > self.persisted.get(client, 0):
                runs = by_publisher.get(client, _NO_ROWS) if exact else whole
                self._publishers[client] = deque([_Position(seq, runs)])
        for upstream, seq in links.items():
            if seq > self.upstream_acks.get(upstream, 0):
                runs = by_upstream.get(upstream, _NO_ROWS) if exact else whole
                self._upstreams[upstream] = deque([_Position(seq, runs)])

    def announce(self) -> None:
        """Re-send every publisher's persisted position (at start: acks lost in a crash resume)."""
        self.release()
        if self._sender and self.persisted:
            self._sender.send(dict(self.persisted), [], self.persisted)

    def on_commit(self, last_seq: int, result: "Classified") -> None:
        with self._lock:
            # A key whose rows the result does not list (a catch-up after a failed batch)
            # waits for the whole batch: never too early.
            whole = _span(self.committed_seq + 1, last_seq)
            if last_seq > self.committed_seq:
                self._batches.append(_Batch(self.committed_seq + 1, last_seq, time.time()))
            for client, seq in result.publishers.items():
                self.stored[client] = max(self.stored.get(client, 0), seq)
                runs = result.publisher_rows.get(client, whole)
                self._publishers.setdefault(client, deque()).append(_Position(seq, runs))
            for upstream, seq in result.links.items():
                runs = result.link_rows.get(upstream, whole)
                self._upstreams.setdefault(upstream, deque()).append(_Position(seq, runs))
            self.committed_seq = max(self.committed_seq, last_seq)
        self.release(result.logons)

    def oldest_waiting_age(self, held_by: Callable[[int, int], bool], now: float | None = None) -> float:
        """Seconds since the oldest committed batch that ``held_by`` still holds a row of (0 when none)."""
        with self._lock:
            batches = [(b.first_seq, b.last_seq, b.committed_at) for b in self._batches]
        for first, last, committed_at in batches:
            if held_by(first, last):
                return (now or time.time()) - committed_at
        return 0.0

    def release(self, logons: list["Logon"] | None = None) -> dict[str, int]:
        """Release what became durable: persisted acks to publishers, acks to upstreams."""
        with self._lock:
            # Durable stays durable: a resync or an upgrade later does not take back acks given.
            self._batches = [b for b in self._batches if self._holds(_span(b.first_seq, b.last_seq))]
            self.durable_seq = (self._batches[0].first_seq - 1) if self._batches else self.committed_seq
            released = self._release_in_order(self._publishers, self.persisted)
            upstreams = self._release_in_order(self._upstreams, self.upstream_acks)
            persisted = dict(self.persisted)
            stored = {logon.client: self.stored.get(logon.client, 0) for logon in logons or []}
            # Written when an ack moves and whenever durable_seq does (fully_durable replays read it):
            # at most once per release.
            if released or upstreams or self.durable_seq != self._saved_durable_seq:
                DurableState(self.durable_seq, persisted, dict(self.upstream_acks)).write(self._layout.durable_json)
                self._saved_durable_seq = self.durable_seq
        for upstream, seq in upstreams.items():
            Ack(seq, time.time()).write(self._layout.ack_file(upstream))
        if self._sender and (released or logons):
            self._sender.send(released, logons or [], persisted, stored)
        return released

    def _release_in_order(self, waiting: dict[str, deque[_Position]], acked: dict[str, int]) -> dict[str, int]:
        """Pop each key's positions whose rows are all durable, in order; raise ``acked``; what moved."""
        moved: dict[str, int] = {}
        for key in list(waiting):
            queue = waiting[key]
            while queue and not self._holds(queue[0].runs):
                head = queue.popleft()
                if head.value > acked.get(key, 0):
                    acked[key] = moved[key] = head.value
            if not queue:
                del waiting[key]
        return moved

    def close(self) -> None:
        if self._sender:
            self._sender.close()
