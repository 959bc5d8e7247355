"""Stops and failed queries: SIGTERM to a process group of busy instances, an ingest query failing 3 times.

An ingest query failing three times while ``replication run`` keeps serving; SIGTERM to the process group of
busy instances (``replication run`` and spark-submit.sh) stopping them cleanly. Instances in processes of
their own."""

from __future__ import annotations

import json
import time

import pytest
from support.fabric import PacedPublisher
from support.factories import (
    assert_exactly_once,
    destination_xml,
    replication_xml,
    txlog_rows,
    wait_until,
    write_config,
)
from support.processes import InstanceProcess, running
from support.repo import REPO

from replication.client import Publisher
from replication.storage.control import Heartbeat
from replication.storage.layout import StorageLayout


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
