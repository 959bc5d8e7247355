"""The Python publisher: sequence numbers, a durable publish store, persisted acks, logon recovery.

Example::

    from replication.client import Publisher

    with Publisher("orders-feed", bootstrap="127.0.0.1:9092", topic="amps-1.publish",
                   instance="amps-1", store_path="orders-feed.store") as pub:
        seq = pub.publish("/orders", b'{"id": 1, "qty": 500}')
        refused = pub.flush(timeout=30)   # every message persisted or refused (returned), else TimeoutError

How it stays exactly-once across crashes: each message is written to the
on-disk store (SQLite, WAL) before it is sent, and deleted only when the
instance's persisted ack covers it. On start, the publisher *logs on*: it sends
a ``logon`` record and the instance answers with the highest sequence it
persisted for this client name; stored messages above it are re-sent, the
rest dropped, and numbering continues after it. The instance drops any copy
it already has, so a resend can never duplicate.

A message the instance rejects (no such topic, a body that does not parse, a
SOW record without its key) is answered with a failure ack: the message leaves
the store (resending it would fail the same way), ``flush()`` returns it among
its :class:`FailedMessage` list, and the publisher goes on with the next
sequence number.

Each publisher object is one session (header ``amps-session``). Two publishers
using one client name at once is an error, as in AMPS: when the instance sees
an earlier session still publishing after a later one logged on, it answers
the later one with a failure ack, and that publisher's ``publish()`` and
``flush()`` raise :class:`ReplicationError` naming the clash.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

from replication import failpoints
from replication.connectors.kafka.librdkafka import partition_count, produce_waiting, take_waiting
from replication.connectors.kafka.security import PLAINTEXT, KafkaSecurity
from replication.durability import acks_topic
from replication.errors import ReplicationError
from replication.messages import (
    HEADER_CLIENT,
    HEADER_COMMAND,
    HEADER_FILTER,
    HEADER_SEQ,
    HEADER_SESSION,
    HEADER_SOW_KEY,
    HEADER_SOW_KEYS,
    HEADER_TOPIC,
    HEADER_TYPE,
    LOGON,
)

log = logging.getLogger(__name__)

#: The ack consumer's fetch wait: Kafka answers a waiting fetch as soon as an ack arrives, so this is only
#: how long an idle fetch is held. Kafka's default; 5 ms (a workaround for a broker that held fetches the
#: whole wait) had each idle publisher cost 0.18 of a core and the broker 0.37 for the same ack latency.
ACK_FETCH_WAIT_MS = 500
#: How long the producer waits for more messages before it sends a request (Kafka's own default since 4.0).
#: Each request costs the publisher and the broker alike: publishing 2k msg/s to one instance, 5 ms instead of
#: 2 took the publisher from 0.49 to 0.42 of a core and the broker from 0.31 to 0.21, for ~4 ms more
#: waiting at most (bench/replicate.py --linger-ms compares latencies).
LINGER_MS = 5
#: How long the producer keeps retrying a send while the broker is away (a week: it gives up only on an error
#: no retry mends, which ``flush()`` raises).
SEND_TIMEOUT_MS = 7 * 24 * 3600 * 1000


class SendRefused(Exception):
    """What the Kafka client said about a send it gave up on (its text and its error code)."""

    def __init__(self, err: Any) -> None:
        super().__init__(f"{err.str()} ({err.name()})")


class FailedMessage(NamedTuple):
    """A message the instance refused to persist: its sequence number, topic and the instance's reason."""

    seq: int
    topic: str
    reason: str


class PublishStore:
    """Unacknowledged messages on disk, in sequence order."""

    def __init__(self, path: str | Path | None) -> None:
        self._db = sqlite3.connect(str(path) if path else ":memory:", check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS messages (seq INTEGER PRIMARY KEY, topic TEXT NOT NULL, "
            "message_type TEXT, command TEXT NOT NULL, data BLOB NOT NULL, stored_at REAL NOT NULL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(messages)")}
        if "headers" not in columns:  # a store written before SOW headers existed
            self._db.execute("ALTER TABLE messages ADD COLUMN headers TEXT")
        self._lock = threading.Lock()

    def add(self, seq: int, topic: str, data: bytes, message_type: str | None, command: str,
            headers: dict[str, str] | None = None) -> None:
        # One statement, its own transaction: the highest sequence ever stored is the messages' own highest
        # until a discard removes it, which records it in meta first (a second statement here, updating meta
        # on every message, made each add take twice as long: 31 against 14 us).
        with self._lock:
            self._db.execute(
                "INSERT INTO messages (seq, topic, message_type, command, data, stored_at, headers) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (seq, topic, message_type, command, data, time.time(), json.dumps(headers) if headers else None),
            )

    def discard_through(self, seq: int) -> None:
        with self._lock:
            self._discard("seq <= ?", seq)

    def discard(self, seq: int) -> str | None:
        """Drop one message (the instance refused it); its topic, None when it was not in the store."""
        with self._lock:
            row = self._db.execute("SELECT topic FROM messages WHERE seq = ?", (seq,)).fetchone()
            self._discard("seq = ?", seq)
        return row[0] if row else None

    def _discard(self, where: str, seq: int) -> None:
        """Delete the messages ``where`` selects, the highest sequence stored kept in meta in the same
        transaction (:meth:`last_seq` must not go back when the newest message is discarded)."""
        self._db.execute("BEGIN")
        try:
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('last_seq', max(?, "
                             "(SELECT coalesce(max(value), 0) FROM meta WHERE key = 'last_seq'), "
                             "(SELECT coalesce(max(seq), 0) FROM messages)))", (seq,))
            self._db.execute(f"DELETE FROM messages WHERE {where}", (seq,))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def unacknowledged(self) -> list[tuple[int, str, str | None, str, bytes, dict[str, str]]]:
        """``(seq, topic, message_type, command, data, headers)`` of each message not yet acknowledged."""
        with self._lock:
            rows = list(self._db.execute(
                "SELECT seq, topic, message_type, command, data, headers FROM messages ORDER BY seq"))
        return [(*row[:5], json.loads(row[5]) if row[5] else {}) for row in rows]

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]

    def oldest_stored_at(self) -> float | None:
        with self._lock:
            return self._db.execute("SELECT MIN(stored_at) FROM messages").fetchone()[0]

    def last_seq(self) -> int:
        """The highest sequence number this store has ever held."""
        with self._lock:
            row = self._db.execute("SELECT max(coalesce((SELECT max(value) FROM meta WHERE key = 'last_seq'), 0), "
                                   "coalesce((SELECT max(seq) FROM messages), 0))").fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


class Publisher:
    """A highly available publisher to one instance (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        bootstrap: str,
        topic: str,
        instance: str,
        store_path: str | Path | None = None,
        message_type: str | None = None,
        logon_timeout: float = 60.0,
        resend_after: float = 10.0,
        compression: str | None = "zstd",
        security: KafkaSecurity = PLAINTEXT,
        linger_ms: int = LINGER_MS,
    ) -> None:
        """``security``: TLS and SASL toward the brokers (:class:`~replication.connectors.kafka.security.KafkaSecurity`;
        an instance config's transport has it: ``cfg.kafka_transports[0].security``). ``linger_ms``: how long a
        message may wait for others to share its request (0: send each at once, for the lowest latency at a
        low rate; more: fewer, larger requests, less CPU on both sides at a high rate). ``logon_timeout``: seconds
        to wait for the instance: its acks topic (made when it starts), then the answer to the logon."""
        from confluent_kafka import Consumer, KafkaException, Producer

        self.name = name
        self.topic = topic
        self.instance = instance
        self.message_type = message_type
        self.resend_after = resend_after
        self.store = PublishStore(store_path)
        # Gapless, in order: the instance keeps one sequence number per client, so a message lost while a later
        # one arrives would be taken for a duplicate when resent. The idempotent producer (all acks) keeps
        # order through retries, and a send is retried until the broker is back (the store holds it anyway).
        # librdkafka, not kafka-python: kafka-python's encoding and its network thread took ~4 times the CPU
        # per message, on the cores the publisher's own application (and often the instance) needs.
        self._producer = Producer({
            "bootstrap.servers": bootstrap, **security.librdkafka(), "acks": "all", "enable.idempotence": True,
            "linger.ms": linger_ms, "compression.type": compression or "none", "message.timeout.ms": SEND_TIMEOUT_MS,
            "delivery.report.only.error": True, "on_delivery": self._request_failed,
            "error_cb": self._client_error, "logger": log,
        })
        self._key = name.encode()
        self._client_refusal = KafkaException
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap, **security.librdkafka(),
            # (assigned, never subscribed: the id only names the client, no group is joined)
            "group.id": f"publisher-{name}", "enable.auto.commit": False, "enable.partition.eof": False,
            "fetch.wait.max.ms": ACK_FETCH_WAIT_MS, "logger": log,
        })
        self._cond = threading.Condition()
        self._persisted = 0
        self._failed: dict[int, FailedMessage] = {}
        """Messages the instance refused, not yet returned by ``flush()``."""
        self._refused_seqs: set[int] = set()
        """Every refused sequence above the persisted one (kept past ``flush()``: they count as answered)."""
        self.session = uuid.uuid4().hex
        """This publisher's session: the instance tells two publishers of one name apart by it."""
        self._clash: str | None = None
        """Why the instance refused this session's use of the name (another publisher holds it)."""
        self._send_error: tuple[int, BaseException] | None = None
        """The lowest sequence whose send failed for good, and why."""
        self.refused_subscriptions: dict[str, str] = {}
        """Queue topic -> why the instance refused this client's subscription to it (see :meth:`send_command`)."""
        self._logon_replies: dict[str, tuple[int, int]] = {}
        """correlation id -> (persisted, stored) sequence the instance answered."""
        self._closed = threading.Event()
        self.resent: list[int] = []
        """Sequence numbers re-sent by logons, in order (for operators and tests)."""
        # An instance starting beside its publisher may not have made its acks topic yet: the wait for
        # it is part of the logon's time (a cold Spark start on a busy machine can take over 30 s).
        logon_deadline = time.monotonic() + logon_timeout
        self._attach_acks_topic(logon_timeout)
        self._listener = threading.Thread(target=self._listen, name=f"{name}-acks", daemon=True)
        self._listener.start()
        self._sender = threading.Thread(target=self._serve_sends, name=f"{name}-sends", daemon=True)
        self._sender.start()
        # (at least 10 s for the answer, as the topic's wait can overrun its deadline by a metadata timeout)
        self.last_logon_seq = self.logon(timeout=max(min(logon_timeout, 10.0), logon_deadline - time.monotonic()))
        self._next_seq = max(self.last_logon_seq, self.store.last_seq()) + 1
        self._watchdog = threading.Thread(target=self._watch, name=f"{name}-resend", daemon=True)
        self._watchdog.start()

    # -- public API ---------------------------------------------------------
    @property
    def persisted_seq(self) -> int:
        """Highest sequence the instance has acknowledged as persisted."""
        with self._cond:
            return self._persisted

    def publish(self, topic: str, data: bytes | str, *, command: str = "publish", message_type: str | None = None,
                sow_key: str | None = None) -> int:
        """Store then send one message; returns its sequence number.

        ``sow_key``: the record's key, for a SOW topic defined with no ``<Key>`` (header ``amps-sow-key``).
        """
        headers = {HEADER_SOW_KEY: sow_key} if sow_key is not None else {}
        return self._publish(topic, data, command, message_type, headers)

    def delta_publish(self, topic: str, data: bytes | str, *, message_type: str | None = None,
                      sow_key: str | None = None) -> int:
        """Publish only the fields that change: the instance merges them into the key's current record."""
        return self.publish(topic, data, command="delta_publish", message_type=message_type, sow_key=sow_key)

    def sow_delete(self, topic: str, *, keys: list[str] | None = None, filter: str | None = None,
                   data: bytes | str | None = None, message_type: str | None = None) -> int:
        """Remove records of a SOW topic: by ``keys`` (as shown in ``sow_key``), by content ``filter``
        (``"1=1"``: all), or by ``data`` (a message holding the key fields). Exactly one of the three."""
        if sum(x is not None for x in (keys, filter, data)) != 1:
            raise ValueError("sow_delete takes exactly one of keys=, filter= or data=")
        headers = {}
        if keys is not None:
            headers[HEADER_SOW_KEYS] = ",".join(keys)
        if filter is not None:
            headers[HEADER_FILTER] = filter
        return self._publish(topic, data if data is not None else b"", "sow_delete", message_type, headers)

    def send_command(self, command: str, topic: str, body: bytes = b"") -> None:
        """Send a command the instance answers but never stores (a queue ``subscribe`` or ``unsubscribe``):
        no sequence number, not kept in the store. A refusal lands in :attr:`refused_subscriptions`."""
        self._raise_clash()
        headers = [(HEADER_CLIENT, self.name.encode()), (HEADER_TOPIC, topic.encode()),
                   (HEADER_SESSION, self.session.encode()), (HEADER_COMMAND, command.encode())]
        self._produce(body, headers)
        self._producer.flush(30)

    @property
    def clash(self) -> str | None:
        """Why the instance refused this publisher's use of its name (another publisher holds it), else None."""
        with self._cond:
            return self._clash

    def _publish(self, topic: str, data: bytes | str, command: str, message_type: str | None,
                 headers: dict[str, str]) -> int:
        body = data.encode() if isinstance(data, str) else data
        self._raise_clash()
        with self._cond:
            seq = self._next_seq
            self._next_seq += 1
        self.store.add(seq, topic, body, message_type or self.message_type, command, headers)
        failpoints.hit("publisher.before_send")
        self._send(seq, topic, message_type or self.message_type, command, body, headers)
        return seq

    def flush(self, timeout: float = 60.0) -> list[FailedMessage]:
        """Wait until the instance has answered every published message: persisted, or refused.

        Returns the messages it refused since the last ``flush()`` (empty when every one was persisted), in
        sequence order. TimeoutError if not answered within ``timeout``; :class:`ReplicationError` when a
        message could not be sent."""
        deadline = time.monotonic() + timeout
        self._producer.flush(timeout)  # (a send that failed is reported by its delivery callback, raised below)
        self.wait_persisted(self._next_seq - 1, timeout=max(0.0, deadline - time.monotonic()))
        with self._cond:
            failed = sorted(self._failed.values())
            self._failed.clear()
        return failed

    def wait_persisted(self, seq: int, timeout: float = 60.0) -> None:
        """Wait until every message through ``seq`` is persisted or refused (see :meth:`flush`)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._answered() < seq:
                self._raise_clash()
                if self._send_error is not None:
                    failed, exc = self._send_error
                    raise ReplicationError(
                        f"publisher {self.name}: message {failed} could not be sent to {self.topic}: {exc}. "
                        "It stays in the publish store; fix the cause and start the publisher again (its logon "
                        "resends what the instance lacks)")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"publisher {self.name}: sequence {seq} not persisted by {self.instance} within {timeout}s "
                        f"(persisted through {self._persisted})"
                    )
                self._cond.wait(min(left, 0.5))

    def _answered(self) -> int:
        """The highest sequence through which every message is persisted or refused (hold ``_cond``)."""
        through = self._persisted
        while through + 1 in self._refused_seqs:
            through += 1
        return through

    def logon(self, timeout: float = 60.0, *, resend_stored: bool = True) -> int:
        """Ask the instance for the last sequence it persisted for this name; resend what is missing.

        Everything above the persisted sequence is resent (the instance drops
        what it has), as after a reconnect. ``resend_stored=False`` resends only
        what the instance never received: messages it stored but has not yet
        persisted (waiting for a sync destination) stay in the store until
        their ack comes. Returns the persisted sequence.
        """
        correlation = uuid.uuid4().hex
        deadline = time.monotonic() + timeout
        with self._cond:
            while correlation not in self._logon_replies:
                self._produce(correlation.encode(), [(HEADER_CLIENT, self.name.encode()),
                                                     (HEADER_COMMAND, LOGON.encode()),
                                                     (HEADER_SESSION, self.session.encode())])
                self._producer.flush(10)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ReplicationError(
                        f"publisher {self.name}: no logon reply from instance {self.instance} on topic "
                        f"{acks_topic(self.instance)} within {timeout:.0f} s; is the instance running and reading "
                        f"{self.topic}?"
                    )
                self._cond.wait(min(left, 5.0))
            persisted, stored = self._logon_replies.pop(correlation)
            self._persisted = max(self._persisted, persisted)
        self.store.discard_through(persisted)
        for seq, topic, message_type, command, data, headers in self.store.unacknowledged():
            if resend_stored or seq > stored:
                self._send(seq, topic, message_type, command, data, headers)
                self.resent.append(seq)
        self._producer.flush(30)
        log.info("publisher %s: logged on to %s, persisted through %d", self.name, self.instance, persisted)
        return persisted

    def close(self) -> None:
        self._closed.set()
        self._watchdog.join(timeout=self.resend_after + 5)  # it may be in a logon: let it end first
        try:
            self._producer.flush(10)
        finally:
            self._sender.join(timeout=5)
            self._producer.close()
            self._listener.join(timeout=5)
            self._consumer.close()
            self.store.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- internals ----------------------------------------------------------
    def _send(self, seq: int, topic: str, message_type: str | None, command: str, body: bytes,
              extra: dict[str, str]) -> None:
        headers = [(HEADER_CLIENT, self.name.encode()), (HEADER_SEQ, str(seq).encode()), (HEADER_TOPIC, topic.encode()),
                   (HEADER_SESSION, self.session.encode())]
        if command != "publish":
            headers.append((HEADER_COMMAND, command.encode()))
        if message_type:
            headers.append((HEADER_TYPE, message_type.encode()))
        headers.extend((key, value.encode()) for key, value in extra.items())
        try:
            self._produce(body, headers, partial(self._delivery_failed, seq))
        except self._client_refusal as exc:  # refused before it left (larger than the client sends)
            self._send_failed(seq, SendRefused(exc.args[0]))

    def _produce(self, value: bytes, headers: list[tuple[str, bytes]], failed: Any = None) -> None:
        """Hand one record to the client; ``failed(err, message)`` is called if it cannot be delivered."""
        extra = {"on_delivery": failed} if failed is not None else {}
        produce_waiting(self._producer, self.topic, key=self._key, value=value, headers=headers, **extra)

    def _serve_sends(self) -> None:
        """Serve the client's callbacks (failed sends, errors, logs) until the publisher closes."""
        while not self._closed.is_set():
            self._producer.poll(0.1)

    def _delivery_failed(self, seq: int, err: Any, message: Any) -> None:
        """librdkafka's report of a message it could not deliver (it reports only those). The broker refuses a
        batch whole: each message of it is reported, and ``flush`` names the lowest."""
        if err is not None:
            self._send_failed(seq, SendRefused(err))

    def _request_failed(self, err: Any, message: Any) -> None:
        """The same for a logon or a queue command: its caller waits for the answer, and asks again."""
        if err is not None:
            log.warning("publisher %s: a request to %s could not be sent: %s", self.name, self.topic,
                        SendRefused(err))

    def _client_error(self, err: Any) -> None:
        """An error of the Kafka client itself. A broker away is retried (and logged); a fatal one ends sending."""
        if not err.fatal():
            log.info("publisher %s: Kafka: %s", self.name, SendRefused(err))
            return
        with self._cond:
            seq = self._answered() + 1
        self._send_failed(seq, SendRefused(err))

    def _send_failed(self, seq: int, exc: BaseException) -> None:
        """A send that no retry mends (a message too large, no right to write the topic): ``flush`` raises it."""
        with self._cond:
            if self._send_error is None or seq < self._send_error[0]:
                self._send_error = (seq, exc)
            self._cond.notify_all()

    def _attach_acks_topic(self, timeout: float) -> None:
        from confluent_kafka import TopicPartition

        topic = acks_topic(self.instance)
        deadline = time.monotonic() + timeout
        while True:
            try:
                parts = partition_count(self._consumer, topic, timeout=10)
                # Acks already on the topic are older than this session: start at its end, resolved now
                # (before the logon goes out, so its reply is read)
                ends = [self._consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                        for p in range(parts)]
            except Exception as exc:  # (the broker not answering yet: confluent_kafka.KafkaException)
                parts, ends, why = 0, [], f"Kafka did not answer ({exc})"
            else:
                why = f"topic {topic} does not exist; start instance {self.instance} first"
            if parts:
                break
            if time.monotonic() > deadline:
                raise ReplicationError(f"publisher {self.name}: {why}")
            time.sleep(0.2)
        self._consumer.assign([TopicPartition(topic, p, end) for p, end in enumerate(ends)])

    def _listen(self) -> None:
        me = self._key
        while not self._closed.is_set():
            try:
                records = take_waiting(self._consumer, 0.1)
            except Exception:  # a broker hiccup: keep listening
                log.exception("publisher %s: ack poll failed", self.name)
                time.sleep(0.5)
                continue
            latest = None
            for record in records:
                if record.error() is not None or record.key() != me:
                    continue
                value = record.value() or b""
                try:
                    seq = self._take_ack(json.loads(value))
                except Exception:  # one bad record must not end the listener (flush would wait for ever)
                    log.exception("publisher %s: an ack it cannot read: %r", self.name, value[:200])
                    continue
                if seq is not None:
                    latest = max(latest or 0, seq)
            if latest is not None:
                with self._cond:
                    advanced = latest > self._persisted
                    self._persisted = max(self._persisted, latest)
                    self._refused_seqs = {s for s in self._refused_seqs if s > self._persisted}
                    self._cond.notify_all()
                if advanced:
                    self.store.discard_through(latest)

    def _take_ack(self, ack: dict) -> int | None:
        """One record of the acks topic for this name; the persisted position it carries, if any."""
        if "subscribe" in ack:  # a queue subscription refused (it carries no sequence number)
            with self._cond:
                self.refused_subscriptions[str(ack["subscribe"])] = str(ack.get("reason", ""))
                self._cond.notify_all()
            return None
        if ack.get("status") == "failure" and "session" in ack:
            if ack["session"] == self.session:
                self._clashed(str(ack.get("reason", "")))
            return None
        if ack.get("status") == "failure":
            self._refused(int(ack["seq"]), str(ack.get("reason", "")))
            return None
        seq = int(ack["seq"])
        if ack.get("logon"):
            with self._cond:
                self._logon_replies[ack.get("correlation_id", "")] = (seq, int(ack.get("stored", seq)))
                self._cond.notify_all()
        return seq

    def _clashed(self, reason: str) -> None:
        log.error("publisher %s: %s refused this session: %s", self.name, self.instance, reason)
        with self._cond:
            self._clash = reason
            self._cond.notify_all()

    def _raise_clash(self) -> None:
        if self._clash is not None:
            raise ReplicationError(f"publisher {self.name}: instance {self.instance} refused this publisher: "
                                   f"{self._clash}")

    def _refused(self, seq: int, reason: str) -> None:
        """A failure ack: the message leaves the store (a resend would fail alike) and ``flush()`` reports it."""
        topic = self.store.discard(seq)
        if topic is None and seq <= self._persisted:
            return  # an answer to a copy of a message persisted already
        log.warning("publisher %s: %s refused message %d: %s", self.name, self.instance, seq, reason)
        with self._cond:
            self._failed[seq] = FailedMessage(seq, topic or "", reason)
            self._refused_seqs.add(seq)
            self._cond.notify_all()

    def _watch(self) -> None:
        """Log on again and resend when acks stop coming (instance restarted, connection lost).

        Only what the instance never received is resent: acks that stall
        because a sync destination is away must not make the publisher send
        its whole store again every few seconds.
        """
        from confluent_kafka import KafkaException

        last_progress = (self.persisted_seq, time.monotonic())
        while not self._closed.wait(1.0):
            if self.clash is not None:
                return  # refused: logging on again would take the name back from the publisher that holds it
            persisted = self.persisted_seq
            if persisted != last_progress[0]:
                last_progress = (persisted, time.monotonic())
                continue
            oldest = self.store.oldest_stored_at()
            if oldest is None or time.time() - oldest < self.resend_after:
                continue
            if time.monotonic() - last_progress[1] < self.resend_after or self._closed.is_set():
                continue
            try:
                self.logon(timeout=self.resend_after, resend_stored=False)
            except ReplicationError as exc:
                log.warning("%s", exc)
            except KafkaException as exc:  # the broker is away: try again at the next stall
                if self._closed.is_set():
                    return
                log.warning("publisher %s: logon to %s failed (%s); retrying", self.name, self.instance, exc)
            except Exception:  # the producer closed under us: close() is in progress
                if not self._closed.is_set():
                    raise
            last_progress = (self.persisted_seq, time.monotonic())
