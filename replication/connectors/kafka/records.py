"""Kafka records into Arrow columns: the hot loop of the Kafka source.

Two ways in, one way out (:meth:`RecordColumns.flush`, a ``pyarrow.RecordBatch``):

- :meth:`RecordColumns.add_records` takes kafka-python ``ConsumerRecord``s (portable);
- :meth:`RecordColumns.add_batches` decodes raw record batches (message format v2)
  straight from the fetch response bytes. kafka-python spends ~3/4 of a read
  building a Python object per record; skipping that makes reads 2-3x faster
  (bench/kafka_source.py). Batches in the older formats v0/v1 are handed to
  kafka-python's own decoder.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

# Record batch v2 header: baseOffset, batchLength, partitionLeaderEpoch, magic,
# crc, attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId,
# producerEpoch, baseSequence, recordCount.
_HEADER = struct.Struct(">qiibIhiqqqhii")
_PREFIX = struct.Struct(">qi")  # baseOffset, batchLength: the same in every format
_LOG_OVERHEAD = 12  # baseOffset + batchLength: batchLength counts the bytes after them
_MAGIC_AT = 16
_CRC_FROM = 21  # the CRC covers everything from the attributes on
_COMPRESSION_MASK = 0x07
_LOG_APPEND_TIME = 0x08
_CONTROL = 0x20


class BatchMark:
    """What the fast path hands back to kafka-python per batch: its last offset and leader epoch."""

    __slots__ = ("offset", "leader_epoch")

    def __init__(self, offset: int, leader_epoch: int) -> None:
        self.offset = offset
        self.leader_epoch = leader_epoch


class RecordColumns:
    """Accumulates the records of one partition column by column, up to offset ``end``.

    Args:
        topic, partition: constant columns of every row.
        end: records at or beyond this offset are left out (the micro-batch's end).
        schema: the Arrow schema of :meth:`flush` (Spark's, to the last detail).
        publish_headers: header keys copied into their own columns, in schema order
            after ``headers``; when a key repeats, the last value wins.
    """

    def __init__(
        self, topic: str, partition: int, end: int, schema: pa.Schema, publish_headers: Sequence[str]
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.end = end
        self.schema = schema
        self._slot = {key: i for i, key in enumerate(publish_headers)}
        self._width = len(publish_headers)
        self.taken_through = -1
        """Highest offset added so far (kept across flushes): a record at or below it is never added again,
        whatever position the consumer is moved back to."""
        self._reset()

    def _reset(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.header_ends: list[int] = [0]
        self.header_keys: list[str] = []
        self.header_values: list[bytes | None] = []
        self.publish: list[list[bytes | None]] = [[] for _ in range(self._width)]

    def __len__(self) -> int:
        return len(self.offsets)

    # -- portable path: kafka-python ConsumerRecords -------------------------

    def add_records(self, records: Iterable[Any]) -> None:
        """Append records that have ``offset, timestamp, key, value, headers`` attributes."""
        end, slot_of, width = self.end, self._slot.get, self._width
        offsets, timestamps = self.offsets.append, self.timestamps.append
        keys, values, header_ends = self.keys.append, self.values.append, self.header_ends.append
        header_keys, header_values = self.header_keys.append, self.header_values.append
        publish = [column.append for column in self.publish]
        count = len(self.header_keys)
        taken = self.taken_through
        for record in records:
            if record.offset >= end:
                break
            if record.offset <= taken:
                continue
            taken = record.offset
            offsets(record.offset)
            timestamps(record.timestamp)
            keys(record.key)
            values(record.value)
            found = [None] * width
            for key, value in record.headers or ():
                header_keys(key)
                header_values(value)
                count += 1
                slot = slot_of(key)
                if slot is not None:
                    found[slot] = value
            header_ends(count)
            for append, value in zip(publish, found):
                append(value)
        self.taken_through = taken

    # -- fast path: raw record batches ---------------------------------------

    def add_batches(self, buffer: bytes | bytearray | memoryview, fetch_offset: int, *,
                    check_crcs: bool = True) -> Iterator[BatchMark]:
        """Decode the record batches in ``buffer`` (a fetch response's records).

        Records below ``fetch_offset`` (a fetch returns whole batches), at or
        below :attr:`taken_through` (a consumer moved back) and at or beyond
        ``end`` are skipped. Yields one :class:`BatchMark` per complete
        batch, after its rows are added; a truncated batch at the end of the
        buffer is left alone (the next fetch starts there). A batch that fails
        to decode adds no rows.
        """
        from kafka.record.util import calc_crc32c

        view = memoryview(buffer)
        size = len(view)
        pos = 0
        fetch_offset = max(fetch_offset, self.taken_through + 1)
        while pos + _LOG_OVERHEAD + 5 <= size:
            base, length = _PREFIX.unpack_from(view, pos)
            start, stop = pos, pos + _LOG_OVERHEAD + length
            if stop > size:
                break  # truncated by the fetch size
            pos = stop
            if view[start + _MAGIC_AT] != 2:
                # Message formats v0/v1 (brokers before 0.11): rare, so kafka-python
                # decodes them. Their offset field is the last offset they hold.
                self._add_legacy(view[start:stop], fetch_offset)
                yield BatchMark(base, -1)
                continue
            (_, _, epoch, _, crc, attributes, last_delta, base_ts, max_ts,
             _, _, _, count) = _HEADER.unpack_from(view, start)
            last = base + last_delta
            if not attributes & _CONTROL and last >= fetch_offset and base < self.end:
                # Only batches that are read are checked: the CRC is pure Python
                # unless the `crc32c` package is installed.
                if check_crcs and calc_crc32c(view[start + _CRC_FROM:stop]) != crc:
                    from kafka.errors import CorruptRecordError

                    raise CorruptRecordError(
                        f"record batch at offset {base} of {self.topic}[{self.partition}] failed its CRC check"
                    )
                data = _decompress(attributes & _COMPRESSION_MASK, view[start + _HEADER.size:stop])
                fixed_ts = max_ts if attributes & _LOG_APPEND_TIME else None
                self._add_v2(data, count, base, base_ts, fixed_ts, fetch_offset)
            yield BatchMark(last, epoch)

    def _add_v2(self, data: bytes, count: int, base: int, base_ts: int, fixed_ts: int | None,
                lowest: int) -> None:
        rows, headers_before = len(self.offsets), len(self.header_keys)
        try:
            self._decode_v2(data, count, base, base_ts, fixed_ts, lowest)
            if len(self.offsets) > rows:
                self.taken_through = self.offsets[-1]
        except (IndexError, ValueError) as exc:  # the bytes end early or lie about lengths
            self._truncate(rows, headers_before)  # all of a batch or none of it
            from kafka.errors import CorruptRecordError

            raise CorruptRecordError(
                f"record batch at offset {base} of {self.topic}[{self.partition}] cannot be decoded: {exc!r}"
            ) from exc

    def _decode_v2(self, data: bytes, count: int, base: int, base_ts: int, fixed_ts: int | None,
                   lowest: int) -> None:
        # The hot loop: varints decoded inline (a call per varint costs ~30%),
        # list appends bound to locals.
        end, slot_of, width = self.end, self._slot.get, self._width
        offsets, timestamps = self.offsets.append, self.timestamps.append
        keys, values, header_ends = self.keys.append, self.values.append, self.header_ends.append
        header_keys, header_values = self.header_keys.append, self.header_values.append
        publish = [column.append for column in self.publish]
        header_count = len(self.header_keys)
        p = 0
        for _ in range(count):
            b = data[p]; p += 1  # noqa: E702  record length
            v = b & 0x7F; shift = 7  # noqa: E702
            while b & 0x80:
                b = data[p]; p += 1; v |= (b & 0x7F) << shift; shift += 7  # noqa: E702
            record_end = p + ((v >> 1) ^ -(v & 1))
            p += 1  # record attributes: unused
            b = data[p]; p += 1  # noqa: E702  timestamp delta
            v = b & 0x7F; shift = 7  # noqa: E702
            while b & 0x80:
                b = data[p]; p += 1; v |= (b & 0x7F) << shift; shift += 7  # noqa: E702
            ts_delta = (v >> 1) ^ -(v & 1)
            b = data[p]; p += 1  # noqa: E702  offset delta
            v = b & 0x7F; shift = 7  # noqa: E702
            while b & 0x80:
                b = data[p]; p += 1; v |= (b & 0x7F) << shift; shift += 7  # noqa: E702
            offset = base + ((v >> 1) ^ -(v & 1))
            if offset < lowest or offset >= end:
                p = record_end
                continue
            offsets(offset)
            timestamps(fixed_ts if fixed_ts is not None else base_ts + ts_delta)
            b = data[p]; p += 1  # noqa: E702  key
            v = b & 0x7F; shift = 7  # noqa: E702
            while b & 0x80:
                b = data[p]; p += 1; v |= (b & 0x7F) << shift; shift += 7  # noqa: E702
            n = (v >> 1) ^ -(v & 1)
            if n < 0:
                keys(None)
            else:
                keys(data[p:p + n]); p += n  # noqa: E702
            b = data[p]; p += 1  # noqa: E702  value
            v = b & 0x7F; shift = 7  # noqa: E702
            while b & 0x80:
                b = data[p]; p += 1; v |= (b & 0x7F) << shift; shift += 7  # noqa: E702
            n = (v >> 1) ^ -(v & 1)
            if n < 0:
                values(None)
            else:
                values(data[p:p + n]); p += n  # noqa: E702
            b = data[p]; p += 1  # noqa: E702  header count
            v = b & 0x7F; shift = 7  # noqa: E702
            while b & 0x80:
                b = data[p]; p += 1; v |= (b & 0x7F) << shift; shift += 7  # noqa: E702
            found: list[bytes | None] = [None] * width
            for _h in range((v >> 1) ^ -(v & 1)):
                b = data[p]; p += 1  # noqa: E702  header key
                v = b & 0x7F; shift = 7  # noqa: E702
                while b & 0x80:
                    b = data[p]; p += 1; v |= (b & 0x7F) << shift; shift += 7  # noqa: E702
                n = (v >> 1) ^ -(v & 1)
                key = data[p:p + n].decode("utf-8", "replace"); p += n  # noqa: E702
                b = data[p]; p += 1  # noqa: E702  header value
                v = b & 0x7F; shift = 7  # noqa: E702
                while b & 0x80:
                    b = data[p]; p += 1; v |= (b & 0x7F) << shift; shift += 7  # noqa: E702
                n = (v >> 1) ^ -(v & 1)
                if n < 0:
                    value = None
                else:
                    value = data[p:p + n]; p += n  # noqa: E702
                header_keys(key)
                header_values(value)
                header_count += 1
                slot = slot_of(key)
                if slot is not None:
                    found[slot] = value
            header_ends(header_count)
            for append, value in zip(publish, found):
                append(value)
            p = record_end

    def _add_legacy(self, batch: memoryview, lowest: int) -> None:
        from kafka.record import MemoryRecords

        records = MemoryRecords(bytes(batch))
        while (legacy := records.next_batch()) is not None:
            self.add_records(r for r in legacy if r.offset >= lowest)

    def _truncate(self, rows: int, headers: int) -> None:
        columns: tuple[list[Any], ...] = (self.offsets, self.timestamps, self.keys, self.values, *self.publish)
        for column in columns:
            del column[rows:]
        del self.header_ends[rows + 1:]
        del self.header_keys[headers:]
        del self.header_values[headers:]

    # -- out -----------------------------------------------------------------

    def flush(self) -> pa.RecordBatch:
        """The rows added so far as one Arrow batch of ``schema``; starts a new one."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.offsets)
        millis = pa.array(self.timestamps, pa.int64())
        # -1 means "no timestamp" (message format v0).
        micros = pc.if_else(pc.less(millis, 0), None, pc.multiply(millis, 1000))
        fields = self.schema.names
        header_type = self.schema.field(fields[6]).type
        entries = pa.StructArray.from_arrays(
            [pa.array(self.header_keys, pa.string()), pa.array(self.header_values, pa.binary())],
            fields=list(header_type.value_type),
        )
        columns = [
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            micros.cast(self.schema.field(fields[3]).type),
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.ListArray.from_arrays(pa.array(self.header_ends, pa.int32()), entries, type=header_type),
        ] + [_utf8(values) for values in self.publish]
        self._reset()
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def _decompress(codec: int, data: memoryview) -> bytes:
    if codec == 0:
        return data.tobytes()
    from kafka import codec as kafka_codec

    if codec == 4:
        return _zstd_decompress(data)
    if codec == 1:
        return kafka_codec.gzip_decode(data)
    if codec == 2:
        return kafka_codec.snappy_decode(data.tobytes())
    if codec == 3:
        return kafka_codec.lz4_decode(data.tobytes())
    raise ValueError(f"unknown Kafka compression codec {codec}")


def _zstd_decompress(data: memoryview) -> bytes:
    import zstandard

    # Producers write one frame per batch, usually without its content size, so
    # a one-shot decompress() cannot size its output: stream it.
    with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as reader:
        return reader.read()


def _utf8(values: list[bytes | None]) -> pa.Array:
    import pyarrow as pa

    return utf8(pa.array(values, pa.binary()))


def utf8(raw: pa.Array) -> pa.Array:
    """Binary values as strings; bytes that are not UTF-8 decoded with U+FFFD replacements."""
    import pyarrow as pa

    try:
        return raw.cast(pa.string())  # validates UTF-8 in C: the common, fast path
    except pa.ArrowInvalid:
        return pa.array([v.decode("utf-8", "replace") if v is not None else None for v in raw.to_pylist()],
                        pa.string())
