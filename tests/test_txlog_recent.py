"""The ingest's latest txlog rows held for the replicators (replication.txlog.recent): the same rows the txlog's
files give, and only while every row of a range is held."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
from support.tables import numbered_txlog_rows

from replication.connectors.delta.tables import IdempotentAppender
from replication.txlog.files import TxlogFiles
from replication.txlog.recent import RecentTxlog, pinned_bytes
from replication.txlog.schema import TXLOG_SCHEMA

#: A writer's table as classify might hand it over: looser nullability and nanosecond times (cast on commit).
LOOSE_SCHEMA = pa.schema([pa.field(f.name, pa.timestamp("ns", tz="UTC") if f.name.endswith("_time") else f.type)
                          for f in TXLOG_SCHEMA])


def varied_rows(first: int, count: int) -> pa.Table:
    """Rows ``first...`` with what a txlog holds besides plain publishes: nulls, empty and null paths, other
    instances' rows, SOW keys, deletes by filter, times to the microsecond."""
    rows = numbered_txlog_rows(first, count).to_pylist()
    for i, row in enumerate(rows):
        row["path"] = None if i % 7 == 0 else [] if i % 7 == 1 else ["amps-2", "amps-1"]
        row["received_from"] = "amps-2" if i % 3 == 0 else None
        row["sow_key"] = f"k{i % 5}" if i % 2 else None
        row["command"], row["filter"] = ("sow_delete", "/qty > 10") if i % 11 == 4 else ("publish", None)
        row["data"] = None if i % 11 == 4 else row["data"]
        row["publish_time"] = datetime(2026, 11, 29, 12, 0, 0, 123_456 + i, tzinfo=timezone.utc)
    return pa.Table.from_pylist(rows, schema=LOOSE_SCHEMA)


def test_held_ranges_are_the_rows_the_txlog_files_give(tmp_path):
    appender = IdempotentAppender(tmp_path / "txlog", TXLOG_SCHEMA, app_id="ingest", name="txlog")
    recent, files = RecentTxlog(), TxlogFiles(str(tmp_path / "txlog"))
    at = 0
    for version, size in enumerate([3, 0, 50, 1, 20, 7]):  # a commit with no row is no batch here
        rows = varied_rows(at + 1, size)
        assert appender.append(rows, version, {"first_seq": at + 1, "last_seq": at + size})
        recent.committed(rows)
        at += size
    assert recent.held == (0, 81)
    for after, through in [(0, 81), (0, 3), (3, 53), (2, 54), (53, 54), (60, 61), (80, 81), (10, 10)]:
        held = recent.read(after, through)
        assert held is not None and held.schema == TXLOG_SCHEMA
        assert held.equals(files.read(after, through)), (after, through)
    assert recent.hits == 8 and recent.misses == 0
    assert recent.read(0, 82) is None and recent.misses == 1  # a row not committed yet: not held, not guessed


def test_a_gap_the_memory_bounds_and_readers_let_batches_go():
    recent = RecentTxlog(max_bytes=10**9, idle_max_bytes=10**9)
    recent.committed(numbered_txlog_rows(101, 50))  # rows 1..100 were committed before this process started
    assert recent.held == (100, 150)
    assert recent.read(90, 120) is None and recent.read(100, 120) is not None
    recent.committed(numbered_txlog_rows(161, 10))  # 151..160 committed some other way (stored backfill parts)
    assert recent.held == (160, 170) and recent.read(140, 165) is None
    assert pc.min(recent.read(160, 165)["seq"]).as_py() == 161
    recent.committed(numbered_txlog_rows(1, 0))  # a commit of no row leaves no gap
    assert recent.held == (160, 170)

    # attached readers: a batch goes once every one of them has read past it
    recent.committed(numbered_txlog_rows(171, 10))
    recent.committed(numbered_txlog_rows(181, 10))
    recent.attach("b", 160)
    recent.passed("b", 185)
    assert recent.held == (180, 190)  # "b", the only reader so far, has read past 180
    recent.attach("c", 172)
    recent.passed("b", 190)
    assert recent.held == (180, 190)  # "c" has not read past 190 yet
    recent.passed("c", 190)
    assert recent.held is None
    recent.committed(numbered_txlog_rows(191, 10))
    recent.detach("c")
    recent.passed("c", 185)  # a detached reader's last batch ending late holds nothing back
    recent.passed("b", 200)
    assert recent.held is None


def test_the_bounds_count_the_buffers_rows_keep_alive():
    one = pinned_bytes(numbered_txlog_rows(1, 10))
    bounded = RecentTxlog(max_bytes=int(2.5 * one), idle_max_bytes=int(1.5 * one))
    bounded.attach("b", 0)
    for first in (1, 11, 21, 31):
        bounded.committed(numbered_txlog_rows(first, 10))
    assert bounded.held == (20, 40)  # the oldest batches go first
    assert bounded.read(10, 40) is None and bounded.read(25, 38)["seq"].to_pylist() == list(range(26, 39))
    bounded.detach("b")  # no replicator runs: the idle bound
    assert bounded.held == (30, 40)

    # a column sliced out of a larger buffer (a Spark batch's bodies) counts as the whole of it
    bodies = pa.array([b"x" * 1_000] * 1_000, pa.binary())
    rows = numbered_txlog_rows(1, 10)
    sliced = rows.set_column(rows.schema.get_field_index("data"), "data", bodies.slice(0, 10))
    assert pinned_bytes(sliced) >= 1_000_000 > 100 * pinned_bytes(rows.select(["data"]))
    held = RecentTxlog(max_bytes=500_000)
    held.attach("b", 0)
    held.committed(sliced)
    assert held.held is None  # over the bound on its own: read from the files


def test_rows_that_cannot_be_held_are_let_go_and_never_fail_the_batch(caplog):
    recent = RecentTxlog()
    recent.committed(numbered_txlog_rows(1, 10))
    gap = pa.concat_tables([numbered_txlog_rows(11, 5), numbered_txlog_rows(20, 5)])  # not one run of seqs
    recent.committed(gap)
    assert recent.held is None and "not held in memory" in caplog.text
    recent.committed(numbered_txlog_rows(25, 5))
    assert recent.held == (24, 29)


def test_a_waiting_replicator_wakes_at_a_hand_over_past_its_position_held_or_not():
    import threading

    recent = RecentTxlog()
    assert recent.latest == 0 and not recent.wait_past(0, 0.01), "nothing handed over: the wait times out"
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(recent.wait_past(10, 30.0)))
    waiter.start()
    recent.committed(numbered_txlog_rows(1, 10))  # through 10: not past the waiter's position
    waiter.join(0.2)
    assert waiter.is_alive(), "a commit through the position does not wake the wait"
    recent.committed(numbered_txlog_rows(11, 2))
    waiter.join(10)
    assert woke == [True] and recent.latest == 12 and recent.held == (0, 12)
    recent.committed(numbered_txlog_rows(13, 5).take(pa.array([0, 4])))  # seqs 13, 17: cannot be held
    assert recent.held is None and recent.latest == 17, "a commit not held still tells how far the txlog goes"
    assert recent.wait_past(12, 0.01) and not recent.wait_past(17, 0.01)
