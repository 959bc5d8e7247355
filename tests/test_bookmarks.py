"""Bookmarks: the AMPS forms, and where each is in a txlog, found from file statistics (Delta tables, no Spark)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from support.factories import T0, stamp, write_batches

from replication import replay
from replication.errors import InputError
from replication.messages import (
    BOOKMARK_FORMS,
    Epoch,
    MessageBookmark,
    Now,
    PersistedAt,
    bookmark,
    parse_bookmarks,
)

# -- the forms -----------------------------------------------------------------------


def test_every_form_parses_and_a_list_keeps_its_order():
    assert parse_bookmarks("0") == (Epoch(),)
    assert parse_bookmarks("0|1|") == (Now(),)
    assert parse_bookmarks("123|45|") == (MessageBookmark(123, 45),)
    assert parse_bookmarks("20261123T093000") == parse_bookmarks("20261123T093000Z") == (
        PersistedAt(datetime(2026, 11, 23, 9, 30, tzinfo=timezone.utc)),)
    assert parse_bookmarks("20261123T093000.25Z")[0].time.microsecond == 250_000
    assert parse_bookmarks(" 7|3| ,0, 20261123T093000Z") == (
        MessageBookmark(7, 3), Epoch(), PersistedAt(datetime(2026, 11, 23, 9, 30, tzinfo=timezone.utc)))


@pytest.mark.parametrize("text", ["", "1|2", "abc", "|1|", "1|x|", "2026-11-23T09:30:00", "20261323T093000Z",
                                  "20261123T093000.1234567", "0|1|,"])
def test_a_malformed_bookmark_names_itself_and_the_accepted_forms(text):
    with pytest.raises(InputError) as err:
        parse_bookmarks(text)
    assert BOOKMARK_FORMS in str(err.value)
    assert "\n" not in str(err.value)


# -- where they are in a txlog ----------------------------------------------------------


def test_each_form_resolves_to_its_position(tmp_path):
    rows = write_batches(tmp_path / "txlog", batches=4, per_publisher=5)  # 60 rows, 15 per batch
    log = replay.open_txlog(tmp_path)
    mid = rows.slice(22, 1).to_pylist()[0]  # seq 23, batch 1
    assert log.position("0") == 0
    assert log.position("0|1|") == 60
    assert log.position(mid["bookmark"]) == 23, "a bookmark: start after its message"
    # A time: the first message persisted at or after it (batch 2 starts at seq 31).
    assert log.position(stamp(T0 + timedelta(seconds=2))) == 30
    assert log.position(stamp(T0 + timedelta(seconds=1, microseconds=701))) == 30
    assert log.position(stamp(T0 + timedelta(seconds=1, microseconds=700))) == 15
    assert log.position(stamp(T0 - timedelta(days=1))) == 0
    assert log.position(stamp(T0 + timedelta(days=1))) == 60, "after the last message: nothing yet"
    # A list: the earliest; as an until, the latest.
    listed = f"{mid['bookmark']},{stamp(T0 + timedelta(seconds=3))},{bookmark('p2', 1)}"
    assert log.position(listed) == 3
    assert log.position(listed, last=True) == 45
    assert log.range(mid["bookmark"], listed) == (23, 45)


def test_a_bookmark_this_txlog_does_not_hold_is_an_error_naming_the_forms(tmp_path):
    write_batches(tmp_path / "txlog", batches=2, per_publisher=3)
    log = replay.open_txlog(tmp_path)
    for unknown in (bookmark("p0", 99), bookmark("someone-else", 1)):
        with pytest.raises(InputError) as err:
            log.position(unknown)
        assert "is not in the txlog" in str(err.value) and BOOKMARK_FORMS in str(err.value)


def test_seeking_reads_only_the_files_the_statistics_point_to(tmp_path):
    """40 files: a bookmark or a time is found by reading one file; the others may as well be gone."""
    path = tmp_path / "txlog"
    rows = write_batches(path, batches=40, per_publisher=5)
    target = rows.slice(15 * 27 + 4, 1).to_pylist()[0]  # in batch 27
    keep = _file_of(path, target["seq"])
    for data_file in path.glob("*.parquet"):
        if data_file.name != keep:
            data_file.unlink()
    log = replay.open_txlog(tmp_path)
    assert log.position(target["bookmark"]) == target["seq"]
    assert log.position(stamp(T0 + timedelta(seconds=27))) == 15 * 27
    assert log._seeker().files_read == 2


def _file_of(path: Path, seq: int) -> str:
    from deltalake import DeltaTable

    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()
    return next(a["path"] for a in actions if a["min.seq"] <= seq <= a["max.seq"])


def test_a_source_that_names_no_instance_says_what_to_give(tmp_path):
    with pytest.raises(InputError, match="does not exist: give an instance's config file"):
        replay.open_txlog(tmp_path / "nowhere")
    with pytest.raises(InputError, match="not int"):
        replay.open_txlog(42)
    from replication.errors import ConfigError

    with pytest.raises(ConfigError, match="config file not found"):
        replay.open_txlog(tmp_path / "missing.xml")


def test_reading_without_spark_gives_each_row_once_in_order_also_after_a_compaction(tmp_path):
    """The first file is streamed in small batches, the rest read in checked windows; a compacted log
    (one file rewritten from many) reads the same."""
    from deltalake import DeltaTable

    rows = write_batches(tmp_path / "txlog", batches=6, per_publisher=400)  # 6 files of 1,200 rows
    log = replay.open_txlog(tmp_path)
    for after, through in ((0, 7200), (1000, 5000), (7000, 7200)):
        got = [s for part in log.read(after, through) for s in part.column("seq").to_pylist()]
        assert got == list(range(after + 1, through + 1))
    first = next(log.read(1000, 7200))
    assert first.column("seq").to_pylist() == list(range(1001, 1201)), "the rest of the first file, alone"
    assert first.to_pylist()[0] == rows.slice(1000, 1).to_pylist()[0]
    DeltaTable(str(tmp_path / "txlog")).optimize.compact()
    log = replay.open_txlog(tmp_path)
    assert [s for part in log.read(10, 7200) for s in part.column("seq").to_pylist()] == list(range(11, 7201))
