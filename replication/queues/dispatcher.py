"""The queues of a running instance: their state kept with the txlog, deliveries sent over Kafka.

:class:`QueueDispatcher` is built before the ingest starts: it reads the txlog
once (:meth:`QueueDispatcher.recover`) so its first acknowledgement check knows
every message and none acknowledged is delivered again after a restart. The
ingest then tells it each commit (:meth:`QueueDispatcher.committed`) and asks
it about acknowledgements (:meth:`QueueDispatcher.check`). Its thread takes
subscribes, ends leases, and sends deliveries on ``<instance>.deliveries``.

An at-most-once message leaves the queue when it is delivered: the removal is
recorded in the txlog (a ``sow_delete`` on the queue topic by the client
``<instance>.queues``, through the instance's own publish topic), and the
delivery is sent once the removal is stored (folded back from a commit), so a
crash can lose a delivery but never repeat it. A removal not yet stored keeps
its deliveries waiting, however long that takes (a slow sync destination does
not matter: stored is enough for a restart).
Leases are not recorded: after a restart, what was leased is delivered again
(at-least-once), and an acknowledgement of the earlier delivery is refused as
not leased to that client.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from replication.config.model import InstanceConfig, QueueTopic
from replication.connectors.kafka.librdkafka import partition_count
from replication.connectors.kafka.security import PLAINTEXT, KafkaSecurity
from replication.errors import ReplicationError
from replication.messages import HEADER_TOPIC
from replication.queues.ack_watch import AckWatch
from replication.queues.book import COLUMNS, QueueBook
from replication.queues.state import Delivery, QueueState
from replication.queues.wire import (
    HEADER_BOOKMARK,
    HEADER_INSTANCE,
    HEADER_LEASE_EXPIRES,
    HEADER_UNDERLYING_TOPIC,
    SILENT_AFTER_S,
    TRANSFER,
    TRANSFER_REQUEST,
    QueueRequest,
    Refusal,
    deliveries_topic,
    delivery_partition,
    manager_client,
    transfer_body,
)
from replication.storage.control import ProxiedTransfer
from replication.storage.layout import StoragePath

if TYPE_CHECKING:
    from replication.client.publisher import Publisher
    from replication.txlog.reader import TxlogReader

log = logging.getLogger(__name__)

#: How often the thread ends leases and looks for subscribers with room when nothing wakes it.
TICK_S = 0.05
#: How often the instances this one stands in for are read again (seconds).
PROXIED_READ_S = 1.0
#: How long Kafka may take to confirm a delivery when no at-least-once queue bounds it (librdkafka's default).
DELIVERY_TIMEOUT_DEFAULT_MS = 300_000
#: The shortest such bound: a lease shorter than this still lets Kafka retry a send once or twice.
DELIVERY_TIMEOUT_MIN_MS = 1_000


def delivery_timeout_ms(queues: Iterable[QueueTopic]) -> int:
    """How long the producer may keep trying a delivery: the shortest lease of an at-least-once queue.

    A delivery Kafka takes after its lease ended would reach a consumer while the message is already leased
    to another (and that consumer's ack would be refused): once the lease is over the send is given up and
    the message goes back to the queue. The bound counts from the send, a little after the lease began, so
    it errs late by that much. With no at-least-once queue, librdkafka's default; the instance's queues share
    one producer, so an at-most-once delivery beside an at-least-once queue is given up at the same bound
    (losing it is what at-most-once allows).
    """
    leases = [q.lease_period_s for q in queues if q.semantics == "at-least-once"]
    if not leases:
        return DELIVERY_TIMEOUT_DEFAULT_MS
    return max(DELIVERY_TIMEOUT_MIN_MS, int(min(leases) * 1000))


class QueueDispatcher:
    """Delivers the queues of one instance (see the module docstring)."""

    def __init__(self, cfg: InstanceConfig, reader: TxlogReader, *, bootstrap: tuple[str, ...],
                 security: KafkaSecurity = PLAINTEXT, refuse: Callable[[Refusal], None] | None = None,
                 silent_after: float = SILENT_AFTER_S, proxied_file: StoragePath | None = None) -> None:
        """``proxied_file``: where ``replication queue --enable-proxied-transfer`` names the instances this one
        stands in for (read every second)."""
        self.cfg = cfg
        self.reader = reader
        self.book = QueueBook(cfg)
        self.topics = self.book.topics
        self.manager = manager_client(cfg.name)
        self._bootstrap, self._security = bootstrap, security
        self._refuse = refuse
        self._proxied_file = proxied_file
        self._proxied_read = 0.0
        self._silent_after = silent_after
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._pending_rows: list[tuple[int, int, pa.Table | None]] = []
        """Commits handed over and not yet folded in: (first seq, last seq, the rows a queue reads; None: read
        them back from the txlog)."""
        self._pending_requests: list[QueueRequest] = []
        self._removals: list[tuple[int, QueueState, list[Delivery]]] = []
        """At-most-once deliveries whose removal (that publisher seq) is recorded and not yet stored."""
        self._producer: Any = None
        self._delivery_timeout_ms = delivery_timeout_ms(cfg.queues)
        self._partitions: int | None = None  # of the deliveries topic (as created, by us or by the user)
        self._publisher: Publisher | None = None
        self._thread: threading.Thread | None = None
        self._watches: list[AckWatch] = []
        self._unconfirmed: dict[str, int] = {}  # the deliveries Kafka gave up on since the last round, by cause
        self._unconfirmed_lock = threading.Lock()  # (librdkafka reports in whichever thread polls or flushes)

    # -- the txlog -----------------------------------------------------------------------------------------

    def recover(self) -> None:
        """Fold the whole stored txlog in (at start, before the ingest runs)."""
        started = time.monotonic()
        rows = self.book.fold_txlog(self.reader, time.time())
        log.info("%s: queues recovered from %d txlog rows in %.1f s: %s", self.cfg.name, rows,
                 time.monotonic() - started,
                 ", ".join(f"{name} {q['depth']} messages" for name, q in self.book.status(time.time()).items()))

    def committed(self, rows: pa.Table, requests: list[QueueRequest], first: int, last: int) -> None:
        """A txlog commit (seqs ``first..last``) with its rows (stored, in seq order; a commit's backfill parts
        stored as they are are not among them: those are read back) and the batch's subscribes."""
        with self._lock:
            if last >= first:
                whole = rows.num_rows == last - first + 1
                self._pending_rows.append((first, last, self.book.relevant(rows).select(COLUMNS) if whole else None))
            self._pending_requests.extend(requests)
        self._wake.set()

    def check(self, acks: list[tuple[str, str, str | None]]) -> list[str | None]:
        """Classify's question (:class:`replication.ingest.classify.QueueAcks`)."""
        with self._lock:
            self._take_rows()
            answers = self.book.check_acks(acks, self.manager)
        if acks:
            self._wake.set()  # (a good acknowledgement frees room in its consumer's backlog already)
        return answers

    def _take_rows(self) -> None:
        """Fold in the commits handed over (lock held); a commit this dispatcher missed is read from the txlog."""
        now = time.time()
        for first, last, rows in self._pending_rows:
            if rows is None or first > self.book.applied_seq + 1:
                upto = last if rows is None else first - 1
                for part in self.reader.read(self.book.applied_seq, upto):
                    self.book.apply(part.select(COLUMNS), now)
            if rows is not None and last > self.book.applied_seq:
                self.book.apply(rows.filter(pc.greater(rows["seq"], self.book.applied_seq)), now)
            self.book.applied_seq = max(self.book.applied_seq, last)
        self._pending_rows = []

    # -- the thread ------------------------------------------------------------------------------------------

    def start(self) -> QueueDispatcher:
        self._producer = self.delivery_producer()
        self._thread = threading.Thread(target=self._run, name=f"{self.cfg.name}-queues", daemon=True)
        self._thread.start()
        acknowledged = frozenset(q.name for q in self.cfg.queues if q.semantics == "at-least-once")
        if acknowledged:  # (an at-most-once queue takes no acknowledgement)
            self._watches = [AckWatch(self.cfg.name, t.topics, bootstrap=t.bootstrap_servers, security=t.security,
                                      queues=acknowledged, seen=self.seen_acks).start()
                             for t in self.cfg.kafka_transports]
        return self

    def delivery_producer(self) -> Any:
        """The producer of ``<instance>.deliveries``: a round hands it the deliveries and goes on (waiting for
        Kafka's confirmations was a pause between rounds); only a delivery Kafka gave up on (refused, or not
        confirmed within the shortest lease, :func:`delivery_timeout_ms`) is reported, to
        :meth:`report_undelivered`."""
        from confluent_kafka import Producer

        # librdkafka, not kafka-python: a delivery is one Kafka record, and kafka-python's encoding of each
        # (with its five headers) was most of the delivery thread's time (bench/queues.py)
        return Producer({"bootstrap.servers": ",".join(self._bootstrap), **self._security.librdkafka(),
                         "acks": "1", "linger.ms": 5, "enable.idempotence": False,
                         "message.send.max.retries": 5, "message.timeout.ms": self._delivery_timeout_ms,
                         # (a request in flight is bounded too: a broker that takes it late times out)
                         "request.timeout.ms": min(30_000, self._delivery_timeout_ms),
                         "delivery.report.only.error": True, "on_delivery": self._undelivered,
                         "logger": log})

    def seen_acks(self, acks: list[tuple[str, str, str]]) -> None:
        """Acknowledgements on Kafka not yet checked by the ingest (:mod:`.ack_watch`): room freed now."""
        with self._lock:
            freed = self.book.seen_acks(acks)
        if freed:
            self._wake.set()

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(TICK_S)
            self._wake.clear()
            try:
                self._round()
            except Exception:  # a delivery round that failed is tried again: nothing was taken from the queue
                log.exception("%s: queue delivery round failed", self.cfg.name)
                self._closed.wait(1.0)
            finally:
                self.report_undelivered()

    def _round(self) -> None:
        now = time.time()
        if self._proxied_file is not None and now - self._proxied_read >= PROXIED_READ_S:
            self._proxied_read = now
            saved = ProxiedTransfer.read(self._proxied_file)
            self.proxy_for(frozenset(saved.instances) if saved else frozenset())
        refusals: list[Refusal] = []
        with self._lock:
            self._take_rows()
            for request in self._pending_requests:
                refusal = self.book.request(request, now)
                if refusal is not None:
                    refusals.append(refusal)
            self._pending_requests = []
            self.book.expire(now, self._silent_after)
            grants, asks = self._transfers(now)
            rounds = self.book.dispatch(now)
        for refusal in refusals:
            log.warning("%s: refused %s's subscription: %s", self.cfg.name, refusal.client, refusal.reason)
            if self._refuse is not None:
                try:
                    self._refuse(refusal)
                except Exception as exc:  # telling the client must not undo the round's grants and deliveries
                    log.error("%s: the refusal of %s's subscription could not be sent: %s", self.cfg.name,
                              refusal.client, exc)
        for queue, bookmarks, to in grants:
            if not self._record(queue, TRANSFER, bookmarks, to) and to != self.cfg.name:
                with self._lock:  # (a proxied take-over stays: it is the owner's stand-in that delivers)
                    queue.ungrant(bookmarks)
        for queue, bookmarks in asks:
            self._record(queue, TRANSFER_REQUEST, bookmarks, self.cfg.name)
        for queue, deliveries in rounds:
            if queue.at_most_once:
                self._record_removal(queue, deliveries)
            else:
                self._send(queue, deliveries)
        with self._lock:
            stored = self.book.manager_stored
            ready = [(queue, deliveries) for seq, queue, deliveries in self._removals if seq <= stored]
            self._removals = [r for r in self._removals if r[0] > stored]
        for queue, deliveries in ready:
            self._send(queue, deliveries)

    def _transfers(self, now: float) -> tuple[list[tuple[QueueState, list[str], str]], list[tuple[QueueState,
                                                                                                  list[str]]]]:
        """(lock held) Answer the transfer requests stored since the last round, and find what to ask for:
        grants to record ``(queue, bookmarks, to)``, requests to record ``(queue, bookmarks)``. Messages of an
        owner this instance stands in for (proxied transfer) are taken at once, by a grant to itself."""
        grants = []
        for queue, bookmarks, to in self.book.requests:
            granted = queue.grant(bookmarks, to, now)
            if granted:
                log.info("%s: %s: granted %d messages to %s", self.cfg.name, queue.queue.name, len(granted), to)
                grants.append((queue, granted, to))
        self.book.requests = []
        asks = []
        for queue in self.book.queues.values():
            wanted = queue.wanted(now)
            proxied = [m.bookmark for m in wanted if m.owner in queue.proxy_for]
            if proxied:
                queue.transferred(proxied, self.cfg.name, now)
                grants.append((queue, proxied, self.cfg.name))
            asked = [m.bookmark for m in wanted if m.owner not in queue.proxy_for]
            if asked:
                queue.transfers_requested += len(asked)
                asks.append((queue, asked))
        return grants, asks

    def _record(self, queue: QueueState, command: str, bookmarks: list[str], to: str) -> bool:
        """Record a transfer request or grant in the txlog (it replicates wherever the queue does)."""
        try:
            self._manager_publisher().publish(queue.queue.name, transfer_body(bookmarks, to), command=command)
            return True
        except Exception as exc:
            log.error("%s: %s of %d messages of %s could not be recorded: %s", self.cfg.name, command,
                      len(bookmarks), queue.queue.name, exc)
            return False

    def proxy_for(self, instances: frozenset[str]) -> None:
        """Take over the messages of these instances (``replication queue --enable-proxied-transfer``)."""
        with self._lock:
            for queue in self.book.queues.values():
                if queue.proxy_for != instances:
                    for added in sorted(instances - queue.proxy_for):
                        log.warning("%s: %s: proxied transfer enabled for %s: its messages are delivered here. "
                                    "A message it delivered before it went down may be delivered twice if it "
                                    "comes back, or if another instance also stands in for it", self.cfg.name,
                                    queue.queue.name, added)
                    queue.proxy_for = instances

    def _record_removal(self, queue: QueueState, deliveries: list[Delivery]) -> None:
        """Record the at-most-once removal of ``deliveries``; they are sent once it is stored. If it cannot be
        sent at all, they go back to the queue."""
        try:
            publisher = self._manager_publisher()
            seq = publisher.sow_delete(queue.queue.name, keys=[d.message.bookmark for d in deliveries])
        except Exception as exc:
            log.error("%s: the removal of %d at-most-once messages of %s could not be sent (%s); they stay queued",
                      self.cfg.name, len(deliveries), queue.queue.name, exc)
            with self._lock:
                queue.undo(deliveries)
            return
        with self._lock:
            self._removals.append((seq, queue, deliveries))

    def _manager_publisher(self) -> Publisher:
        from replication.client.publisher import Publisher

        if self._publisher is None:  # (logs on: the ingest must be running, so not before the first delivery)
            transport = self.cfg.kafka_transports[0]
            self._publisher = Publisher(self.manager, bootstrap=",".join(transport.bootstrap_servers),
                                        topic=transport.topics[0], instance=self.cfg.name,
                                        message_type=None, security=transport.security)
        return self._publisher

    def _send(self, queue: QueueState, deliveries: list[Delivery]) -> None:
        topic = deliveries_topic(self.cfg.name)
        if not self._partitions:
            self._partitions = partition_count(self._producer, topic)  # (fixed while it runs: consumers hash alike)
            if not self._partitions:
                raise ReplicationError(f"{self.cfg.name}: the deliveries topic {topic} is not in Kafka's metadata "
                                       "with its partitions; retrying")
        name, instance = (HEADER_TOPIC, queue.queue.name.encode()), (HEADER_INSTANCE, self.cfg.name.encode())
        # (a round's deliveries share their lease's end and have few consumers and underlying topics: each
        # such header and partition is worked out once per round, not once per delivery)
        expiries: dict[float, tuple[str, bytes]] = {}
        underlying: dict[str, tuple[str, bytes]] = {}
        consumers: dict[str, tuple[bytes, int]] = {}
        for client, message, lease_expires in deliveries:
            expires = expiries.get(lease_expires)
            if expires is None:
                expires = expiries[lease_expires] = (HEADER_LEASE_EXPIRES, str(int(lease_expires * 1000)).encode())
            source = underlying.get(message.topic)
            if source is None:
                source = underlying[message.topic] = (HEADER_UNDERLYING_TOPIC, message.topic.encode())
            consumer = consumers.get(client)
            if consumer is None:
                consumer = consumers[client] = (client.encode(), delivery_partition(client, self._partitions))
            headers = [name, (HEADER_BOOKMARK, message.bookmark.encode()), source, expires, instance]
            while True:
                try:
                    self._producer.produce(topic, value=message.data, key=consumer[0], headers=headers,
                                           partition=consumer[1])
                    break
                except BufferError:  # its local queue is full (Kafka away): let it send some, unless stopping
                    if self._closed.is_set():  # (the queue's state ends with the instance; a restart rebuilds it)
                        return
                    self._producer.poll(0.1)

    def _undelivered(self, error: Any, _record: Any) -> None:
        """(librdkafka's report, for a delivery it gave up on; called from ``poll`` or ``flush``.)"""
        with self._unconfirmed_lock:
            self._unconfirmed[str(error)] = self._unconfirmed.get(str(error), 0) + 1

    def report_undelivered(self) -> None:
        """Log the deliveries Kafka gave up on since the last round, one line per cause. A lease that runs out
        brings each message back; an at-most-once delivery is lost, as it may be."""
        if self._producer is not None:
            self._producer.poll(0)
        with self._unconfirmed_lock:
            counts, self._unconfirmed = self._unconfirmed, {}
        for error, count in counts.items():
            log.warning("%s: %d deliveries not confirmed by Kafka: %s", self.cfg.name, count, error)

    # -- status and stop -------------------------------------------------------------------------------------

    def oldest(self) -> dict[str, int | None]:
        """Per queue, the seq of its oldest message not yet acknowledged here (None: none), commits handed over
        included; an at-most-once delivery waiting for its removal to be stored holds it too."""
        with self._lock:
            self._take_rows()
            oldest = {name: q.oldest_seq() for name, q in self.book.queues.items()}
            for _seq, queue, deliveries in self._removals:
                first = min(d.message.seq for d in deliveries)
                held = oldest.get(queue.queue.name)
                oldest[queue.queue.name] = first if held is None else min(held, first)
            return oldest

    def status(self) -> dict[str, dict]:
        with self._lock:
            return self.book.status(time.time())

    def stop(self) -> None:
        for watch in self._watches:
            watch.stop()
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._publisher is not None:
            self._publisher.close()
        if self._thread is not None and self._thread.is_alive():  # (stuck past the join: it keeps the producer)
            log.warning("%s: the queue delivery thread did not stop within 10 s", self.cfg.name)
            return
        if self._producer is not None:
            left = self._producer.flush(5)
            self.report_undelivered()
            if left:
                log.warning("%s: %d deliveries not handed to Kafka at stop (at-most-once ones are lost)",
                            self.cfg.name, left)
            self._producer = None  # (librdkafka's client ends with its last reference)
