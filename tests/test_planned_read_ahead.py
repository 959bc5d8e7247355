"""A micro-batch read once Spark has planned it (replication/connectors/spark/planned_read_ahead.py)."""

from __future__ import annotations

import threading
import time

from support.factories import wait_until

from replication.connectors.spark.planned_read_ahead import PlannedReadAhead


def entry(offsets, batch_id: int) -> None:
    offsets.mkdir(parents=True, exist_ok=True)
    (offsets / str(batch_id)).write_text("v1\n{}\n{}")


def test_the_next_batch_is_read_once_its_entry_is_written_and_taken_by_its_call(tmp_path):
    reads: list[int] = []
    ahead = PlannedReadAhead(tmp_path, lambda b: reads.append(b) or f"rows of {b}", "test")
    ahead.start(7)
    time.sleep(0.3)  # the thread looks every few ms
    assert reads == [], "read before its entry was written"
    entry(tmp_path, 7)
    wait_until(lambda: reads == [7], timeout=10, what="batch 7 read ahead")
    assert ahead.take(7) == "rows of 7"
    assert ahead.take(7) is None, "what was read ahead is taken once"
    assert ahead.hits == 1


def test_what_was_read_for_another_batch_is_not_taken(tmp_path):
    ahead = PlannedReadAhead(tmp_path, lambda b: f"rows of {b}", "test")
    entry(tmp_path, 3)
    ahead.start(3)
    wait_until(lambda: ahead._done is not None, timeout=10, what="batch 3 read ahead")
    assert ahead.take(4) is None, "a re-run or skipped batch reads its own rows"
    assert ahead.hits == 0


def test_a_call_waits_for_a_read_under_way_and_takes_it(tmp_path):
    reading, release = threading.Event(), threading.Event()

    def slow(batch_id):
        reading.set()
        release.wait(10)
        return f"rows of {batch_id}"

    ahead = PlannedReadAhead(tmp_path, slow, "test")
    entry(tmp_path, 2)
    ahead.start(2)
    assert reading.wait(10)
    threading.Timer(0.2, release.set).start()
    assert ahead.take(2) == "rows of 2", "the read under way completes and is used, not started again"


def test_a_call_before_the_entry_is_seen_stops_the_wait_and_reads_itself(tmp_path):
    reads: list[int] = []
    ahead = PlannedReadAhead(tmp_path, reads.append, "test")
    ahead.start(5)
    assert ahead.take(5) is None
    entry(tmp_path, 5)
    time.sleep(0.3)
    assert reads == [], "a read began after the call took over"


def test_a_failed_read_ahead_leaves_the_batch_to_its_call(tmp_path):
    def broken(batch_id):
        raise ConnectionError("broker gone")

    ahead = PlannedReadAhead(tmp_path, broken, "test")
    entry(tmp_path, 1)
    ahead.start(1)
    ahead._thread.join(10)
    assert ahead.take(1) is None


def test_a_closed_read_ahead_starts_no_thread(tmp_path):
    ahead = PlannedReadAhead(tmp_path, lambda b: b, "test")
    ahead.start(1)
    ahead.close(1)
    entry(tmp_path, 2)
    ahead.start(2)
    assert ahead._thread is None and ahead.take(2) is None


def test_rows_the_call_does_not_want_are_not_used_nor_counted(tmp_path):
    ahead = PlannedReadAhead(tmp_path, lambda b: ("ranges of another plan", b), "test")
    entry(tmp_path, 4)
    ahead.start(4)
    ahead._thread.join(10)
    assert ahead.take(4, lambda read: read[0] == "ranges of this plan") is None
    assert ahead.hits == 0


def test_close_says_when_a_read_is_still_under_way(tmp_path):
    release = threading.Event()
    ahead = PlannedReadAhead(tmp_path, lambda b: release.wait(10), "test")
    entry(tmp_path, 1)
    ahead.start(1)
    wait_until(lambda: ahead._thread is not None and ahead._thread.is_alive() and (tmp_path / "1").exists(),
               timeout=10, what="the read under way")
    time.sleep(0.1)  # (past the thread's first look for the entry)
    assert ahead.close(0.1) is False, "the caller must not close the readers the thread still uses"
    release.set()
    assert ahead.close(10) is True
