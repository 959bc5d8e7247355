"""Replication between instances end to end: pairs, chains, rings, routing, acks (real broker, Spark, Delta).

Issue 3: pairs, chains and rings deliver once; routing by topic, type and content; acks wait for sync
destinations only."""

from __future__ import annotations

import json
import threading
import time

import pytest
from deltalake import DeltaTable
from support.fabric import ONE_WAY, PacedPublisher, publish_orders
from support.factories import assert_exactly_once, destination_xml, inbox_codecs, replication_xml, wait_until

from replication import config, routing
from replication.commands import trace as trace_command
from replication.config.fabric import Fabric
from replication.messages import tag_value_body, tag_value_fields


def test_two_way_pair_ends_with_the_same_messages_once_each(fabric, read_path):
    fabric.start_sync_pair()
    pa_, pb_ = fabric.publisher("pub-a", "a"), fabric.publisher("pub-b", "b")
    # Both sides at once, at a steady pace: each side's batches then hold its own rows (waiting for the
    # partner's ack) next to the partner's rows (acknowledged to the partner). No downgrade action is
    # configured, so acks that waited on each other would never come and flush would time out.
    threads = [threading.Thread(target=publish_paced, args=(pub, 1500, 1000.0)) for pub in (pa_, pb_)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pa_.flush(timeout=240)  # sync: persisted only once the other side has it
    pb_.flush(timeout=240)
    for side in ("a", "b"):
        assert_exactly_once(fabric.rows(side), {"pub-a": 1500, "pub-b": 1500})
    assert set(fabric.rows("a")["bookmark"].to_pylist()) == set(fabric.rows("b")["bookmark"].to_pylist())
    received = [r for r in fabric.rows("b").to_pylist() if r["publisher"] == "pub-a"]
    assert {r["received_from"] for r in received} == {fabric.name("a")}
    assert {tuple(r["path"]) for r in received} == {(fabric.name("a"), fabric.name("b"))}
    assert {r["origin"] for r in received} == {fabric.name("a")}
    assert inbox_codecs(fabric.storage("b")) == {"ZSTD"}, "inbox writes default to zstd"
    assert_read_path(read_path, *fabric.running.values())


def publish_paced(pub, n: int, rate: float) -> None:
    """Publish ``n`` orders at about ``rate`` per second."""
    started = time.monotonic()
    for i in range(n):
        pub.publish("/orders", json.dumps({"i": i, "qty": i % 300}).encode())
        ahead = started + (i + 1) / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)


def assert_read_path(read_path: str, *instances) -> None:
    """The ingests' small batches were read by their writers themselves, or (spark-job) every batch by Spark; the
    replicators (driver threads) took the rows their ingest had just committed from memory either way."""
    counts = [inst.writer.driver_read.batches for inst in instances]
    if read_path == "driver-read":
        assert all(n > 0 for n in counts), counts
        # and batches were read as soon as Spark had planned them (the rows checked exactly once above)
        assert sum(inst.writer.driver_read.ahead.hits for inst in instances) > 0
    else:
        assert not any(counts), counts
    from_memory = [m.replicator.ranges_from_memory for inst in instances for m in inst.managers
                   if m.replicator is not None]
    assert from_memory and all(n > 0 for n in from_memory), from_memory


@pytest.mark.parametrize("passthrough", [None, ".*"], ids=["no-passthrough", "passthrough"])
def test_chain_forwards_only_with_passthrough(fabric, passthrough):
    c = fabric.storage("c")
    b = fabric.storage("b")
    fabric.configure("c")
    fabric.configure("b", replication=replication_xml(
        destination_xml(fabric.name("c"), [c], topics=ONE_WAY, passthrough=passthrough)))
    fabric.configure("a", replication=replication_xml(destination_xml(fabric.name("b"), [b], topics=ONE_WAY)))
    for short in ("c", "b", "a"):
        fabric.start(short)
    from_a, from_b = fabric.publisher("from-a", "a"), fabric.publisher("from-b", "b")
    publish_orders(from_a, 200)
    publish_orders(from_b, 200)
    from_a.flush(timeout=240)
    from_b.flush(timeout=240)
    assert_exactly_once(fabric.rows("b"), {"from-a": 200, "from-b": 200})
    expected_at_c = {"from-b": 200} if passthrough is None else {"from-a": 200, "from-b": 200}
    wait_until(lambda: fabric.count("c") == sum(expected_at_c.values()), what="C to receive what it should")
    assert_exactly_once(fabric.rows("c"), expected_at_c)


def test_cycle_with_passthrough_does_not_loop(fabric):
    a, b, c = (fabric.storage(s) for s in "abc")
    ring = {"a": ("b", b), "b": ("c", c), "c": ("a", a)}
    for short, (nxt, addr) in ring.items():
        fabric.configure(short, replication=replication_xml(
            destination_xml(fabric.name(nxt), [addr], sync="async", topics=ONE_WAY)))
    for short in "abc":
        fabric.start(short)
    pubs = {s: fabric.publisher(f"at-{s}", s) for s in "abc"}
    for pub in pubs.values():
        publish_orders(pub, 300)
    for pub in pubs.values():
        pub.flush(timeout=240)
    for s in "abc":
        wait_until(lambda s=s: fabric.count(s) == 900, what=f"{s} to hold all 900")
        assert_exactly_once(fabric.rows(s), {"at-a": 300, "at-b": 300, "at-c": 300})
    # No message went round twice: each inbox holds at most one copy per hop.
    for s in "abc":
        inbox = fabric.running[s].layout.inbox
        from deltalake import DeltaTable
        assert DeltaTable(str(inbox)).to_pyarrow_table(columns=["publisher"]).num_rows <= 600


def test_topic_type_and_content_filters_route_exactly_the_expected_rows(fabric, read_path):
    b = fabric.storage("b")
    topics = (
        '<Topic><Name>/orders</Name><MessageType>json</MessageType><Filter>/qty &gt; 100 AND /side = \'buy\'</Filter>'
        '<ExcludeValidation>replicate,cascade,replicate_filter</ExcludeValidation></Topic>'
        '<Topic><Name>^/trades/</Name><MessageType>json</MessageType>'
        '<ExcludeValidation>replicate,cascade</ExcludeValidation></Topic>'
    )
    txlog = ('<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>'
             '<Topic><Name>.*</Name><MessageType>xml</MessageType></Topic>')
    fabric.configure("b", txlog_topics=txlog)
    fabric.configure("a", txlog_topics=txlog, replication=replication_xml(
        destination_xml(fabric.name("b"), [b], topics=topics, compression="snappy")))
    fabric.start("b")
    fabric.start("a")
    pub = fabric.publisher("mixed", "a")
    link = fabric.running["a"].links[fabric.name("b")]
    sent = []
    for i in range(120):
        if i == 4:  # the first four through the link first (B is sync: their persisted acks wait for its
            pub.flush(timeout=120)  # ack): the rest come in later batches, read ahead
        topic = ["/orders", "/trades/eu", "/quotes", "/orders/x"][i % 4]
        body = {"qty": (i * 7) % 250, "side": "buy" if i % 3 else "sell"}
        sent.append((i + 1, topic, "json", body))
        pub.publish(topic, json.dumps(body).encode())
    for i in range(5):
        pub.publish("/trades/eu", b"<trade/>", message_type="xml")
        sent.append((121 + i, "/trades/eu", "xml", None))
    pub.flush(timeout=240)

    a_cfg = config.load(str(fabric.paths["a"]))
    dest = a_cfg.destinations[0]
    by_module = {seq for seq, topic, mtype, body in sent
                 if routing.decide(a_cfg, dest, routing.published(topic, a_cfg.name, message_type=mtype, data=body))}
    by_hand = {seq for seq, topic, mtype, body in sent
               if (topic == "/orders" and body["qty"] > 100 and body["side"] == "buy")
               or (topic.startswith("/trades/") and mtype == "json")}
    assert by_module == by_hand and 0 < len(by_hand) < len(sent)
    wait_until(lambda: fabric.count("b") == len(by_hand), what="B to receive the routed rows")
    assert set(fabric.rows("b")["publisher_seq"].to_pylist()) == by_hand
    assert inbox_codecs(b) == {"SNAPPY"}, "the destination's <Compression> applies to its inbox writes"
    # Filtered rows are acknowledged too: the link's acknowledged position reaches the end of A's log.
    wait_until(lambda: link.acked_seq == fabric.running["a"].durability.committed_seq, what="filtered rows acked")
    assert_read_path(read_path, *fabric.running.values())


@pytest.mark.parametrize("sync_type", ["sync", "async"])
def test_persisted_acks_wait_for_sync_destinations_only(fabric, sync_type, monkeypatch):
    b = fabric.storage("b")
    fabric.configure("b")
    fabric.configure("a", replication=replication_xml(
        destination_xml(fabric.name("b"), [b], sync=sync_type, topics=ONE_WAY)))
    fabric.start("b")
    fabric.stop("b")  # B exists (validation can read it) but is down
    fabric.start("a")
    pub = fabric.publisher("waiter", "a", resend_after=1.0)
    publish_orders(pub, 100)
    if sync_type == "sync":
        with pytest.raises(TimeoutError):
            pub.flush(timeout=8)
        assert fabric.count("a") == 100, "the messages are in A's txlog; only the ack is withheld"
        # Meanwhile the publisher's watchdog logged on again (acks stalled for over a second) and
        # learnt that A has stored everything: nothing was sent twice.
        assert pub.resent == [] and fabric.running["a"].status().counters["duplicates"] == 0
    else:
        pub.flush(timeout=120)
    fabric.start("b")  # B returns: A resyncs it, and acks flow
    pub.flush(timeout=240)
    wait_until(lambda: fabric.count("b") == 100, what="B to be resynced")
    assert_exactly_once(fabric.rows("b"), {"waiter": 100})
    # Nothing waits for B now: the ack watch reads B's ack once a second, not at every 50 ms turn.
    from replication.destination import manager

    wait_until(lambda: not fabric.running["a"].links[fabric.name("b")].awaiting_ack(), what="every row acked")
    reads, read_ack = [], manager.read_ack
    monkeypatch.setattr(manager, "read_ack", lambda layout, upstream: reads.append(upstream) or read_ack(layout,
                                                                                                          upstream))
    time.sleep(3)
    assert 1 <= len(reads) <= 5, f"{len(reads)} reads of an idle link's ack in 3 s"


def test_a_replicator_batch_that_cannot_be_read_is_run_again_after_a_back_off(fabric, monkeypatch, caplog):
    """A txlog read that fails stops the replicator; its manager starts it again after a back-off, after the
    link's position: the same rows are read again, and every row reaches B once."""
    from replication.destination.replicator import Replicator

    real_read = Replicator._read_and_route
    failures = []

    def failing_twice(self, after, through):
        if len(failures) < 2:
            failures.append((after, through))
            raise OSError("a txlog file could not be opened (injected)")
        return real_read(self, after, through)

    monkeypatch.setattr(Replicator, "_read_and_route", failing_twice)
    fabric.start_one_way_pair()
    pub = fabric.publisher("read-fails", "a")
    publish_orders(pub, 1)
    pub.flush(timeout=120)
    wait_until(lambda: fabric.count("b") == 1, what="B to receive the first message")
    publish_orders(pub, 299)
    pub.flush(timeout=120)
    wait_until(lambda: fabric.count("b") == 300, what="B to receive every message")
    assert len(failures) == 2 and failures[0] == failures[1], failures
    assert any("replicator stopped: a txlog file could not be opened (injected)" in r.getMessage()
               for r in caplog.records)
    assert_exactly_once(fabric.rows("b"), {"read-fails": 300})


@pytest.mark.parametrize("restarted", [False, True], ids=["held-in-memory", "restarted"])
def test_a_replicator_that_starts_behind_takes_the_backlog_in_one_batch(fabric, restarted):
    """A replicator whose destination comes up after A has stored messages takes them all in its first batch.
    Rows the ingest committed in this process are taken from memory; after a restart, from the txlog's files."""
    fabric.configure("b")
    fabric.configure("a", replication=replication_xml(destination_xml(fabric.name("b"), [fabric.storage("b")],
                                                                      topics=ONE_WAY)))
    fabric.start("a")  # B does not exist yet: A's link waits for it
    pub = fabric.publisher("early", "a")
    publish_orders(pub, 50)
    wait_until(lambda: fabric.count("a") == 50, what="A to store every message")
    if restarted:
        fabric.stop("a")
        fabric.start("a")
    fabric.start("b")
    pub.flush(timeout=240)
    assert_exactly_once(fabric.rows("b"), {"early": 50})
    assert_same_rows(fabric.rows("a"), fabric.rows("b"))
    replicators = [m.replicator for m in fabric.running["a"].managers]
    assert [r.batches for r in replicators] == [1], "one batch"
    assert [r.ranges_from_memory for r in replicators] == [0 if restarted else 1]


def test_a_batch_that_failed_after_its_txlog_commit_is_replicated_from_the_txlogs_files(fabric):
    """A's 3rd ingest batch fails after its txlog commit, before its rows reach the replicators' memory: the
    restarted query skips it, and the rows held start again after it. B, coming up afterwards, gets that
    range from A's txlog files, later rows from memory: every row once, as A stored it."""
    from replication import failpoints

    fabric.configure("b")
    fabric.configure("a", max_offsets=100, replication=replication_xml(
        destination_xml(fabric.name("b"), [fabric.storage("b")], topics=ONE_WAY)))
    a = fabric.start("a")  # B does not exist yet: only A's ingest passes the failpoint
    failpoints.arm("ingest.after_txlog_commit@3:raise")
    try:
        pub = fabric.publisher("failed-batch", "a")
        publish_orders(pub, 400)
        wait_until(lambda: fabric.count("a") == 400, what="A to store every message")
    finally:
        failpoints.arm("")
    assert a.restarts >= 1
    fabric.start("b")
    wait_until(lambda: fabric.count("b") == 400, what="B to receive the first 400")
    writer = a.managers[0].replicator
    assert writer.ranges_from_memory == 0, "the range with the failed batch's rows came from the files"
    publish_orders(pub, 100)
    pub.flush(timeout=240)
    wait_until(lambda: fabric.count("b") == 500, what="B to receive the rest")
    assert writer.ranges_from_memory >= 1, "rows committed after B came up were taken from memory"
    assert_exactly_once(fabric.rows("b"), {"failed-batch": 500})
    assert_same_rows(fabric.rows("a"), fabric.rows("b"))


def assert_same_rows(upstream, downstream) -> None:
    """``downstream`` holds the upstream's rows as they were stored there: bodies, topics, times, SOW keys."""
    columns = ["bookmark", "topic", "message_type", "command", "sow_key", "data", "origin", "publish_time"]
    assert upstream.select(columns).sort_by("bookmark").equals(downstream.select(columns).sort_by("bookmark"))


@pytest.mark.parametrize("content_filter", [False, True], ids=["headers-only", "content-filter"])
def test_a_replicator_backlog_is_routed_by_headers_or_by_its_content_filter(fabric, content_filter):
    """A backlog taken in one batch is routed as a live stream is: by headers (one answer per distinct header
    combination), or by a content filter that reads bodies."""
    topics = ("<Topic><Name>/orders</Name><MessageType>json</MessageType><Filter>/qty &lt; 20</Filter>"
              "<ExcludeValidation>replicate,cascade,replicate_filter</ExcludeValidation></Topic>"
              if content_filter else ONE_WAY)
    fabric.configure("b")
    fabric.configure("a", replication=replication_xml(destination_xml(fabric.name("b"), [fabric.storage("b")],
                                                                      topics=topics)))
    fabric.start("a")  # B does not exist yet: A's link waits for it, and then takes the 50 rows in one batch
    pub = fabric.publisher("backlog", "a")
    publish_orders(pub, 50)
    wait_until(lambda: fabric.count("a") == 50, what="A to store every message")
    fabric.start("b")
    pub.flush(timeout=240)  # (B is sync: filtered rows are acknowledged too)
    routed = 20 if content_filter else 50  # publish_orders: the i-th order has qty i
    wait_until(lambda: fabric.count("b") == routed, what="B to receive the routed rows")
    assert_exactly_once(fabric.rows("b"), {"backlog": routed})
    assert [m.replicator.batches for m in fabric.running["a"].managers] == [1]


def test_a_sync_pair_stopped_mid_stream_and_restarted_acknowledges_everything_once(fabric):
    """Both halves stop while each holds rows not yet durable; after the restart each matches those rows to
    their publishers and upstreams again (from its txlog) and acks flow, with no downgrade configured."""
    fabric.start_sync_pair()
    pubs = [fabric.publisher("early-a", "a", resend_after=2.0), fabric.publisher("early-b", "b", resend_after=2.0)]
    threads = [threading.Thread(target=publish_paced, args=(pub, 1200, 600.0)) for pub in pubs]
    for t in threads:
        t.start()
    wait_until(lambda: fabric.count("a") > 300 and fabric.count("b") > 300, what="both sides to store a few")
    fabric.stop("a")  # at 600 msg/s a side has a few hundred rows in flight to its partner at any moment
    fabric.stop("b")
    for t in threads:
        t.join()
    fabric.start("a")
    fabric.start("b")
    for pub in pubs:
        pub.flush(timeout=240)
    for side in ("a", "b"):
        assert_exactly_once(fabric.rows(side), {"early-a": 1200, "early-b": 1200})


def test_a_ring_of_three_sync_instances_named_by_group_delivers_once_and_never_loops(fabric):
    """A -> B -> C -> A, all sync, PassThrough .*, each destination written with a <Group> and no <Name>,
    publishers at all three at once. Acknowledging only a prefix per upstream, each instance's acks wait
    on the next one's round the ring and stop for good; per row they flow. The loop rule asks whether the
    instance reached (not the destination's group name) is on a message's path."""
    ring = {"a": "b", "b": "c", "c": "a"}
    for short, nxt in ring.items():
        fabric.configure(short, group="ring", replication=replication_xml(
            destination_xml(None, [fabric.storage(nxt)], group="ring", topics=ONE_WAY)))
    for short in "abc":
        fabric.start(short)
    pubs = {s: fabric.publisher(f"ring-{s}", s, resend_after=60) for s in "abc"}
    feeds = [PacedPublisher(pub, rate=60) for pub in pubs.values()]
    time.sleep(8)
    published = {f"ring-{s}": feed.stop() for s, feed in zip("abc", feeds)}
    for pub in pubs.values():
        pub.flush(timeout=240)  # with no downgrade configured, acks that waited on each other never come
    for s in "abc":
        assert fabric.running[s].status().links["ring"]["state"] == "connected"
        wait_until(lambda s=s: fabric.count(s) == sum(published.values()), what=f"{s} to hold everything")
        assert_exactly_once(fabric.rows(s), published)

    # Nothing went to an instance already on its path: no inbox holds a copy that passed through its owner.
    for s in "abc":
        paths = DeltaTable(str(fabric.storage(s) / "inbox")).to_pyarrow_table(columns=["path"])["path"].to_pylist()
        assert not any(fabric.name(s) in path for path in paths), f"{s} was sent copies that passed through it"
    # The engine and `replication trace` agree on where a message published at A goes, and by which path:
    # an inbox row carries its sender's path; the receiver stores that path plus itself (trace's form).
    result = trace_command.trace(Fabric.load([str(fabric.paths[s]) for s in "abc"]), fabric.name("a"), "/orders")
    traced = {name: {tuple(p) for p in paths} for name, paths in result.routes.items()}
    assert set(traced) == {fabric.name(s) for s in "abc"}
    for s in "bc":
        inbox = DeltaTable(str(fabric.storage(s) / "inbox")).to_pyarrow_table(columns=["path", "publisher"])
        engine = {tuple(p) + (fabric.name(s),)
                  for p, pub in zip(inbox["path"].to_pylist(), inbox["publisher"].to_pylist(), strict=True)
                  if pub == "ring-a"}
        assert engine == traced[fabric.name(s)], (s, engine, traced)


def test_fix_and_nvfix_topics_filtered_by_tag_route_row_by_row(fabric):
    topics = (
        "<Topic><Name>^/fix/</Name><MessageType>fix</MessageType><Filter>/55 = 'IBM' AND /38 &gt;= 200</Filter>"
        "<ExcludeValidation>replicate,cascade,replicate_filter</ExcludeValidation></Topic>"
        "<Topic><Name>^/nv/</Name><MessageType>nvfix</MessageType>"
        "<Filter>/Side = 'buy' OR /Note IS NULL</Filter>"
        "<ExcludeValidation>replicate,cascade,replicate_filter</ExcludeValidation></Topic>"
    )
    txlog = ("<Topic><Name>^/fix/</Name><MessageType>fix</MessageType></Topic>"
             "<Topic><Name>^/nv/</Name><MessageType>nvfix</MessageType></Topic>")
    fabric.configure("b", txlog_topics=txlog)
    fabric.configure("a", txlog_topics=txlog, replication=replication_xml(
        destination_xml(fabric.name("b"), [fabric.storage("b")], topics=topics)))
    fabric.start("b")
    fabric.start("a")
    pub = fabric.publisher("tags", "a")
    expected = set()
    for i in range(60):
        symbol, qty = ("IBM", "MSFT", "AAPL")[i % 3], (i * 37) % 400
        fix = tag_value_body([("35", "D"), ("55", symbol), ("38", str(qty)), ("54", "1")])
        if pub.publish("/fix/orders", fix, message_type="fix") and symbol == "IBM" and qty >= 200:
            expected.add(2 * i + 1)
        side = ("buy", "sell")[i % 2]
        nv = [("Symbol", symbol), ("Side", side)] + ([("Note", "n")] if i % 3 else [])
        if pub.publish("/nv/orders", tag_value_body(nv), message_type="nvfix") and (side == "buy" or i % 3 == 0):
            expected.add(2 * i + 2)
    assert pub.flush(timeout=240) == []
    assert 0 < len(expected) < 120
    wait_until(lambda: fabric.count("b") == len(expected), what="B to receive the rows the filters pass")
    rows = fabric.rows("b").to_pylist()
    assert [r["publisher_seq"] for r in rows] == sorted(expected)
    for row in rows:  # checked row by row against the body B holds
        fields = dict(tag_value_fields(row["data"]))
        if row["message_type"] == "fix":
            assert row["topic"] == "/fix/orders" and fields["55"] == "IBM" and int(fields["38"]) >= 200, fields
        else:
            assert row["topic"] == "/nv/orders" and (fields["Side"] == "buy" or "Note" not in fields), fields
    a_rows = fabric.rows("a").to_pylist()
    assert len(a_rows) == 120 and {r["message_type"] for r in a_rows} == {"fix", "nvfix"}


def test_a_batch_read_ahead_for_other_ranges_is_not_used_and_stop_ends_the_threads(fabric, monkeypatch):
    """The ingest writers take rows read ahead only when they are the batch's own: here every read ahead is made
    to claim other ranges (and hold no rows), so using one would lose the batch's rows. Stopping the instances
    ends their read-ahead threads, and their replicators' threads."""
    from replication.ingest.inputs import DriverRead, _Read

    made = {"ingest": 0}
    ingest_read = DriverRead._read_ahead

    def other_ranges(self, plans, batch_id):
        read = ingest_read(self, plans, batch_id)
        made["ingest"] += read is not None
        return None if read is None else _Read([({"t": {"0": -1}}, {"t": {"0": -1}})], [], None)

    monkeypatch.setattr(DriverRead, "_read_ahead", other_ranges)
    fabric.start_one_way_pair()
    a, b = fabric.running["a"], fabric.running["b"]
    pub = fabric.publisher("pub-a", "a")
    publish_paced(pub, 600, 1000.0)  # many small batches, each read ahead
    pub.flush(timeout=240)
    wait_until(lambda: fabric.count("b") >= 600, timeout=120, what="B has A's 600 rows")
    for side in ("a", "b"):
        assert_exactly_once(fabric.rows(side), {"pub-a": 600})
    assert made["ingest"] > 0, made
    assert a.writer.driver_read.ahead.hits == 0 and b.writer.driver_read.ahead.hits == 0
    fabric.stop("a")
    fabric.stop("b")
    left = [t.name for t in threading.enumerate()
            if (t.name.endswith("-read-ahead") or "#" in t.name) and fabric.suffix in t.name]
    assert left == [], left
