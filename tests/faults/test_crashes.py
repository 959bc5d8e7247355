"""kill -9 of instances at crash points or mid-replication, then restart: nothing lost, nothing duplicated.

An instance killed at each step of a batch; kill -9 inside the durability tracker and of both halves of a sync
pair at once; an upstream killed mid-replication. Acks resume after each restart."""

from __future__ import annotations

import json
import signal
import time
import uuid

import pytest
from deltalake import DeltaTable
from support.fabric import ONE_WAY, PacedPublisher, publish_orders
from support.factories import (
    assert_exactly_once,
    bulk_publish,
    destination_xml,
    replication_xml,
    txlog_rows,
    wait_until,
    write_config,
)
from support.processes import InstanceProcess, running

from replication.client import Publisher
from replication.storage.layout import StorageLayout

PER_STAGE = 1500

#: Every batch committed on a thread while Spark goes on, as a backlog's are (a live stream's small batches are
#: committed before Spark goes on: the ingest's other crash tests have those).
COMMIT_BEHIND = {"REPLICATION_COMMIT_BEHIND_ROWS": "0"}

#: Where an instance dies in a batch, one per life.
BATCH_CRASH_POINTS = [
    "ingest.before_txlog_commit@3",  # mid-batch: read, classified, rejects written, txlog not
    # Delta commit done, Spark's checkpoint not (Spark commits a batch once the call returns: it waits here)
    "ingest.handed_over@3:pause,ingest.after_txlog_commit@3",
    "ingest.before_ack@3",  # txlog and state committed, acks not sent
]

#: B receives from A over a sync link (and A from B); its crash points in that role, one per life: before
#: recording what it acknowledges, before telling its upstream, while writing its own link file, and after
#: releasing what A's acknowledgement made durable, before its link file records that acknowledgement.
SYNC_PAIR_CRASH_POINTS = ["durability.before_persisted_state@4", "durability.before_upstream_ack@4",
                          "link.before_write@30", "link.before_ack_save@8"]


@pytest.mark.slow
def test_kill_9_at_each_step_then_restart_loses_and_duplicates_nothing(broker, tmp_path):
    """One instance, committing each batch behind Spark, crashes three times (once per crash point) while a
    publisher keeps publishing."""
    name = f"crash{uuid.uuid4().hex[:6]}"
    cfg = write_config(tmp_path, name, broker.bootstrap, max_offsets=250)
    proc = InstanceProcess(cfg, tmp_path / "run0.log", failpoints=BATCH_CRASH_POINTS[0], env=COMMIT_BEHIND)
    pub = Publisher("crash-pub", bootstrap=broker.bootstrap, topic=f"{name}.publish", instance=name,
                    store_path=tmp_path / "pub.store", resend_after=3, logon_timeout=180)
    published = 0
    try:
        for stage, failpoint in enumerate(BATCH_CRASH_POINTS):
            for _ in range(PER_STAGE):
                published += 1
                pub.publish("/orders", b'{"i": %d}' % published)
            code = proc.wait_killed(timeout=300)
            assert code == -signal.SIGKILL, proc.log_text()[-3000:]
            assert f"failpoint {failpoint.split(',')[-1].split('@')[0]} reached" in proc.log_text()
            assert pub.persisted_seq < published, "the crash came after everything was acknowledged"
            following = BATCH_CRASH_POINTS[stage + 1] if stage + 1 < len(BATCH_CRASH_POINTS) else None
            proc = InstanceProcess(cfg, tmp_path / f"run{stage + 1}.log", failpoints=following, env=COMMIT_BEHIND)
        pub.flush(timeout=300)  # acks resume after the last restart
    finally:
        pub.close()
        proc.stop()
    assert_exactly_once(txlog_rows(tmp_path, name), {"crash-pub": published})


@pytest.mark.slow
def test_kill_9_after_spark_committed_a_batch_the_txlog_had_not_then_restart_reads_it_again(broker, tmp_path):
    """The writer hands a batch's commit to a thread and Spark commits the batch meanwhile: killed in between
    (the pause lets Spark's commit come first), the restart runs the batch again. The publishes come from a
    Kafka producer that never sends again: a batch skipped would be rows missing."""
    name = f"behind{uuid.uuid4().hex[:6]}"
    cfg = write_config(tmp_path, name, broker.bootstrap, max_offsets=100)
    proc = InstanceProcess(cfg, tmp_path / "run0.log",
                           failpoints="ingest.commit_begins@3:pause,ingest.before_txlog_commit@3", env=COMMIT_BEHIND)
    try:
        count = bulk_publish(broker.bootstrap, f"{name}.publish", "once",
                             (("/orders", b'{"i": %d}' % i) for i in range(500)))
        assert proc.wait_killed(timeout=300) == -signal.SIGKILL, proc.log_text()[-3000:]
        checkpoint = tmp_path / name / "_checkpoints" / "ingest"
        spark_query = json.loads((checkpoint / "metadata").read_text())["id"]
        assert (checkpoint / "commits" / "2").exists(), "Spark had committed the batch when the instance died"
        assert DeltaTable(str(tmp_path / name / "txlog")).transaction_version(f"ingest:{spark_query}") == 1
        proc = InstanceProcess(cfg, tmp_path / "run1.log", env=COMMIT_BEHIND)
        wait_until(lambda: txlog_rows(tmp_path, name).num_rows >= count, timeout=240, what="every row")
    finally:
        proc.stop()
    assert "Spark had committed ingest batch 2, the txlog had not" in proc.log_text()
    assert_exactly_once(txlog_rows(tmp_path, name), {"once": count})


@pytest.mark.slow
def test_kill_9_inside_durability_and_of_both_halves_of_a_sync_pair_loses_and_duplicates_nothing(broker, tmp_path):
    suffix = str(int(time.time() * 1000) % 100000)
    a_name, b_name = f"cpa{suffix}", f"cpb{suffix}"
    a_cfg, b_cfg = (write_config(tmp_path, name, broker.bootstrap, group="pair", max_offsets=100,
                                 replication=replication_xml(destination_xml(other, [tmp_path / other])))
                    for name, other in ((a_name, b_name), (b_name, a_name)))
    a = InstanceProcess(a_cfg, tmp_path / "a0.log")
    b = InstanceProcess(b_cfg, tmp_path / "b0.log", failpoints=SYNC_PAIR_CRASH_POINTS[0])
    wait_until(lambda: running(tmp_path / a_name) and running(tmp_path / b_name), timeout=240,
               what="both halves to run")
    pubs = [Publisher(f"{n}-pub", bootstrap=broker.bootstrap, topic=f"{n}.publish", instance=n,
                      store_path=tmp_path / f"{n}.store", resend_after=3, logon_timeout=240) for n in (a_name, b_name)]
    feeds = [PacedPublisher(pub, rate=100) for pub in pubs]
    try:
        for stage, failpoint in enumerate(SYNC_PAIR_CRASH_POINTS):
            assert b.wait_killed(timeout=300) == -signal.SIGKILL, b.log_text()[-3000:]
            assert f"failpoint {failpoint.split('@')[0]} reached" in b.log_text()
            if stage + 1 < len(SYNC_PAIR_CRASH_POINTS):
                b = InstanceProcess(b_cfg, tmp_path / f"b{stage + 1}.log", failpoints=SYNC_PAIR_CRASH_POINTS[stage + 1])
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


@pytest.mark.slow
@pytest.mark.parametrize("failpoint", ["replicator.after_inbox_commit", "replicator.before_inbox_commit"])
def test_kill_9_mid_replication_then_restart_keeps_every_txlog_and_the_inbox_exactly_once(fabric, broker, failpoint):
    """A's replicator is killed after its 3rd inbox commit, before telling its link (the restart finds the batch
    in the inbox by its app transaction and tells the link), or just before that commit (the restart appends
    the rows again, in a batch of its own)."""
    fabric.configure("b")
    a_cfg = fabric.configure("a", max_offsets=200, replication=replication_xml(
        destination_xml(fabric.name("b"), [fabric.storage("b")], topics=ONE_WAY)))
    fabric.start("b")
    proc = InstanceProcess(a_cfg, fabric.root / "a-run0.log", failpoints=f"{failpoint}@3")
    pub = fabric.publisher("kill", "a", resend_after=3, logon_timeout=180)
    try:
        publish_orders(pub, 1500)
        assert proc.wait_killed(timeout=300) == -signal.SIGKILL, proc.log_text()[-3000:]
        assert f"failpoint {failpoint} reached" in proc.log_text()
        proc = InstanceProcess(a_cfg, fabric.root / "a-run1.log")
        pub.flush(timeout=300)
    finally:
        proc.stop()
    assert_exactly_once(fabric.rows("a"), {"kill": 1500})
    assert_exactly_once(fabric.rows("b"), {"kill": 1500})
    inbox = DeltaTable(str(StorageLayout.of(str(fabric.storage("b"))).inbox)).to_pyarrow_table(columns=["upstream_seq"])
    assert sorted(inbox["upstream_seq"].to_pylist()) == list(range(1, 1501)), "each of A's rows in B's inbox once"
