"""Faults that need real processes (issue 14): kill -9 of a destination, kill -9 at each crash point of
the durability tracker and of both halves of a sync pair at once, SIGTERM to a process group."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from fabric_support import ONE_WAY, PacedPublisher, publish_orders
from factories import assert_exactly_once, destination_xml, replication_xml, txlog_rows, wait_until, write_config
from processes import InstanceProcess
from replication.client import Publisher
from replication.destination.resync import heartbeat_fresh
from replication.storage.control import Heartbeat
from replication.storage.layout import StorageLayout

REPO = Path(__file__).resolve().parents[1]


def running(storage) -> bool:
    return heartbeat_fresh(StorageLayout.of(str(storage)))


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


#: B receives from A over a sync link (and A from B); its crash points in that role, one per life: before
#: recording what it acknowledges, before telling its upstream, while writing its own link file.
CRASH_POINTS = ["durability.before_persisted_state@4", "durability.before_upstream_ack@4", "link.before_write@30"]


@pytest.mark.slow
def test_kill_9_inside_durability_and_of_both_halves_of_a_sync_pair_loses_and_duplicates_nothing(broker, tmp_path):
    suffix = str(int(time.time() * 1000) % 100000)
    a_name, b_name = f"cpa{suffix}", f"cpb{suffix}"
    a_cfg, b_cfg = (write_config(tmp_path, name, broker.bootstrap, group="pair", max_offsets=100,
                                 replication=replication_xml(destination_xml(other, [tmp_path / other])))
                    for name, other in ((a_name, b_name), (b_name, a_name)))
    a = InstanceProcess(a_cfg, tmp_path / "a0.log")
    b = InstanceProcess(b_cfg, tmp_path / "b0.log", failpoints=CRASH_POINTS[0])
    wait_until(lambda: running(tmp_path / a_name) and running(tmp_path / b_name), timeout=240,
               what="both halves to run")
    pubs = [Publisher(f"{n}-pub", bootstrap=broker.bootstrap, topic=f"{n}.publish", instance=n,
                      store_path=tmp_path / f"{n}.store", resend_after=3, logon_timeout=240) for n in (a_name, b_name)]
    feeds = [PacedPublisher(pub, rate=100) for pub in pubs]
    try:
        for stage, failpoint in enumerate(CRASH_POINTS):
            assert b.wait_killed(timeout=300) == -signal.SIGKILL, b.log_text()[-3000:]
            assert f"failpoint {failpoint.split('@')[0]} reached" in b.log_text()
            if stage + 1 < len(CRASH_POINTS):
                b = InstanceProcess(b_cfg, tmp_path / f"b{stage + 1}.log", failpoints=CRASH_POINTS[stage + 1])
        # B's last crash, mid-stream, and A killed with kill -9 at once: both halves down together
        a.kill9()
        a = InstanceProcess(a_cfg, tmp_path / "a1.log")
        b = InstanceProcess(b_cfg, tmp_path / "b9.log")
        wait_until(lambda: running(tmp_path / a_name) and running(tmp_path / b_name), timeout=240,
                   what="both halves to run again")
        time.sleep(2)
    finally:
        published = [feed.stop() for feed in feeds]
    try:
        for pub in pubs:
            pub.flush(timeout=300)  # acks resume
    finally:
        for pub in pubs:
            pub.close()
        a.stop()
        b.stop()
    expected = {f"{a_name}-pub": published[0], f"{b_name}-pub": published[1]}
    for name in (a_name, b_name):
        assert_exactly_once(txlog_rows(tmp_path, name), expected)


def test_a_run_whose_ingest_query_fails_three_times_keeps_serving_and_stores_everything_once(broker, tmp_path):
    """`replication run` outlives its queries' failures: the instance restarts a failed ingest query (with
    back-off), the process goes on serving, and every message is stored once. (The run used to exit when it
    saw a failed query, racing the restart, and took every instance of the process down with it.)"""
    name = "fails3"
    path = write_config(tmp_path, name, broker.bootstrap, max_offsets=100)
    # three failures of three successive batches: #3 after its commit, #4 before its acknowledgement, #5
    # before its commit; restart n waits 2^(n-1) s, so the third failure stands for seconds before its restart
    proc = InstanceProcess(path, tmp_path / "run.log", failpoints=(
        "ingest.after_txlog_commit@3:raise,ingest.before_ack@3:raise,ingest.before_txlog_commit@5:raise"))
    pub = None
    try:
        wait_until(lambda: running(tmp_path / name), timeout=240, what="the instance to run")
        pub = Publisher("survivor", bootstrap=broker.bootstrap, topic=f"{name}.publish", instance=name,
                        store_path=tmp_path / "survivor.store")
        for i in range(600):
            pub.publish("/orders", b'{"i": %d}' % i)
        wait_until(lambda: pub.persisted_seq >= 600 or proc.proc.poll() is not None, timeout=240,
                   what="every message to be persisted")
        log = proc.log_text()
        assert proc.proc.poll() is None, "the run ended when a query failed:\n" + log[-3000:]
        assert "restarting it (restart 3)" in log, log[-3000:]
    finally:
        if pub is not None:
            pub.close()
        code = proc.stop()
    assert code == 0, proc.log_text()[-3000:]
    assert_exactly_once(txlog_rows(tmp_path, name), {"survivor": 600})


@pytest.mark.parametrize("launcher", ["replication run", pytest.param("spark-submit.sh", marks=pytest.mark.slow)])
def test_sigterm_to_the_process_group_stops_busy_instances_cleanly(broker, tmp_path, launcher):
    """What systemd (or a supervisor killing a process group) does. The JVM must not stop under running
    queries: exit 0, no traceback, no ERROR line, and each instance's last heartbeat says it stopped.
    (Under spark-submit.sh the JVM is the parent of the Python driver: it must not take the signal either.)"""
    suffix = str(int(time.time() * 1000) % 100000)
    names = [f"ta{suffix}", f"tb{suffix}"]
    a_cfg = write_config(tmp_path, names[0], broker.bootstrap, group="t", replication=replication_xml(
        destination_xml(names[1], [tmp_path / names[1]])))
    b_cfg = write_config(tmp_path, names[1], broker.bootstrap, group="t", replication=replication_xml(
        destination_xml(names[0], [tmp_path / names[0]])))
    proc = InstanceProcess([a_cfg, b_cfg], tmp_path / "run.log",
                           command=[str(REPO / "spark-submit.sh")] if launcher == "spark-submit.sh" else None)
    pubs = []
    try:
        wait_until(lambda: all(running(tmp_path / n) for n in names), timeout=240, what="both instances to run")
        pubs = [Publisher(f"{n}-p", bootstrap=broker.bootstrap, topic=f"{n}.publish", instance=n,
                          store_path=tmp_path / f"{n}.store") for n in names]
        feeds = [PacedPublisher(pub, rate=150) for pub in pubs]
        wait_until(lambda: all(pub.persisted_seq > 100 for pub in pubs), timeout=120, what="both to be busy")
        proc.terminate_group()
        code = proc.proc.wait(timeout=120)
        for feed in feeds:
            feed.stop()
    finally:
        for pub in pubs:
            pub.close()
        proc.stop()
    log = proc.log_text()
    assert code == 0, log[-3000:]
    assert "Traceback" not in log, log[-5000:]
    assert not [line for line in log.splitlines() if " ERROR " in line], log[-5000:]
    for name in names:
        beat = Heartbeat.read(StorageLayout.of(str(tmp_path / name)).heartbeat_json)
        assert beat is not None and beat.running is False, json.dumps(beat.to_json() if beat else None)
