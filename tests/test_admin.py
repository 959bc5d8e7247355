"""An operator's downgrade and upgrade of a sync destination (AMPS's administrative console):
``replication downgrade`` / ``replication upgrade`` on a running instance, kept over a restart, never undone by
the automatic upgrade action."""

from __future__ import annotations

import time

import pytest
from support.cli import run_cli
from support.fabric import ONE_WAY, link_of, publish_orders
from support.factories import destination_xml, downgrade_xml, replication_xml, wait_until, write_config


def test_an_operators_downgrade_holds_over_a_restart_and_the_upgrade_action_until_upgraded(fabric):
    b_name = fabric.name("b")
    fabric.configure("b")
    # the automatic action would never downgrade (300 s) and would upgrade a caught-up link at once (60 s)
    fabric.configure("a", replication=replication_xml(
        destination_xml(b_name, [fabric.storage("b")], topics=ONE_WAY),
        actions=downgrade_xml(every="0.5s", downgrade_age="300s", upgrade_age="60s")))
    fabric.start("b")
    fabric.start("a")
    pub = fabric.publisher("admin", "a", resend_after=60)
    publish_orders(pub, 10)
    assert pub.flush(timeout=120) == []

    done = run_cli("downgrade", fabric.paths["a"], "--destination", b_name, "--reason", "maintenance of b")
    assert done.code == 0, done.err
    assert f"{b_name}: downgraded to async until `replication upgrade`" in done.out and "within a second" in done.out
    wait_until(lambda: link_of(fabric, "a", b_name)["manual"], timeout=30, what="A to apply the downgrade")

    fabric.stop("b")  # B away: A's publishers are no longer held by it
    publish_orders(pub, 10)
    assert pub.flush(timeout=60) == []
    status = run_cli("status", fabric.paths["a"])
    assert "downgraded by an operator: async until `replication upgrade`" in status.out, status.out

    fabric.stop("a")
    fabric.start("a")
    assert link_of(fabric, "a", b_name)["downgraded"], "the downgrade outlives a restart"
    fabric.start("b")
    wait_until(lambda: fabric.count("b") == 20, timeout=120, what="B to catch up")
    wait_until(lambda: link_of(fabric, "a", b_name)["lag_seconds"] == 0, what="the link to be caught up")
    time.sleep(2.0)  # four ticks of the upgrade action, which upgrades a caught-up link it downgraded itself
    link = link_of(fabric, "a", b_name)
    assert link["downgraded"] and link["manual"], "the upgrade action never undoes an operator's downgrade"

    done = run_cli("upgrade", fabric.paths["a"], "--destination", b_name)
    assert done.code == 0 and f"{b_name}: sync again" in done.out, done.out + done.err
    wait_until(lambda: not link_of(fabric, "a", b_name)["downgraded"], timeout=30, what="A to apply the upgrade")
    fabric.stop("b")  # sync again: acks wait for B
    publish_orders(pub, 1)
    with pytest.raises(TimeoutError):
        pub.flush(timeout=5)
    fabric.start("b")
    assert pub.flush(timeout=120) == []


@pytest.mark.parametrize("args, message", [
    (["--destination", "nowhere"], "has no destination 'nowhere' (its destinations: b-dest, c-dest)"),
    (["--destination", "c-dest"], "destination c-dest of a is async: only a sync destination"),
])
def test_downgrade_of_a_destination_that_cannot_be_downgraded_exits_2_with_one_line(tmp_path, args, message):
    path = write_config(tmp_path, "a", "localhost:9", replication=replication_xml(
        destination_xml("b-dest", [tmp_path / "b"]), destination_xml("c-dest", [tmp_path / "c"], sync="async")))
    done = run_cli("downgrade", path, *args)
    assert done.code == 2 and message in done.err and len(done.err.strip().splitlines()) == 1, done.err
    assert not (tmp_path / "a" / "_control" / "downgraded").exists()
