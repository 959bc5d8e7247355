"""The HA publisher: killed with unacknowledged messages, it logs on again and resends only what is missing."""

from __future__ import annotations

import re
import signal
import uuid

import pytest
from support.cli import CliResult, run_cli
from support.fabric import AckListener, publish_orders
from support.factories import assert_exactly_once, rejected_rows, txlog_rows, wait_until, write_config

from replication import config
from replication.client import FailedMessage
from replication.errors import ReplicationError
from replication.instance import Instance


def publish_cli(cfg_path, store, count, *, failpoints: str | None = None) -> CliResult:
    """``replication publish`` of ``count`` orders as client ``feed``, in a process of its own (a failpoint
    kills it)."""
    return run_cli("publish", "--config", cfg_path, "--client", "feed", "--store", store, "--topic", "/orders",
                   "--count", count, env={"REPLICATION_FAILPOINTS": failpoints or None})


def test_killed_publisher_logs_on_and_resends_only_what_is_missing(spark, broker, tmp_path):
    name = f"pub{uuid.uuid4().hex[:6]}"
    cfg_path = write_config(tmp_path, name, broker.bootstrap)
    inst = Instance(config.load(str(cfg_path)), spark).start()
    store = tmp_path / "feed.store"
    try:
        done = publish_cli(cfg_path, store, 500)
        assert done.code == 0, done.err[-2000:]
        assert "persisted through 500" in done.out

        # The second run dies after storing its 301st message (seq 801) and before sending it:
        # 801 is in its publish store only, and some before it may not have left its producer.
        killed = publish_cli(cfg_path, store, 500, failpoints="publisher.before_send@301")
        assert killed.code == -signal.SIGKILL, killed.err[-2000:]

        # Messages still in the killed producer's buffer never reached Kafka; the
        # instance says how far it got, and exactly the rest is re-sent.
        again = publish_cli(cfg_path, store, 0)
        assert again.code == 0, again.err[-2000:]
        logon = re.search(r"persisted through (\d+); re-sent (\d+) message\(s\) \((\d+)\.\.(\d+)\)", again.out)
        assert logon, again.out
        persisted, resent, first, last = map(int, logon.groups())
        assert 500 <= persisted <= 800, "the first 500 were acknowledged before the kill"
        assert (first, last, resent) == (persisted + 1, 801, 801 - persisted)
        assert "persisted through 801" in again.out
    finally:
        inst.stop()
    assert_exactly_once(txlog_rows(tmp_path, name), {"feed": 801})


def test_a_refused_message_gets_a_failure_ack_and_flush_returns_it(fabric):
    # B is A's sync destination: persisted acks wait for it, a failure ack waits for nothing
    fabric.start_one_way_pair()
    pub = fabric.publisher("feed", "a")
    with AckListener("librdkafka", fabric.broker.bootstrap, f"{fabric.name('a')}.acks") as acks:
        publish_orders(pub, 3)                                # 1..3
        assert pub.publish("/orders", b"{not json") == 4      # refused in the middle
        publish_orders(pub, 2)                                # 5, 6
        assert pub.publish("/orders", b"[1,") == 7            # refused last: flush used to wait out its timeout
        refused = pub.flush(timeout=120)

        rejected = {int(r["publisher_seq"]): r["reason"] for r in rejected_rows(fabric.root, fabric.name("a"))}
        assert sorted(rejected) == [4, 7]
        assert refused == [FailedMessage(4, "/orders", rejected[4]), FailedMessage(7, "/orders", rejected[7])]
        assert all("JSON" in reason for reason in rejected.values()), rejected
        assert pub.persisted_seq == 6, "a persisted ack never covers a refused message"
        assert pub.store.count() == 0, "the refused messages left the publish store"

        # the publisher goes on past them; the next flush reports only what is new
        assert pub.publish("/orders", b'{"id": 8}') == 8
        assert pub.flush(timeout=120) == []
        assert pub.persisted_seq == 8
        assert pub.publish("/orders", b"{refused again") == 9  # a flush after one that returned a refusal
        assert [f.seq for f in pub.flush(timeout=120)] == [9]
        wait_until(lambda: len(acks.failures) == 3 and acks.persisted.get("feed") == 8, timeout=60,
                   what="the acks topic's records")
    assert [(f["client"], f["seq"], f["status"], f["reason"], f["instance"]) for f in acks.failures[:2]] == [
        ("feed", seq, "failure", rejected[seq], fabric.name("a")) for seq in (4, 7)]
    wait_until(lambda: fabric.count("b") == 6, what="B's copies")
    assert fabric.rows("b")["publisher_seq"].to_pylist() == [1, 2, 3, 5, 6, 8]


def test_two_publishers_using_one_client_name_at_once_are_a_clash_the_later_one_is_refused(fabric):
    fabric.configure("a")
    fabric.start("a")
    first = fabric.publisher("shared", "a", store_path=fabric.root / "first.store")
    publish_orders(first, 5)
    assert first.flush(timeout=120) == []
    second = fabric.publisher("shared", "a", store_path=fabric.root / "second.store")  # logs on: 5 persisted
    assert second.clash is None
    publish_orders(first, 5)  # the first is still publishing under the name the second logged on with

    wait_until(lambda: second.clash is not None, timeout=60, what="the later publisher to be refused")
    assert f"client name 'shared' is in use by another publisher (session {first.session})" in second.clash
    with pytest.raises(ReplicationError, match="refused this publisher: client name 'shared' is in use"):
        second.publish("/orders", b'{"id": 1}')
    assert first.clash is None
    beat = fabric.running["a"].status()
    assert beat.clashes["shared"]["earlier"] == first.session and beat.clashes["shared"]["later"] == second.session
    check = wait_until(lambda: (lambda r: r if r.code == 1 else None)(run_cli("status", fabric.paths["a"], "--check")),
                       timeout=30, what="status --check to read the heartbeat that has the clash")
    assert "CLASH" in check.out and "client name 'shared' is used by two publishers" in check.out, check.out


def test_a_publisher_waits_its_logon_timeout_for_an_instance_that_is_starting(fabric):
    """The acks topic an instance makes at its start is waited for as long as the publisher's
    ``logon_timeout`` says: a publisher started beside a starting instance logs on once it is up; one whose
    instance never comes gets the error that names the instance, when its own timeout says."""
    import threading
    import time

    fabric.configure("a")
    started = time.monotonic()
    with pytest.raises(ReplicationError, match=rf"topic {fabric.name('a')}\.acks does not exist; start instance "):
        fabric.publisher("too-early", "a", logon_timeout=2)
    assert time.monotonic() - started < 29, "the caller's 2 s, not the fixed 30 s the publisher used to wait"
    cli = run_cli("publish", "--config", fabric.paths["a"], "--client", "cli", "--store", fabric.root / "cli.store",
                  "--count", 1, "--logon-timeout", 2)
    assert cli.code == 1 and f"start instance {fabric.name('a')} first" in cli.err, (cli.code, cli.err)
    assert len(cli.err.strip().splitlines()) == 1, cli.err

    logged_on: list = []
    early = threading.Thread(target=lambda: logged_on.append(fabric.publisher("early", "a", logon_timeout=300)))
    early.start()
    fabric.start("a")
    early.join(timeout=300)
    assert logged_on and logged_on[0].last_logon_seq == 0
    publish_orders(logged_on[0], 3)
    assert logged_on[0].flush(timeout=120) == []
    assert fabric.count("a") == 3
