"""Queues without services: their config, the state folded from txlog rows, dispatch and leases, and how the
ingest classifies subscribes and acknowledgements."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from replication.config.model import QueueTopic
from replication.config.parser import parse_string
from replication.errors import ConfigError
from replication.expressions import Filter
from replication.ingest.classify import CANDIDATE_SCHEMA, classify
from replication.queues.book import QueueBook
from replication.queues.state import QueueState
from replication.queues.wire import QueueRequest
from replication.txlog.publishers import PublisherState

BASE = """<AMPSConfig><Name>amps-1</Name><Storage>/tmp/q</Storage>
<Transports><Transport><Name>k</Name><Type>kafka</Type><InetAddr>localhost:9092</InetAddr>
<Topic>amps-1.publish</Topic><MessageType>json</MessageType></Transport>
<Transport><Name>r</Name><Type>amps-replication</Type></Transport></Transports>
<TransactionLog><Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
<SOW>{sow}</SOW>{replication}</AMPSConfig>"""


def load(sow: str, replication: str = ""):
    return parse_string(BASE.format(sow=sow, replication=replication), filename="amps-1.xml")


def queue(**kwargs) -> QueueTopic:
    defaults = {"name": "/work", "message_type": "json", "underlying_topic": "/tasks", "semantics": "at-least-once",
                "lease_period_s": 10.0}
    return QueueTopic(**{**defaults, **kwargs})


def test_queue_config_takes_semantics_lease_and_local_queues_and_refuses_what_is_not_built():
    cfg = load("<Queue><Name>/work</Name><MessageType>json</MessageType><UnderlyingTopic>/tasks</UnderlyingTopic>"
               "<Semantics>at-least-once</Semantics><LeasePeriod>30s</LeasePeriod></Queue>"
               "<LocalQueue><Name>/mine</Name><MessageType>json</MessageType></LocalQueue>")
    work, mine = cfg.queues
    assert (work.semantics, work.lease_period_s, work.kind) == ("at-least-once", 30.0, "Queue")
    assert (mine.kind, mine.semantics) == ("LocalQueue", "at-most-once")  # AMPS's default semantics
    with pytest.raises(ConfigError, match=r"amps-1.xml:\d+: .*<MaxDeliveries> in <Queue> is not supported yet"):
        load("<Queue><Name>/w</Name><MessageType>json</MessageType><MaxDeliveries>3</MaxDeliveries></Queue>")
    with pytest.raises(ConfigError, match="'exactly-once' is not a valid Semantics"):
        load("<Queue><Name>/w</Name><MessageType>json</MessageType><Semantics>exactly-once</Semantics></Queue>")


def test_a_local_queue_that_a_destination_replicates_stops_the_load_naming_both():
    replication = ("<Replication><Destination><Name>amps-2</Name><SyncType>sync</SyncType><Topic><Name>.*</Name>"
                   "<MessageType>json</MessageType></Topic><Transport><Type>amps-replication</Type>"
                   "<InetAddr>/tmp/amps-2</InetAddr></Transport></Destination></Replication>")
    with pytest.raises(ConfigError) as caught:
        load("<LocalQueue><Name>/mine</Name><MessageType>json</MessageType></LocalQueue>", replication)
    message = str(caught.value)
    assert "amps-2" in message and "'/mine'" in message and "a LocalQueue cannot be replicated" in message
    assert "Fix:" in message and caught.value.line


def test_at_least_once_leases_in_turn_redelivers_after_the_lease_and_takes_only_the_holders_ack():
    state = QueueState(queue(lease_period_s=10.0), "amps-1")
    for seq in range(1, 7):
        state.add(seq, f"9|{seq}", "/tasks", b'{"n": %d}' % seq, origin="amps-1")
    state.subscribe("w1", None, 2, now=0.0)
    state.subscribe("w2", None, 2, now=0.0)
    first = state.dispatch(now=1.0)
    assert sorted((d.client, d.message.seq) for d in first) == [("w1", 1), ("w1", 3), ("w2", 2), ("w2", 4)]
    assert state.dispatch(now=1.5) == []  # both full
    taken: set[str] = set()
    holder = {d.message.bookmark: d.client for d in first}
    other = next(b for b, c in holder.items() if c == "w2")
    assert "leased to another client" in state.check_ack("w1", [other], taken)
    assert "it never had it" in state.check_ack("w1", ["9|99"], taken)
    assert "not leased to 'w1'" in state.check_ack("w1", ["9|5"], taken)
    mine = [b for b, c in holder.items() if c == "w1"]
    assert state.check_ack("w1", mine, taken) is None
    assert "acknowledged twice" in state.check_ack("w1", mine[:1], taken)
    state.remove(mine, "w1")
    state.subscribers["w2"].seen = 11.0
    assert state.expire(now=11.5, silent_after=100) == 2  # w2's leases ran out at 11.0
    again = state.dispatch(now=12.0)
    # oldest first, the returned ones ahead, and not to w2, which let their leases run out
    assert sorted((d.client, d.message.seq) for d in again) == [("w1", 2), ("w1", 4), ("w2", 5), ("w2", 6)]
    assert state.status(12.0)["acknowledged"] == 2 and state.redelivered == 2


def test_a_checked_acknowledgement_frees_backlog_room_before_it_is_stored_and_a_lapsed_lease_takes_it_back():
    state = QueueState(queue(lease_period_s=10.0), "amps-1")
    for seq in range(1, 6):
        state.add(seq, f"9|{seq}", "/tasks", b"{}", origin="amps-1")
    state.subscribe("w1", None, 2, now=0.0)
    assert [d.message.seq for d in state.dispatch(now=1.0)] == [1, 2]
    assert state.check_ack("w1", ["9|1"], set()) is None  # its batch commits: not stored yet
    assert [d.message.seq for d in state.dispatch(now=1.1)] == [3]  # room for one more already
    assert state.dispatch(now=1.2) == []
    assert state.check_ack("w1", ["9|1"], set()) is None  # the batch tried again: the same answer, no more room
    assert state.dispatch(now=1.3) == []
    assert state.status(1.3)["consumers"]["w1"]["acknowledging"] == 1
    state.remove(["9|1"], "w1")  # stored
    assert state.status(1.4)["consumers"]["w1"] == {**state.status(1.4)["consumers"]["w1"], "leased": 2,
                                                    "acknowledging": 0}
    assert state.check_ack("w1", ["9|2"], set()) is None  # and its batch never commits: the lease ends
    assert [d.message.seq for d in state.dispatch(now=1.5)] == [4]
    state.subscribers["w1"].seen = 11.2
    assert state.expire(now=11.2, silent_after=100) == 2  # 9|2 and 9|3 come back, 9|2 no longer acknowledging
    assert state.status(11.2)["consumers"]["w1"]["acknowledging"] == 0
    assert [d.message.seq for d in state.dispatch(now=11.3)] == [2]  # 9|4 still held: room for one, not two


def test_an_acknowledgement_seen_on_kafka_frees_room_for_the_leases_of_its_sender_only():
    state = QueueState(queue(lease_period_s=10.0), "amps-1")
    for seq in range(1, 7):
        state.add(seq, f"9|{seq}", "/tasks", b"{}", origin="amps-1")
    state.subscribe("w1", None, 2, now=0.0)
    state.subscribe("w2", None, 2, now=0.0)
    assert sorted(d.message.seq for d in state.dispatch(now=1.0)) == [1, 2, 3, 4]
    leased = {d: c for d, (_, c) in state.leased.items()}
    theirs = [b for b, c in leased.items() if c == "w2"]
    mine = [b for b, c in leased.items() if c == "w1"]
    # w1 names one of its own, one of w2's and one never delivered: only its own frees room, and only its own
    assert state.seen_acks("w1", [mine[0], theirs[0], "9|6"]) == 1
    assert state.seen_acks("nobody", mine) == 0
    assert [d.client for d in state.dispatch(now=1.1)] == ["w1"]
    assert state.dispatch(now=1.2) == []
    assert len(state.leased) == 5, "seen is not stored: the message stays leased until the ack is"
    book = QueueBook(load('<Queue><Name>/work</Name><MessageType>json</MessageType>'
                          '<UnderlyingTopic>/tasks</UnderlyingTopic></Queue>'))
    book.queues["/work"] = state
    assert book.seen_acks([("w2", "/work", ",".join(theirs)), ("w2", "/other", theirs[0])]) == 2


@pytest.mark.parametrize("semantics", ["at-least-once", "at-most-once"])
def test_unfiltered_subscribers_are_dealt_in_turn_as_filtered_ones_are(semantics):
    """Subscribers with no filter and no lapsed lease are dealt in one pass over the queue: the same messages
    to the same subscribers, in the same turns, as subscribers with a filter every message passes."""
    def deal(flt):
        state = QueueState(queue(semantics=semantics, lease_period_s=5.0), "amps-1")
        for seq in range(1, 11):
            state.add(seq, f"9|{seq}", "/tasks", b'{"n": %d}' % seq, origin="amps-1")
        for client, backlog in (("a", 1), ("b", 3), ("c", 2)):
            state.subscribe(client, flt, backlog, now=0.0)
        first = state.dispatch(now=1.0)
        limited = state.dispatch(now=2.0, limit=2)  # (at-least-once: all full, nothing more)
        return ([(d.client, d.message.seq, d.lease_expires) for d in first + limited],
                state.status(2.0)["waiting"], state.delivered)

    in_order = deal(None)
    assert in_order == deal(Filter("/n > 0"))
    dealt, waiting, delivered = in_order
    expires = 6.0 if semantics == "at-least-once" else 0.0
    assert dealt[:6] == [("a", 1, expires), ("b", 2, expires), ("c", 3, expires), ("b", 4, expires),
                         ("c", 5, expires), ("b", 6, expires)]
    if semantics == "at-most-once":  # (room is per round: the limit stops the second round after two)
        assert [(c, seq) for c, seq, _ in dealt[6:]] == [("a", 7), ("b", 8)]
    assert (waiting, delivered) == (10 - len(dealt), len(dealt))


def test_silent_subscribers_and_unsubscribes_give_their_messages_back():
    state = QueueState(queue(), "amps-1")
    state.add(1, "9|1", "/tasks", b"{}", origin="amps-1")
    state.subscribe("w1", None, 5, now=0.0)
    assert len(state.dispatch(now=0.0)) == 1
    assert state.expire(now=3.0, silent_after=2.0) == 1 and "w1" not in state.subscribers
    state.subscribe("w2", None, 5, now=3.0)
    assert len(state.dispatch(now=3.0)) == 1
    assert state.unsubscribe("w2") == 1 and list(state.waiting) == ["9|1"]


def test_filters_ownership_and_at_most_once():
    state = QueueState(queue(filter=Filter("/n > 1"), semantics="at-most-once"), "amps-1")
    assert not state.add(1, "9|1", "/tasks", b'{"n": 1}', origin="amps-1")  # the queue's filter
    state.add(2, "9|2", "/tasks", b'{"n": 2}', origin="amps-2")  # another instance's: it delivers it
    state.add(3, "9|3", "/tasks", b'{"n": 3}', origin="amps-1")
    state.add(4, "9|4", "/tasks", b'{"n": 4}', origin="amps-1")
    state.subscribe("w1", Filter("/n = 4"), 1, now=0.0)
    state.subscribe("w2", None, 1, now=0.0)
    out = state.dispatch(now=0.0)
    assert sorted((d.client, d.message.seq, d.lease_expires) for d in out) == [("w1", 4, 0.0), ("w2", 3, 0.0)]
    assert not state.leased and not state.waiting and list(state.elsewhere) == ["9|2"]
    assert "at-most-once" in state.check_ack("w1", ["9|4"], set())
    state.undo(out[:1])
    assert len(state.waiting) == 1
    state.remove(["9|2"], "amps-2.queues")  # the owner's removal, replicated
    assert not state.elsewhere
    group = QueueState(queue(kind="GroupLocalQueue", initial_owner="amps-2"), "amps-1")
    group.add(1, "9|1", "/tasks", b"{}", origin="amps-1")
    assert list(group.elsewhere) == ["9|1"]  # its InitialOwner delivers it, wherever it was published


def txlog(rows: list[tuple[int, str, str, str, bytes, str]], keys: list[str | None] | None = None) -> pa.Table:
    seq, bookmark, topic, command, data, publisher = zip(*rows, strict=True)
    n = len(rows)
    return pa.table({"seq": list(seq), "bookmark": list(bookmark), "publisher": list(publisher),
                     "publisher_seq": list(seq), "topic": list(topic), "message_type": ["json"] * n,
                     "command": list(command),
                     "sow_keys": pa.array(keys or [None] * n, pa.string()), "data": list(data),
                     "origin": ["amps-1"] * n})


def test_the_book_folds_publishes_and_acknowledgements_and_answers_subscribes():
    cfg = load("<Queue><Name>/work</Name><MessageType>json</MessageType><UnderlyingTopic>^/tasks/</UnderlyingTopic>"
               "<Semantics>at-least-once</Semantics></Queue>")
    book = QueueBook(cfg)
    book.apply(txlog([(1, "7|1", "/tasks/a", "publish", b"{}", "p"), (2, "7|2", "/other", "publish", b"{}", "p"),
                      (3, "7|3", "/tasks/b", "publish", b"{}", "p")]))
    assert list(book.queues["/work"].waiting) == ["7|1", "7|3"] and book.applied_seq == 3
    assert book.request(QueueRequest("w", "subscribe", "/work", b'{"max_backlog": 1}'), 0.0) is None
    refused = book.request(QueueRequest("w", "subscribe", "/orders"), 0.0)
    assert refused is not None and "'/orders' is not a queue of amps-1" in refused.reason
    bad = book.request(QueueRequest("w", "subscribe", "/work", b'{"max_backlog": 0}'), 0.0)
    assert bad is not None and "max_backlog must be a whole number" in bad.reason
    (queue_state, [delivery]), = book.dispatch(1.0)
    assert delivery.message.bookmark == "7|1"
    answers = book.check_acks([("w", "/work", "7|1"), ("x", "/work", "7|3"), ("amps-1.queues", "/work", "7|3")],
                              "amps-1.queues")
    assert answers[0] is None and "not leased to 'x'" in answers[1] and answers[2] is None  # (the manager's own)
    book.apply(txlog([(4, "5|1", "/work", "sow_delete", b"", "w")], keys=["7|1"]))
    assert book.status(2.0)["/work"]["acknowledged"] == 1 and book.status(2.0)["/work"]["depth"] == 1


class Acks:
    topics = frozenset({"/work"})

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, bytes | None]] = []

    def check(self, acks: list[tuple[str, str, str | None]]) -> list[str | None]:
        self.asked.extend(acks)
        return [None if keys == "7|1" else "not leased" for _c, _t, keys in acks]


def candidates(rows: list[dict]) -> pa.Table:
    full = [{**{f.name: None for f in CANDIDATE_SCHEMA}, "source": "kafka", "message_type": "json", **r}
            for r in rows]
    return pa.Table.from_pylist(full, schema=CANDIDATE_SCHEMA)


def test_classify_answers_subscribes_and_stores_only_acknowledgements_the_queue_takes():
    batch = candidates([
        {"publisher": "w", "command": "subscribe", "topic": "/work", "data": b'{"max_backlog": 3}'},
        {"publisher": "w", "publisher_seq": "1", "command": "sow_delete", "topic": "/work", "sow_keys": "7|1",
         "data": b""},
        {"publisher": "w", "publisher_seq": "2", "command": "sow_delete", "topic": "/work", "sow_keys": "7|2",
         "data": b""},
        {"publisher": "w", "command": "unsubscribe", "topic": "/work"},
    ])
    acks = Acks()
    out = classify(batch, PublisherState(), instance="amps-1", recorded=lambda t, m: True, queues=acks,
                   now=datetime.now(timezone.utc))
    assert [(r.command, r.topic) for r in out.queue_requests] == [("subscribe", "/work"), ("unsubscribe", "/work")]
    assert out.txlog_rows.column("sow_keys").to_pylist() == ["7|1"]  # stored as a sow_delete by key (bookmark)
    assert out.txlog_rows.column("command").to_pylist() == ["sow_delete"]
    assert out.rejected_rows.column("reason").to_pylist() == ["not leased"]
    assert acks.asked == [("w", "/work", "7|1"), ("w", "/work", "7|2")]


def test_a_non_owner_asks_for_messages_its_owner_does_not_keep_up_with_and_the_owner_grants_what_it_cannot_take():
    owner, other = QueueState(queue(), "amps-1"), QueueState(queue(), "amps-2")
    for state in (owner, other):
        for seq in (1, 2, 3):
            state.add(seq, f"9|{seq}", "/tasks", b"{}", origin="amps-1", now=0.0)
    assert list(other.elsewhere) == ["9|1", "9|2", "9|3"] and not other.waiting
    other.subscribe("w2", None, 2, now=0.0)
    assert other.wanted(now=0.5) == []  # not waited the typical publish-to-ack time (1 s before any is seen)
    asked = [m.bookmark for m in other.wanted(now=1.5)]
    assert asked == ["9|1", "9|2"]  # as many as its subscribers have room for
    assert other.wanted(now=2.0) == []  # asked already: not again before REQUEST_AGAIN_S
    owner.subscribe("w1", None, 1, now=1.5)
    owner.dispatch(now=1.5)  # 9|1 leased at the owner
    owner.subscribe("w1b", None, 1, now=1.5)
    assert owner.grant(asked, "amps-2", now=1.6) == []  # w1b has room: the owner keeps its messages
    del owner.subscribers["w1b"]
    assert owner.grant(asked, "amps-2", now=1.7) == ["9|2"]  # 9|1 is leased; 9|2 goes
    assert owner.elsewhere["9|2"].owner == "amps-2"
    other.transferred(["9|2"], "amps-2", now=2.0)  # the grant, replicated
    owner.transferred(["9|2"], "amps-2", now=2.0)  # and stored at the owner
    assert [d.message.bookmark for d in other.dispatch(now=2.0)] == ["9|2"]
    assert other.transfers_received == 1 and owner.transfers_granted == 1
    other.remove(["9|1"], "w1", now=3.0)  # an acknowledgement seen 3 s after its message: the typical time moves
    assert 1.0 < other.typical_ack_s < 3.0


def test_a_proxied_owner_s_messages_are_wanted_at_once_and_a_failed_grant_is_undone():
    state = QueueState(queue(), "amps-2")
    state.add(1, "9|1", "/tasks", b"{}", origin="amps-1", now=0.0)
    state.subscribe("w", None, 5, now=0.0)
    assert state.wanted(now=0.1) == []
    state.proxy_for = frozenset({"amps-1"})
    assert [m.bookmark for m in state.wanted(now=0.1)] == ["9|1"]
    owner = QueueState(queue(), "amps-1")
    owner.add(1, "9|1", "/tasks", b"{}", origin="amps-1")
    assert owner.grant(["9|1"], "amps-2") == ["9|1"]
    owner.ungrant(["9|1"])
    assert list(owner.waiting) == ["9|1"] and owner.waiting["9|1"].owner == "amps-1" and owner.transfers_granted == 0


def test_a_barrier_waits_for_every_message_ahead_of_it_here_whoever_owns_them():
    state = QueueState(queue(barrier=Filter("/barrier = 1")), "amps-2")
    state.add(1, "9|1", "/tasks", b'{"n": 1}', origin="amps-2")
    state.add(2, "9|2", "/tasks", b'{"n": 2}', origin="amps-1")  # owned elsewhere: its ack comes by replication
    state.add(3, "9|3", "/tasks", b'{"barrier": 1}', origin="amps-1")  # delivered here too (the spec's tip)
    state.add(4, "9|4", "/tasks", b'{"n": 4}', origin="amps-2")
    state.add(5, "9|5", "/tasks", b'{"barrier": 1}', origin="amps-2")
    state.subscribe("w", None, 10, now=0.0)
    assert [d.message.bookmark for d in state.dispatch(now=0.0)] == ["9|1", "9|4"]  # not the barriers
    state.remove(["9|1"], "w")
    assert state.dispatch(now=1.0) == []  # 9|2 (another's) is still unacknowledged, ahead of the barrier
    state.remove(["9|2"], "amps-1-consumer")
    assert [d.message.bookmark for d in state.dispatch(now=2.0)] == ["9|3"]
    state.remove(["9|3", "9|4"], "w")
    assert [d.message.bookmark for d in state.dispatch(now=3.0)] == ["9|5"]  # after the first barrier went
    assert state.status(3.0)["barriers_waiting"] == 0


def test_review_fixes_barrier_copies_restarted_consumers_lapsed_leases_and_counts():
    # another instance's acknowledgement of a barrier is its copy's: this instance still delivers its own
    state = QueueState(queue(barrier=Filter("/barrier = 1")), "amps-2")
    state.add(1, "9|1", "/tasks", b'{"barrier": 1}', origin="amps-1")
    state.remove(["9|1"], "someone-at-amps-1", local=False)
    state.subscribe("w", None, 5, now=0.0, session="s1")
    assert [d.message.bookmark for d in state.dispatch(now=0.0)] == ["9|1"]
    assert state.check_ack("w", ["9|1"], set()) is None
    # a consumer restarted under the same name (a new session) does not inherit the old one's leases
    state.add(2, "9|2", "/tasks", b"{}", origin="amps-2")
    assert [d.message.bookmark for d in state.dispatch(now=0.0)] == ["9|2"]
    state.subscribe("w", None, 5, now=1.0, session="s2")
    assert state.subscribers["w"].leased == {} and "9|2" in state.waiting
    # a lapsed message goes back to the same subscriber when no other can take it
    lapsed = QueueState(queue(lease_period_s=1.0), "amps-1")
    lapsed.add(1, "9|1", "/tasks", b'{"n": 1}', origin="amps-1")
    lapsed.subscribe("x", None, 5, now=0.0)
    lapsed.subscribe("y", Filter("/n = 2"), 5, now=0.0)
    assert [d.client for d in lapsed.dispatch(now=0.0)] == ["x"]
    lapsed.expire(now=2.0, silent_after=100)
    assert [d.client for d in lapsed.dispatch(now=2.0)] == ["x"]  # y's filter refuses it: x again
    # at-most-once: counted as acknowledged when delivered (its removal row, folded later, finds nothing)
    once = QueueState(queue(semantics="at-most-once"), "amps-1")
    once.add(1, "9|1", "/tasks", b"{}", origin="amps-1")
    once.subscribe("w", None, 5, now=0.0)
    once.dispatch(now=0.0)
    once.remove(["9|1"], "amps-1.queues")
    assert once.status(0.0)["acknowledged"] == 1


def test_a_resent_acknowledgement_is_a_duplicate_and_a_subscribe_to_an_instance_with_no_queue_is_refused():
    batch = candidates([
        {"publisher": "w", "publisher_seq": "3", "command": "sow_delete", "topic": "/work", "sow_keys": "7|1",
         "data": b""},
        {"publisher": "w", "publisher_seq": "4", "command": "sow_delete", "topic": "/work", "sow_keys": "7|1",
         "data": b""},
        {"publisher": "w", "publisher_seq": "4", "command": "sow_delete", "topic": "/work", "sow_keys": "7|1",
         "data": b""},
    ])
    acks = Acks()
    out = classify(batch, PublisherState(publishers={"w": 3}), instance="amps-1", recorded=lambda t, m: True,
                   queues=acks, now=datetime.now(timezone.utc))
    assert acks.asked == [("w", "/work", "7|1")]  # seq 3 is stored already, the second 4 a copy: not checked
    assert out.txlog_rows.num_rows == 1 and out.rejected_rows.num_rows == 0 and out.duplicates == 2
    subscribe = candidates([{"publisher": "w", "command": "subscribe", "topic": "/work"}])
    refused = classify(subscribe, PublisherState(), instance="amps-1", recorded=lambda t, m: True,
                       now=datetime.now(timezone.utc))
    assert refused.rejected_rows.column("reason").to_pylist() == [
        "amps-1 has no queue: define one in <SOW> (<Queue>, <GroupLocalQueue> or <LocalQueue>) to subscribe to it"]


def test_kafka_gives_up_a_delivery_when_the_shortest_at_least_once_lease_ends():
    """A delivery Kafka confirms after its lease ended would reach a consumer while the message is leased to
    another: the producer's message timeout is the shortest at-least-once lease (at-most-once: the default)."""
    from replication.queues.dispatcher import DELIVERY_TIMEOUT_DEFAULT_MS, delivery_timeout_ms

    assert delivery_timeout_ms([queue(lease_period_s=45.0), queue(name="/b", lease_period_s=12.5)]) == 12_500
    assert delivery_timeout_ms([queue(lease_period_s=0.2)]) == 1_000, "never below a second: Kafka may retry"
    assert delivery_timeout_ms([queue(semantics="at-most-once", lease_period_s=5.0)]) == DELIVERY_TIMEOUT_DEFAULT_MS
    assert delivery_timeout_ms([]) == DELIVERY_TIMEOUT_DEFAULT_MS


def test_a_delivery_kafka_gives_up_on_after_the_lease_is_logged_once_per_round_by_cause(caplog):
    """A round hands deliveries to the producer and goes on; one Kafka never takes (nothing listens on the
    address) is given up after the shortest lease, 1 s here, and each round reports those given up since
    the last one in one line per cause."""
    import socket
    import time

    from replication.queues.dispatcher import QueueDispatcher

    with socket.socket() as unused:  # a loopback port nothing listens on
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
    cfg = load("<Queue><Name>/work</Name><MessageType>json</MessageType><UnderlyingTopic>/tasks</UnderlyingTopic>"
               "<Semantics>at-least-once</Semantics><LeasePeriod>1s</LeasePeriod></Queue>")
    dispatcher = QueueDispatcher(cfg, reader=None, bootstrap=(address,))  # type: ignore[arg-type]
    dispatcher._producer = producer = dispatcher.delivery_producer()
    for n in range(3):
        producer.produce("amps-1.deliveries", value=b"m%d" % n, key=b"c1")
    started, waited, rounds = time.monotonic(), None, []
    with caplog.at_level("WARNING", logger="replication.queues.dispatcher"):
        # (librdkafka gives up on the three in its timeout scans: one scan or two, as their deadlines fall)
        while sum(told(rounds)) < 3 and time.monotonic() - started < 30:
            caplog.clear()
            dispatcher.report_undelivered()
            rounds.append([r.getMessage() for r in caplog.records if "not confirmed" in r.getMessage()])
            if rounds[-1] and waited is None:
                waited = time.monotonic() - started
            time.sleep(0.1)
        caplog.clear()
        dispatcher.report_undelivered()  # the next round: nothing new to say
        after = [r.getMessage() for r in caplog.records if "not confirmed" in r.getMessage()]
    said = [line for lines in rounds for line in lines]
    assert sum(told(rounds)) == 3 and all(len(lines) <= 1 for lines in rounds), said  # a line per cause and round
    assert all("timed out" in line.lower() for line in said), said
    assert not after, after
    assert waited is not None and waited >= 0.9, "given up only once the lease could have run out"
    dispatcher._producer = producer = None  # (librdkafka's client ends with its last reference)


def told(rounds: list[list[str]]) -> list[int]:
    """The delivery counts of ``amps-1: N deliveries not confirmed by Kafka: ...`` lines."""
    return [int(re.match(r"amps-1: (\d+) deliveries not confirmed by Kafka: ", line).group(1))  # type: ignore[union-attr]
            for lines in rounds for line in lines]
