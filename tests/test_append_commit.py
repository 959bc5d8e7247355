"""Appends committed by the engine's own commit files (replication/connectors/delta/append_commit.py).

What a reader observes: the rows, the app transaction versions and the commit records delta-rs' own appends
give, a checkpoint every ``delta.checkpointInterval`` versions, and delta-rs taking over any append that
follows another writer's commit or meets a table feature the engine does not write.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError
from support.tables import TxlogWriter, numbered_inbox_rows, numbered_txlog_rows

from replication.connectors.delta import append_commit
from replication.connectors.delta.append_commit import ENGINE_INFO
from replication.connectors.delta.tables import COMMIT_METADATA_KEY, IdempotentAppender, commit_metadata_since
from replication.connectors.s3.objects import ObjectPath
from replication.inbox.schema import INBOX_SCHEMA, INBOX_TABLE_CONFIGURATION
from replication.txlog.files import read_range
from replication.txlog.schema import TXLOG_SCHEMA


def engines(path: Path) -> dict[int, str]:
    """version -> the engineInfo of its commit."""
    out = {}
    for entry in (path / "_delta_log").glob("*.json"):
        info = json.loads(entry.read_text().splitlines()[0])["commitInfo"]
        out[int(entry.stem)] = info.get("engineInfo", "")
    return out


def data_files(path: Path) -> set[str]:
    return {p.name for p in path.glob("*.parquet")}


def logged_files(path: Path) -> set[str]:
    """Every data file a commit of the table ever added."""
    return {json.loads(line)["add"]["path"] for entry in (path / "_delta_log").glob("*.json")
            for line in entry.read_text().splitlines() if line.startswith('{"add"')}


def test_appends_commit_their_own_files_with_what_delta_rs_commits_and_a_checkpoint_every_interval(tmp_path):
    path = tmp_path / "txlog"
    writer = TxlogWriter(path)
    for _ in range(120):
        writer.append(7)
    writer.append(0)  # an empty batch still records its version
    writer.appender.wait_for_checkpoint()

    assert engines(path) == {0: engines(path)[0], **{v: ENGINE_INFO for v in range(1, 122)}}, "create, then ours"
    table = DeltaTable(str(path))
    assert table.version() == 121 and table.transaction_version("ingest") == 120
    assert read_range(str(path), 0, 840)["seq"].to_pylist() == list(range(1, 841))
    assert table.to_pyarrow_table().num_rows == 840
    records = commit_metadata_since(table, 118)
    assert [(v, r["batch"], r["last_seq"]) for v, r in records] == [(119, 118, 833), (120, 119, 840), (121, 120, 840)]
    assert table.history(1)[0][COMMIT_METADATA_KEY] == json.dumps(records[-1][1], separators=(",", ":"))
    # delta.checkpointInterval is 50: checkpoints at 49 and 99, where delta-rs makes them after its commits
    assert sorted(p.name for p in (path / "_delta_log").glob("*.checkpoint.parquet")) == [
        f"{49:020d}.checkpoint.parquet", f"{99:020d}.checkpoint.parquet"]
    assert json.loads((path / "_delta_log" / "_last_checkpoint").read_text())["version"] == 99
    # add actions carry the statistics readers place a file by
    last = [json.loads(line) for line in (path / "_delta_log" / f"{120:020d}.json").read_text().splitlines()]
    (add,) = [a["add"] for a in last if "add" in a]
    stats = json.loads(add["stats"])
    assert (stats["numRecords"], stats["minValues"]["seq"], stats["maxValues"]["seq"]) == (7, 834, 840)
    assert data_files(path) == {f.split("/")[-1] for f in table.file_uris()}, "no file outside the log"
    # a replay of a committed batch writes nothing
    assert writer.appender.append(numbered_txlog_rows(1, 7), 5) is False
    assert DeltaTable(str(path)).version() == 121


def test_another_writers_commit_hands_the_next_append_to_delta_rs_and_then_it_goes_on_locally(tmp_path):
    path = tmp_path / "txlog"
    writer = TxlogWriter(path)
    writer.append(10)
    other = IdempotentAppender(path, TXLOG_SCHEMA, app_id="loader", name="txlog")  # another writer, own app id
    other.append(numbered_txlog_rows(1001, 5), 0)
    writer.append(10)  # version 3 was taken: this append is delta-rs', checked against version 2
    writer.append(10)
    DeltaTable(str(path)).delete("seq <= 5")  # a removal of old rows (retention) by yet another writer
    writer.append(10)
    writer.append(10)

    by = engines(path)
    assert [v for v in range(1, 8) if by[v] == ENGINE_INFO] == [1, 2, 4, 7], "the loader's append is local too"
    assert "delta-rs" in by[3] and "delta-rs" in by[6], "the appends that found another writer's commit"
    assert data_files(path) == logged_files(path), "the file of the append that lost its version was removed"
    table = DeltaTable(str(path))
    assert (table.transaction_version("ingest"), table.transaction_version("loader")) == (4, 0)
    seqs = sorted(table.to_pyarrow_table(columns=["seq"])["seq"].to_pylist())
    assert seqs == list(range(6, 51)) + list(range(1001, 1006))


def test_a_table_feature_the_engine_does_not_write_leaves_its_appends_to_delta_rs(tmp_path):
    path = tmp_path / "txlog"
    writer = TxlogWriter(path)
    writer.append(3)
    # a user adds a check constraint (delta-spark's ALTER TABLE ... ADD CONSTRAINT, here through deltalake)
    DeltaTable(str(path)).alter.add_constraint({"small_seq": "seq < 100"})
    writer.append(3)
    writer.append(3)
    assert "delta-rs" in engines(path)[3] and "delta-rs" in engines(path)[4], "constraints are delta-rs' to check"
    with pytest.raises(DeltaError, match="1 rows failed validation check"):
        writer.appender.append(numbered_txlog_rows(100, 1), 99)
    assert DeltaTable(str(path)).version() == 4


def test_a_null_where_the_schema_has_none_is_refused_by_delta_rs_naming_the_column(tmp_path):
    path = tmp_path / "txlog"
    writer = TxlogWriter(path)
    writer.append(2)
    rows = numbered_txlog_rows(3, 1)
    rows = rows.set_column(rows.schema.get_field_index("publisher"), "publisher", pa.array([None], pa.string()))
    with pytest.raises(Exception, match="publisher"):
        writer.appender.append(rows, 1)
    writer.append(2)  # the next append (batch 1 again) is fine
    assert DeltaTable(str(path)).to_pyarrow_table().num_rows == 4


@pytest.mark.parametrize("codec", ["ZSTD", "LZ4_RAW", "UNCOMPRESSED"])
def test_inbox_appends_keep_their_codec_and_the_change_data_feed_readable(tmp_path, codec):
    path = tmp_path / "inbox"
    inbox = IdempotentAppender(path, INBOX_SCHEMA, app_id="a->b", name="inbox",
                               configuration=INBOX_TABLE_CONFIGURATION, compression=codec)
    inbox.append(numbered_inbox_rows("a->b", 1, 4), 0, commit_info={"replication.signature": "s1"})
    inbox.append(numbered_inbox_rows("a->b", 5, 4), 1)
    assert set(engines(path).values()) - {engines(path)[0]} == {ENGINE_INFO}
    table = DeltaTable(str(path))
    assert table.history(2)[-1]["replication.signature"] == "s1"
    changes = table.load_cdf(starting_version=1).read_all()
    assert sorted(changes["upstream_seq"].to_pylist()) == list(range(1, 9))
    assert set(changes["_change_type"].to_pylist()) == {"insert"}
    codecs = {pq.ParquetFile(f.removeprefix("file://")).metadata.row_group(0).column(0).compression
              for f in table.file_uris()}
    assert codecs == {{"LZ4_RAW": "LZ4"}.get(codec, codec)}, "a destination's <Compression> applies to its inbox"


def test_delta_spark_reads_a_locally_committed_table_through_its_checkpoint(tmp_path, spark):
    path = tmp_path / "txlog"
    writer = TxlogWriter(path)
    for _ in range(55):
        writer.append(4)
    write_deltalake(str(tmp_path / "plain"), numbered_txlog_rows(1, 3))  # (the same session reads delta-rs' too)
    frame = spark.read.format("delta").load(str(path))
    assert frame.count() == 220
    assert sorted(r.seq for r in frame.select("seq").collect()) == list(range(1, 221))
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "operation").collect()
    assert max(r.version for r in history) == 55 and {r.operation for r in history} >= {"WRITE"}


def test_a_commit_file_that_cannot_be_made_fails_the_append_and_leaves_no_file_behind(tmp_path, monkeypatch):
    path = tmp_path / "txlog"
    writer = TxlogWriter(path)
    writer.append(3)
    real_link = append_commit.os.link

    def failing_link(source, target):  # noqa: ANN001 - os.link's signature
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(append_commit.os, "link", failing_link)
    with pytest.raises(OSError, match="Input/output error"):
        writer.append(3)
    assert data_files(path) == logged_files(path), "the data file of the failed commit was removed"
    assert not list((path / "_delta_log").glob(".*.tmp")), "no temporary commit file left behind"
    monkeypatch.setattr(append_commit.os, "link", real_link)
    writer.append(3)  # (the batch again, as Spark retries it)
    table = DeltaTable(str(path))
    assert (table.version(), table.transaction_version("ingest"), table.to_pyarrow_table().num_rows) == (2, 1, 6)


def test_a_commit_made_but_answered_as_taken_counts_once(tmp_path, monkeypatch):
    """NFS may answer a retried LINK with "exists" for the link it made, and S3 a retried conditional put with
    412 for the object it stored: the append is committed, once, and its data file kept."""
    path = tmp_path / "txlog"
    writer = TxlogWriter(path)
    writer.append(3)
    real_link = append_commit.os.link

    def link_answered_exists(source, target):  # noqa: ANN001 - os.link's signature
        real_link(source, target)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))

    monkeypatch.setattr(append_commit.os, "link", link_answered_exists)
    writer.append(3)
    monkeypatch.setattr(append_commit.os, "link", real_link)
    put = append_commit.LocalFiles.put_if_absent

    def put_answered_taken(self, version, body):  # noqa: ANN001
        put(self, version, body)
        raise append_commit.VersionTaken("refused on a retry")

    monkeypatch.setattr(append_commit.LocalFiles, "put_if_absent", put_answered_taken)
    writer.append(3)
    monkeypatch.setattr(append_commit.LocalFiles, "put_if_absent", put)
    writer.append(3)

    assert [engines(path)[v] for v in range(1, 5)] == [ENGINE_INFO] * 4, "no append handed to delta-rs"
    table = DeltaTable(str(path))
    assert (table.version(), table.transaction_version("ingest")) == (4, 3)
    assert sorted(table.to_pyarrow_table(columns=["seq"])["seq"].to_pylist()) == list(range(1, 13))
    assert data_files(path) == logged_files(path)


@pytest.mark.usefixtures("s3_process")
def test_on_s3_appends_commit_their_own_objects_put_if_absent_and_another_writers_commit_goes_to_delta_rs(s3):
    bucket = f"commit-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(bucket)
    root = ObjectPath.of(f"s3://{bucket}/amps-1/txlog")
    appender = IdempotentAppender(root, TXLOG_SCHEMA, app_id="ingest", name="txlog")
    seq = 0
    for batch in range(52):
        if batch == 30:  # another writer's append takes the version batch 30 wanted
            write_deltalake(root.uri, numbered_txlog_rows(1001, 2), mode="append",
                            storage_options=root.storage_options)
        appender.append(numbered_txlog_rows(seq + 1, 3), batch)
        seq += 3
    appender.wait_for_checkpoint()

    table = DeltaTable(root.uri, storage_options=root.storage_options)
    by_version = {h["version"]: h.get("engineInfo", "") for h in table.history()}
    assert table.version() == 53 and table.transaction_version("ingest") == 51
    assert [v for v in range(1, 54) if by_version[v] != ENGINE_INFO] == [31, 32], "the foreign one, then delta-rs'"
    assert sorted(table.to_pyarrow_table(columns=["seq"])["seq"].to_pylist()) == list(range(1, 157)) + [1001, 1002]
    assert (root / "_delta_log" / f"{49:020d}.checkpoint.parquet").is_file()
    stored = {p.name for p in root.glob("*.parquet")}
    assert stored == {u.rsplit("/", 1)[-1] for u in table.file_uris()}, "the losing attempt's object removed"


def test_a_checkpoint_that_fails_is_logged_and_the_appends_go_on(tmp_path, monkeypatch, caplog):
    from deltalake import DeltaTable as Table

    path = tmp_path / "txlog"
    writer = TxlogWriter(path)
    for _ in range(48):
        writer.append(2)
    real = Table.create_checkpoint

    def failing(self):  # noqa: ANN001
        raise OSError("disk full")

    monkeypatch.setattr(Table, "create_checkpoint", failing)
    with caplog.at_level("WARNING", logger="replication.connectors.delta.tables"):
        writer.append(2)  # version 49: its checkpoint fails, the append stands
        writer.appender.wait_for_checkpoint()
    assert "no checkpoint at version 49 (disk full)" in caplog.text
    monkeypatch.setattr(Table, "create_checkpoint", real)
    for _ in range(50):
        writer.append(2)
    writer.appender.wait_for_checkpoint()
    checkpoints = sorted(p.name for p in (path / "_delta_log").glob("*.checkpoint.parquet"))
    assert checkpoints == [f"{99:020d}.checkpoint.parquet"], "the next one where it is due"
    table = DeltaTable(str(path))
    assert (table.version(), table.to_pyarrow_table().num_rows) == (99, 198)


def test_a_checkpoint_is_made_on_a_thread_while_the_next_appends_commit(tmp_path, monkeypatch):
    from deltalake import DeltaTable as Table

    path = tmp_path / "txlog"
    writer = TxlogWriter(path)
    started, release = threading.Event(), threading.Event()
    real = Table.create_checkpoint

    def held(self):  # noqa: ANN001
        started.set()
        assert release.wait(60), "the test never let the checkpoint go"
        real(self)

    monkeypatch.setattr(Table, "create_checkpoint", held)
    for _ in range(49):
        writer.append(2)  # the 49th commits version 49, whose checkpoint is due
    assert started.wait(30)
    for _ in range(5):
        writer.append(2)  # committed while the checkpoint is held
    assert DeltaTable(str(path)).version() == 54
    assert not list((path / "_delta_log").glob("*.checkpoint.parquet"))
    release.set()
    writer.appender.wait_for_checkpoint()
    assert [p.name for p in (path / "_delta_log").glob("*.checkpoint.parquet")] == [f"{49:020d}.checkpoint.parquet"]
    assert json.loads((path / "_delta_log" / "_last_checkpoint").read_text())["version"] == 49
    writer.append(2)  # from the re-opened table on
    assert DeltaTable(str(path)).to_pyarrow_table().num_rows == 110
