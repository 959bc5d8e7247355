"""Misconfigured links: one refused by validation until fixed, a terminal destination error not retried.

A link refused by replication validation connects once its destination is fixed, without restarting the
upstream; a destination whose error waiting cannot fix (a newer release's instance.json) stops its link with
``config error``, not retried. Real broker, Spark and Delta."""

from __future__ import annotations

import json
import time

from support.cli import run_cli
from support.fabric import ONE_WAY, link_of, publish_orders
from support.factories import assert_exactly_once, destination_xml, replication_xml, wait_until


def test_a_link_refused_by_validation_connects_once_the_destination_is_fixed_without_restarting_the_upstream(
        fabric, caplog):
    caplog.set_level("ERROR", logger="replication.destination.manager")
    b_name, a_name = fabric.name("b"), fabric.name("a")
    fabric.configure("b", txlog_topics='<Topic><Name>^/audit</Name><MessageType>json</MessageType></Topic>')
    fabric.configure("a", replication=replication_xml(
        destination_xml(b_name, [fabric.storage("b")], sync="async", topics=ONE_WAY)))
    fabric.start("b")
    fabric.start("a")
    link = wait_until(lambda: (lambda s: s if s["state"] == "validation failed" else None)(
        link_of(fabric, "a", b_name)), timeout=60, what="the link to be refused")
    assert "txlog" in link["detail"] and "TransactionLog" in link["detail"], link["detail"]
    assert any("replication validation failed" in r.getMessage() for r in caplog.records)
    refused = f"REFUSED: {a_name} -> {b_name}: validation failed"
    out = wait_until(lambda: (lambda r: r[1] if r[0] == 1 and refused in r[1] else None)(
        run_cli("status", fabric.paths["a"], "--check")), timeout=30, what="status --check to see the heartbeat")
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
        run_cli("status", fabric.paths["a"], fabric.paths["b"], "--check")), timeout=30, what="status --check: OK")
    assert out.startswith("OK: 2 instances running"), out


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
    status = run_cli("status", fabric.paths["a"])
    assert status.code == 0
    line = next(line for line in status.out.splitlines() if "config error:" in line)
    assert "format 2 is not supported" in line
    assert fabric.count("b") == 0


def test_a_destination_whose_group_is_not_the_downstreams_is_refused_until_the_groups_agree(fabric):
    b_name, a_name = fabric.name("b"), fabric.name("a")
    fabric.configure("b", group="nyc-archive")
    fabric.configure("a", replication=replication_xml(
        destination_xml(b_name, [fabric.storage("b")], sync="async", group="ldn-archive", topics=ONE_WAY)))
    both = (fabric.paths["a"], fabric.paths["b"])

    # offline, before anything runs: `validate` names both groups
    code, out, _ = run_cli("validate", *both)
    assert code == 1, out
    assert (f"group check failed: destination {b_name} declares <Group>ldn-archive</Group>, but {b_name} at this "
            "address is in group nyc-archive") in out, out

    fabric.start("b")
    fabric.start("a")
    pub = fabric.publisher("grouped", "a")
    publish_orders(pub, 10)
    assert pub.flush(timeout=120) == []  # async: A's publishers are not held by the refused link
    link = wait_until(lambda: (lambda s: s if s["state"] == "validation failed" else None)(
        link_of(fabric, "a", b_name)), timeout=60, what="the link to be refused")
    assert "ldn-archive" in link["detail"] and "nyc-archive" in link["detail"], link["detail"]
    out = wait_until(lambda: (lambda r: r[1] if r[0] == 1 and "REFUSED" in r[1] else None)(
        run_cli("status", *both, "--check")), timeout=30, what="status --check to see the heartbeat")
    assert f"REFUSED: {a_name} -> {b_name}: validation failed" in out and "nyc-archive" in out, out
    assert fabric.count("b") == 0, "nothing crossed a refused link"

    # B declares the group the destination names: the link connects without restarting A
    fabric.stop("b")
    fabric.configure("b", group="ldn-archive")
    fabric.start("b")
    wait_until(lambda: fabric.count("b") == 10, timeout=120, what="B to receive what A held")
    assert_exactly_once(fabric.rows("b"), {"grouped": 10})
