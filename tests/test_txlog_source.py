"""The "replication-txlog" Spark source, against real txlog Delta tables and a real SparkSession."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction
from support.streams import run_available_now
from support.tables import TxlogWriter, numbered_txlog_rows

from replication.connectors.delta.tables import COMMIT_METADATA_KEY
from replication.errors import ConfigError
from replication.storage.control import DurableState
from replication.txlog import stream as txlog_stream
from replication.txlog.files import ROWS_PER_PARTITION, TxlogFiles, TxlogSourceError, read_files, read_range
from replication.txlog.schema import TXLOG_SCHEMA
from replication.txlog.stream import FORMAT, TxlogSourceOptions, read_partition, register

# -- helpers -------------------------------------------------------------------


def bulk_txlog(path: Path, files: int, rows_per_file: int = 10) -> None:
    """A txlog of ``files`` Parquet files (seqs in order), committed 500 files per Delta commit.

    Writes the files directly and commits their add actions with statistics, as
    a writer that keeps data off the driver does; much faster than one
    write_deltalake per file.
    """
    path.mkdir(parents=True)
    DeltaTable.create(str(path), TXLOG_SCHEMA, configuration={"delta.checkpointInterval": "50"})
    table = DeltaTable(str(path))
    actions = []
    for i in range(files):
        first = i * rows_per_file + 1
        name = f"part-{i:05d}-{uuid.uuid4().hex}.parquet"
        pq.write_table(numbered_txlog_rows(first, rows_per_file), path / name)
        stats = {"numRecords": rows_per_file, "minValues": {"seq": first},
                 "maxValues": {"seq": first + rows_per_file - 1}, "nullCount": {"seq": 0}}
        actions.append(AddAction(name, (path / name).stat().st_size, {}, int(time.time() * 1000), True,
                                 json.dumps(stats)))
        if len(actions) == 500 or i == files - 1:
            table.create_write_transaction(actions, mode="append", schema=TXLOG_SCHEMA)
            actions = []


def viewed_txlog(path: Path, commits: int) -> tuple[TxlogWriter, TxlogFiles]:
    """A txlog of ``commits`` commits of 10 rows (one file each: 1-10, 11-20, ...), and a view of it, refreshed."""
    writer = TxlogWriter(path)
    for _ in range(commits):
        writer.append(10)
    view = TxlogFiles(str(path))
    view.refresh()
    return writer, view


def seqs(batches: list[pa.Table]) -> list[list[int]]:
    return [b.column("seq").to_pylist() for b in batches]


def flat(batches: list[pa.Table]) -> list[int]:
    return [s for b in seqs(batches) for s in b]


# -- options -------------------------------------------------------------------


def test_options():
    assert TxlogSourceOptions.parse({"path": "/t"}) == TxlogSourceOptions("/t", 0, None, ROWS_PER_PARTITION)
    assert TxlogSourceOptions.parse(
        {"path": "/t", "startSeq": "5", "maxRowsPerTrigger": "9", "rowsPerPartition": "3"}
    ) == TxlogSourceOptions("/t", 5, 9, 3)
    replay = TxlogSourceOptions.parse({"path": "/t", "endSeq": "40", "durableFile": "/r/_control/durable.json",
                                       "rate": "2x"})
    assert (replay.end_seq, replay.durable_file, replay.rate) == (40, "/r/_control/durable.json", 2.0)


@pytest.mark.parametrize(
    "options, fix",
    [
        ({}, "option 'path' is required"),
        ({"path": "/t", "startSeq": "-1"}, "startSeq must be an integer >= 0, got '-1'"),
        ({"path": "/t", "maxRowsPerTrigger": "0"}, "maxRowsPerTrigger must be a positive integer"),
        ({"path": "/t", "driverReadRows": "many"}, r"driverReadRows must be an integer >= 0 \(0 reads every"),
        ({"path": "/t", "columns": "seq,body"}, r"columns lists 'body', not a txlog column; choose from seq, "),
        ({"path": "/t", "endSeq": "soon"}, "endSeq must be an integer >= 0, got 'soon'"),
        ({"path": "/t", "rate": "fast"}, r"'fast' is not a replay rate; write a positive multiple .* e.g. '2x'"),
        ({"path": "/t", "rate": "0x"}, "'0x' is not a replay rate"),
    ],
)
def test_bad_options_say_what_to_write(options, fix):
    with pytest.raises(ConfigError, match=fix):
        TxlogSourceOptions.parse(options)


# -- planning and reading, without Spark ---------------------------------------


def test_committed_seq_follows_the_log_and_ignores_empty_commits(tmp_path):
    view = TxlogFiles(str(tmp_path / "txlog"))
    view.refresh()
    assert (view.version, view.committed_seq) == (None, 0)  # absent table

    writer = TxlogWriter(tmp_path / "txlog")
    view.refresh()
    assert view.committed_seq == 0  # created, empty
    writer.append(10)
    writer.append(0)  # a batch of duplicates only: commits, adds no file
    writer.append(5)
    view.refresh()
    assert view.committed_seq == 15
    assert view.file_count == 2


def test_plan_picks_only_overlapping_files_and_splits_large_ranges(tmp_path):
    _, view = viewed_txlog(tmp_path / "txlog", 10)  # files hold 1-10, 11-20, ... 91-100

    [one] = view.plan(34, 52)
    assert (one.start, one.end, len(one.files)) == (34, 52, 3)  # 31-40, 41-50, 51-60
    assert read_files(one.files, 34, 52).column("seq").to_pylist() == list(range(35, 53))

    # A cut after each file where the running row count passes 25, 50, 75.
    parts = view.plan(0, 100, rows_per_partition=25)
    assert [(p.start, p.end) for p in parts] == [(0, 30), (30, 50), (50, 80), (80, 100)]
    assert [len(p.files) for p in parts] == [3, 2, 3, 2]
    assert [s for p in parts for b in read_partition(p) for s in b.column("seq").to_pylist()] == list(range(1, 101))
    assert view.plan(7, 7) == []


def test_compaction_rewrites_files_but_rows_are_read_once(tmp_path):
    writer, view = viewed_txlog(tmp_path / "txlog", 6)
    before = view.plan(0, 60)

    DeltaTable(str(tmp_path / "txlog")).optimize.compact()  # dataChange=false rewrite into one file
    writer.appender.table.update_incremental()
    writer.append(10)
    view.refresh()
    assert view.committed_seq == 70
    assert view.file_count == 2
    assert read_range(str(tmp_path / "txlog"), 0, 70).column("seq").to_pylist() == list(range(1, 71))
    # A plan made before the compaction still reads right: the old files stay until a vacuum.
    assert [r for p in before for b in read_partition(p) for r in b.column("seq").to_pylist()] == list(range(1, 61))


def test_a_plan_whose_files_were_vacuumed_is_made_again_by_the_task(tmp_path):
    _, view = viewed_txlog(tmp_path / "txlog", 3)
    [stale] = view.plan(5, 25)
    table = DeltaTable(str(tmp_path / "txlog"))
    table.optimize.compact()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    seqs = [s for b in read_partition(stale) for s in b.column("seq").to_pylist()]
    assert seqs == list(range(6, 26))


def test_txlog_files_are_snappy_with_seq_statistics_and_plain_bodies(tmp_path):
    """How the txlog is written: compressed, ``seq`` and time statistics kept (readers prune by them), no
    dictionary on the columns distinct per row and no statistics on the bodies (nothing filters on them)."""
    path = tmp_path / "txlog"
    writer = TxlogWriter(path)
    writer.append(2000)
    [stats] = [json.loads(json.loads(line)["add"]["stats"]) for log in sorted((path / "_delta_log").glob("*.json"))
               for line in log.read_text().splitlines() if '"add"' in line]
    assert (stats["minValues"]["seq"], stats["maxValues"]["seq"]) == (1, 2000)
    assert "persist_time" in stats["minValues"] and "data" not in stats["minValues"]
    [file] = [f.removeprefix("file://") for f in DeltaTable(str(path)).file_uris()]
    chunks = {c.path_in_schema: c for c in (pq.ParquetFile(file).metadata.row_group(0).column(i)
                                             for i in range(len(TXLOG_SCHEMA)))}
    assert {c.compression for c in chunks.values()} == {"SNAPPY"}
    assert not any("DICTIONARY" in e for e in chunks["data"].encodings + chunks["bookmark"].encodings)
    assert any("DICTIONARY" in e for e in chunks["topic"].encodings), "repeating values keep their dictionary"
    assert chunks["data"].statistics is None and chunks["seq"].statistics.max == 2000
    view = TxlogFiles(str(path))
    view.refresh()
    [part] = view.plan(1500, 1502)
    assert [s for b in read_partition(part) for s in b.column("seq").to_pylist()] == [1501, 1502]


def test_files_without_statistics_are_read_and_the_commit_record_gives_the_end(tmp_path):
    """A writer that records no statistics (stats are optional in Delta): correct, just not pruned."""
    path = tmp_path / "txlog"
    path.mkdir()
    DeltaTable.create(str(path), TXLOG_SCHEMA)
    actions = []
    for first in (1, 11):
        name = f"part-{first}.parquet"
        pq.write_table(numbered_txlog_rows(first, 10), path / name)
        actions.append(AddAction(name, (path / name).stat().st_size, {}, 0, True, json.dumps({"numRecords": 10})))
    record = json.dumps({"batch": 0, "first_seq": 1, "last_seq": 20, "publishers": {}, "links": {}})
    DeltaTable(str(path)).create_write_transaction(
        actions, mode="append", schema=TXLOG_SCHEMA,
        commit_properties=CommitProperties(custom_metadata={COMMIT_METADATA_KEY: record}),
    )
    view = TxlogFiles(str(path))
    view.refresh()
    assert view.committed_seq == 20
    [part] = view.plan(12, 15)
    assert len(part.files) == 2
    assert [s for b in read_partition(part) for s in b.column("seq").to_pylist()] == [13, 14, 15]


def test_missing_rows_fail_loudly(tmp_path):
    writer = TxlogWriter(tmp_path / "txlog")
    writer.append(10)
    with pytest.raises(TxlogSourceError, match=r"expected 15 rows with seq in \(0, 15\], found 10"):
        read_range(str(tmp_path / "txlog"), 0, 15)


def test_reading_a_small_range_costs_the_same_on_a_20x_longer_log(tmp_path):
    """The cost of a read follows the range, not the log: 100 files vs 2,000 files."""
    timings = {}
    for files in (100, 2000):
        path = tmp_path / f"txlog-{files}"
        bulk_txlog(path, files)
        view = TxlogFiles(str(path))
        view.refresh()
        assert view.committed_seq == files * 10
        start = files * 10 // 2 - 5  # 20 rows in the middle of the log
        plan_s, read_s = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            view.refresh()
            [part] = view.plan(start, start + 20)
            t1 = time.perf_counter()
            rows = [s for b in read_partition(part) for s in b.column("seq").to_pylist()]
            t2 = time.perf_counter()
            plan_s.append(t1 - t0)
            read_s.append(t2 - t1)
        assert rows == list(range(start + 1, start + 21))
        assert len(part.files) == 3  # the range spans three 10-row files, whatever the log's length
        timings[files] = (min(plan_s), min(read_s))
    print(
        "\nread 20 rows: "
        + ", ".join(f"{n} files: plan {p * 1e3:.2f} ms, read {r * 1e3:.2f} ms" for n, (p, r) in timings.items())
    )
    # Reading touches the same 3 files: same cost give or take noise. Planning
    # filters the cached file list (Arrow, ~0.1 us per file).
    assert timings[2000][1] < 3 * timings[100][1] + 0.005
    assert timings[2000][0] < 0.05


# -- the stream, with Spark ----------------------------------------------------


def test_available_now_delivers_every_row_once_in_order_and_restarts_where_it_stopped(spark, tmp_path):
    writer = TxlogWriter(tmp_path / "txlog")
    for count in (10, 0, 25, 7):
        writer.append(count)
    checkpoint = tmp_path / "checkpoint"

    first = run_available_now(spark, txlog_stream, tmp_path / "txlog", checkpoint)
    assert flat(first) == list(range(1, 43))
    everything = pa.concat_tables(first)
    assert everything.column_names == TXLOG_SCHEMA.names
    expected = pa.concat_tables([numbered_txlog_rows(1, 10), numbered_txlog_rows(11, 25), numbered_txlog_rows(36, 7)])
    for name in ("bookmark", "publisher_seq", "topic", "data", "path", "sow_key", "received_from"):
        assert everything.column(name).to_pylist() == expected.column(name).to_pylist(), name

    writer.append(8)
    writer.append(4)
    second = run_available_now(spark, txlog_stream, tmp_path / "txlog", checkpoint)
    assert flat(second) == list(range(43, 55))
    assert run_available_now(spark, txlog_stream, tmp_path / "txlog", checkpoint) == []


# driverReadRows: every batch read in the driver by the planner (default), by tasks (0), or both (5: the last,
# 2-row batch)
@pytest.mark.parametrize("driver_read", [{}, {"driverReadRows": "0"}, {"driverReadRows": "5"}],
                         ids=["planner", "tasks", "mixed"])
def test_max_rows_per_trigger_bounds_each_batch_and_start_seq_skips(spark, tmp_path, driver_read):
    writer = TxlogWriter(tmp_path / "txlog")
    for _ in range(4):
        writer.append(10)

    batches = run_available_now(
        spark, txlog_stream, tmp_path / "txlog", tmp_path / "cp", maxRowsPerTrigger="7", startSeq="3", **driver_read
    )
    assert [len(b) for b in seqs(batches)] == [7, 7, 7, 7, 7, 2]
    assert flat(batches) == list(range(4, 41))


@pytest.mark.parametrize("driver_read", ["0", "1000"], ids=["tasks", "planner"])
def test_columns_reads_only_those_columns_with_seq_first(spark, tmp_path, driver_read):
    writer = TxlogWriter(tmp_path / "txlog")
    writer.append(12)
    batches = run_available_now(spark, txlog_stream, tmp_path / "txlog", tmp_path / "cp", columns="topic, path",
                                driverReadRows=driver_read)
    rows = pa.concat_tables(batches)
    assert rows.column_names == ["seq", "topic", "path"]
    assert rows.column("seq").to_pylist() == list(range(1, 13))
    assert rows.column("topic").to_pylist() == [f"/orders/{s}" for s in range(1, 13)]


def test_end_seq_and_the_durable_watermark_hold_the_stream_back(spark, tmp_path):
    """A replay's caps: never past endSeq; with durableFile, never past the instance's durable_seq (fully_durable)."""
    writer = TxlogWriter(tmp_path / "txlog")
    for _ in range(3):
        writer.append(10)
    durable = tmp_path / "_control" / "durable.json"
    caps = {"endSeq": "24", "durableFile": str(durable)}
    txlog, checkpoint = tmp_path / "txlog", tmp_path / "cp"
    assert flat(run_available_now(spark, txlog_stream, txlog, checkpoint, **caps)) == [], "no durable.json yet"
    DurableState(12).write(durable)
    assert flat(run_available_now(spark, txlog_stream, txlog, checkpoint, **caps)) == list(range(1, 13))
    DurableState(30).write(durable)
    assert flat(run_available_now(spark, txlog_stream, txlog, checkpoint, **caps)) == list(range(13, 25))


def test_absent_then_growing_log_with_a_processing_time_trigger(spark, tmp_path):
    register(spark)
    seen: list[int] = []
    query = (
        spark.readStream.format(FORMAT).option("path", str(tmp_path / "txlog")).load()
        .writeStream.trigger(processingTime="100 milliseconds")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .foreachBatch(lambda df, _id: seen.extend(r.seq for r in df.select("seq").collect()))
        .start()
    )
    try:
        time.sleep(1.5)  # a few triggers on an absent table
        assert query.exception() is None and seen == []
        writer = TxlogWriter(tmp_path / "txlog")
        for _ in range(5):
            writer.append(20)
            time.sleep(0.2)
        deadline = time.monotonic() + 120
        while len(seen) < 100 and time.monotonic() < deadline and query.exception() is None:
            time.sleep(0.2)
        assert query.exception() is None
        assert seen == list(range(1, 101))
    finally:
        query.stop()


def test_a_failed_batch_is_replayed_with_the_same_rows_and_the_stream_goes_on(spark, tmp_path):
    """The replicator's contract: after a crash, batch b comes again with the same rows, then b+1..."""
    writer = TxlogWriter(tmp_path / "txlog")
    for _ in range(3):
        writer.append(10)
    register(spark)
    delivered: list[tuple[int, list[int]]] = []

    def sink(df, batch_id):
        delivered.append((batch_id, df.toArrow().column("seq").to_pylist()))
        if batch_id == 1 and len(delivered) == 2:
            raise RuntimeError("crash in foreachBatch")

    for attempt in range(2):
        query = (
            spark.readStream.format(FORMAT).option("path", str(tmp_path / "txlog"))
            .option("maxRowsPerTrigger", "10").option("rowsPerPartition", "4")  # 3 tasks per batch
            .load()
            .writeStream.trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .foreachBatch(sink)
            .start()
        )
        try:
            query.awaitTermination(300)
        except Exception:
            assert attempt == 0
        assert (query.exception() is None) == (attempt == 1)

    assert delivered == [
        (0, list(range(1, 11))),
        (1, list(range(11, 21))),
        (1, list(range(11, 21))),  # replayed after the restart: same batch id, same rows
        (2, list(range(21, 31))),
    ]
