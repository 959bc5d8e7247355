"""Decoding raw Kafka record batches into Arrow columns (no broker needed)."""

from __future__ import annotations

import struct

import pytest
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c
from pyspark.sql.pandas.types import to_arrow_schema

from replication.connectors.kafka.ranges import PUBLISH_HEADERS, SCHEMA
from replication.connectors.kafka.records import RecordColumns

NONE, GZIP, ZSTD = 0, 1, 4
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")

RECORDS = [  # (offset delta, timestamp ms, key, value, headers)
    (0, 1_700_000_000_000, b"pub1", b'{"a":1}', [("amps-client", b"pub1"), ("amps-seq", b"1")]),
    (1, 1_700_000_000_005, None, None, [("amps-seq", b"2"), ("x", None), ("amps-seq", b"3")]),
    (2, 1_700_000_000_009, b"k", b"v", [("amps-topic", b"\xff bad utf-8")]),
    (3, 1_700_000_000_010, b"", b"", []),
]


def _batch(base: int, records=RECORDS, *, codec: int = NONE, attributes_or: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False,
        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )
    for delta, ts, key, value, headers in records:
        builder.append(delta, timestamp=ts, key=key, value=value, headers=headers)
    buf = bytearray(builder.build())
    struct.pack_into(">q", buf, 0, base)  # the base offset is outside the CRC
    if attributes_or:
        attributes = struct.unpack_from(">h", buf, 21)[0] | attributes_or
        struct.pack_into(">h", buf, 21, attributes)
        struct.pack_into(">I", buf, 17, calc_crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def _columns(end: int = 1 << 62) -> RecordColumns:
    return RecordColumns("t", 3, end, ARROW_SCHEMA, [key for key, _ in PUBLISH_HEADERS])


def _decode(buffer: bytes, fetch_offset: int = 0, end: int = 1 << 62):
    columns = _columns(end)
    marks = [m.offset for m in columns.add_batches(buffer, fetch_offset)]
    return marks, columns.flush().to_pylist()


@pytest.mark.parametrize("codec", [NONE, GZIP, ZSTD])
def test_every_field_of_every_record_is_decoded(codec):
    marks, rows = _decode(_batch(100, codec=codec))
    assert marks == [103]
    assert [(r["kafka_offset"], r["key"], r["value"]) for r in rows] == [
        (100, b"pub1", b'{"a":1}'), (101, None, None), (102, b"k", b"v"), (103, b"", b""),
    ]
    assert {(r["kafka_topic"], r["kafka_partition"]) for r in rows} == {("t", 3)}
    assert int(rows[1]["kafka_timestamp"].timestamp() * 1000) == 1_700_000_000_005
    assert [(h["key"], h["value"]) for h in rows[1]["headers"]] == [("amps-seq", b"2"), ("x", None), ("amps-seq", b"3")]
    assert [r["h_seq"] for r in rows] == ["1", "3", None, None]  # a repeated key: the last wins
    assert rows[2]["h_topic"] == "\ufffd bad utf-8"  # the raw bytes stay in `headers`
    assert rows[2]["headers"][0]["value"] == b"\xff bad utf-8"


def test_fast_and_portable_paths_give_identical_batches():
    from kafka.record import MemoryRecords

    buffer = _batch(0, codec=ZSTD) + _batch(4, codec=GZIP)
    fast = _columns()
    list(fast.add_batches(buffer, 0))
    portable = _columns()
    records = MemoryRecords(buffer)
    while (batch := records.next_batch()) is not None:
        portable.add_records(list(batch))
    assert fast.flush().equals(portable.flush())


def test_rows_below_the_fetch_offset_and_from_the_end_on_are_left_out():
    buffer = _batch(10) + _batch(14)
    marks, rows = _decode(buffer, fetch_offset=12, end=16)
    assert marks == [13, 17]
    assert [r["kafka_offset"] for r in rows] == [12, 13, 14, 15]


@pytest.mark.parametrize("path", ["fast", "portable"])
def test_records_already_taken_are_never_added_again_when_the_consumer_moves_back(path):
    """A consumer reset to an earlier offset fetches records this range already holds: they are skipped."""
    from kafka.record import MemoryRecords

    columns = _columns()

    def add(buffer, fetch_offset):
        if path == "fast":
            list(columns.add_batches(buffer, fetch_offset))
        else:
            records = MemoryRecords(buffer)
            while (batch := records.next_batch()) is not None:
                columns.add_records([r for r in batch if r.offset >= fetch_offset])

    add(_batch(10) + _batch(14), 10)
    first = columns.flush()  # a flush (Arrow batch handed on) does not forget what was taken
    add(_batch(0) + _batch(10) + _batch(14) + _batch(18), 0)  # moved back to the log start
    assert first["kafka_offset"].to_pylist() == list(range(10, 18))
    assert columns.flush()["kafka_offset"].to_pylist() == [18, 19, 20, 21]


def test_control_batches_add_no_rows_but_advance():
    marks, rows = _decode(_batch(0) + _batch(4, RECORDS[:1], attributes_or=0x20) + _batch(5))
    assert marks == [3, 4, 8]
    assert [r["kafka_offset"] for r in rows] == [0, 1, 2, 3, 5, 6, 7, 8]


def test_log_append_time_stamps_every_record_with_the_batch_time():
    _, rows = _decode(_batch(0, attributes_or=0x08))
    assert {int(r["kafka_timestamp"].timestamp() * 1000) for r in rows} == {1_700_000_000_010}


def test_a_batch_cut_off_by_the_fetch_size_is_left_for_the_next_fetch():
    whole = _batch(0)
    marks, rows = _decode(whole + _batch(4)[:30])
    assert marks == [3] and len(rows) == 4


def test_a_corrupt_batch_raises_and_adds_nothing():
    good, bad = _batch(0), bytearray(_batch(4))
    bad[-1] ^= 0xFF
    columns = _columns()
    with pytest.raises(CorruptRecordError, match="offset 4 of t\\[3\\]"):
        list(columns.add_batches(good + bytes(bad), 0))
    assert [r["kafka_offset"] for r in columns.flush().to_pylist()] == [0, 1, 2, 3]


def test_a_batch_that_lies_about_its_records_raises_and_adds_none_of_them():
    bad = bytearray(_batch(4))
    struct.pack_into(">i", bad, 57, 9)  # claims 9 records, holds 4
    struct.pack_into(">I", bad, 17, calc_crc32c(memoryview(bad)[21:]))
    columns = _columns()
    with pytest.raises(CorruptRecordError, match="offset 4 of t\\[3\\] cannot be decoded"):
        list(columns.add_batches(_batch(0) + bytes(bad), 0))
    assert [r["kafka_offset"] for r in columns.flush().to_pylist()] == [0, 1, 2, 3]
