"""Replication keeps its guarantees under faults (issue 14): real broker, Spark and Delta, instances in one
Spark application (the kill -9 cases are in test_fault_processes.py).

- a sync destination that stops: acks withheld until the downgrade Age, then flowing; upgraded only once
  caught up; MinimumSyncDestinations respected; ``status --check`` names the stall, the lag, the instance down;
- transitive sync A -> B -> C: C's absence withholds A's publisher's acks, C's return releases them; then
  ``verify`` is clean, and finds a message deleted and a body changed by hand;
- a link refused by replication validation, its destination fixed and restarted: the link connects without
  restarting the upstream; an async link's lag is measured;
- a ring of three sync instances, destinations named by their group: everything once, acks flow, nothing
  sent to an instance already on a message's path, and ``trace`` shows the same routes as the inboxes.
"""

from __future__ import annotations

import time

import json

import pytest
from deltalake import DeltaTable

from fabric_support import ONE_WAY, AckRecorder, PacedPublisher, cli, publish_orders
from factories import assert_exactly_once, destination_xml, downgrade_xml, replication_xml, wait_until
from replication import instance as instance_module
from replication.commands import trace as trace_command
from replication.config.fabric import Fabric

AGE = 6.0  # downgrade Age (s); upgrade at half of it, as 60East recommends
EVERY = 0.5


def link_of(fabric, short: str, dest: str) -> dict:
    """What ``replication status`` shows for one destination of a running instance."""
    return fabric.running[short].status().links[dest]


def test_a_stopped_sync_destination_is_downgraded_after_its_age_then_upgraded_once_caught_up(fabric, monkeypatch,
                                                                                            caplog):
    monkeypatch.setattr(instance_module, "STALL_REPORT_S", 2.0)  # the heartbeat's own stall report (30 s)
    b_name, c_name = fabric.name("b"), fabric.name("c")
    fabric.configure("b")
    fabric.configure("c")
    fabric.configure("a", replication=replication_xml(
        destination_xml(b_name, [fabric.storage("b")], topics=ONE_WAY),
        destination_xml(c_name, [fabric.storage("c")], topics=ONE_WAY),
        actions=downgrade_xml(every=f"{EVERY}s", downgrade_age=f"{AGE}s", upgrade_age=f"{AGE / 2}s", minimum_sync=1)))
    fabric.start("b")
    fabric.start("c")
    fabric.start("a")
    pub = fabric.publisher("steady", "a", resend_after=60)
    acks = AckRecorder(pub)
    feed = PacedPublisher(pub, rate=40)
    try:
        wait_until(lambda: pub.persisted_seq >= 40, what="acks to flow with both sync destinations up")

        # B stops. Its rows keep their ages: acks are withheld until the Age, then B is downgraded...
        fabric.stop("b")
        stopped_at, last_before = time.monotonic(), feed.published
        wait_until(lambda: link_of(fabric, "a", b_name)["downgraded"], timeout=60, what="B to be downgraded")
        downgraded_at = time.monotonic()
        first_after = acks.first_covering(last_before + 1)
        assert first_after is None or first_after - stopped_at > AGE * 0.8, "acks were not withheld until Age"
        # ...and from then on acks flow steadily: no burst every Age (a downgraded link that lost its rows'
        # ages was upgraded at the next tick, then downgraded again an Age later, and so on)
        downgrade_states = []
        deadline = downgraded_at + 2 * AGE
        while time.monotonic() < deadline:
            downgrade_states.append(link_of(fabric, "a", b_name)["downgraded"])
            time.sleep(0.2)
        assert all(downgrade_states), "B was upgraded while still down"
        gap = acks.largest_gap(downgraded_at + 2 * EVERY, deadline)
        assert gap < AGE / 2, f"acks stalled {gap:.1f}s at a time after the downgrade (Age {AGE}s)"

        # What a monitor sees: B down, A's link to B stalled and lagging.
        code, out = cli("status", fabric.paths["a"], fabric.paths["b"], "--check", "--stall-after", "2",
                        "--max-lag", "2")
        assert code == 1, out
        assert f"DOWN: {b_name} is not running" in out, out
        assert f"STALLED: {fabric.name('a')} -> {b_name}: stalled" in out, out
        assert f"LAGGING: {fabric.name('a')} -> {b_name}: lagging" in out, out
        beat = fabric.running["a"].status()
        assert beat.links[b_name]["waiting_since"] is not None and beat.links[b_name]["lag_seconds"] > AGE
        assert beat.stalled[b_name] == beat.links[b_name]["waiting_since"], "the heartbeat says stalled, since when"
        assert any(f"destination {b_name} stalled" in r.getMessage() for r in caplog.records)

        # C stops too: downgrading it would leave no sync destination (MinimumSyncDestinations 1).
        fabric.stop("c")
        last_before_c = feed.published
        time.sleep(AGE + 4 * EVERY)
        assert not link_of(fabric, "a", c_name)["downgraded"]
        assert pub.persisted_seq < last_before_c + 1, "acks must wait for C, which stays sync"

        # C returns: acks resume. B returns: resynced, and upgraded once within the upgrade Age.
        fabric.start("c")
        wait_until(lambda: pub.persisted_seq > last_before_c, timeout=120, what="acks to resume with C back")
        fabric.start("b")
        wait_until(lambda: not link_of(fabric, "a", b_name)["downgraded"], timeout=120, what="B to be upgraded")
        upgraded = link_of(fabric, "a", b_name)
        assert upgraded["state"] in ("connected", "failed over") and upgraded["lag_seconds"] < AGE
    finally:
        published = feed.stop()
        acks.stop()
    pub.flush(timeout=240)
    assert pub.persisted_seq == published
    for side in ("a", "b", "c"):
        wait_until(lambda s=side: fabric.count(s) == published, what=f"{side} to hold every message")
        assert_exactly_once(fabric.rows(side), {"steady": published})


def test_transitive_sync_withholds_acks_while_the_last_hop_is_down_and_verify_checks_what_was_acknowledged(fabric):
    fabric.configure("c")
    fabric.configure("b", replication=replication_xml(
        destination_xml(fabric.name("c"), [fabric.storage("c")], topics=ONE_WAY)))
    fabric.configure("a", replication=replication_xml(
        destination_xml(fabric.name("b"), [fabric.storage("b")], topics=ONE_WAY)))
    for short in ("c", "b", "a"):
        fabric.start(short)
    pub = fabric.publisher("chain", "a", resend_after=60)
    publish_orders(pub, 50)
    pub.flush(timeout=240)

    fabric.stop("c")
    publish_orders(pub, 50)
    wait_until(lambda: fabric.count("b") == 100, what="B to store the messages published after C stopped")
    with pytest.raises(TimeoutError):
        pub.flush(timeout=6)
    assert pub.persisted_seq == 50, "B has them, but B's sync destination C does not: A must not ack"
    fabric.start("c")
    pub.flush(timeout=240)
    for side in ("a", "b", "c"):
        assert_exactly_once(fabric.rows(side), {"chain": 100})

    configs = [fabric.paths[s] for s in ("a", "b", "c")]
    code, out = cli("verify", *configs)
    assert code == 0 and "consistent" in out, out  # while the instances run

    for short in ("a", "b", "c"):
        fabric.stop(short)
    DeltaTable(str(fabric.storage("c") / "txlog")).delete("publisher_seq = 42")
    b_txlog = DeltaTable(str(fabric.storage("b") / "txlog"))
    b_txlog.update(updates={"data": "CAST('{\"qty\": 999}' AS BYTEA)"}, predicate="publisher_seq = 7")
    code, out = cli("verify", *configs)
    assert code == 1, out
    assert f"{fabric.name('b')} -> {fabric.name('c')}" in out and "publisher chain missing" in out
    assert "publisher_seq 42" in out, out
    assert f"different body at {fabric.name('b')}" in out, out
    code, out = cli("verify", *configs, "--format", "json")
    findings = json.loads(out)["findings"]
    # the body changed at B differs from A's (A -> B) and from C's (B -> C)
    assert {(f["kind"], f["upstream"], f["downstream"]) for f in findings} == {
        ("missing", fabric.name("b"), fabric.name("c")), ("body", fabric.name("a"), fabric.name("b")),
        ("body", fabric.name("b"), fabric.name("c"))}
    assert [f["seq_ranges"] for f in findings if f["kind"] == "missing"] == [[[42, 42]]]
    # Spark, which verify uses for txlogs too large for one process, finds the same
    code, out = cli("verify", *configs, "--engine", "spark", "--format", "json")
    assert code == 1 and json.loads(out)["engine"] == "spark"
    assert json.loads(out)["findings"] == findings


def test_a_link_refused_by_validation_connects_once_the_destination_is_fixed_without_restarting_the_upstream(
        fabric, caplog):
    caplog.set_level("ERROR", logger="replication.destination.manager")
    b_name, a_name = fabric.name("b"), fabric.name("a")
    fabric.configure("b", txlog_topics='<Topic><Name>^/audit</Name><MessageType>json</MessageType></Topic>')
    fabric.configure("a", replication=replication_xml(
        destination_xml(b_name, [fabric.storage("b")], sync="async", topics=ONE_WAY)))
    fabric.start("b")
    fabric.start("a")
    link = wait_until(lambda: (lambda s: s if s["state"] == "validation failed" else None)(link_of(fabric, "a", b_name)),
                      timeout=60, what="the link to be refused")
    assert "txlog" in link["detail"] and "TransactionLog" in link["detail"], link["detail"]
    assert any("replication validation failed" in r.getMessage() for r in caplog.records)
    refused = f"REFUSED: {a_name} -> {b_name}: validation failed"
    out = wait_until(lambda: (lambda r: r[1] if r[0] == 1 and refused in r[1] else None)(
        cli("status", fabric.paths["a"], "--check")), timeout=30, what="status --check to see the heartbeat")
    assert "txlog check failed" in out, out

    pub = fabric.publisher("refused", "a")
    publish_orders(pub, 30)
    pub.flush(timeout=120)  # async: A's publishers are not held by the refused link
    # ...but the link is behind, and says by how long (an async destination's lag, issue 14 #4)
    wait_until(lambda: link_of(fabric, "a", b_name)["lag_seconds"] > 1.0, what="the async link's lag to grow")

    fabric.stop("b")
    fabric.configure("b")  # fixed: records every topic
    fabric.start("b")
    wait_until(lambda: link_of(fabric, "a", b_name)["state"] == "connected", timeout=120,
               what="A's link to connect to the fixed B")
    wait_until(lambda: fabric.count("b") == 30, what="B to receive what A held")
    assert_exactly_once(fabric.rows("b"), {"refused": 30})
    wait_until(lambda: link_of(fabric, "a", b_name)["lag_seconds"] == 0, what="the link to catch up")
    out = wait_until(lambda: (lambda r: r[1] if r[0] == 0 else None)(
        cli("status", fabric.paths["a"], fabric.paths["b"], "--check")), timeout=30, what="status --check: OK")
    assert out.startswith("OK: 2 instances running"), out


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
