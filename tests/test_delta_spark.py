"""delta-spark, the reader Databricks users have, on every table the engine writes (deltalake writes them).

One running pair (A -> B, sync; a SOW topic on both; a backfill stored in place; rejected messages) is
read back with ``spark.read.format("delta")`` and compared with deltalake's rows; a running txlog is read
as a Delta stream; and what a delta-spark user does to a table (DESCRIBE HISTORY, OPTIMIZE, a
checkpoint, VACUUM) is done to A's txlog and SOW table while the pair runs: the engine keeps working.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from support.cli import run_cli
from support.fabric import PacedPublisher, TestFabric
from support.factories import assert_exactly_once, raw_publish, wait_until

from replication import backfill, config, replay
from replication.sow.table import topic_id

SOW = ("<Topic><Name>/orders</Name><MessageType>json</MessageType><Key>/id</Key>"
       "<CompactionInterval>1s</CompactionInterval></Topic>")
KEYS = 50


@pytest.fixture(scope="module")
def pair(spark, broker, tmp_path_factory):
    """A -> B (sync), both running, /orders a SOW topic on each."""
    fabric = TestFabric(spark, broker, tmp_path_factory.mktemp("delta-spark"))
    fabric.start_one_way_pair(sow=SOW)
    fabric.orders = {}  # id -> the last body published with it (what the SOW must hold)
    fabric.published = 0
    yield fabric
    fabric.close()


def publish_orders(pair, pub, count: int) -> None:
    for _ in range(count):
        pair.published += 1
        n = pair.published  # every body distinct
        key = n % KEYS
        body = json.dumps({"id": key, "qty": n % 997, "n": n}).encode()
        pair.orders[key] = body
        pub.publish("/orders", body)


def backfill_trades(spark, pair, tmp_path: Path, client: str, rows: int) -> backfill.Result:
    folder = tmp_path / client
    folder.mkdir()
    half = rows // 2
    for part, (lo, hi) in enumerate(((0, half), (half, rows))):
        pq.write_table(pa.table({"trade": list(range(lo, hi)), "px": [i / 8 for i in range(lo, hi)]}),
                       folder / f"trades-{part}.parquet")
    cfg = config.load(str(pair.paths["a"]))
    return backfill.run(spark, cfg, [str(folder)], backfill.Options(client, "parquet", topic="/trades"))


def spark_rows(spark, path: Path, columns: list[str]) -> list[tuple]:
    table = spark.read.format("delta").load(str(path)).select(*columns).toArrow()
    return sorted(_normal(row, columns) for row in table.to_pylist())


def deltalake_rows(path: Path, columns: list[str]) -> list[tuple]:
    table = DeltaTable(str(path)).to_pyarrow_table(columns=columns)
    return sorted(_normal(row, columns) for row in table.to_pylist())


def _normal(row: dict, columns: list[str]) -> tuple:
    def value(v):
        if isinstance(v, datetime.datetime):
            return v.astimezone(datetime.timezone.utc).isoformat()
        if isinstance(v, list):
            return tuple(v)
        return v
    return tuple(repr(value(row[c])) for c in columns)


def sow_path(pair, short: str) -> Path:
    return pair.storage(short) / "sow" / topic_id("/orders")


def test_delta_spark_reads_every_table_the_engine_writes_as_deltalake_does(pair, spark, broker, tmp_path):
    pub = pair.publisher("feed", "a")
    publish_orders(pair, pub, 400)
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    raw_publish(producer, f"{pair.name('a')}.publish", b'{"id": ', amps_client="bad", amps_seq="1",
                amps_topic="/orders")
    raw_publish(producer, f"{pair.name('a')}.publish", b'{"qty": 1}', amps_client="bad", amps_seq="2",
                amps_topic="/orders")  # no /id: the SOW cannot key it
    producer.close()
    result = backfill_trades(spark, pair, tmp_path, "history", 30_000)
    assert result.stored == 30_000
    pub.flush(timeout=120)
    wait_until(lambda: pair.count("b") == 400 + 30_000, timeout=300, what="B to hold every message")
    wait_until(lambda: pair.running["a"].writer.staged.stats["stored_as_is"] >= 1, what="a part stored in place")
    a, b = pair.storage("a"), pair.storage("b")
    wait_until(lambda: DeltaTable(str(a / "rejected")).to_pyarrow_table().num_rows == 2, what="the two rejects")
    time.sleep(2.5)  # a compaction of each SOW table after the last publish

    tables = {
        "A txlog": a / "txlog", "B txlog": b / "txlog", "B inbox": b / "inbox", "A rejected": a / "rejected",
        "A sow": sow_path(pair, "a"), "B sow": sow_path(pair, "b"),
    }
    for name, path in tables.items():
        columns = DeltaTable(str(path)).schema().to_arrow().names
        expected = deltalake_rows(path, columns)
        assert expected, f"{name}: the test wrote nothing to compare"
        assert spark_rows(spark, path, columns) == expected, f"{name}: delta-spark and deltalake differ"
    assert {json.loads(r["data"])["id"] for r in spark.read.format("delta").load(str(sow_path(pair, "a")))
            .select("data").collect()} == set(pair.orders)
    # the backfill's parts are among A's txlog files as the backfill wrote them, and Spark reads them
    trades = spark.read.format("delta").load(str(a / "txlog")).where("publisher = 'history'")
    assert trades.count() == 30_000
    assert sorted(r.publisher_seq for r in trades.select("publisher_seq").collect()) == list(range(1, 30_001))


def test_a_delta_stream_of_a_running_txlog_sees_every_row_once_in_seq_order(pair, spark, tmp_path):
    batches: list[list[int]] = []

    def collect(df, _batch_id):
        batches.append([r.seq for r in df.select("seq").collect()])

    query = (spark.readStream.format("delta").load(str(pair.storage("a") / "txlog")).writeStream
             .trigger(processingTime="200 milliseconds").option("checkpointLocation", str(tmp_path / "cp"))
             .foreachBatch(collect).start())
    try:
        pub = pair.publisher("streamed", "a")
        paced = PacedPublisher(pub, rate=200, topic="/trades")
        result = backfill_trades(spark, pair, tmp_path, "history-2", 20_000)  # parts stored in place, mid-stream
        time.sleep(2)
        paced.stop()
        pub.flush(timeout=120)
        assert result.stored == 20_000
        end = DeltaTable(str(pair.storage("a") / "txlog")).to_pyarrow_table(columns=["seq"])["seq"]
        last = max(end.to_pylist())
        wait_until(lambda: sum(map(len, batches)) >= last or query.exception(), timeout=180,
                   what="the stream to reach the txlog's end")
        assert query.exception() is None
    finally:
        query.stop()
    seen = [s for batch in batches for s in batch]
    assert sorted(seen) == list(range(1, last + 1)), "every txlog row once"
    non_empty = [sorted(b) for b in batches if b]
    assert all(x[-1] < y[0] for x, y in zip(non_empty, non_empty[1:])), "batches follow one another in seq order"


def test_describe_history_optimize_checkpoint_and_vacuum_by_a_user_leave_the_engine_working(pair, spark):
    a_txlog, a_sow = pair.storage("a") / "txlog", sow_path(pair, "a")
    history = spark.sql(f"DESCRIBE HISTORY delta.`{a_txlog}`").collect()
    assert len(history) == len(DeltaTable(str(a_txlog)).history())

    pub = pair.publisher("maintained", "a")
    paced = PacedPublisher(pub, rate=100, topic="/trades")
    try:
        # OPTIMIZE while the instance writes: the engine's appends and a user's compaction commit side by side.
        _retrying(lambda: spark.sql(f"OPTIMIZE delta.`{a_txlog}`").collect())
        time.sleep(1.5)
    finally:
        published = paced.stop()
    pub.flush(timeout=120)
    optimized = spark.sql(f"DESCRIBE HISTORY delta.`{a_txlog}`").where("operation = 'OPTIMIZE'").collect()
    assert optimized and int(optimized[0].operationMetrics["numRemovedFiles"]) > 1, "OPTIMIZE compacted the txlog"

    # A stopped (RETAIN 0 HOURS needs no commit in flight, as Delta says of a vacuum that short; and the
    # maintenance jobs then have the cores to themselves): a checkpoint written by delta-spark, then VACUUM
    # of what OPTIMIZE replaced. Every compaction rewrites the SOW buckets it touches into one file each:
    # nothing for OPTIMIZE to do there.
    pair.stop("a")
    sow_metrics = spark.sql(f"OPTIMIZE delta.`{a_sow}`").collect()[0].metrics
    assert sow_metrics.numFilesRemoved == 0, sow_metrics
    for path in (a_txlog, a_sow):
        spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(path)).checkpoint()
        assert list((path / "_delta_log").glob("*.checkpoint.parquet")), f"{path}: delta-spark wrote a checkpoint"
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    # VACUUM lists the table's folders with one task per folder up to this many (default 10,000 tasks: most
    # of a VACUUM's time on a small table)
    spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.parallelism", "2")
    try:
        on_disk = len(list(a_txlog.glob("*.parquet")))
        spark.sql(f"VACUUM delta.`{a_txlog}` RETAIN 0 HOURS").collect()
        assert len(list(a_txlog.glob("*.parquet"))) < on_disk, "VACUUM removed the files OPTIMIZE replaced"
        spark.sql(f"VACUUM delta.`{a_sow}` RETAIN 0 HOURS").collect()
    finally:
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "true")
        spark.conf.unset("spark.sql.sources.parallelPartitionDiscovery.parallelism")

    # The engine goes on: A restarted rebuilds its SOW; more publishes, replicated and acknowledged.
    pair.start("a")
    publish_orders(pair, pub, 300)
    pub.flush(timeout=120)

    for short in ("a", "b"):
        rows = pair.rows(short)
        counts = {p: rows["publisher"].to_pylist().count(p) for p in set(rows["publisher"].to_pylist())}
        assert_exactly_once(rows, counts)
        assert counts["maintained"] == published + 300
    a_rows = pair.rows("a")
    assert spark_rows(spark, a_txlog, ["seq", "bookmark", "data"]) == deltalake_rows(a_txlog, ["seq", "bookmark",
                                                                                              "data"])
    code, out, _ = run_cli("verify", pair.paths["a"], pair.paths["b"])
    assert code == 0, out
    # replay from the start and from a bookmark half way, through files OPTIMIZE wrote
    assert [r.seq for r in replay.txlog(str(pair.paths["a"]), spark=spark).select("seq").collect()] == \
        a_rows["seq"].to_pylist()
    middle = a_rows.num_rows // 2
    mark = a_rows["bookmark"][middle].as_py()
    after = replay.txlog(str(pair.paths["a"]), bookmark=mark, spark=spark).select("seq").collect()
    assert [r.seq for r in after] == a_rows["seq"].to_pylist()[middle + 1:]
    # the SOW, exact (base + txlog) and as compacted in its table
    done = run_cli("sow", str(pair.paths["a"]), "--topic", "/orders", process=True)
    assert done.code == 0, done.err
    printed = {json.dumps(record["data"], sort_keys=True) for record in done.jsonl()}
    assert printed == {json.dumps(json.loads(body), sort_keys=True) for body in pair.orders.values()}
    wait_until(lambda: {bytes(r.data) for r in spark.read.format("delta").load(str(a_sow)).select("data").collect()}
               == set(pair.orders.values()), timeout=60, what="A's SOW table to hold the current records")


def _retrying(operation, attempts: int = 5):
    """A user's OPTIMIZE may lose a race with the engine's own commit (Delta's optimistic concurrency): retry."""
    for attempt in range(attempts):
        try:
            return operation()
        except Exception as exc:  # ConcurrentModificationException and its kind, through py4j
            if "Concurrent" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.5)
    return None
