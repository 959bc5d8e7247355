"""One queue on one instance: its messages, leases and subscribers, folded from txlog rows (pure: no I/O).

A message enters when a publish on an underlying topic (of the queue's message type, passing its
``<Filter>``) is stored, and leaves when a ``sow_delete`` on the queue topic naming its bookmark is
stored: a consumer's acknowledgement, or the owner's removal of an at-most-once message it delivered.
Only messages this instance owns are delivered here; the others wait in :attr:`QueueState.elsewhere`
until their owner's acknowledgement arrives by replication.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from replication.config.model import QueueTopic
from replication.expressions import Filter
from replication.routing import regex_matches

#: The typical publish-to-acknowledgement time assumed before any has been seen (seconds).
DEFAULT_TYPICAL_ACK_S = 1.0
#: A non-owner never asks for a message sooner than this after it arrived (seconds).
MIN_TRANSFER_WAIT_S = 0.2
#: A request the owner did not grant is made again after this long (seconds).
REQUEST_AGAIN_S = 5.0
#: Weight of the newest sample in the typical publish-to-acknowledgement time (an exponential average).
TYPICAL_WEIGHT = 0.2


class Message(NamedTuple):
    """(A named tuple, not a dataclass: a queue makes one per message, and a frozen dataclass's ``__init__``
    was the largest part of folding a publish in.)"""

    seq: int
    bookmark: str
    topic: str
    """The underlying topic it was published to."""
    data: bytes
    owner: str


@dataclass
class Subscriber:
    client: str
    filter: Filter | None
    max_backlog: int
    seen: float
    """When it last subscribed (its heartbeat), epoch seconds."""
    leased: dict[str, float] = field(default_factory=dict)
    """Bookmark -> lease expiry (epoch seconds) of the messages it holds."""
    session: str | None = None
    delivered: int = 0
    acknowledged: int = 0
    acking: set[str] = field(default_factory=set)
    """Leased bookmarks whose acknowledgement passed the check and is being stored: they leave its backlog at
    once, so deliveries go on while the acknowledgement's batch commits (a lease ending drops them too)."""

    def holds(self) -> int:
        """How many unacknowledged messages count against its ``max_backlog``."""
        return len(self.leased) - len(self.acking)


class Delivery(NamedTuple):
    client: str
    message: Message
    lease_expires: float
    """Epoch seconds; 0 for an at-most-once message (removed on delivery: nothing to acknowledge)."""


class QueueState:
    """A queue's messages not yet removed, who holds which, and who may receive more."""

    def __init__(self, queue: QueueTopic, instance: str) -> None:
        self.queue = queue
        self.instance = instance
        self.waiting: dict[str, Message] = {}
        """Messages this instance owns and may deliver, by bookmark, in seq order (see :meth:`_sort`)."""
        self._removed = 0  # messages delivered out of ``waiting`` since it was last copied
        self.leased: dict[str, tuple[Message, str]] = {}
        """Bookmark -> (message, client holding it)."""
        self.elsewhere: dict[str, Message] = {}
        """Messages another instance owns: delivered there, removed here by its acknowledgement."""
        self.subscribers: dict[str, Subscriber] = {}
        self.acknowledged = 0
        self.delivered = 0
        self.redelivered = 0
        self.acks_seen_before_check = 0
        """Acknowledged bookmarks whose room was freed when seen on Kafka, before the ingest checked them."""
        self._unsorted = False
        self._takes: dict[tuple[str, str], bool] = {}
        self._lapsed: dict[str, str] = {}
        """Bookmark -> the client whose lease on it ran out: it goes to another subscriber when one has room."""
        self.arrived: dict[str, float] = {}
        """Bookmark -> when a message owned elsewhere arrived here (epoch seconds)."""
        self.typical_ack_s = DEFAULT_TYPICAL_ACK_S
        """The typical time from a message owned elsewhere arriving here to its acknowledgement arriving: a
        message waiting longer is not being kept up with, and a subscriber here with room asks for it."""
        self.requested: dict[str, float] = {}
        """Bookmark -> when this instance asked its owner for it."""
        self.barriers: dict[str, Message] = {}
        """Barrier messages not yet released, in seq order: each waits for every message ahead of it here."""
        self._barrier_ids: set[str] = set()
        """Every barrier's bookmark, released or not, until this instance's copy is acknowledged."""
        self.proxy_for: frozenset[str] = frozenset()
        """Instances whose messages this one may take over (``enable_proxied_transfer``)."""
        self.transfers_requested = 0
        self.transfers_granted = 0
        self.transfers_received = 0

    @property
    def at_most_once(self) -> bool:
        return self.queue.semantics == "at-most-once"

    # -- what the txlog says --------------------------------------------------------------------------

    def takes(self, topic: str, message_type: str) -> bool:
        """Is a publish on ``topic`` of ``message_type`` a message of this queue (before its filter)?"""
        key = (topic, message_type)
        hit = self._takes.get(key)
        if hit is None:
            hit = self._takes[key] = (message_type == self.queue.message_type
                                      and regex_matches(self.queue.underlying_topic, topic))
        return hit

    def owner_of(self, origin: str) -> str:
        """The spec's initial owner: the instance that first received the publish (``<Queue>``), the
        ``<InitialOwner>`` (``<GroupLocalQueue>``), this instance (``<LocalQueue>``)."""
        if self.queue.kind == "GroupLocalQueue" and self.queue.initial_owner:
            return self.queue.initial_owner
        if self.queue.kind == "LocalQueue":
            return self.instance
        return origin

    def add(self, seq: int, bookmark: str, topic: str, data: bytes, origin: str, now: float = 0.0) -> bool:
        """A stored publish on an underlying topic; False when the queue's filter leaves it out."""
        if self.queue.filter is not None and not self.queue.filter.matches(data, self.queue.message_type):
            return False
        if bookmark in self.waiting or bookmark in self.leased or bookmark in self.elsewhere \
                or bookmark in self.barriers:
            return True
        if self.queue.barrier is not None and self.queue.barrier.matches(data, self.queue.message_type):
            # every instance holding a barrier delivers it (the spec's tip): it is this one's to deliver
            self.barriers[bookmark] = Message(seq, bookmark, topic, data, self.instance)
            self._barrier_ids.add(bookmark)
            return True
        message = Message(seq, bookmark, topic, data, self.owner_of(origin))
        if message.owner == self.instance:
            self.waiting[bookmark] = message
        else:
            self.elsewhere[bookmark] = message
            self.arrived[bookmark] = now
        return True

    def remove(self, bookmarks: Iterable[str], client: str, now: float = 0.0, *, local: bool = True) -> int:
        """A stored acknowledgement (or removal) by ``client``: the messages leave the queue. How many did.
        ``local``: published at this instance; another instance's acknowledgement of a barrier is its own
        copy's (every instance delivers its barrier), not this one's."""
        removed = 0
        # (the maps are often empty, and this runs for every acknowledged message: skip what cannot hold it)
        arrived_at, requested, lapsed, barrier_ids = self.arrived, self.requested, self._lapsed, self._barrier_ids
        for bookmark in bookmarks:
            if barrier_ids and not local and bookmark in barrier_ids:
                continue
            if arrived_at:
                arrived = arrived_at.pop(bookmark, None)
                if arrived is not None and now > arrived:
                    self.typical_ack_s += TYPICAL_WEIGHT * ((now - arrived) - self.typical_ack_s)
            if requested:
                requested.pop(bookmark, None)
            held = self.leased.pop(bookmark, None)
            if held is not None:
                subscriber = self.subscribers.get(held[1])
                if subscriber is not None:
                    subscriber.leased.pop(bookmark, None)
                    subscriber.acking.discard(bookmark)
            elif self.waiting.pop(bookmark, None) is None and self.elsewhere.pop(bookmark, None) is None \
                    and self.barriers.pop(bookmark, None) is None:
                continue
            if lapsed:
                lapsed.pop(bookmark, None)
            if barrier_ids:
                barrier_ids.discard(bookmark)
            removed += 1
        self.acknowledged += removed
        subscriber = self.subscribers.get(client)
        if subscriber is not None and not self.at_most_once:
            subscriber.acknowledged += removed
        return removed

    # -- acknowledgements published here --------------------------------------------------------------

    def check_ack(self, client: str, bookmarks: list[str], taken: set[str]) -> str | None:
        """Why an acknowledgement ``client`` published here cannot be stored, or None. ``taken``: bookmarks
        acknowledged earlier in the same batch (added to it when this one is good). A good one frees its room
        in the client's backlog now (:attr:`Subscriber.acking`): a batch tried again checks it again alike."""
        name = self.queue.name
        if not bookmarks:
            return (f"an acknowledgement on queue {name!r} must name the bookmarks it acknowledges in its "
                    "amps-sow-keys header")
        if self.at_most_once:
            return (f"queue {name!r} is at-most-once: a message is removed when it is delivered and takes no "
                    "acknowledgement")
        for bookmark in bookmarks:
            held = self.leased.get(bookmark)
            if bookmark in taken:
                return f"bookmark {bookmark} of queue {name!r} is acknowledged twice"
            if held is None and (bookmark in self.waiting or bookmark in self.elsewhere):
                return f"bookmark {bookmark} of queue {name!r} is not leased to {client!r}: it was not delivered to it"
            if held is None:
                return (f"queue {name!r} does not hold bookmark {bookmark}: it never had it, or it was acknowledged "
                        "already")
            if held[1] != client:
                return (f"bookmark {bookmark} of queue {name!r} is leased to another client, not {client!r}: only "
                        "the client it was delivered to acknowledges it")
        taken.update(bookmarks)
        subscriber = self.subscribers.get(client)
        if subscriber is not None:
            subscriber.acking.update(bookmarks)
        return None

    def seen_acks(self, client: str, bookmarks: list[str]) -> int:
        """An acknowledgement by ``client`` seen on Kafka, not checked yet (:mod:`.ack_watch`): the bookmarks
        leased to it leave its backlog now, as :meth:`check_ack` would make them. How many did."""
        subscriber = self.subscribers.get(client)
        if subscriber is None:
            return 0
        mine = [b for b in bookmarks if (held := self.leased.get(b)) is not None and held[1] == client
                and b not in subscriber.acking]
        subscriber.acking.update(mine)
        self.acks_seen_before_check += len(mine)
        return len(mine)

    # -- subscribers ------------------------------------------------------------------------------------

    def subscribe(self, client: str, flt: Filter | None, max_backlog: int, now: float, *,
                  session: str | None = None) -> None:
        """A subscribe (or its heartbeat): a new subscriber, or the same one seen again (its options updated).
        A new ``session`` of a client is a restarted consumer: what the old one held returns to the queue."""
        subscriber = self.subscribers.get(client)
        if subscriber is not None and session is not None and subscriber.session not in (None, session):
            self.unsubscribe(client)
            subscriber = None
        if subscriber is None:
            self.subscribers[client] = Subscriber(client, flt, max_backlog, now, session=session)
        else:
            subscriber.filter, subscriber.max_backlog, subscriber.seen = flt, max_backlog, now

    def unsubscribe(self, client: str) -> int:
        """The subscriber leaves; the messages it held return to the queue. How many did."""
        subscriber = self.subscribers.pop(client, None)
        if subscriber is None:
            return 0
        return self._return(list(subscriber.leased))

    def expire(self, now: float, silent_after: float) -> int:
        """Leases that ended and subscribers gone silent give their messages back. How many came back."""
        back = 0
        for client in [c for c, s in self.subscribers.items() if now - s.seen > silent_after]:
            back += self.unsubscribe(client)
        for subscriber in self.subscribers.values():
            ended = [b for b, expires in subscriber.leased.items() if expires <= now]
            if ended:
                for bookmark in ended:
                    del subscriber.leased[bookmark]
                    subscriber.acking.discard(bookmark)
                    self._lapsed[bookmark] = subscriber.client
                back += self._return(ended)
        return back

    def _return(self, bookmarks: list[str]) -> int:
        back = 0
        for bookmark in bookmarks:
            held = self.leased.pop(bookmark, None)
            if held is not None:
                self.waiting[bookmark] = held[0]
                back += 1
        if back:
            self._unsorted = True
            self.redelivered += back
        return back

    # -- ownership transfers ---------------------------------------------------------------------------

    def wanted(self, now: float) -> list[Message]:
        """Messages owned elsewhere to ask for: subscribers here have room for them, and they have waited
        longer than the typical publish-to-acknowledgement time (the owner's consumers are not keeping up)."""
        open_ = [s for s in self.subscribers.values() if self._room(s) > 0]
        # (asked for and not granted yet: their room is spoken for until the request may be made again)
        room = sum(self._room(s) for s in open_) - sum(
            1 for b, at in self.requested.items() if now - at < REQUEST_AGAIN_S and b in self.elsewhere)
        if room <= 0 or not self.elsewhere:
            return []
        wait = max(MIN_TRANSFER_WAIT_S, self.typical_ack_s)
        out: list[Message] = []
        for bookmark, message in self.elsewhere.items():
            if len(out) >= room:
                break
            if now - self.requested.get(bookmark, -1e18) < REQUEST_AGAIN_S:
                continue
            # (an owner this instance stands in for is away: its messages are taken at once)
            if message.owner not in self.proxy_for and now - self.arrived.get(bookmark, now) < wait:
                continue
            if any(self._takes_it(s, message) for s in open_):
                out.append(message)
        for message in out:
            self.requested[message.bookmark] = now
        return out

    def grant(self, bookmarks: Iterable[str], to: str, now: float = 0.0) -> list[str]:
        """``to`` asks for these: the ones this instance owns, has not leased, and has no subscriber able to
        take now go to ``to`` (the caller records the grant; :meth:`ungrant` if it cannot)."""
        granted = []
        for bookmark in bookmarks:
            message = self.waiting.get(bookmark)
            if message is None or any(self._room(s) > 0 and self._takes_it(s, message)
                                      for s in self.subscribers.values()):
                continue
            del self.waiting[bookmark]
            self.elsewhere[bookmark] = message._replace(owner=to)
            self.arrived[bookmark] = now
            granted.append(bookmark)
        self.transfers_granted += len(granted)
        return granted

    def ungrant(self, bookmarks: list[str]) -> None:
        """Grants that could not be recorded: the messages are this instance's again."""
        for bookmark in bookmarks:
            message = self.elsewhere.pop(bookmark, None)
            if message is not None:
                self.waiting[bookmark] = message._replace(owner=self.instance)
                self.arrived.pop(bookmark, None)
        self.transfers_granted -= len(bookmarks)
        self._unsorted = True

    def transferred(self, bookmarks: Iterable[str], to: str, now: float = 0.0) -> None:
        """A stored grant: ``to`` owns these now (here, it is delivered when ``to`` is this instance)."""
        for bookmark in bookmarks:
            held = self.waiting.pop(bookmark, None)
            message = held or self.elsewhere.pop(bookmark, None)
            if message is None:
                continue  # acknowledged already, or leased here (this instance granted it, so it is not)
            message = message._replace(owner=to)
            if to == self.instance:
                if held is None:
                    self.transfers_received += 1
                self.requested.pop(bookmark, None)
                self.arrived.pop(bookmark, None)
                self.waiting[bookmark] = message
                self._unsorted = True
            else:
                self.elsewhere[bookmark] = message
                self.arrived.setdefault(bookmark, now)

    def _room(self, subscriber: Subscriber, given: int = 0) -> int:
        """Messages ``subscriber`` may still be given: at-least-once, what it holds counts against its backlog;
        at-most-once, only the ``given`` of the round being dealt."""
        return subscriber.max_backlog - (given if self.at_most_once else subscriber.holds())

    def _takes_it(self, subscriber: Subscriber, message: Message) -> bool:
        return subscriber.filter is None or subscriber.filter.matches(message.data, self.queue.message_type)

    # -- deliveries -------------------------------------------------------------------------------------

    def dispatch(self, now: float, *, limit: int = 10_000) -> list[Delivery]:
        """Give waiting messages to subscribers with room, oldest first, one each in turn. At-least-once: each
        is leased until ``now + LeasePeriod``; at-most-once: each leaves the queue (the caller records its
        removal before delivering it, and calls :meth:`undo` if that fails)."""
        self._release_barriers()
        if not self.waiting or not self.subscribers:
            return []
        self._sort()
        out: list[Delivery] = []
        turn = sorted(self.subscribers.values(), key=lambda s: (s.holds(), s.client))
        # What is taken leaves ``waiting`` after the round: a dict iterated from its start again after each
        # removal at its front walks over every removed slot, which made a 100k-message queue's deliveries
        # quadratic.
        taken: set[str] = set()
        try:
            if not self._lapsed and all(s.filter is None for s in turn):
                self._deal_in_order(turn, taken, out, now, limit)
            else:
                self._deal(turn, taken, out, now, limit)
        finally:  # (even if a round fails half way: what was leased must not stay waiting too)
            for bookmark in taken:
                del self.waiting[bookmark]
            self._removed += len(taken)
            if self._removed > len(self.waiting):  # (a dict keeps removed slots until it grows: copy it, amortized)
                self.waiting, self._removed = dict(self.waiting), 0
        return out

    def _deal(self, turn: list[Subscriber], taken: set[str], out: list[Delivery], now: float, limit: int) -> None:
        """:meth:`dispatch`'s rounds: one message to each subscriber with room in turn, into ``out``. Each
        subscriber scans the waiting messages once, from the oldest, skipping what is ``taken``."""
        given = {s.client: 0 for s in turn}
        scans = {s.client: iter(self.waiting.values()) for s in turn}
        while turn and len(taken) < len(self.waiting) and len(out) < limit:
            still = []
            for subscriber in turn:
                if len(out) >= limit:
                    return
                if self._room(subscriber, given[subscriber.client]) <= 0:
                    continue
                message = self._next_for(subscriber, scans[subscriber.client], taken)
                if message is None:
                    continue
                taken.add(message.bookmark)
                self._lapsed.pop(message.bookmark, None)
                given[subscriber.client] += 1
                subscriber.delivered += 1
                self.delivered += 1
                if self.at_most_once:
                    self.acknowledged += 1  # (removed now: its removal row, folded later, finds nothing)
                    out.append(Delivery(subscriber.client, message, 0.0))
                else:
                    expires = now + self.queue.lease_period_s
                    subscriber.leased[message.bookmark] = expires
                    self.leased[message.bookmark] = (message, subscriber.client)
                    out.append(Delivery(subscriber.client, message, expires))
                still.append(subscriber)
            turn = still

    def _deal_in_order(self, turn: list[Subscriber], taken: set[str], out: list[Delivery], now: float,
                       limit: int) -> None:
        """:meth:`_deal` when no subscriber has a filter and no lease lapsed (the usual case): every subscriber
        takes the next waiting message, so one pass over ``waiting`` deals them all."""
        expires = 0.0 if self.at_most_once else now + self.queue.lease_period_s
        room = {s.client: self._room(s) for s in turn}
        scan = iter(self.waiting.values())
        while turn:
            turn = [s for s in turn if room[s.client] > 0]
            for subscriber in turn:
                message = next(scan, None)
                if message is None or len(out) >= limit:
                    return
                client, bookmark = subscriber.client, message.bookmark
                taken.add(bookmark)
                room[client] -= 1
                subscriber.delivered += 1
                self.delivered += 1
                if self.at_most_once:
                    self.acknowledged += 1  # (removed now: its removal row, folded later, finds nothing)
                else:
                    subscriber.leased[bookmark] = expires
                    self.leased[bookmark] = (message, client)
                out.append(Delivery(client, message, expires))

    def undo(self, deliveries: list[Delivery]) -> None:
        """At-most-once deliveries whose removal could not be recorded: back to the queue, undelivered."""
        for delivery in deliveries:
            self.waiting[delivery.message.bookmark] = delivery.message
            subscriber = self.subscribers.get(delivery.client)
            if subscriber is not None:
                subscriber.delivered -= 1
            self.delivered -= 1
            self.acknowledged -= 1
        self._unsorted = self._unsorted or bool(deliveries)

    def _release_barriers(self) -> None:
        """Barriers with no message left ahead of them here (waiting, leased, owned elsewhere, or an earlier
        barrier) join the messages to deliver."""
        if not self.barriers:
            return
        ahead = min((m.seq for m in self.waiting.values()), default=None)
        for first in (min((m.seq for m, _client in self.leased.values()), default=None),
                      min((m.seq for m in self.elsewhere.values()), default=None)):
            if first is not None:
                ahead = first if ahead is None else min(ahead, first)
        for bookmark, barrier in list(self.barriers.items()):  # in seq order: an earlier one blocks the later
            if ahead is not None and ahead < barrier.seq:
                break
            del self.barriers[bookmark]
            self.waiting[bookmark] = barrier
            self._unsorted = True
            ahead = barrier.seq if ahead is None else min(ahead, barrier.seq)

    def _next_for(self, subscriber: Subscriber, scan: Iterator[Message], taken: set[str]) -> Message | None:
        """The next message of ``scan`` (this round's pass over ``waiting``) for ``subscriber``."""
        for message in scan:
            if message.bookmark in taken:
                continue
            if self._lapsed.get(message.bookmark) == subscriber.client and any(
                    s is not subscriber and self._room(s) > 0 and self._takes_it(s, message)
                    for s in self.subscribers.values()):
                continue  # it let this one's lease run out: another subscriber with room takes it
            if subscriber.filter is None or subscriber.filter.matches(message.data, self.queue.message_type):
                return message
        return None

    def _sort(self) -> None:
        if self._unsorted:
            self.waiting = dict(sorted(self.waiting.items(), key=lambda item: item[1].seq))
            self._unsorted = False

    def oldest_seq(self) -> int | None:
        """The seq of the oldest message still in the queue here (None: empty)."""
        seqs = [m.seq for held in (self.waiting.values(), self.elsewhere.values(), self.barriers.values())
                for m in held] + [m.seq for m, _ in self.leased.values()]
        return min(seqs, default=None)

    # -- what ``replication queue`` shows ----------------------------------------------------------------

    def status(self, now: float) -> dict:
        return {
            "queue": self.queue.name, "kind": self.queue.kind, "semantics": self.queue.semantics,
            "depth": len(self.waiting) + len(self.leased) + len(self.elsewhere) + len(self.barriers),
            "barriers_waiting": len(self.barriers),
            "waiting": len(self.waiting), "leased": len(self.leased), "owned_elsewhere": len(self.elsewhere),
            "delivered": self.delivered, "redelivered": self.redelivered, "acknowledged": self.acknowledged,
            "transfers": {"requested": self.transfers_requested, "granted": self.transfers_granted,
                          "received": self.transfers_received},
            "typical_ack_seconds": round(self.typical_ack_s, 3),
            "acks_seen_before_check": self.acks_seen_before_check,
            "proxied_transfer_for": sorted(self.proxy_for),
            "consumers": {
                s.client: {"leased": len(s.leased), "acknowledging": len(s.acking), "delivered": s.delivered,
                           "acknowledged": s.acknowledged,
                           "max_backlog": s.max_backlog, "filter": s.filter.text if s.filter else None,
                           "seen_seconds_ago": round(now - s.seen, 1)}
                for s in sorted(self.subscribers.values(), key=lambda s: s.client)
            },
        }
