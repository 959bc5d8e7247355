"""The "replication-inbox" Spark source, against real inbox Delta tables written by two upstreams at once."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from support.streams import run_available_now
from support.tables import Upstream, numbered_inbox_rows, push_concurrently

from replication.errors import ConfigError
from replication.inbox import stream as inbox_stream
from replication.inbox.read_ahead import InboxReadAhead
from replication.inbox.schema import INBOX_SCHEMA, INBOX_TABLE_CONFIGURATION, STREAM_SCHEMA, create_inbox
from replication.inbox.stream import FORMAT, VERSIONS_PER_PARTITION, InboxSourceOptions, register
from replication.inbox.versions import InboxLog, read_versions
from replication.txlog.schema import TXLOG_SCHEMA

# -- helpers -------------------------------------------------------------------


def one_upstream(inbox: Path, *sizes: int) -> Upstream:
    """An inbox created at ``inbox``, and upstream ``amps-a``'s batches of ``sizes`` rows in it (versions 1, 2, ...)."""
    create_inbox(inbox)
    upstream = Upstream(inbox, "amps-a")
    for size in sizes:
        upstream.push(size)
    return upstream


def by_link(rows: pa.Table) -> dict[str, list[int]]:
    """upstream_seq per link, in delivery order."""
    out: dict[str, list[int]] = {}
    for link, seq in zip(rows.column("link").to_pylist(), rows.column("upstream_seq").to_pylist(), strict=True):
        out.setdefault(link, []).append(seq)
    return out


def assert_commit_order(rows: pa.Table) -> None:
    versions = rows.column("inbox_version").to_pylist()
    assert versions == sorted(versions)


# -- schema, options -----------------------------------------------------------


def test_inbox_schema_is_a_txlog_row_without_seq_plus_the_link():
    assert INBOX_SCHEMA.names == [n for n in TXLOG_SCHEMA.names if n != "seq"] + ["upstream_seq", "link", "link_group"]
    assert STREAM_SCHEMA.names == INBOX_SCHEMA.names + ["inbox_version"]


def test_create_inbox_turns_the_change_data_feed_on(tmp_path):
    table = create_inbox(tmp_path / "inbox")
    assert table.metadata().configuration["delta.enableChangeDataFeed"] == "true"
    assert INBOX_TABLE_CONFIGURATION == {"delta.enableChangeDataFeed": "true"}
    assert create_inbox(tmp_path / "inbox").version() == 0  # opening again creates nothing


def test_options():
    assert InboxSourceOptions.parse({"path": "/i"}) == InboxSourceOptions("/i", None, VERSIONS_PER_PARTITION)
    assert InboxSourceOptions.parse(
        {"PATH": "/i", "maxrowspertrigger": "5", "versionsPerPartition": "2"}
    ) == InboxSourceOptions("/i", 5, 2)
    with pytest.raises(ConfigError, match="option 'path' is required"):
        InboxSourceOptions.parse({})
    with pytest.raises(ConfigError, match="maxRowsPerTrigger must be a positive integer, got 'x'"):
        InboxSourceOptions.parse({"path": "/i", "maxRowsPerTrigger": "x"})


# -- reading versions, without Spark -------------------------------------------


def test_concurrent_upstreams_are_read_once_each_in_their_order_and_compaction_is_skipped(tmp_path):
    inbox = tmp_path / "inbox"
    create_inbox(inbox)
    a, b = Upstream(inbox, "amps-a"), Upstream(inbox, "amps-b")
    push_concurrently(inbox, [a, b], batches=8, size=5)
    table = DeltaTable(str(inbox))
    assert table.version() == 16  # create + 16 commits, none lost to the race

    rows = read_versions(str(inbox), 0, 16)
    assert rows.schema == STREAM_SCHEMA
    assert by_link(rows) == {"amps-a": list(range(1, 41)), "amps-b": list(range(1, 41))}
    assert_commit_order(rows)
    # A commit holds one upstream batch: its rows share the version.
    assert len(set(zip(rows.column("inbox_version").to_pylist(), rows.column("link").to_pylist()))) == 16

    table.optimize.compact()  # version 17: the same rows rewritten, dataChange=false
    a.push(3)  # version 18
    assert by_link(read_versions(str(inbox), 17, 18)) == {"amps-a": [41, 42, 43]}
    again = read_versions(str(inbox), 0, 18)
    assert by_link(again) == {"amps-a": list(range(1, 44)), "amps-b": list(range(1, 41))}


def test_rows_a_commit_holds_out_of_order_are_read_in_stream_order(tmp_path):
    # Upstreams append in order, and that order is kept as read; a commit written otherwise by hand
    # (reversed, two links interleaved) still comes out per version, per link, by upstream seq.
    inbox = tmp_path / "inbox"
    create_inbox(inbox)
    write_deltalake(str(inbox), numbered_inbox_rows("amps-a", 1, 4), mode="append")  # version 1, in order
    reversed_rows = numbered_inbox_rows("amps-a", 5, 4)
    write_deltalake(str(inbox), reversed_rows.take(pa.array([3, 2, 1, 0])), mode="append")  # version 2
    mixed = pa.concat_tables([numbered_inbox_rows("amps-b", 1, 3), numbered_inbox_rows("amps-a", 9, 3)])
    write_deltalake(str(inbox), mixed.take(pa.array([3, 0, 4, 1, 5, 2])), mode="append")  # version 3
    rows = read_versions(str(inbox), 1, 3)
    assert list(zip(rows.column("inbox_version").to_pylist(), rows.column("link").to_pylist(),
                    rows.column("upstream_seq").to_pylist(), strict=True)) == (
        [(1, "amps-a", s) for s in range(1, 5)] + [(2, "amps-a", s) for s in range(5, 9)]
        + [(3, "amps-a", s) for s in range(9, 12)] + [(3, "amps-b", s) for s in range(1, 4)])
    assert rows.column("data").to_pylist()[4] == b'{"n":5}'  # whole rows moved, not only the keys


def test_row_limit_takes_whole_commits_and_at_least_one(tmp_path):
    inbox = tmp_path / "inbox"
    one_upstream(inbox, 4, 4, 10, 1)  # versions 1..4
    log = InboxLog(str(inbox))
    assert log.latest_version() == 4
    assert [log.rows_in(v) for v in range(5)] == [0, 4, 4, 10, 1]
    assert log.end_within(-1, 4, 8) == 2
    assert log.end_within(2, 4, 8) == 3  # one commit larger than the limit still goes, alone
    assert log.end_within(3, 4, 8) == 4
    assert InboxLog(str(tmp_path / "absent")).latest_version() == -1


def test_read_ahead_gives_the_rows_read_versions_gives_and_takes_the_next_batch_from_what_it_read(tmp_path):
    inbox = tmp_path / "inbox"
    create_inbox(inbox)
    a, b = Upstream(inbox, "amps-a"), Upstream(inbox, "amps-b")
    for size in (3, 3, 3, 3, 3, 3):  # versions 1..6, 3 rows each
        a.push(size)
    reads = InboxReadAhead(str(inbox), rows=6)

    def same(first: int, last: int) -> int:
        """read() of the batch ``first..last`` equals read_versions; how many of its versions were read ahead."""
        hits = reads.hits
        assert reads.read(first, last).equals(read_versions(str(inbox), first, last))
        return reads.hits - hits

    try:
        assert same(0, 1) == 0  # nothing read ahead yet; then versions 2 and 3 (6 rows) are
        assert same(2, 3) == 2
        assert same(4, 4) == 1  # a batch ending within what was read: 5 stays held, 6 is read
        assert same(5, 6) == 2
        reads._reading.result()  # (the thread has looked for version 7, and found none)
        b.push(2)  # version 7
        a.push(4)  # version 8
        assert same(7, 8) == 0
        reads._reading.result()
        for size in (2, 2, 2):  # versions 9..11, committed after the thread looked for 9
            b.push(size)
        assert same(9, 9) == 0  # then 10 and 11 are read ahead
        assert same(11, 11) == 1  # a batch starting past the first held version: the one it needs is taken
        assert same(10, 11) == 0  # a batch behind what was read (a replayed one): read from the files
    finally:
        reads.close()


# -- the stream, with Spark ----------------------------------------------------


def test_available_now_from_absent_inbox_then_concurrent_upstreams_then_restart(spark, tmp_path):
    inbox = tmp_path / "inbox"
    checkpoint = tmp_path / "cp"
    # No table yet: no rows, no error (Spark still runs one empty first batch).
    assert sum(t.num_rows for t in run_available_now(spark, inbox_stream, inbox, checkpoint)) == 0

    a, b = Upstream(inbox, "amps-a"), Upstream(inbox, "amps-b")
    create_inbox(inbox)
    push_concurrently(inbox, [a, b], batches=5, size=6)
    first = pa.concat_tables(run_available_now(spark, inbox_stream, inbox, checkpoint))
    assert by_link(first) == {"amps-a": list(range(1, 31)), "amps-b": list(range(1, 31))}
    assert_commit_order(first)
    assert first.column("link_group").to_pylist()[0].startswith("group-amps-")

    push_concurrently(inbox, [a, b], batches=2, size=3)
    second = pa.concat_tables(run_available_now(spark, inbox_stream, inbox, checkpoint))
    assert by_link(second) == {"amps-a": list(range(31, 37)), "amps-b": list(range(31, 37))}
    assert min(second.column("inbox_version").to_pylist()) > max(first.column("inbox_version").to_pylist())


@pytest.mark.parametrize("driver_read", ["0", "8"], ids=["tasks", "planner"])
def test_max_rows_per_trigger_bounds_batches_in_whole_commits(spark, tmp_path, driver_read):
    inbox = tmp_path / "inbox"
    one_upstream(inbox, *[4] * 6)
    # One task per commit, or the planner reading the commits in turn: rows come back in version order.
    batches = run_available_now(spark, inbox_stream, inbox, tmp_path / "cp", maxRowsPerTrigger="9",
                                versionsPerPartition="1", driverReadRows=driver_read)
    assert [b.num_rows for b in batches] == [8, 8, 8]
    assert by_link(pa.concat_tables(batches)) == {"amps-a": list(range(1, 25))}


def test_processing_time_trigger_follows_concurrent_upstreams(spark, tmp_path):
    inbox = tmp_path / "inbox"
    register(spark)
    seen: list[pa.Table] = []
    query = (
        spark.readStream.format(FORMAT).option("path", str(inbox)).load()
        .writeStream.trigger(processingTime="100 milliseconds")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .foreachBatch(lambda df, _id: seen.append(df.toArrow()))
        .start()
    )
    try:
        time.sleep(1.0)  # triggers on an absent inbox
        assert query.exception() is None
        create_inbox(inbox)
        a, b = Upstream(inbox, "amps-a"), Upstream(inbox, "amps-b")
        push_concurrently(inbox, [a, b], batches=6, size=5)
        deadline = time.monotonic() + 120
        while sum(t.num_rows for t in seen) < 60 and time.monotonic() < deadline and query.exception() is None:
            time.sleep(0.2)
        assert query.exception() is None
        rows = pa.concat_tables(seen)
        assert by_link(rows) == {"amps-a": list(range(1, 31)), "amps-b": list(range(1, 31))}
        assert_commit_order(rows)
    finally:
        query.stop()


# -- versions only: Spark tracks the position, the ingest writer fetches the rows ---------


@pytest.mark.parametrize("driver_read", ["0", "1000"], ids=["tasks", "planner"])
def test_versions_only_streams_one_row_per_version_within_the_row_limit(spark, tmp_path, driver_read):
    inbox = tmp_path / "inbox"
    one_upstream(inbox, *[4] * 5)  # versions 1..5
    batches = run_available_now(spark, inbox_stream, inbox, tmp_path / "cp", versionsOnly="true", maxRowsPerTrigger="9",
                                driverReadRows=driver_read)
    assert [b.column_names for b in batches] == [["inbox_version"]] * len(batches)
    # Version 0 (the table's creation, no rows) rides with the first batch.
    assert [b.column("inbox_version").to_pylist() for b in batches] == [[0, 1, 2], [3, 4], [5]]


def test_inbox_rows_replace_version_rows_by_the_rows_as_candidates(tmp_path):
    from replication.config.model import InstanceConfig
    from replication.ingest.classify import CANDIDATE_SCHEMA
    from replication.ingest.inputs import INBOX_MARK, InboxRows

    inbox = tmp_path / "inbox"
    create_inbox(inbox)
    a, b = Upstream(inbox, "amps-a"), Upstream(inbox, "amps-b")
    a.push(2)  # version 1
    b.push(1)  # version 2
    a.push(1)  # version 3: not in this batch
    kafka = {name: None for name in CANDIDATE_SCHEMA.names} | {"source": "kafka", "publisher": "p",
                                                               "publisher_seq": "7", "data": b"{}"}
    mark = {name: None for name in CANDIDATE_SCHEMA.names} | {"source": INBOX_MARK}
    batch = pa.Table.from_pylist([mark | {"inbox_version": 1}, kafka, mark | {"inbox_version": 2}],
                                 schema=CANDIDATE_SCHEMA)

    cfg = InstanceConfig(name="amps-2", group="g2", storage=str(tmp_path), txlog_topics=())
    rows = InboxRows(cfg, str(inbox))(batch).to_pylist()
    assert [(r["source"], r["publisher"], r["publisher_seq"], r["upstream_seq"]) for r in rows] == [
        ("kafka", "p", "7", None),
        ("inbox:amps-a", "pub-amps-a", "1", 1), ("inbox:amps-a", "pub-amps-a", "2", 2),
        ("inbox:amps-b", "pub-amps-b", "1", 1),
    ]
    received = rows[1]
    assert received["path"] == ["amps-a", "amps-2"]
    assert (received["received_from"], received["received_from_group"], received["origin"]) == (
        "amps-a", "group-amps-a", "amps-a")
    assert received["data"] == b'{"n":1}' and received["inbox_version"] == 1
    assert InboxRows(cfg, str(inbox))(batch.slice(1, 1)).to_pylist() == [rows[0]]  # no versions: as it was


#: The ingest query's inbox planner, as Spark's planner process runs it: plan one batch, hand its rows over.
_PLANNER_PROCESS = """
import json, sys
import pyspark.sql.streaming.python_streaming_source_runner  # what the planner process runs
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches
from replication.inbox.stream import InboxSource

source = InboxSource({"path": sys.argv[1], "versionsOnly": "true", "maxRowsPerTrigger": "1000"})
schema = source.schema()
reader = source.streamReader(schema)
start = reader.initialOffset()
end = reader.latestOffset(start, reader.getDefaultReadLimit())
reader.partitions(start, end)
batches = list(records_to_arrow_batches(reader.getCache(start, end), 10_000, schema, source))
print(json.dumps({"versions": [v for b in batches for v in b.column("inbox_version").to_pylist()],
                  "pandas": "pandas" in sys.modules}))
"""


def test_the_inbox_planner_hands_over_a_batch_without_importing_pandas(tmp_path):
    # pandas costs a new planner process ~0.2 CPU-s to import, and the first inbox batch after every
    # start would wait for it: nothing in the planner's path needs it.
    import json
    import subprocess
    import sys

    inbox = tmp_path / "inbox"
    one_upstream(inbox, 4, 4, 4)  # versions 1..3
    out = subprocess.run([sys.executable, "-c", _PLANNER_PROCESS, str(inbox)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"versions": [0, 1, 2, 3], "pandas": False}
