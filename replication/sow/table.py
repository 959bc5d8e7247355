"""A SOW topic's Delta table: a compacted base of current records, and the exact state from base + txlog.

The SOW is derived from the txlog. ``sow/<topic-id>/`` holds the current
records as of some txlog position S (the app transaction ``sow`` of its last
commit); the changes after S are the txlog's own rows, whose ``sow_key`` says
which record each wrote or removed. So:

- the exact current state is the base at S, then the txlog rows after S
  folded on top (:func:`read_current`); that is what ``replication sow`` and
  the instance's recovery read;
- :meth:`SowTable.compact` brings the base up to a later position: it rewrites
  only the partitions (``bucket``, a stable hash of topic and key) that the
  folded rows touch, in one commit recording the new position, so a plain
  Delta reader (deltalake, delta-spark, Databricks) always sees current
  records, no key twice, no deleted key, at most one compaction interval old.

Compaction is idempotent: a commit names the position it reached, and a
compaction to a position already reached does nothing. A crash before its
commit leaves files no snapshot references (removed by the next vacuum).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from replication import failpoints
from replication.config.model import InstanceConfig, SowTopic
from replication.connectors.delta.tables import arrow_dataset, open_table
from replication.connectors.s3.access import delta_options_for
from replication.errors import InputError
from replication.expressions import Filter
from replication.expressions.columnar import matching
from replication.sow.keys import SowTopics, bucket_of, split_keys
from replication.sow.recent import RecentRows
from replication.sow.state import SowState
from replication.storage.layout import StorageLayout, StoragePath
from replication.txlog.files import TxlogFiles
from replication.txlog.schema import TXLOG_SCHEMA

log = logging.getLogger(__name__)

#: App transaction of the compactions: its version is the txlog seq the base holds everything through.
APP_ID = "sow"
#: Partitions of a SOW table; a compaction rewrites the ones its changes touch.
DEFAULT_BUCKETS = 16
#: A compactor keeps the base it wrote in memory, up to this size, rather than reading it back each time.
MAX_CACHED_BASE_BYTES = 256 << 20
#: A vacuum keeps the files of the snapshots committed this recently (readers may still be on them).
KEEP_SNAPSHOTS_S = 60.0

SOW_SCHEMA = pa.schema(
    [
        pa.field("bucket", pa.int32(), nullable=False),
        pa.field("sow_key", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("bookmark", pa.string(), nullable=False),
        pa.field("publisher", pa.string(), nullable=False),
        pa.field("publisher_seq", pa.int64(), nullable=False),
        pa.field("message_type", pa.string(), nullable=False),
        pa.field("origin", pa.string()),
        pa.field("publish_time", pa.timestamp("us", tz="UTC")),
        pa.field("persist_time", pa.timestamp("us", tz="UTC")),
        pa.field("data", pa.binary()),
    ]
)
#: The txlog columns a fold of SOW changes reads.
TAIL_COLUMNS = ("seq", "topic", "message_type", "command", "sow_key", "bookmark", "publisher", "publisher_seq",
                "origin", "publish_time", "persist_time", "data")
#: Those columns as the txlog types them.
TAIL_SCHEMA = pa.schema([TXLOG_SCHEMA.field(name) for name in TAIL_COLUMNS])
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def topic_id(name: str) -> str:
    """The folder under ``sow/`` of a ``<SOW><Topic>``: its name with every run of characters other than
    letters, digits, ``.``, ``_``, ``-`` replaced by ``_`` and leading ``_`` dropped, then ``-`` and the
    first 8 hex digits of the name's SHA-256 (two names that clean to the same text stay apart).
    ``/orders`` -> ``orders-<hash>``; ``^/orders/.*`` -> ``orders_-<hash>``."""
    cleaned = _SAFE.sub("_", name).strip("_") or "topic"
    return f"{cleaned[:80]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def table_path(layout: StorageLayout, sow: SowTopic) -> StoragePath:
    return layout.sow(topic_id(sow.name))


@dataclass
class Changes:
    """The net effect of txlog rows on one SOW topic: the last write per record."""

    upserts: pa.Table
    """One txlog row (TAIL_COLUMNS) per record whose last change wrote it."""
    deleted: set[tuple[str, str]]
    """(topic, key) of the records whose last change removed them."""

    def touched(self) -> set[tuple[str, str]]:
        keys = set(zip(self.upserts["topic"].to_pylist(), self.upserts["sow_key"].to_pylist(), strict=True))
        return keys | self.deleted


def net_changes(rows: pa.Table, topics: SowTopics, index: int) -> Changes:
    """The net effect of txlog ``rows`` (seq order) on the ``index``-th SOW topic.

    A publish wrote its ``sow_key``; a sow_delete removed every key of its
    ``sow_key`` list. Rows from before the topic was a SOW topic have no key
    and change nothing.
    """
    if not rows.num_rows:
        return Changes(rows, set())
    member = (topics.indexes(rows) == index) & pc.is_valid(rows["sow_key"]).to_numpy(zero_copy_only=False)
    delete = pc.fill_null(pc.equal(rows["command"], "sow_delete"), False).to_numpy(zero_copy_only=False)
    writes, removes = np.flatnonzero(member & ~delete), np.flatnonzero(member & delete)

    # every (topic, key) a row changed, with its position * 2 (+1: removed); the highest is the last change
    removed = [(topic, key, position * 2 + 1) for position, topic, sow_key in zip(
        removes.tolist(), rows["topic"].take(removes).to_pylist(), rows["sow_key"].take(removes).to_pylist(),
        strict=True) for key in split_keys(sow_key)]
    changed = pa.table({
        "topic": pa.concat_arrays([rows["topic"].take(writes).combine_chunks().cast(pa.string()),
                                   pa.array([r[0] for r in removed], pa.string())]),
        "key": pa.concat_arrays([rows["sow_key"].take(writes).combine_chunks().cast(pa.string()),
                                 pa.array([r[1] for r in removed], pa.string())]),
        "code": np.concatenate([writes.astype(np.int64) * 2, np.array([r[2] for r in removed], dtype=np.int64)]),
    })
    last = changed.group_by(["topic", "key"], use_threads=False).aggregate([("code", "max")])
    code = last["code_max"].to_numpy()
    gone = last.filter(pa.array(code % 2 == 1))
    written = np.sort(code[code % 2 == 0] // 2)
    return Changes(rows.take(pa.array(written, pa.int64())),
                   set(zip(gone["topic"].to_pylist(), gone["key"].to_pylist(), strict=True)))


def as_records(upserts: pa.Table, buckets: int) -> pa.Table:
    """Txlog rows of upserts as SOW table rows."""
    keys, topics = upserts["sow_key"].to_pylist(), upserts["topic"].to_pylist()
    columns = {name: upserts[name] for name in SOW_SCHEMA.names if name in upserts.column_names}
    columns["bucket"] = pa.array([bucket_of(t, k, buckets) for t, k in zip(topics, keys, strict=True)], pa.int32())
    return pa.table({name: columns[name] for name in SOW_SCHEMA.names}).cast(SOW_SCHEMA)


def apply_changes(base: pa.Table, changes: Changes, buckets: int, *, upserts: pa.Table | None = None) -> pa.Table:
    """Base records with ``changes`` applied: records touched are replaced by their upsert or dropped.
    ``upserts``: ``as_records(changes.upserts, buckets)`` when the caller has it already."""
    upserts = as_records(changes.upserts, buckets) if upserts is None else upserts
    kept = base
    if base.num_rows and (upserts.num_rows or changes.deleted):
        deleted_topics = pa.array([t for t, _ in changes.deleted], pa.string())
        deleted_keys = pa.array([k for _, k in changes.deleted], pa.string())
        # by key first (cheap, and narrow when few records changed), then by topic and key on those rows
        maybe = np.flatnonzero(pc.is_in(base["sow_key"], value_set=pa.concat_arrays(
            [upserts["sow_key"].combine_chunks(), deleted_keys])).to_numpy(zero_copy_only=False))
        if maybe.size:
            touched = pa.concat_arrays([_record_ids(upserts["topic"], upserts["sow_key"]),
                                        _record_ids(deleted_topics, deleted_keys)])
            ids = _record_ids(base["topic"].take(maybe), base["sow_key"].take(maybe))
            mask = np.ones(base.num_rows, dtype=bool)
            mask[maybe[pc.is_in(ids, value_set=touched).to_numpy(zero_copy_only=False)]] = False
            kept = base.filter(pa.array(mask))
    return pa.concat_tables([kept.select(SOW_SCHEMA.names).cast(SOW_SCHEMA), upserts])


def _record_ids(topics, keys) -> pa.Array:
    """One value per record, distinct for distinct (topic, key): the topic's length, the topic, the key."""
    ids = pc.binary_join_element_wise(pc.cast(pc.utf8_length(topics), pa.string()), topics, keys, "\x00")
    return ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids


class SowTable:
    """The Delta table of one ``<SOW><Topic>`` (see the module docstring); the compactor is its one writer."""

    def __init__(self, layout: StorageLayout, sow: SowTopic, *, start_seq: int = 0, create: bool = True) -> None:
        """Open the table, creating it when absent: a SOW topic starts empty at ``start_seq`` (the txlog's
        position when it was first configured), so rows stored before that are not folded into it.
        ``create=False``: a table that does not exist raises ``TableNotFoundError`` (another instance's)."""
        self.sow = sow
        self.path = table_path(layout, sow)
        try:
            self.table = open_table(self.path)
        except TableNotFoundError:
            if not create:
                raise
            if isinstance(self.path, Path):
                self.path.mkdir(parents=True, exist_ok=True)
            self.table = DeltaTable.create(
                str(self.path), SOW_SCHEMA, mode="ignore", partition_by=["bucket"], name=f"sow {sow.name}",
                configuration={"replication.sow.buckets": str(DEFAULT_BUCKETS), "replication.sow.topic": sow.name,
                               "delta.checkpointInterval": "50"},
                commit_properties=CommitProperties(app_transactions=[Transaction(APP_ID, start_seq)]),
                raise_if_key_not_exists=False,  # our own replication.sow.* properties
                storage_options=delta_options_for(str(self.path)),
            )
        self.buckets = int(self.table.metadata().configuration.get("replication.sow.buckets", DEFAULT_BUCKETS))
        self.last_compaction_s = 0.0
        self._base: tuple[int, pa.Table] | None = None
        """(table version, its every record): what this object's last compaction wrote, kept in memory."""
        self.compacted_through = self.through_seq
        """:attr:`through_seq` as of this object's last open, compaction or replace (for status: no log read)."""

    @property
    def through_seq(self) -> int:
        """The txlog seq through which the base holds every change."""
        return self.table.transaction_version(APP_ID) or 0

    def records(self, bucket_set: set[int] | None = None) -> pa.Table:
        """Base records (all, or of some buckets)."""
        dataset = arrow_dataset(self.table)
        where = ds.field("bucket").isin(sorted(bucket_set)) if bucket_set is not None else None
        return dataset.to_table(filter=where).select(SOW_SCHEMA.names).cast(SOW_SCHEMA)

    def replace(self, records: pa.Table, through: int) -> None:
        """Make the table hold exactly ``records`` (SOW_SCHEMA) as of txlog seq ``through`` (one commit)."""
        write_deltalake(
            self.table, records.cast(SOW_SCHEMA), mode="overwrite", partition_by=["bucket"],
            commit_properties=CommitProperties(app_transactions=[Transaction(APP_ID, through)]),
        )
        self.table.update_incremental()
        self._base = None
        self.compacted_through = through

    def compact(self, txlog: TxlogFiles, topics: SowTopics, index: int, through: int,
                recent: RecentRows | None = None) -> bool:
        """Bring the base up to txlog seq ``through``; False when it already is. One commit.
        ``recent``: the rows the ingest writer just committed, used instead of reading them back."""
        started = time.monotonic()
        self.table.update_incremental()
        since = self.compacted_through = self.through_seq
        if through <= since:
            return False
        read = partial(txlog.read, schema=TAIL_SCHEMA)
        rows = recent.rows(since, through, read) if recent is not None else read(since, through)
        changes = net_changes(rows, topics, index)
        upserts = as_records(changes.upserts, self.buckets)
        touched = set(pc.unique(upserts["bucket"]).to_pylist()) | {
            bucket_of(t, k, self.buckets) for t, k in changes.deleted}
        version = self.table.version()
        cached = self._base[1] if self._base is not None and self._base[0] == version else None
        if cached is not None:  # the table as this object last wrote it: no read
            in_touched = pc.is_in(cached["bucket"], value_set=pa.array(sorted(touched), pa.int32()))
            base = _where(cached, in_touched)
        else:
            base = self.records(touched) if touched else SOW_SCHEMA.empty_table()
        if touched:
            merged = apply_changes(base, changes, self.buckets, upserts=upserts)
            predicate = f"bucket IN ({', '.join(str(b) for b in sorted(touched))})"
        else:
            merged, predicate = SOW_SCHEMA.empty_table(), "bucket IN (-1)"  # nothing changed: record the position
        failpoints.hit("sow.before_compaction_commit")
        write_deltalake(
            self.table, merged, mode="overwrite", predicate=predicate, partition_by=["bucket"],
            commit_properties=CommitProperties(app_transactions=[Transaction(APP_ID, through)],
                                               custom_metadata={"replication.sow": f"through {through}"}),
        )
        failpoints.hit("sow.after_compaction_commit")
        self.table.update_incremental()
        # Kept for the next compaction: the untouched buckets as they were and the touched ones as just written,
        # when the whole table is known (cached, or every bucket rewritten) and small enough.
        whole = (pa.concat_tables([_where(cached, pc.invert(in_touched)), merged]) if cached is not None else
                 merged if len(touched) == self.buckets else None)
        if whole is not None and whole.num_rows and whole["data"].num_chunks > 64:
            whole = whole.combine_chunks()
        ours = self.table.version() == version + 1  # (no other commit since: the table is what we wrote)
        self._base = (version + 1, whole) if ours and whole is not None and whole.nbytes <= MAX_CACHED_BASE_BYTES \
            else None
        self._vacuum()
        self.last_compaction_s = time.monotonic() - started
        self.compacted_through = through
        return True

    def _vacuum(self) -> None:
        """Remove files no recent snapshot needs: each compaction replaces whole buckets.

        deltalake's vacuum in its default (lite) mode deletes only files that a commit removed, never
        files no commit names: a user's OPTIMIZE still writing its files next to ours loses nothing.
        """
        cutoff = (time.time() - KEEP_SNAPSHOTS_S) * 1000
        recent = [e["version"] for e in self.table.history(limit=100) if e.get("timestamp", 0) >= cutoff]
        self.table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False, full=False,
                          keep_versions=sorted(set(recent) | {self.table.version()}))


def tail_rows(txlog: TxlogFiles, since: int, through: int | None = None) -> pa.Table:
    """The txlog rows a SOW fold reads (:data:`TAIL_COLUMNS`) with ``since < seq <= through`` (default: the end)."""
    if through is None:
        txlog.refresh()
        through = txlog.committed_seq
    return txlog.read(since, max(through, since), schema=TAIL_SCHEMA)


def rebuild_state(state: SowState, tables: list[SowTable], txlog: TxlogFiles, through: int) -> None:
    """Fill ``state`` with every SOW topic's records as of txlog seq ``through``: each table's base, then
    the txlog rows after it."""
    for records, table in zip(state.records, tables, strict=True):
        _hold(records, table.records())
    fold_tail(state, txlog, [t.through_seq for t in tables], through)


def fold_tail(state: SowState, txlog: TxlogFiles, since: list[int], through: int) -> None:
    """Fold the txlog rows after ``since[i]`` through ``through`` into each SOW topic ``i`` of ``state``
    (read once, from the oldest position)."""
    start = min(since, default=through)
    if through > start:
        rows = txlog.read(start, through, schema=TAIL_SCHEMA)
        seqs = rows["seq"].to_numpy()
        for index, after in enumerate(since):
            changes = net_changes(rows.slice(int((seqs <= after).sum())), state.topics, index)
            records = state.records[index]
            for topic, key in changes.deleted:
                records.get(topic, {}).pop(key, None)
            _hold(records, changes.upserts)
    state.applied_seq = max(state.applied_seq, through)


def _hold(records: dict[str, dict[str, bytes]], rows: pa.Table) -> None:
    """Put ``rows``' records (``topic``, ``sow_key``, ``data``) into a SOW state's topic -> key -> body."""
    for topic, key, data in zip(*(rows[c].to_pylist() for c in ("topic", "sow_key", "data")), strict=True):
        records.setdefault(topic, {})[key] = data or b""  # (None marks a deleted record in the state)


def sow_topic_for(cfg: InstanceConfig, topic: str) -> tuple[int, SowTopic]:
    """The ``<SOW><Topic>`` holding ``topic`` (first match, any message type); :class:`InputError` when none does."""
    topics = SowTopics.of(cfg)
    for index, sow in enumerate(cfg.sow_topics):
        if topics.index(topic, sow.message_type) == index:
            return index, sow
    names = ", ".join(repr(s.name) for s in cfg.sow_topics) or "none"
    raise InputError(f"{topic!r} is not a SOW topic of {cfg.name} (its SOW topics: {names})")


def exact_records(table: SowTable, txlog: TxlogFiles, topics: SowTopics, index: int, *, through: int | None = None,
                  topic: str | None = None, keys: list[str] | None = None, filter: Filter | None = None) -> pa.Table:
    """The exact records of one SOW topic (SOW_SCHEMA): its table's base plus the txlog rows after it, up to
    ``through`` (default: the txlog's end). ``topic`` / ``keys`` / ``filter`` narrow it; keys read only their
    buckets; a filter is tested on the base before anything is copied (a change to a record that no longer
    matches removes it)."""
    buckets = {bucket_of(topic, k, table.buckets) for k in keys} if keys is not None and topic is not None else None
    base = table.records(buckets)
    if topic is not None:
        base = _where(base, pc.equal(base["topic"], topic))
    if keys is not None:
        base = _where(base, pc.is_in(base["sow_key"], value_set=pa.array(keys, pa.string())))
    tail = tail_rows(txlog, table.through_seq, through)
    if topic is not None:
        tail = tail.filter(pc.equal(tail["topic"], topic))
    changes = net_changes(tail, topics, index)
    if filter is not None:
        message_type = table.sow.message_type
        base = _where(base, matching(filter, base["data"], message_type, valid_json=True))
        ups = changes.upserts
        keep = matching(filter, ups["data"], message_type, valid_json=True)
        gone = ups.filter(pa.array(~keep))
        changes = Changes(ups.filter(pa.array(keep)), changes.deleted | set(zip(
            gone["topic"].to_pylist(), gone["sow_key"].to_pylist(), strict=True)))
    records = apply_changes(base, changes, table.buckets)
    if keys is not None:
        records = records.filter(pc.is_in(records["sow_key"], value_set=pa.array(keys, pa.string())))
    return records


def _where(rows: pa.Table, mask) -> pa.Table:
    """``rows.filter(mask)``, without a copy when every row is kept."""
    mask = pc.fill_null(mask if isinstance(mask, (pa.Array, pa.ChunkedArray)) else pa.array(mask), False)
    return rows if pc.all(mask).as_py() is not False else rows.filter(mask)


def read_current(cfg: InstanceConfig, topic: str, *, keys: list[str] | None = None,
                 filter: Filter | None = None) -> pa.Table:
    """The exact current records of ``topic`` (SOW_SCHEMA, seq order): the base plus the txlog rows after it.

    ``keys`` (as shown in ``sow_key``) reads only their buckets; ``filter`` keeps
    the records it matches. Raises :class:`InputError` when ``topic`` is not a SOW topic.
    """
    index, sow = sow_topic_for(cfg, topic)
    layout = StorageLayout.of(cfg.storage)
    return exact_records(SowTable(layout, sow), TxlogFiles(str(layout.txlog)), SowTopics.of(cfg), index,
                         topic=topic, keys=keys, filter=filter).sort_by("seq")
