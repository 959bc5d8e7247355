"""Resync after a destination returns or a checkpoint is lost; failover of destinations and publishers."""

from __future__ import annotations

import json
import shutil
import signal
import time

import pytest
from deltalake import DeltaTable

from fabric_support import ONE_WAY, publish_orders
from factories import assert_exactly_once, destination_xml, replication_xml, wait_until
from processes import InstanceProcess



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
    publish_orders(pub, 100)
    pub.flush(timeout=240)
    assert_exactly_once(fabric.rows("b"), {"resync": 700})
    # Resync started where B's marks said, not at the beginning of A's log.
    assert inbox_rows(fabric, "b") - sent_before < 300


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
        text = status_text(fabric.paths["a"], fabric.paths["b1"])
        return text if "failed over" in link_line(text) else None

    text = wait_until(failed_over_text, timeout=30, what="status to show the failover")  # heartbeats: every second
    assert str(b2) in link_line(text) and "sync" in link_line(text)
    assert any(fabric.name("b1") in line and "DOWN" in line for line in text.splitlines())


def status_text(*config_paths) -> str:
    """What ``replication status`` prints for these configs."""
    import contextlib
    import io

    from replication.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["status", *map(str, config_paths)]) == 0
    return out.getvalue()


def test_a_terminal_destination_error_shows_config_error_and_is_not_retried(fabric, caplog):
    """B runs a newer release whose ``instance.json`` A cannot read: waiting will not fix that. A's link
    stops with ``config error: <message>`` in its log and in ``replication status``, and is not retried;
    A goes on accepting publishes."""
    caplog.set_level("ERROR", logger="replication.destination.manager")
    b_name = fabric.name("b")
    fabric.configure("b")
    fabric.configure("a", replication=replication_xml(
        destination_xml(b_name, [fabric.storage("b")], sync="async", topics=ONE_WAY)))
    fabric.start("b")
    instance_json = fabric.storage("b") / "_control" / "instance.json"
    newer = json.loads(instance_json.read_text())
    instance_json.write_text(json.dumps({**newer, "format": 2}))  # what a newer release would write
    a = fabric.start("a")

    link = wait_until(lambda: (lambda s: s if s["state"] == "config error" else None)(a.status().links[b_name]),
                      timeout=60, what="the link to show its config error")
    assert "format 2 is not supported" in link["detail"] and "Fix: run the same version" in link["detail"]
    pub = fabric.publisher("still-works", "a")
    publish_orders(pub, 20)
    pub.flush(timeout=120)  # async: A's publishers are not held by the stopped link

    def config_errors() -> list[str]:
        return [r.getMessage() for r in caplog.records if "config error at" in r.getMessage()]

    time.sleep(3)  # a retried link would have tried again several times (back-off starts at 0.5 s)
    assert len(config_errors()) == 1, config_errors()
    assert a.status().links[b_name]["state"] == "config error"
    assert a.status().links[b_name]["updated"] == link["updated"], "nothing touched the link since it stopped"
    line = next(line for line in status_text(fabric.paths["a"]).splitlines() if "config error:" in line)
    assert "format 2 is not supported" in line
    assert fabric.count("b") == 0


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


@pytest.mark.slow
def test_kill_9_mid_replication_then_restart_keeps_every_txlog_exactly_once(fabric, broker):
    fabric.configure("b")
    a_cfg = fabric.configure("a", max_offsets=200, replication=replication_xml(
        destination_xml(fabric.name("b"), [fabric.storage("b")], topics=ONE_WAY)))
    fabric.start("b")
    proc = InstanceProcess(a_cfg, fabric.root / "a-run0.log", failpoints="replicator.after_inbox_commit@3")
    pub = fabric.publisher("kill", "a", resend_after=3, logon_timeout=180)
    try:
        publish_orders(pub, 1500)
        assert proc.wait_killed(timeout=300) == -signal.SIGKILL, proc.log_text()[-3000:]
        assert "failpoint replicator.after_inbox_commit reached" in proc.log_text()
        proc = InstanceProcess(a_cfg, fabric.root / "a-run1.log")
        pub.flush(timeout=300)
    finally:
        proc.stop()
    assert_exactly_once(fabric.rows("a"), {"kill": 1500})
    assert_exactly_once(fabric.rows("b"), {"kill": 1500})
