"""The replicator thread (replication/destination/replicator.py) on real Delta tables, without Spark: each batch
appended once with its last seq as the inbox version, taken from memory when the ingest hands rows over, and a
batch a crash kept from the link file told to the link at the restart rather than appended again."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from support.fabric import ONE_WAY
from support.factories import destination_xml, replication_xml, wait_until, write_config
from support.tables import numbered_txlog_rows

from replication import config, failpoints
from replication.connectors.delta.tables import IdempotentAppender
from replication.destination.link import Link
from replication.destination.replicator import Replicator
from replication.inbox.schema import create_inbox
from replication.storage.layout import StorageLayout
from replication.txlog.recent import RecentTxlog
from replication.txlog.schema import TXLOG_SCHEMA


class Pair:
    """amps-1's txlog (written here as its ingest would), its link to amps-2, and amps-2's inbox."""

    def __init__(self, tmp_path) -> None:
        self.down = StorageLayout.of(str(tmp_path / "amps-2"))
        cfg_file = write_config(tmp_path, "amps-1", "localhost:9", replication=replication_xml(
            destination_xml("amps-2", [tmp_path / "amps-2"], topics=ONE_WAY)))
        self.cfg = config.load(str(cfg_file))
        self.dest = self.cfg.destinations[0]
        self.up = StorageLayout.of(str(self.cfg.storage))
        self.txlog = IdempotentAppender(self.up.txlog, TXLOG_SCHEMA, app_id="ingest", name="txlog")
        self.link_file = tmp_path / "link.json"
        self.commits = 0
        create_inbox(self.down.inbox)

    def commit(self, first: int, count: int, recent: RecentTxlog | None = None) -> None:
        rows = numbered_txlog_rows(first, count)
        self.txlog.append(rows, self.commits)
        self.commits += 1
        if recent is not None:
            recent.committed(rows)

    def replicator(self, recent: RecentTxlog | None = None) -> Replicator:
        link = Link(self.link_file, "amps-2", "sync")
        return Replicator(self.cfg, self.dest, txlog=self.up.txlog, inbox=self.down.inbox, incarnation="1-test",
                          link=link, target="amps-2", recent=recent).start()

    def inbox_seqs(self) -> list[int]:
        return sorted(DeltaTable(str(self.down.inbox)).to_pyarrow_table(columns=["upstream_seq"])
                      ["upstream_seq"].to_pylist())

    def inbox_version(self) -> int | None:
        return DeltaTable(str(self.down.inbox)).transaction_version("amps-1->amps-2#1-test")


@pytest.fixture
def pair(tmp_path):
    return Pair(tmp_path)


def test_each_commit_is_appended_once_with_its_last_seq_as_the_inbox_version(pair):
    pair.commit(1, 5)
    replicator = pair.replicator()
    try:
        wait_until(lambda: replicator.link.snapshot().sent_seq == 5, timeout=30, what="seqs 1-5 sent")
        assert pair.inbox_version() == 5
        pair.commit(6, 3)  # (not handed over: the replicator finds it in the txlog's Delta log)
        wait_until(lambda: replicator.link.snapshot().sent_seq == 8, timeout=30, what="seqs 6-8 sent")
    finally:
        replicator.stop()
    assert pair.inbox_seqs() == list(range(1, 9)) and pair.inbox_version() == 8
    assert replicator.link.snapshot().unacked == ((1, 8),) and replicator.error is None
    assert replicator.ranges_from_memory == 0 and replicator.batches == 2


def test_rows_the_ingest_hands_over_are_taken_from_memory(pair):
    recent = RecentTxlog()
    replicator = pair.replicator(recent)
    try:
        pair.commit(1, 4, recent)
        wait_until(lambda: replicator.link.snapshot().sent_seq == 4, timeout=30, what="seqs 1-4 sent")
        pair.commit(5, 4, recent)
        wait_until(lambda: replicator.link.snapshot().sent_seq == 8, timeout=30, what="seqs 5-8 sent")
    finally:
        replicator.stop()
    assert replicator.ranges_from_memory == replicator.batches >= 2
    assert pair.inbox_seqs() == list(range(1, 9))
    assert recent.held is None, "rows every replicator has passed are let go"


@pytest.mark.parametrize("point", ["replicator.after_inbox_commit", "replicator.before_inbox_commit"])
def test_a_batch_a_failure_kept_from_the_link_is_sent_once_after_the_restart(pair, point):
    """After the inbox commit and before the link file: the restart finds the batch in the inbox by its version
    and tells the link, appending nothing. Before the commit: nothing is there, and the restart appends it."""
    pair.commit(1, 5)
    failpoints.arm(f"{point}@1:raise")
    try:
        failed = pair.replicator()
        wait_until(lambda: not failed.is_active, timeout=30, what="the replicator to fail")
    finally:
        failpoints.arm("")
    failed.stop()
    assert isinstance(failed.error, failpoints.FailpointError)
    assert failed.link.snapshot().sent_seq == 0
    assert pair.inbox_seqs() == (list(range(1, 6)) if point == "replicator.after_inbox_commit" else [])
    pair.commit(6, 3)  # (rows committed meanwhile: the restart's first batch must not take 1-5 with them)
    restarted = pair.replicator()
    try:
        wait_until(lambda: restarted.link.snapshot().sent_seq == 8, timeout=30, what="seqs 1-8 told to the link")
    finally:
        restarted.stop()
    assert pair.inbox_seqs() == list(range(1, 9)), "each row in the inbox once"
    assert restarted.rows_sent == (3 if point == "replicator.after_inbox_commit" else 8)
    assert restarted.link.snapshot().unacked == ((1, 8),), "the rows wait for the destination's ack"
