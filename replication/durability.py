"""When a message counts as persisted, and telling its publisher and its upstream (DESIGN §5, §7).

A committed row is durable once no sync destination (not downgraded) still
waits to acknowledge it; with no sync destinations, at once. Persisted acks go
to the Kafka topic ``<instance>.acks``: key = client name, value = JSON
``{"client", "seq", "instance"}`` where ``seq`` is the highest persisted
publisher sequence. A logon is answered on the same topic with
``"logon": true``, the publisher's ``correlation_id`` and ``stored``, the
highest sequence of the client in the txlog (persisted or still waiting for
sync destinations): a publisher need not resend what is stored.

A publish the instance rejects (it is in ``rejected/`` with its reason) is
answered at once with a failure ack on the same topic: ``{"client", "seq",
"instance", "status": "failure", "reason"}``. It is final (the message will
never be persisted), so it waits for no destination; the publisher drops the
message from its store and ``flush()`` reports it. Persisted acks stay
cumulative over the messages that were stored: a persisted ``seq`` above a
failed one does not make the failed one persisted. A failure ack lost in a
crash between the batch's commit and the ack is not sent again; the rejected
row and its reason stay in ``rejected/``.

Acknowledgements to upstreams (``_control/acks/<upstream>.json``) are per row:
a prefix ``seq`` plus ``runs`` of the upstream's seqs above it (see
:class:`~replication.storage.control.Ack`). Why per row: in a ring of sync
links (A -> B -> C -> A) each instance's rows from its upstream wait for its
own downstream, whose acknowledgement waits for rows *it* received, and so on
round the ring. With a prefix only, one waiting row holds back every later
row from that upstream, including rows the ring needs acknowledged first, and
under steady publishing at every instance the three prefixes wait on each
other for ever. Each row's own wait follows its own path, which the loop rule
keeps acyclic, so per-row acknowledgements always make progress.

A copy the ingest drops as a duplicate (the original came another way) is
acknowledged once the original is *handed* to every sync destination (not
downgraded) it goes to, that is, written to their inboxes (their storage),
not once they acknowledge it. Waiting for their acknowledgement would make
acknowledgements wait in a circle wherever sync partners each receive the
same message from outside and forward it to each other (three instances in
a ring fed by an upstream tier, say): each one's acknowledgement of the
other's copy would wait for the next one's. Handing over depends on nothing
but the replicators' progress, so it cannot close a circle, and the message
is in the txlog here and in the storage of each sync destination.

Ages: each committed batch's time is kept until no destination waits for it,
so every link (sync or async, downgraded or not) has an age, the time since
the oldest row it has not acknowledged was committed: the downgrade action's
measure and ``lag_seconds`` in the status.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.compute as pc

from replication import failpoints
from replication.connectors.kafka.librdkafka import produce_waiting
from replication.connectors.kafka.security import PLAINTEXT, KafkaSecurity
from replication.queues.wire import Refusal, refusal_ack
from replication.storage.control import Ack, DurableState
from replication.txlog.runs import Runs, run_bounds, runs_by_value

if TYPE_CHECKING:
    import pyarrow as pa

    from replication.destination.link import Link
    from replication.ingest.classify import Classified, Logon
    from replication.storage.layout import StorageLayout

log = logging.getLogger(__name__)

#: At most this many runs above the prefix in an ack file (the lowest ones; the rest are acknowledged later).
MAX_ACK_RUNS = 1000
#: Batch times kept for ages; beyond it the older half is thinned (ages of old rows are then rounded up).
MAX_TIMELINE = 50_000


def acks_topic(instance: str) -> str:
    return f"{instance}.acks"


#: How long a send of acks may take before the step that sends them fails (it is retried by the next one).
ACK_FLUSH_TIMEOUT_S = 30.0


class AckSender:
    """Publishes persisted acks and logon replies for one instance.

    Each send waits until Kafka has the acks (a failure ack must be on the topic before a later persisted
    ack). librdkafka, not kafka-python: the send and its wait sit on every persisted ack's path, and cost
    the driver's CPU per batch."""

    def __init__(self, instance: str, bootstrap_servers: Iterable[str], security: KafkaSecurity = PLAINTEXT) -> None:
        from confluent_kafka import Producer

        self.instance = instance
        self.topic = acks_topic(instance)
        self._producer = Producer({
            "bootstrap.servers": ",".join(bootstrap_servers), **security.librdkafka(), "acks": "1",
            "linger.ms": 0, "enable.idempotence": False, "message.send.max.retries": 5,
            "delivery.report.only.error": True, "on_delivery": self._undelivered, "logger": log,
        })

    def send(self, acks: dict[str, int], logons: list[Logon], persisted: dict[str, int],
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
            self._flush()

    def send_failures(self, failures: list[Failure]) -> None:
        """Failure acks for publishes the instance rejected (final: nothing waits for them)."""
        for failure in failures:
            self._send(failure.client, {"client": failure.client, "seq": failure.seq, "instance": self.instance,
                                        "status": "failure", "reason": failure.reason})
        if failures:
            self._flush()

    def send_clash(self, client: str, session: str, reason: str) -> None:
        """A failure ack to one session of ``client``: its logon took a name another publisher still uses."""
        self._send(client, {"client": client, "seq": 0, "session": session, "instance": self.instance,
                            "status": "failure", "logon": True, "reason": reason})
        self._flush()

    def send_refusal(self, refusal: Refusal) -> None:
        """A queue subscription refused (:mod:`replication.queues.wire`): the client is told why."""
        self._produce(refusal.client, refusal_ack(refusal, self.instance))
        self._flush()

    def _send(self, client: str, value: dict) -> None:
        self._produce(client, json.dumps(value, separators=(",", ":")).encode())

    def _produce(self, client: str, value: bytes) -> None:
        produce_waiting(self._producer, self.topic, key=client.encode(), value=value)

    def _flush(self) -> None:
        left = self._producer.flush(ACK_FLUSH_TIMEOUT_S)
        if left:
            raise TimeoutError(f"{left} ack(s) not taken by Kafka on {self.topic} within {ACK_FLUSH_TIMEOUT_S:.0f}s; "
                               "they are sent again as publishers log on")

    def _undelivered(self, err: object, message: object) -> None:
        if err is not None:  # the publisher's logon asks again for what it lacks
            log.warning("%s: an ack could not be sent to %s: %s", self.instance, self.topic, err)

    def close(self) -> None:
        self._producer.flush(5)
        self._producer.close()


@dataclass(frozen=True)
class Failure:
    """A publish rejected here: its client, its sequence number and why."""

    client: str
    seq: int
    reason: str


def failures_in(rejected: pa.Table) -> list[Failure]:
    """The rejected rows a publisher can be told about: published here (not replicated), with a client name
    and a sequence number."""
    if rejected.num_rows == 0:
        return []
    rows = rejected.filter(pc.fill_null(pc.equal(rejected["source"], "kafka"), False))
    out = []
    for client, seq, reason in zip(rows["publisher"].to_pylist(), rows["publisher_seq"].to_pylist(),
                                   rows["reason"].to_pylist(), strict=True):
        if client and seq and seq.isascii() and seq.isdigit() and len(seq) <= 18:
            out.append(Failure(client, int(seq), reason))
    return out


@dataclass
class _Position:
    """A publisher's position, acknowledged once the local rows it covers are durable."""

    value: int
    runs: Runs
    """The local seqs of the rows that carry this position."""


@dataclass
class _UpstreamRows:
    """Rows of one committed batch received from one upstream that still wait; what is not here is durable.

    Exact form: ``ups``/``local`` aligned per row. Coarse form (after a restart, or a batch committed
    without per-row detail): every upstream seq in ``span`` waits until no local row of ``runs`` is held.
    """

    ups: np.ndarray
    local: np.ndarray
    runs: Runs
    """Runs of ``local``."""
    dups: np.ndarray
    """Upstream seqs of copies dropped as duplicates: released once ``dup_bound`` is handed over."""
    dup_bound: int
    span: tuple[int, int] | None = None
    """(after, through] upstream seqs of a coarse entry."""
    checked: int = -1
    """Link version at the last per-row check: rows are re-checked only when a link changed."""
    waiting: Runs | None = None
    """Runs of the upstream seqs still waiting (``ups`` and ``dups``), kept for :func:`_acknowledged`."""

    def empty(self) -> bool:
        return self.ups.size == 0 and self.dups.size == 0 and self.span is None

    def waiting_runs(self) -> Runs:
        if self.waiting is None:
            seqs = np.concatenate((self.ups, self.dups)) if self.dups.size else self.ups
            if seqs.size > 1 and not bool(np.all(seqs[1:] > seqs[:-1])):  # rows come in upstream order
                seqs = np.unique(seqs)
            self.waiting = run_bounds(seqs)
        return self.waiting


@dataclass
class _Upstream:
    top: int = 0
    """Highest seq received from this upstream (stored, duplicate or rejected)."""
    waiting: deque[_UpstreamRows] = field(default_factory=deque)
    written: tuple[int, tuple] = (0, ())
    """The (prefix, runs) last written to its ack file."""


def _span(first: int, last: int) -> Runs:
    """Rows ``first..last`` as one run (none when ``last < first``)."""
    if last < first:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.array([first], np.int64), np.array([last], np.int64)


#: A key none of whose rows wait: released as soon as it is first in line.
_NO_ROWS = _span(1, 0)
_NONE: np.ndarray = np.zeros(0, np.int64)


class Durability:
    """Tracks committed-but-not-yet-durable rows; releases persisted acks and upstream acks.

    A row is durable when no sync destination (not downgraded) still holds it
    (see :meth:`replication.destination.link.Link.holds_any`). A publisher's
    position is released, in order, when the rows that publisher's messages
    got are durable. An upstream's rows are acknowledged each as it becomes
    durable (see the module docstring): this is also what keeps a two-way sync
    pair from waiting on itself, since a row received from the partner is
    never sent back (loop rule). Releasing (a) sends publishers their persisted
    acks and (b) writes ``_control/acks/<upstream>.json``: sync chains are
    transitive because a downstream acknowledges only what is durable at its
    own sync destinations.

    ``durable_seq`` is the prefix watermark: every local row through it is
    durable; it never goes back (acks given stay given, whatever an upgrade or
    a resync does later). ``_control/durable.json`` records it each time it
    moves (and the acks given), which is what ``fully_durable`` replays read.

    Thread-safe: the ingest batch thread calls :meth:`on_commit`; destination
    threads and the downgrade action call :meth:`release` when links move.
    """

    def __init__(
        self,
        sender: AckSender | None,
        *,
        layout: StorageLayout,
        committed_seq: int,
        publishers: dict[str, int],
        upstreams: dict[str, int],
        destinations: Mapping[str, Link] | None = None,
        rows_since: Callable[[int, int], pa.Table] | None = None,
        received_since: Callable[[str, int, int], pa.Table] | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        """``publishers``/``upstreams``: the txlog's positions at start. ``destinations``: the instance's
        outgoing links (read live: sync ones hold rows, every one has an age). ``rows_since(after,
        through)`` reads the txlog's ``seq``, ``publisher``, ``publisher_seq`` and ``received_from`` of
        rows ``after < seq <= through``: after a restart, the rows not yet known durable are matched to
        their keys again (without it, every key waits for the whole range). ``received_since(upstream,
        after, through)`` reads the inbox's ``publisher``, ``publisher_seq`` and ``upstream_seq`` of the
        rows ``upstream`` sent with ``after < upstream_seq <= through``: with it, those rows are
        acknowledged one by one after a restart too (without it, together)."""
        self._sender = sender
        self._layout = layout
        self._lock = threading.Lock()
        self._links = destinations if destinations is not None else {}
        self._now = now
        saved = DurableState.read(layout.durable_json) or DurableState()
        self.persisted: dict[str, int] = {k: int(v) for k, v in saved.publishers.items()}
        self.upstream_acks: dict[str, int] = {k: int(v) for k, v in saved.upstreams.items()}
        self.durable_seq = int(saved.durable_seq)
        self._saved_durable_seq = self.durable_seq
        self.committed_seq = committed_seq
        self.stored = dict(publishers)
        """client -> highest sequence in the txlog, persisted or not (told to publishers at logon)."""
        self._publishers: dict[str, deque[_Position]] = {}
        self._upstreams: dict[str, _Upstream] = {
            name: _Upstream(top=seq, written=(seq, ())) for name, seq in self.upstream_acks.items()}
        started = now()
        # (first local seq of a batch, when it was committed); rows from before this start count from it
        self._firsts: list[int] = [1]
        self._times: list[float] = [started]
        if committed_seq > self.durable_seq or publishers != self.persisted or upstreams != self.upstream_acks:
            self._recover(publishers, upstreams, rows_since, received_since)

    def _recover(self, publishers: dict[str, int], upstreams: dict[str, int],
                 rows_since: Callable[[int, int], pa.Table] | None,
                 received_since: Callable[[str, int, int], pa.Table] | None) -> None:
        """After a restart: what was committed but not known durable waits again."""
        after, through = self.durable_seq, self.committed_seq
        whole = _span(after + 1, through)
        by_publisher: dict[str, Runs] = {}
        by_upstream: dict[str, Runs] = {}
        rows = None
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
        for client, seq in publishers.items():
            if seq > self.persisted.get(client, 0):
                runs = by_publisher.get(client, _NO_ROWS) if rows is not None else whole
                self._publishers[client] = deque([_Position(seq, runs)])
        for upstream, seq in upstreams.items():
            acked = self.upstream_acks.get(upstream, 0)
            if seq <= acked:
                continue
            entry = None
            if rows is not None and received_since is not None:
                entry = _received_rows(rows, upstream, acked, seq, received_since, through)
            if entry is None:  # which of its seqs each row had is not known: they wait together
                runs = by_upstream.get(upstream, _NO_ROWS) if rows is not None else whole
                entry = _UpstreamRows(_NONE, _NONE, runs, _NONE, 0, span=(acked, seq))
            state = self._upstreams.setdefault(upstream, _Upstream())
            state.top = max(state.top, seq)
            if not entry.empty():
                state.waiting.append(entry)

    def announce(self) -> None:
        """Re-send every publisher's persisted position (at start: acks lost in a crash resume)."""
        self.release()
        if self._sender and self.persisted:
            self._sender.send(dict(self.persisted), [], self.persisted)

    def on_commit(self, last_seq: int, result: Classified) -> None:
        failures = failures_in(result.rejected_rows)
        if failures and self._sender:
            # Before this batch's positions can be released (by any thread): a persisted ack for a later
            # seq must not reach the publisher before the failure ack of an earlier one.
            try:
                self._sender.send_failures(failures)
            except Exception as exc:  # the rows and reasons are in rejected/: the batch goes on
                log.error("failure acks for %d refused publishes could not be sent: %s", len(failures), exc)
        with self._lock:
            first = self.committed_seq + 1
            # A key whose rows the result does not list (a catch-up after a failed batch)
            # waits for the whole batch: never too early.
            whole = _span(first, last_seq)
            if last_seq > self.committed_seq:
                self._firsts.append(first)
                self._times.append(self._now())
            for client, seq in result.publishers.items():
                self.stored[client] = max(self.stored.get(client, 0), seq)
                runs = result.publisher_rows.get(client, whole)
                self._publishers.setdefault(client, deque()).append(_Position(seq, runs))
            for upstream, top in result.links.items():
                state = self._upstreams.setdefault(upstream, _Upstream())
                exact = result.link_seqs.get(upstream)
                dups = result.link_duplicates.get(upstream, _NONE)
                if exact is not None:
                    ups, local = exact
                    entry = _UpstreamRows(ups, local, run_bounds(local), dups, last_seq)
                elif upstream in result.link_rows or not dups.size:
                    entry = _UpstreamRows(_NONE, _NONE, result.link_rows.get(upstream, whole), _NONE, 0,
                                          span=(state.top, top))
                else:
                    entry = _UpstreamRows(_NONE, _NONE, _NO_ROWS, dups, last_seq)
                state.top = max(state.top, top)
                if not entry.empty():
                    state.waiting.append(entry)
            self.committed_seq = max(self.committed_seq, last_seq)
        self.release(result.logons)

    # -- ages ---------------------------------------------------------------
    def link_age(self, link: Link, now: float | None = None) -> float:
        """Seconds since the oldest row ``link`` has not acknowledged (or not decided) was committed; 0 when
        it waits for nothing. Counted whether the link is sync, async or downgraded."""
        oldest = link.oldest_waiting()
        with self._lock:
            if oldest > self.committed_seq:
                return 0.0
            i = max(0, bisect.bisect_right(self._firsts, oldest) - 1)
            committed_at = self._times[i]
        return max(0.0, (now if now is not None else self._now()) - committed_at)

    def _prune_timeline_locked(self) -> None:
        """Forget batch times no link waits for any more; thin them when a link has waited very long."""
        links = list(self._links.values())
        oldest = min((link.oldest_waiting() for link in links), default=self.committed_seq + 1)
        keep_from = max(0, bisect.bisect_right(self._firsts, oldest) - 1)
        if keep_from:
            del self._firsts[:keep_from]
            del self._times[:keep_from]
        if len(self._firsts) > MAX_TIMELINE:
            half = len(self._firsts) // 2
            # each kept entry takes the earlier time of the pair it absorbs: ages of old rows round up
            self._firsts[:half] = self._firsts[:half:2]
            self._times[:half] = self._times[:half:2]

    # -- what is durable ----------------------------------------------------
    def _sync_links(self) -> list[Link]:
        return [link for link in self._links.values() if link.sync and not link.downgraded]

    def _holds(self, runs: Runs, links: list[Link]) -> bool:
        return any(link.holds_any(runs) for link in links)

    def release(self, logons: list[Logon] | None = None) -> dict[str, int]:
        """Release what became durable: persisted acks to publishers, acks to upstreams."""
        links = self._sync_links()
        version = sum(link.version for link in self._links.values())
        with self._lock:
            waiting = [link.oldest_waiting() - 1 for link in links]
            # Durable stays durable: a resync or an upgrade later does not take back acks given.
            self.durable_seq = max(self.durable_seq, min([self.committed_seq, *waiting]))
            released = self._release_publishers(links)
            acks = {name: ack for name, state in self._upstreams.items()
                    if (ack := self._release_upstream(state, links, version)) is not None}
            for name, (prefix, _runs) in acks.items():
                self.upstream_acks[name] = prefix
            self._prune_timeline_locked()
            persisted = dict(self.persisted)
            stored = {logon.client: self.stored.get(logon.client, 0) for logon in logons or []}
            # Written when an ack moves and whenever durable_seq does (fully_durable replays read it):
            # at most once per release.
            if released or acks or self.durable_seq != self._saved_durable_seq:
                failpoints.hit("durability.before_persisted_state")
                DurableState(self.durable_seq, persisted, dict(self.upstream_acks)).write(self._layout.durable_json)
                self._saved_durable_seq = self.durable_seq
        # Order: what was acknowledged is recorded first, then told. A crash in between tells again at
        # restart (announce(), and the ack files rewritten as rows are found durable): never too early.
        for upstream, (prefix, runs) in acks.items():
            failpoints.hit("durability.before_upstream_ack")
            Ack(prefix, time.time(), runs).write(self._layout.ack_file(upstream))
        if self._sender and (released or logons):
            self._sender.send(released, logons or [], persisted, stored)
        return released

    def _release_publishers(self, links: list[Link]) -> dict[str, int]:
        """Pop each publisher's positions whose rows are all durable, in order; what moved."""
        moved: dict[str, int] = {}
        for key in list(self._publishers):
            queue = self._publishers[key]
            while queue and not self._holds(queue[0].runs, links):
                head = queue.popleft()
                if head.value > self.persisted.get(key, 0):
                    self.persisted[key] = moved[key] = head.value
            if not queue:
                del self._publishers[key]
        return moved

    def close(self) -> None:
        if self._sender:
            self._sender.close()

    def _release_upstream(self, state: _Upstream, links: list[Link], version: int) -> tuple[int, tuple] | None:
        """Drop this upstream's rows that became durable; the new (prefix, runs) if it changed, else None.

        A batch whose rows are all durable goes at once; one still partly held is checked row by row,
        and only when a link moved since its last check (so a held batch costs nothing per commit)."""
        kept: deque[_UpstreamRows] = deque()
        for entry in state.waiting:
            if entry.span is not None:
                if not self._holds(entry.runs, links):
                    entry.span = None
            elif entry.ups.size:
                if not self._holds(entry.runs, links):
                    entry.ups = entry.local = _NONE
                    entry.waiting = None
                elif entry.checked != version:
                    entry.checked = version
                    self._keep_held_rows(entry, links)
            if entry.dups.size and all(link.handed_through(entry.dup_bound) for link in links):
                entry.dups = _NONE
                entry.waiting = None
            if not entry.empty():
                kept.append(entry)
        state.waiting = kept
        ack = _acknowledged(state)
        if ack == state.written:
            return None
        state.written = ack
        return ack


    @staticmethod
    def _keep_held_rows(entry: _UpstreamRows, links: list[Link]) -> None:
        """Keep only the rows of ``entry`` a link still holds. Rows before every link's oldest waiting
        row are durable and rows after a link's last decided row are held, so only the rows between
        are looked at one by one, and not even those when one link holds all of them (a batch in flight)."""
        lo = min(link.oldest_waiting() for link in links)
        hi = min(link.decided_through() for link in links)
        local = entry.local  # ascending: local seqs are given in order
        i = int(np.searchsorted(local, lo, side="left"))
        j = max(i, int(np.searchsorted(local, hi, side="right")))
        if i < j and not any(link.holds_all(int(local[i]), int(local[j - 1])) for link in links):
            middle = local[i:j]
            held: np.ndarray = np.zeros(middle.size, dtype=bool)
            for link in links:
                held |= link.held_mask(middle)
            keep = np.concatenate((held, np.ones(local.size - j, dtype=bool)))
            entry.ups, entry.local = entry.ups[i:][keep], local[i:][keep]
        elif i:
            entry.ups, entry.local = entry.ups[i:], local[i:]
        else:
            return
        entry.runs = run_bounds(entry.local)
        entry.waiting = None


def _received_rows(rows: pa.Table, upstream: str, acked: int, top: int,
                   received_since: Callable[[str, int, int], pa.Table], through: int) -> _UpstreamRows | None:
    """After a restart, the rows ``upstream`` sent after ``acked``, matched to our txlog rows by
    (publisher, publisher_seq): stored ones wait for their local rows, the others (duplicates, rejects)
    for everything committed to be handed over. None when the inbox cannot be read."""
    try:
        sent = received_since(upstream, acked, top)
    except Exception as exc:  # acknowledged together instead: slower, never too early
        log.warning("the inbox rows from %s after %d could not be read (%s); they are acknowledged together",
                    upstream, acked, exc)
        return None
    mine = rows.filter(pc.fill_null(pc.equal(rows["received_from"], upstream), False))
    mine = mine.select(["publisher", "publisher_seq", "seq"])
    sent = sent.select(["publisher", "publisher_seq", "upstream_seq"]).group_by(
        ["publisher", "publisher_seq"]).aggregate([("upstream_seq", "min")])
    joined = sent.join(mine, keys=["publisher", "publisher_seq"], join_type="left outer")
    stored = pc.is_valid(joined["seq"])
    pairs = joined.filter(stored).sort_by("seq")
    ups = pairs["upstream_seq_min"].to_numpy().astype(np.int64)
    local = pairs["seq"].to_numpy().astype(np.int64)
    others = np.sort(joined.filter(pc.invert(stored))["upstream_seq_min"].to_numpy().astype(np.int64))
    return _UpstreamRows(ups, local, run_bounds(local), others, through)


def _acknowledged(state: _Upstream) -> tuple[int, tuple]:
    """(prefix, runs above it) of an upstream's seqs: everything through ``state.top`` but what still waits."""
    starts, ends = [], []
    for entry in state.waiting:
        if entry.span is not None and entry.span[1] > entry.span[0]:
            starts.append(np.array([entry.span[0] + 1], np.int64))
            ends.append(np.array([entry.span[1]], np.int64))
        if entry.ups.size or entry.dups.size:
            firsts, lasts = entry.waiting_runs()
            starts.append(firsts)
            ends.append(lasts)
    if not starts:
        return state.top, ()
    first = np.concatenate(starts)
    last = np.concatenate(ends)
    order = np.argsort(first, kind="stable")
    first, last = first[order], last[order]
    reach = np.maximum.accumulate(last)  # the end of the waiting stretch each pending seq belongs to
    gaps = np.flatnonzero(first[1:] > reach[:-1] + 1)[:MAX_ACK_RUNS]
    runs = list(zip((reach[gaps] + 1).tolist(), (first[gaps + 1] - 1).tolist()))
    if reach[-1] < state.top and len(runs) < MAX_ACK_RUNS:
        runs.append((int(reach[-1]) + 1, state.top))
    return int(first[0]) - 1, tuple(runs)
