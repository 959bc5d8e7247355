"""The replicator thread (replication/destination/replicator.py) on real Delta tables, without Spark: each batch
appended once with its last seq as the inbox version, taken from memory when the ingest hands rows over, and a
batch a crash kept from the link file told to the link at the restart rather than appended again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from deltalake import DeltaTable
from support.fabric import ONE_WAY
from support.factories import destination_xml, replication_xml, wait_until, write_config
from support.tables import numbered_txlog_rows

from replication import config, failpoints
from replication.connectors.delta.tables import IdempotentAppender
from replication.connectors.spark.trigger import trigger_seconds
from replication.destination.link import Link
from replication.destination.replicator import Replicator
from replication.inbox.schema import create_inbox
from replication.storage.control import LinkState
from replication.storage.layout import StorageLayout
from replication.txlog.recent import RecentTxlog
from replication.txlog.schema import TXLOG_SCHEMA


class Pair:
    """amps-1's txlog (written here as its ingest would), its link to amps-2, and amps-2's inbox."""

    def __init__(self, tmp_path, topics: str = ONE_WAY) -> None:
        self.down = StorageLayout.of(str(tmp_path / "amps-2"))
        cfg_file = write_config(tmp_path, "amps-1", "localhost:9", replication=replication_xml(
            destination_xml("amps-2", [tmp_path / "amps-2"], topics=topics)))
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

    @contextmanager
    def running(self, recent: RecentTxlog | None = None) -> Iterator[Replicator]:
        """A started replicator, stopped on leaving (its counters stay readable)."""
        replicator = self.replicator(recent)
        try:
            yield replicator
        finally:
            replicator.stop()

    def inbox_seqs(self) -> list[int]:
        return sorted(DeltaTable(str(self.down.inbox)).to_pyarrow_table(columns=["upstream_seq"])
                      ["upstream_seq"].to_pylist())

    def inbox_version(self) -> int | None:
        return DeltaTable(str(self.down.inbox)).transaction_version("amps-1->amps-2#1-test")


def wait_sent(replicator: Replicator, seq: int) -> None:
    """Until the replicator has told its link every seq through ``seq``."""
    wait_until(lambda: replicator.link.snapshot().sent_seq == seq, timeout=30, what=f"seqs through {seq} sent")


@pytest.fixture
def pair(tmp_path):
    return Pair(tmp_path)


def test_each_commit_is_appended_once_with_its_last_seq_as_the_inbox_version(pair):
    pair.commit(1, 5)
    with pair.running() as replicator:
        wait_sent(replicator, 5)
        assert pair.inbox_version() == 5
        pair.commit(6, 3)  # (not handed over: the replicator finds it in the txlog's Delta log)
        wait_sent(replicator, 8)
    assert pair.inbox_seqs() == list(range(1, 9)) and pair.inbox_version() == 8
    assert replicator.link.snapshot().unacked == ((1, 8),) and replicator.error is None
    assert replicator.ranges_from_memory == 0 and replicator.batches == 2


def test_rows_the_ingest_hands_over_are_taken_from_memory(pair):
    recent = RecentTxlog()
    with pair.running(recent) as replicator:
        pair.commit(1, 4, recent)
        wait_sent(replicator, 4)
        pair.commit(5, 4, recent)
        wait_sent(replicator, 8)
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
    with pair.running() as restarted:
        wait_sent(restarted, 8)
    assert pair.inbox_seqs() == list(range(1, 9)), "each row in the inbox once"
    assert restarted.rows_sent == (3 if point == "replicator.after_inbox_commit" else 8)
    assert restarted.link.snapshot().unacked == ((1, 8),), "the rows wait for the destination's ack"


def test_a_trigger_interval_paces_the_replicators_batches_in_seconds():
    assert trigger_seconds("0 seconds") == 0.0
    assert trigger_seconds("250 milliseconds") == 0.25
    assert trigger_seconds("1 second") == trigger_seconds("1s") == trigger_seconds("interval 1 second") == 1.0
    assert trigger_seconds("2 minutes") == 120.0 and trigger_seconds("1 hour") == 3600.0
    assert trigger_seconds("1 minute 30 seconds") == 90.0
    for bad in ("fast", "3 fortnights", "1 second and more", ""):
        with pytest.raises(ValueError, match=f"trigger interval '{bad}': expected numbers with units"):
            trigger_seconds(bad)


def test_a_link_file_far_behind_the_inbox_is_told_in_batch_sized_pieces(pair, monkeypatch):
    """A restored (older) link file: every batch the inbox holds past it is told to the link, a batch's rows at a
    time, and nothing is appended again."""
    from replication.destination import replicator as module

    pair.commit(1, 8)
    with pair.running() as first:
        wait_sent(first, 8)
    LinkState("amps-2", "sync", incarnation=first.link.snapshot().incarnation).write(pair.link_file)
    monkeypatch.setattr(module, "BATCH_ROWS", 3)
    with pair.running() as restarted:
        wait_sent(restarted, 8)
    assert restarted.batches == 3 and restarted.rows_sent == 0
    assert restarted.link.snapshot().unacked == ((1, 8),)
    assert pair.inbox_seqs() == list(range(1, 9))


def test_a_content_filter_that_reads_bodies_routes_smaller_batches(tmp_path, monkeypatch):
    from replication.destination import replicator as module

    monkeypatch.setattr(module, "BODY_ROUTED_BATCH_ROWS", 3)
    pair = Pair(tmp_path, topics="<Topic><Name>.*</Name><MessageType>json</MessageType><Filter>/seq &gt; 4</Filter>"
                                 "<ExcludeValidation>replicate,cascade,replicate_filter</ExcludeValidation></Topic>")
    pair.commit(1, 8)
    with pair.running() as replicator:
        wait_sent(replicator, 8)
    assert replicator.batches == 3 and pair.inbox_seqs() == [5, 6, 7, 8]
    assert replicator.link.snapshot().unacked == ((5, 8),), "the rows filtered out wait for nothing"


def test_a_link_never_gets_a_second_replicator_while_the_last_ones_batch_is_under_way(pair, monkeypatch):
    """Stopping gives up on a batch stuck at the destination's storage; connecting again waits for it to end."""
    from replication.destination.manager import DestinationManager
    from replication.errors import StorageError

    monkeypatch.setattr(failpoints, "PAUSE_S", 5.0)  # (the batch "stuck" at its inbox commit)
    pair.commit(1, 5)
    failpoints.arm("replicator.before_inbox_commit@1:pause")
    try:
        stuck = pair.replicator()
        manager = DestinationManager(pair.cfg, pair.dest, layout=pair.up, link=stuck.link, on_ack=lambda: None)
        manager.replicator = stuck
        wait_until(failpoints_reached, timeout=30, interval=0.01, what="the batch to pause")
        with pytest.raises(StorageError, match="the last replicator's batch is still under way"):
            manager._connect(0, str(pair.down.root), pair.down)
    finally:
        failpoints.arm("")
        stuck.stop()
    assert not stuck.is_active and pair.inbox_seqs() == [1, 2, 3, 4, 5]


def failpoints_reached() -> bool:
    return failpoints._counts.get("replicator.before_inbox_commit", 0) >= 1


def test_run_with_a_trigger_it_cannot_read_exits_2_with_one_line_before_anything_starts(tmp_path):
    from support.cli import run_cli

    path = write_config(tmp_path, "amps-1", "localhost:9")
    done = run_cli("run", path, "--trigger", "fast")
    assert done.code == 2 and len(done.err.strip().splitlines()) == 1, done.err
    assert "argument --trigger: trigger interval 'fast': expected numbers with units" in done.err
    assert not (tmp_path / "amps-1").exists(), "nothing started"
