"""New values for 64-bit integer columns of a Parquet file, written over the old ones in place.

A backfill part is written as a txlog file before the instance knows its
``seq`` and ``persist_time`` (:mod:`replication.ingest.staged_parts`). When
those two columns are written PLAIN, uncompressed, without dictionary, without
statistics and without page checksums, each data page of them holds its
values as raw little-endian 8-byte integers, after its levels: the file can
be given its final values by overwriting those bytes, and every other column
(the message bodies above all) is kept as written, not decoded and encoded
again.

:func:`value_spans` finds where each page's values are, from the footer and
the page headers (a few Thrift compact-protocol structures, read by a
minimal reader here), and refuses any other layout with
:class:`NotInPlace`; :func:`overwrite` writes the new values and reads the
columns back to check them. Nothing here guesses: a layout it does not know
exactly is refused, and the caller writes the file the usual way instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

#: pyarrow's writer options that give a column this layout (see :func:`writer_options`).
PLAIN = "PLAIN"


class NotInPlace(ValueError):
    """A column whose values cannot be overwritten in place (its layout is not the one described above)."""


@dataclass(frozen=True)
class Span:
    """``count`` values of 8 bytes at byte ``offset`` of the file: one data page's values."""

    offset: int
    count: int


def writer_options(columns: list[str], all_columns: list[str]) -> dict:
    """``pyarrow.parquet.write_table`` options that give ``columns`` the layout :func:`value_spans` accepts,
    leaving the others to the caller (merge them: these win for ``columns``)."""
    return {
        "column_encoding": {name: PLAIN for name in columns},
        "compression": {name: "NONE" for name in columns},
        "use_dictionary": [name for name in all_columns if name not in columns],
        "write_statistics": [name for name in all_columns if name not in columns],
        "write_page_checksum": False,
        "data_page_version": "1.0",
    }


def value_spans(path: str, columns: list[str], metadata: pq.FileMetaData | None = None) -> dict[str, list[Span]]:
    """Where the values of each of ``columns`` (INT64, no nulls) are in the file at ``path`` (whose footer, when
    read already, is ``metadata``), in row order.

    Raises :class:`NotInPlace` when a column is not laid out as the module docstring says.
    """
    metadata = metadata or pq.ParquetFile(path).metadata
    index = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    spans: dict[str, list[Span]] = {}
    with open(path, "rb") as f:
        for name in columns:
            if name not in index:
                raise NotInPlace(f"no column {name!r}")
            spans[name] = []
            optional = metadata.schema.column(index[name]).max_definition_level > 0
            if metadata.schema.column(index[name]).max_repetition_level:
                raise NotInPlace(f"{name}: a repeated column")
            for g in range(metadata.num_row_groups):
                chunk = metadata.row_group(g).column(index[name])
                if chunk.physical_type != "INT64":
                    raise NotInPlace(f"{name}: {chunk.physical_type}, not INT64")
                if chunk.compression != "UNCOMPRESSED" or chunk.has_dictionary_page or chunk.is_stats_set:
                    raise NotInPlace(f"{name}: compressed, dictionary-encoded or with statistics")
                if chunk.has_column_index or chunk.bloom_filter_offset is not None:
                    raise NotInPlace(f"{name}: with a column index or a bloom filter (of the values written over)")
                if set(chunk.encodings) - {"PLAIN", "RLE", "BIT_PACKED"}:
                    raise NotInPlace(f"{name}: encodings {chunk.encodings}")
                f.seek(chunk.data_page_offset)
                raw = f.read(chunk.total_compressed_size)
                spans[name] += _page_spans(raw, chunk.data_page_offset, optional, name)
                if sum(s.count for s in spans[name]) != sum(
                        metadata.row_group(k).num_rows for k in range(g + 1)):
                    raise NotInPlace(f"{name}: its pages do not hold one value per row (nulls?)")
    return spans


def overwrite(path: str, spans: dict[str, list[Span]], values: dict[str, np.ndarray]) -> None:
    """Write ``values[name]`` (int64, one per row) over the values of each column, then read the columns back
    and check them (:class:`NotInPlace` if they differ: the file must not be used)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        for name, column_spans in spans.items():
            data = np.ascontiguousarray(values[name], dtype="<i8")
            at = 0
            for span in column_spans:
                os.pwrite(fd, data[at:at + span.count].tobytes(), span.offset)
                at += span.count
            if at != data.size:
                raise NotInPlace(f"{name}: {data.size} values for {at} rows")
    finally:
        os.close(fd)
    back = pq.read_table(path, columns=list(spans), partitioning=None)
    for name in spans:
        got = back.column(name).combine_chunks()
        if got.null_count or not np.array_equal(got.cast("int64").to_numpy(), np.asarray(values[name], np.int64)):
            raise NotInPlace(f"{name}: the values read back are not those written")


# -- the page headers ---------------------------------------------------------------------------

_DATA_PAGE = 0
_PLAIN_ENCODING, _RLE_ENCODING = 0, 3
#: PageHeader fields; DataPageHeader fields.
_TYPE, _UNCOMPRESSED_SIZE, _COMPRESSED_SIZE, _CRC, _DATA_PAGE_HEADER = 1, 2, 3, 4, 5
_NUM_VALUES, _ENCODING, _LEVELS_ENCODING, _STATISTICS = 1, 2, 3, 5


def _page_spans(raw: bytes, base: int, optional: bool, name: str) -> list[Span]:
    """The data pages of one column chunk (``raw``, at file offset ``base``): where their values are."""
    out, at = [], 0
    while at < len(raw):
        header, body = _Reader(raw, at).struct()
        size = header.get(_COMPRESSED_SIZE)
        if header.get(_TYPE) != _DATA_PAGE or size is None or _CRC in header or header.get(_UNCOMPRESSED_SIZE) != size:
            raise NotInPlace(f"{name}: a page that is not an uncompressed v1 data page without checksum")
        page = header.get(_DATA_PAGE_HEADER) or {}
        count = page.get(_NUM_VALUES)
        if count is None or page.get(_STATISTICS):  # (pyarrow writes an empty one)
            raise NotInPlace(f"{name}: a data page with statistics")
        if page.get(_ENCODING) != _PLAIN_ENCODING or (optional and page.get(_LEVELS_ENCODING) != _RLE_ENCODING):
            raise NotInPlace(f"{name}: a data page not PLAIN, or its levels not RLE")
        values_at = body
        if optional:  # v1: the definition levels first, their byte length before them
            levels = int.from_bytes(raw[body:body + 4], "little")
            values_at = body + 4 + levels
        if body + size > len(raw) or (body + size) - values_at != 8 * count:
            raise NotInPlace(f"{name}: a page whose values are not {count} plain 8-byte integers")
        out.append(Span(base + values_at, count))
        at = body + size
    return out


class _Reader:
    """The Thrift compact protocol, as far as Parquet's page headers use it: structs as ``{field id: value}``."""

    def __init__(self, raw: bytes, at: int) -> None:
        self.raw = raw
        self.at = at

    def struct(self) -> tuple[dict, int]:
        """The struct at the position and the position after it."""
        return self._struct(), self.at

    def _byte(self) -> int:
        if self.at >= len(self.raw):
            raise NotInPlace("a page header runs past its column chunk")
        value = self.raw[self.at]
        self.at += 1
        return value

    def _varint(self) -> int:
        shift = result = 0
        while True:
            byte = self._byte()
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise NotInPlace("a malformed page header")

    def _zigzag(self) -> int:
        n = self._varint()
        return (n >> 1) ^ -(n & 1)

    def _struct(self) -> dict:
        fields: dict[int, object] = {}
        last = 0
        while True:
            head = self._byte()
            kind = head & 0x0F
            if kind == 0:
                return fields
            delta = head >> 4
            last = last + delta if delta else self._zigzag()
            fields[last] = self._value(kind)

    def _value(self, kind: int, in_collection: bool = False):
        if kind in (1, 2):  # a field's boolean is in its type; a list's takes a byte
            return self._byte() == 1 if in_collection else kind == 1
        if kind == 3:
            return self._byte()
        if kind in (4, 5, 6):
            return self._zigzag()
        if kind == 7:
            self.at += 8
            return None
        if kind == 8:
            n = self._varint()
            self.at += n
            return self.raw[self.at - n:self.at]
        if kind in (9, 10):
            head = self._byte()
            n = head >> 4 if head >> 4 != 15 else self._varint()
            return [self._value(head & 0x0F, True) for _ in range(n)]
        if kind == 11:
            n = self._varint()
            types = self._byte() if n else 0
            return [(self._value(types >> 4, True), self._value(types & 0x0F, True)) for _ in range(n)]
        if kind == 12:
            return self._struct()
        raise NotInPlace(f"a page header with Thrift type {kind}")
