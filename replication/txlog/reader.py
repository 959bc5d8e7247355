"""An instance's txlog read without Spark: bookmark positions, the durable watermark, rows in ``seq`` order.

What ``replication replay``, the notebooks' replay API and ``replication verify`` read through: a
source (a config file, a parsed config or a storage root) opened with :func:`open_txlog`.
Positions are local ``seq`` values, found from the Delta file statistics
(:mod:`replication.txlog.seek`) without reading the whole log.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replication import config
from replication.config.model import InstanceConfig
from replication.connectors.delta.tables import open_table
from replication.connectors.s3.access import arrow_location
from replication.errors import InputError
from replication.messages import BOOKMARK_FORMS, Epoch, MessageBookmark, Now, PersistedAt, parse_bookmarks
from replication.storage.control import DurableState, RetentionState
from replication.storage.layout import StorageLayout
from replication.txlog.files import TxlogFiles, local_or_uri
from replication.txlog.schema import TXLOG_SCHEMA
from replication.txlog.seek import TxlogSeek

#: What a replay reads: a config file, a parsed config, or an instance's storage root.
Source = str | os.PathLike | InstanceConfig
#: Rows per window when the txlog is read without Spark (whole files; ``replication replay``).
WINDOW_ROWS = 50_000
#: Rows per batch of the first file, streamed.
STREAM_ROWS = 2_000


def open_txlog(source: Source) -> TxlogReader:
    """The txlog of ``source``: a config file (``.xml``), a parsed config, or an instance's storage root.

    Raises :class:`~replication.errors.ConfigError` for a config that does not
    load, :class:`~replication.errors.InputError` for anything else that names no instance.
    """
    if isinstance(source, InstanceConfig):
        return TxlogReader(StorageLayout.of(source.storage).check_reachable(), source.name)
    if not isinstance(source, (str, os.PathLike)):
        raise InputError(
            f"a replay source is a config file path, a parsed config or a storage root, not {type(source).__name__}"
        )
    text = os.fspath(source)
    if text.lower().endswith(".xml") or Path(text).is_file():
        cfg = config.load(text)
        return TxlogReader(StorageLayout.of(cfg.storage).check_reachable(), cfg.name)
    layout = StorageLayout.of(text).check_reachable()
    if not layout.root.is_dir():
        raise InputError(
            f"{text!r} does not exist: give an instance's config file (e.g. conf/amps-1.xml), "
            "a parsed config (replication.config.load(...)) or an instance's storage root"
        )
    return TxlogReader(layout, layout.root.name)


class TxlogReader:
    """One instance's transaction log, read without Spark: bookmark positions, the durable watermark, rows.

    Positions are local ``seq`` values: a replay from position ``p`` returns
    the rows with ``seq > p``; one until position ``q`` stops after ``seq = q``.
    """

    def __init__(self, layout: StorageLayout, name: str) -> None:
        self.layout = layout
        self.name = name
        self.files = TxlogFiles(self.path)
        self._seek: TxlogSeek | None = None

    @property
    def path(self) -> str:
        return str(self.layout.txlog)

    def exists(self) -> bool:
        self.files.refresh()
        return self.files.version is not None

    def committed_seq(self) -> int:
        """The highest seq committed now (0: empty or absent)."""
        self.files.refresh()
        return self.files.committed_seq

    def durable_seq(self) -> int:
        """Every row through this seq is acknowledged by every sync destination (``_control/durable.json``)."""
        saved = DurableState.read(self.layout.durable_json)
        return int(saved.durable_seq) if saved else 0

    def position(self, bookmark: str, *, last: bool = False) -> int:
        """Where ``bookmark`` is: the earliest of a list, or with ``last`` (an ``until``) the latest."""
        positions = [self._position(point) for point in parse_bookmarks(bookmark)]
        return max(positions) if last else min(positions)

    def range(self, bookmark: str = "0", until: str | None = None, *,
              fully_durable: bool = False) -> tuple[int, int | None]:
        """``(start, end)``: rows ``start < seq <= end``; ``end`` None: no end (a subscription's)."""
        start = self.position(bookmark)
        end = self.position(until, last=True) if until is not None else None
        if fully_durable:
            durable = self.durable_seq()
            end = durable if end is None else min(end, durable)
        return start, end

    def file_uris(self, after: int, through: int) -> list[str]:
        """The data files of the current snapshot that may hold rows ``after < seq <= through``, in seq order."""
        self.files.refresh()
        return [f.uri for f in self.files.overlapping(after, through)] if through > after else []

    def read(self, after: int, through: int) -> Iterator[pa.Table]:
        """Rows ``after < seq <= through`` in seq order: the first file streamed in small batches (the first
        rows come out at once, whatever the file's size), then about :data:`WINDOW_ROWS` rows (whole files,
        checked complete) at a time."""
        self.files.refresh()
        position = after
        for rows in self._stream_first_file(after, through):
            position = int(rows.column("seq")[-1].as_py())
            yield rows
        for part in self.files.plan(position, through, rows_per_partition=WINDOW_ROWS):
            yield self.files.read(part.start, part.end)

    def _stream_first_file(self, after: int, through: int) -> Iterator[pa.Table]:
        """The rows of the first file that holds ``after + 1``, batch by batch, while they follow on from
        ``after`` without a gap (the plain case); anything else is left to the checked windows."""
        first = self.files.overlapping(after, through)[:1]
        if not first:
            return
        try:
            path, filesystem = arrow_location(local_or_uri(first[0].uri))
            parquet = pq.ParquetFile(filesystem.open_input_file(path) if filesystem is not None else path)
        except FileNotFoundError:  # compacted and vacuumed since listed: the checked read re-plans
            return
        seq_column = parquet.schema_arrow.get_field_index("seq")
        groups = [g for g in range(parquet.metadata.num_row_groups)
                  if _may_hold_after(parquet.metadata.row_group(g).column(seq_column).statistics, after)]
        position = after
        for batch in parquet.iter_batches(batch_size=STREAM_ROWS, row_groups=groups):
            seqs = batch.column("seq")
            rows = pa.Table.from_batches([batch]).filter(
                pc.and_(pc.greater(seqs, position), pc.less_equal(seqs, through)))
            if not rows.num_rows:
                continue
            got = rows.column("seq").to_numpy()
            if got[0] != position + 1 or got[-1] - got[0] != len(got) - 1:
                return
            yield rows.cast(TXLOG_SCHEMA)
            position = int(got[-1])

    def first_retained(self) -> tuple[int, str | None]:
        """The first seq the txlog still holds and its bookmark (``(1, None)``: retention never removed rows)."""
        state = RetentionState.read(self.layout.retention_json)
        if state is None or state.first_seq <= 1:
            return 1, None
        return state.first_seq, state.first_bookmark

    def _position(self, point) -> int:
        if isinstance(point, Epoch):
            return self.first_retained()[0] - 1  # (the oldest message still held)
        if isinstance(point, Now):
            return self.committed_seq()
        if isinstance(point, PersistedAt):
            first = self._seeker().first_seq_persisted_at(point.micros) if self.exists() else None
            return first - 1 if first is not None else self.committed_seq()
        assert isinstance(point, MessageBookmark)
        seq = self._seeker().seq_of_bookmark(point.text, point.publisher_seq) if self.exists() else None
        first, first_bookmark = self.first_retained()
        if seq is None and first > 1:
            raise InputError(
                f"bookmark {point.text!r} is not in the txlog of {self.name}: retention removed the rows before "
                f"seq {first:,}, and it is not among the rows kept. The first retained bookmark is "
                f"{first_bookmark}: replay from it (or from 0, the oldest message kept)"
            )
        if seq is None:
            raise InputError(
                f"bookmark {point.text!r} is not in the txlog of {self.name} ({self.path}): no message has it. "
                f"Use a bookmark from this instance's txlog (the bookmark column, or the last one "
                f"`replication replay` printed), or one of: {BOOKMARK_FORMS}"
            )
        return seq

    def message_types(self, after: int, through: int) -> set[str] | None:
        """The message types of rows ``after < seq <= through`` by the files' statistics (None: unknown)."""
        return self._seeker().message_types(after, through) if self.exists() else None

    def _seeker(self) -> TxlogSeek:
        if self._seek is None:
            self._seek = TxlogSeek(open_table(self.path))
        return self._seek


def _may_hold_after(statistics, after: int) -> bool:
    """Can a row group with these ``seq`` statistics hold a row after ``after``? (no statistics: yes)"""
    return statistics is None or not statistics.has_min_max or statistics.max > after
