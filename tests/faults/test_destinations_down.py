"""Destinations stopped, killed or unreachable: downgrade/upgrade, transitive sync, failover, resync.

A sync destination downgraded after its Age and upgraded once caught up; transitive sync withholding acks while
its last hop is down; failover to a destination's next address (after a clean stop, and after kill -9 with
growing back-off); resync after a destination returns or a checkpoint is lost; a publisher failing over within
a sync pair. Real broker, Spark and Delta."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections import Counter

import pytest
from deltalake import DeltaTable
from support.cli import run_cli
from support.fabric import ONE_WAY, AckRecorder, PacedPublisher, link_of, publish_orders
from support.factories import assert_exactly_once, destination_xml, downgrade_xml, replication_xml, wait_until
from support.processes import InstanceProcess, running

from replication import instance as instance_module

AGE = 6.0  # downgrade Age (s); upgrade at half of it, as 60East recommends
EVERY = 0.5


def test_a_stopped_sync_destination_is_downgraded_after_its_age_then_upgraded_once_caught_up(fabric, monkeypatch,
                                                                                            caplog):
    monkeypatch.setattr(instance_module, "STALL_REPORT_S", 2.0)  # the heartbeat's own stall report (30 s)
    b_name, c_name = fabric.name("b"), fabric.name("c")
    fabric.configure("b")
    fabric.configure("c")
    # the downgrade and the upgrade as two actions, each on its own schedule, as AMPS users often write them
    fabric.configure("a", replication=replication_xml(
        destination_xml(b_name, [fabric.storage("b")], topics=ONE_WAY),
        destination_xml(c_name, [fabric.storage("c")], topics=ONE_WAY),
        actions=downgrade_xml(every=f"{EVERY}s", downgrade_age=f"{AGE}s", upgrade_age=f"{AGE / 2}s", minimum_sync=1,
                              upgrade_every="1s")))
    fabric.start("b")
    fabric.start("c")
    fabric.start("a")
    pub = fabric.publisher("steady", "a", resend_after=60)
    acks = AckRecorder(pub)
    feed = PacedPublisher(pub, rate=40)
    try:
        wait_until(lambda: pub.persisted_seq >= 40, what="acks to flow with both sync destinations up")

        # B stops. Its rows keep their ages: acks are withheld until the Age, then B is downgraded...
        # (B acknowledges nothing once its stop begins, and a stop on a loaded machine takes seconds: the
        # oldest row waiting for B is from then, so the Age counts from then)
        stopping_at = time.monotonic()
        fabric.stop("b")
        last_before = feed.published
        wait_until(lambda: link_of(fabric, "a", b_name)["downgraded"], timeout=60, what="B to be downgraded")
        downgraded_at = time.monotonic()
        first_after = acks.first_covering(last_before + 1)
        assert first_after is None or first_after - stopping_at > AGE * 0.8, "acks were not withheld until Age"
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
        code, out, _ = run_cli("status", fabric.paths["a"], fabric.paths["b"], "--check", "--stall-after", "2",
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
    code, out, _ = run_cli("verify", *configs)
    assert code == 0 and "consistent" in out, out  # while the instances run

    for short in ("a", "b", "c"):
        fabric.stop(short)
    DeltaTable(str(fabric.storage("c") / "txlog")).delete("publisher_seq = 42")
    b_txlog = DeltaTable(str(fabric.storage("b") / "txlog"))
    b_txlog.update(updates={"data": "CAST('{\"qty\": 999}' AS BYTEA)"}, predicate="publisher_seq = 7")
    code, out, _ = run_cli("verify", *configs)
    assert code == 1, out
    assert f"{fabric.name('b')} -> {fabric.name('c')}" in out and "publisher chain missing" in out
    assert "publisher_seq 42" in out, out
    assert f"different body at {fabric.name('b')}" in out, out
    code, out, _ = run_cli("verify", *configs, "--format", "json")
    findings = json.loads(out)["findings"]
    # the body changed at B differs from A's (A -> B) and from C's (B -> C)
    assert {(f["kind"], f["upstream"], f["downstream"]) for f in findings} == {
        ("missing", fabric.name("b"), fabric.name("c")), ("body", fabric.name("a"), fabric.name("b")),
        ("body", fabric.name("b"), fabric.name("c"))}
    assert [f["seq_ranges"] for f in findings if f["kind"] == "missing"] == [[[42, 42]]]
    # Spark, which verify uses for txlogs too large for one process, finds the same
    code, out, _ = run_cli("verify", *configs, "--engine", "spark", "--format", "json")
    assert code == 1 and json.loads(out)["engine"] == "spark"
    assert json.loads(out)["findings"] == findings


def inbox_rows(fabric, short: str) -> int:
    return DeltaTable(str(fabric.storage(short) / "inbox")).to_pyarrow_table(columns=["upstream_seq"]).num_rows


def test_destination_down_then_back_and_lost_checkpoint_resync_without_loss_or_duplicate(fabric):
    fabric.configure("b")
    fabric.configure("a", replication=replication_xml(destination_xml(fabric.name("b"), [fabric.storage("b")],
                                                                      topics=ONE_WAY)))
    fabric.start("b")
    fabric.start("a")
    pub = fabric.publisher("resync", "a")
    publish_orders(pub, 300)
    pub.flush(timeout=240)

    fabric.stop("b")  # down for a while: A keeps accepting, acks wait (sync)
    publish_orders(pub, 300)
    with pytest.raises(TimeoutError):
        pub.flush(timeout=5)
    fabric.start("b")
    pub.flush(timeout=240)
    assert_exactly_once(fabric.rows("b"), {"resync": 600})

    # A loses its replicator checkpoint and link state: it must resync from B's high-water marks.
    fabric.stop("a")
    shutil.rmtree(fabric.storage("a") / "_checkpoints")
    shutil.rmtree(fabric.storage("a") / "_control" / "links")
    sent_before = inbox_rows(fabric, "b")
    fabric.start("a")
    # A's ingest begins a new checkpoint (batch ids from 0 again): what is published now is stored at once, not
    # taken for batches already committed. This publisher does not resend, so nothing else would store it.
    late = fabric.publisher("after-loss", "a", resend_after=600)
    publish_orders(late, 100)
    late.flush(timeout=240)
    pub.flush(timeout=240)
    assert_exactly_once(fabric.rows("b"), {"resync": 600, "after-loss": 100})
    # Resync started where B's marks said, not at the beginning of A's log.
    assert inbox_rows(fabric, "b") - sent_before < 300
    late.close()


def test_with_checkpoint_link_file_and_the_downstreams_ack_all_lost_resync_starts_at_what_it_lacks(fabric):
    a_name, b_name = fabric.name("a"), fabric.name("b")
    fabric.configure("b")
    fabric.configure("a", replication=replication_xml(destination_xml(b_name, [fabric.storage("b")], sync="async",
                                                                      topics=ONE_WAY)))
    fabric.start("b")
    fabric.start("a")
    first, second = fabric.publisher("p1", "a"), fabric.publisher("p2", "a")
    for pub in (first, second):  # A's seqs 1..200
        publish_orders(pub, 100)
        pub.flush(timeout=240)
    wait_until(lambda: fabric.count("b") == 200, what="B to hold the first 200")

    fabric.stop("b")  # async: A goes on accepting; B lacks A's seqs 201..300
    for pub in (first, second):
        publish_orders(pub, 50)
        pub.flush(timeout=240)
    fabric.stop("a")
    # Everything that says how far B got is gone but B's own txlog: A's replicator checkpoint and link file,
    # and B's acknowledgement file to A.
    shutil.rmtree(fabric.storage("a") / "_checkpoints")
    shutil.rmtree(fabric.storage("a") / "_control" / "links")
    ack_file = fabric.storage("b") / "_control" / "acks" / f"{a_name}.json"
    assert ack_file.exists()
    ack_file.unlink()
    before = DeltaTable(str(fabric.storage("b") / "inbox")).version()

    fabric.start("b")
    fabric.start("a")
    wait_until(lambda: fabric.count("b") == 300, timeout=240, what="B to receive what it lacked")
    def upstream_seqs(version=None) -> Counter:
        table = DeltaTable(str(fabric.storage("b") / "inbox"), version=version)
        return Counter(table.to_pyarrow_table(columns=["upstream_seq"])["upstream_seq"].to_pylist())

    sent = sorted((upstream_seqs() - upstream_seqs(before)).elements())
    assert sent[0] == 201, "the first row sent is the earliest B lacked by its per-publisher marks"
    assert sent == list(range(201, 301)), "nothing B had was sent again"
    assert_exactly_once(fabric.rows("b"), {"p1": 150, "p2": 150})
    assert [r["seq"] for r in fabric.rows("a").to_pylist()] == list(range(1, 301))


def test_destination_fails_over_to_the_next_address(fabric):
    b1, b2 = fabric.storage("b1"), fabric.storage("b2")
    fabric.configure("b1")
    fabric.configure("b2")
    fabric.configure("a", replication=replication_xml(destination_xml("B", [b1, b2], topics=ONE_WAY)))
    fabric.start("b1")
    fabric.start("b2")
    a = fabric.start("a")
    pub = fabric.publisher("fo", "a")
    publish_orders(pub, 200)
    pub.flush(timeout=240)
    assert a.status().links["B"]["state"] == "connected"
    assert_exactly_once(fabric.rows("b1"), {"fo": 200})

    fabric.stop("b1")
    publish_orders(pub, 200)
    pub.flush(timeout=240)  # sync acks resume through the second address
    link = a.status().links["B"]
    assert link["state"] == "failed over" and link["address"] == str(b2)
    assert_exactly_once(fabric.rows("b2"), {"fo": 400})

    # What an operator sees: `replication status` names the state and the address in use.
    def link_line(text: str) -> str:
        return next((line for line in text.splitlines() if line.split()[:1] == ["B"]), "")

    def failed_over_text() -> str | None:
        status = run_cli("status", fabric.paths["a"], fabric.paths["b1"])
        assert status.code == 0
        text = status.out
        return text if "failed over" in link_line(text) else None

    text = wait_until(failed_over_text, timeout=30, what="status to show the failover")  # heartbeats: every second
    assert str(b2) in link_line(text) and "sync" in link_line(text)
    assert any(fabric.name("b1") in line and "DOWN" in line for line in text.splitlines())


def test_a_destination_killed_with_kill_9_fails_over_with_growing_back_off_that_resets_once_connected(fabric):
    b1, b2 = fabric.storage("b1"), fabric.storage("b2")
    b1_proc = InstanceProcess(fabric.configure("b1"), fabric.root / "b1.log")
    fabric.configure("b2")
    fabric.configure("a", replication=replication_xml(destination_xml("B", [b1, b2], topics=ONE_WAY)))
    try:
        wait_until(lambda: running(b1), timeout=180, what="B1 (its own process) to run")
        a = fabric.start("a")
        pub = fabric.publisher("fo9", "a", resend_after=60)
        publish_orders(pub, 100)
        pub.flush(timeout=240)
        assert a.status().links["B"]["state"] == "connected"

        b1_proc.kill9()  # no clean stop: B1's heartbeat still says running, and goes stale
        waits: list[float] = []

        def retry_delays() -> list[float]:
            link = a.status().links["B"]
            found = re.search(r"retrying in ([\d.]+)s", link["detail"] or "")
            if link["state"] == "waiting" and found and (not waits or float(found.group(1)) != waits[-1]):
                waits.append(float(found.group(1)))
            return waits if len(waits) >= 3 else []

        wait_until(retry_delays, timeout=120, interval=0.05, what="A to retry the list with growing back-off")
        assert waits == sorted(waits) and waits[0] < waits[1] < waits[2], waits
        publish_orders(pub, 100)  # acks wait: no address of B is usable

        fabric.start("b2")
        pub.flush(timeout=240)
        link = a.status().links["B"]
        assert (link["state"], link["address"]) == ("failed over", str(b2))
        assert_exactly_once(fabric.rows("b2"), {"fo9": 200})  # resynced: B2 never saw the first 100

        fabric.stop("b2")  # once connected, the back-off starts again from the beginning
        first = wait_until(lambda: re.search(r"retrying in ([\d.]+)s", a.status().links["B"]["detail"] or ""),
                           timeout=60, interval=0.05, what="A to retry after B2 stopped")
        assert float(first.group(1)) == waits[0], (first.group(0), waits)
    finally:
        b1_proc.stop()


def test_publisher_fails_over_within_a_sync_pair_without_loss_or_duplicate(fabric, tmp_path):
    a, b = fabric.storage("a"), fabric.storage("b")
    fabric.configure("a", group="pair", replication=replication_xml(destination_xml(fabric.name("b"), [b])))
    fabric.configure("b", group="pair", replication=replication_xml(destination_xml(fabric.name("a"), [a])))
    fabric.start("a")
    fabric.start("b")
    store = tmp_path / "mover.store"
    first = fabric.publisher("mover", "a", store_path=store)
    publish_orders(first, 500)
    first.flush(timeout=240)
    publish_orders(first, 200)  # in flight when amps-1 goes away
    fabric.stop("a")
    first.close()

    second = fabric.publisher("mover", "b", store_path=store)  # same client name, same publish store
    assert second.last_logon_seq >= 500
    publish_orders(second, 300)
    with pytest.raises(TimeoutError):
        second.flush(timeout=5)  # amps-2's sync partner is down: nothing more counts as persisted
    fabric.start("a")
    second.flush(timeout=240)
    wait_until(lambda: fabric.rows("a").num_rows == 1000, timeout=240, what="amps-1 to catch up after restart")
    for side in ("a", "b"):
        assert_exactly_once(fabric.rows(side), {"mover": 1000})
