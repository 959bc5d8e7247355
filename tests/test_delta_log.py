"""Following a txlog's new commits from its commit files, against real Delta tables written by delta-rs."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from support.tables import TxlogWriter

from replication.connectors.delta.log import appends_after, local_log_dir
from replication.txlog.files import TxlogFiles, read_files


def test_plain_appends_are_read_from_the_commit_files(tmp_path):
    writer = TxlogWriter(tmp_path / "txlog")
    writer.append(10)
    since = DeltaTable(str(tmp_path / "txlog")).version()
    writer.append(5)
    writer.append(0)  # duplicates only: a commit without a file
    writer.append(7)
    appended = appends_after(local_log_dir(str(tmp_path / "txlog")), since)
    assert appended is not None
    assert appended.version == since + 3
    assert (appended.lo, appended.hi, appended.last_seq) == ([11, 16], [15, 22], 22)
    files = [str(tmp_path / "txlog" / p) for p in appended.paths]
    assert read_files(files, 10, 22)["seq"].to_pylist() == list(range(11, 23))
    nothing_new = appends_after(local_log_dir(str(tmp_path / "txlog")), appended.version)
    assert nothing_new is not None and (nothing_new.version, nothing_new.paths) == (appended.version, [])


def test_anything_but_an_append_or_other_storage_asks_for_a_snapshot(tmp_path):
    writer = TxlogWriter(tmp_path / "txlog")
    for _ in range(3):
        writer.append(10)
    table = DeltaTable(str(tmp_path / "txlog"))
    since = table.version()
    table.optimize.compact()  # removes three files, adds one
    assert appends_after(local_log_dir(str(tmp_path / "txlog")), since) is None
    assert local_log_dir("s3://bucket/amps-1/txlog") is None
    assert local_log_dir(f"file://{tmp_path}/txlog") == tmp_path / "txlog" / "_delta_log"


def test_a_view_that_follows_commits_plans_and_reads_as_a_fresh_snapshot(tmp_path, monkeypatch):
    _follow_commits_as_a_fresh_snapshot(tmp_path / "txlog", str(tmp_path / "txlog"), monkeypatch)


@pytest.mark.usefixtures("s3_process")
def test_a_view_of_a_txlog_on_s3_follows_its_commit_objects_as_a_fresh_snapshot(s3, monkeypatch):
    """Part 5 of the object-storage issue: on S3 the txlog's new commits are followed from their commit
    objects (one GET each), and a compaction still falls back to a snapshot."""
    import uuid

    from replication.storage.layout import StorageLayout

    bucket = f"follow-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    txlog = StorageLayout.of(f"s3://{bucket}/amps-1").txlog
    _follow_commits_as_a_fresh_snapshot(txlog, str(txlog), monkeypatch)


def _follow_commits_as_a_fresh_snapshot(path, uri: str, monkeypatch) -> None:
    from replication.connectors.delta.tables import open_table

    snapshots = []
    load_files = TxlogFiles._load_files
    monkeypatch.setattr(TxlogFiles, "_load_files", lambda self: snapshots.append(self) or load_files(self))
    writer = TxlogWriter(path)
    view = TxlogFiles(uri)
    for round_ in range(6):
        for _ in range(round_ + 1):
            writer.append(4)
        if round_ == 3:
            open_table(uri).optimize.compact()
            writer.appender.table.update_incremental()
        view.refresh()
        fresh = TxlogFiles(uri)
        fresh.refresh()
        assert (view.version, view.committed_seq, view.file_count) == (fresh.version, fresh.committed_seq,
                                                                        fresh.file_count)
        end = writer.max_seq
        assert [(p.start, p.end, p.files) for p in view.plan(0, end, rows_per_partition=9)] == \
               [(p.start, p.end, p.files) for p in fresh.plan(0, end, rows_per_partition=9)]
        assert view.read(0, end)["seq"].to_pylist() == list(range(1, end + 1))
    # The view listed the table's files twice: at its first refresh and after the compaction.
    assert sum(1 for s in snapshots if s is view) == 2


def test_inbox_versions_read_from_their_commit_files_are_the_change_feeds_inserts(tmp_path, monkeypatch):
    from support.tables import Upstream, push_concurrently

    from replication.inbox import versions
    from replication.inbox.schema import create_inbox

    inbox = tmp_path / "inbox"
    create_inbox(inbox)
    push_concurrently(inbox, [Upstream(inbox, "a"), Upstream(inbox, "b"), Upstream(inbox, "c")], batches=4, size=7)
    view = versions.InboxLog(str(inbox))
    assert view.latest_version() == DeltaTable(str(inbox)).version()
    push_concurrently(inbox, [Upstream(inbox, "d"), Upstream(inbox, "e")], batches=2, size=3)
    latest = DeltaTable(str(inbox)).version()
    assert view.latest_version() == latest, "the commit files after the known version were found"
    assert versions._read_appended(str(inbox), 2, latest) is not None, "plain appends: read from their files"
    from_files = versions.read_versions(str(inbox), 2, latest)
    monkeypatch.setattr(versions, "_read_appended", lambda *args: None)  # the change data feed only
    from_feed = versions.read_versions(str(inbox), 2, latest)
    assert from_files.num_rows == 11 * 7 + 4 * 3
    assert from_files.to_pylist() == from_feed.to_pylist()


def test_a_commit_file_that_cannot_be_read_is_an_error_not_a_missing_commit(tmp_path):
    """A missing commit is None (not written yet, or cleaned up); one that exists but cannot be read raises,
    so a signature check or a cleanup does not take it for "gone". The row counts then count it as large,
    and the follower asks for a snapshot."""
    from replication.connectors.delta.log import commit_text
    from replication.errors import StorageError
    from replication.inbox import versions

    writer = TxlogWriter(tmp_path / "txlog")
    writer.append(3)
    table = str(tmp_path / "txlog")
    assert commit_text(table, 99) is None
    broken = tmp_path / "txlog" / "_delta_log" / f"{DeltaTable(table).version() + 1:020d}.json"
    broken.mkdir()  # exists, and cannot be read as a file
    with pytest.raises(StorageError, match=r"commit \d+ cannot be read"):
        commit_text(table, DeltaTable(table).version() + 1)
    assert appends_after(local_log_dir(table), DeltaTable(table).version()) is None
    view = versions.InboxLog(table)
    view.latest_version()
    assert view.rows_in(DeltaTable(table).version() + 1) == 2**62, "unreadable: a batch of its own"
