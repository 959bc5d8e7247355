"""Replay's Spark side on tables of its own: pacing, fully_durable on a sync pair, and the choice of reader."""

from __future__ import annotations

import json
import time

from support.cli import run_cli
from support.factories import wait_until, write_batches
from support.streams import collecting, spark_seqs

from replication import replay


def test_a_paced_subscription_releases_rows_by_their_original_spacing(spark, tmp_path):
    """Rows published 1 s apart, replayed at 4x: the first micro-batch holds only the first row (it anchors
    the replay); unpaced, one batch would hold them all."""
    write_batches(tmp_path / "txlog", batches=4, per_publisher=1, publishers=("p0",))
    batches: list[list[int]] = []
    query = (replay.subscribe(tmp_path, rate="4x").writeStream.trigger(processingTime="100 milliseconds")
             .option("checkpointLocation", str(tmp_path / "cp"))
             .foreachBatch(lambda df, _id: batches.append(spark_seqs(df))).start())
    try:
        wait_until(lambda: sum(map(len, batches)) >= 4 or query.exception(), what="the paced rows")
    finally:
        query.stop()
    delivered = [b for b in batches if b]
    assert delivered[0] == [1] and [s for b in delivered for s in b] == [1, 2, 3, 4]


# -- fully_durable: its own pair ------------------------------------------------------------


def test_fully_durable_returns_only_what_the_sync_destination_acknowledged(fabric, tmp_path):
    """A -> B sync. B stops: what A stores after that is not fully durable; once B is back, it is."""
    fabric.start_one_way_pair()
    config = fabric.paths["a"]
    pub = fabric.publisher("careful", "a", resend_after=2.0)
    for i in range(40):
        pub.publish("/orders", json.dumps({"i": i}).encode())
    pub.flush(timeout=120)
    fabric.stop("b")
    for i in range(40, 80):
        pub.publish("/orders", json.dumps({"i": i}).encode())
    wait_until(lambda: fabric.count("a") == 80, what="A to store the messages published after B stopped")

    assert spark_seqs(replay.txlog(config, fully_durable=True)) == list(range(1, 41))
    assert spark_seqs(replay.txlog(config)) == list(range(1, 81))
    printed = run_cli("replay", str(config), "--topic", ".*", "--fully-durable").jsonl()
    assert [m["seq"] for m in printed] == list(range(1, 41))
    seen: list[int] = []
    query = collecting(replay.subscribe(config, fully_durable=True), tmp_path / "cp", seen)
    try:
        wait_until(lambda: len(seen) >= 40 or query.exception(), what="the durable messages")
        time.sleep(1.0)  # several triggers: the subscription holds at the watermark
        assert seen == list(range(1, 41))
        fabric.start("b")
        pub.flush(timeout=240)
        wait_until(lambda: len(seen) >= 80 or query.exception(), what="the rest, once B acknowledged it")
    finally:
        query.stop()
    assert seen == list(range(1, 81))
    assert spark_seqs(replay.txlog(config, fully_durable=True)) == list(range(1, 81))
    printed = run_cli("replay", str(config), "--topic", ".*", "--fully-durable").jsonl()
    assert [m["seq"] for m in printed] == list(range(1, 81))


# -- which reader ---------------------------------------------------------------------------


def test_the_native_delta_reader_is_chosen_where_delta_is_available(spark, monkeypatch):
    assert replay.reads_delta_natively(spark) is True, "the project's sessions have delta-spark"

    class Jvm:  # a JVM whose lookup of the "delta" source fails, as on a Spark without delta-spark
        def __getattr__(self, name):
            return self

        def __call__(self, *args):
            return self

        def lookupDataSource(self, name, conf):
            raise RuntimeError("Failed to find the data source: delta")

    class WithoutDelta:
        _jvm = Jvm()
        _jsparkSession = Jvm()

    assert replay.reads_delta_natively(WithoutDelta()) is False
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")
    assert replay.reads_delta_natively(object()) is True, "Databricks (Spark Connect has no JVM handle)"


def test_both_readers_return_the_same_rows(spark, tmp_path, monkeypatch):
    """The native branch reads format("delta").load(txlog) with delta-spark; the other, the Parquet files of
    deltalake's snapshot that can hold the range. Both give the same rows."""
    rows = write_batches(tmp_path / "txlog", batches=5, per_publisher=4)
    mid = rows["bookmark"][17].as_py()
    natively = replay.txlog(tmp_path, bookmark=mid, filter="/seq > 30")
    assert "DeltaFileIndex" in natively._jdf.queryExecution().executedPlan().toString(), "read by delta-spark"
    with monkeypatch.context() as patched:
        patched.setattr(replay, "reads_delta_natively", lambda _spark: False)
        by_files = replay.txlog(tmp_path, bookmark=mid, filter="/seq > 30")
        assert "DeltaFileIndex" not in by_files._jdf.queryExecution().executedPlan().toString()
        by_files_seqs = spark_seqs(by_files)
    assert spark_seqs(natively) == by_files_seqs == list(range(31, 61))
