"""Backfill parts handed to the ingest as txlog files: stored by writing in their ``seq``, not rewritten.

A backfill (:mod:`replication.backfill`) writes each part of its input as a
txlog file (:data:`TXLOG_SCHEMA`, the rows as this instance stores a publish)
in the inbox's staging directory, and commits a descriptor of it to the inbox
(a commit with no rows, :data:`replication.inbox.schema.STAGED_PART_KEY`). The inbox stays
the instance's one batch entrance, running or not, and the ingest writer the
txlog's one writer: only it knows the rows' ``seq`` and ``persist_time``. The
part's file has those two columns laid out to be overwritten in place
(:mod:`replication.connectors.parquet_in_place`), so the writer stores a part
by moving its file into the txlog's directory, writing those two columns and
adding the file in the batch's txlog commit: its bodies are neither read nor
written again.

That fast path is taken when it stores exactly what classifying the part's
rows would: none of them stored already (its client's high-water mark below
its first sequence), its client publishing nothing else in the batch, its
topics recorded here and none of them a SOW topic (rows of a SOW topic get
their keys and fold into the SOW as they are classified), its origin this
instance. Otherwise its rows are read and classified with the batch's others
(the fallback): the result is the same either way.

Order and crashes: the fast parts take the batch's first seqs, in inbox
order, the classified rows the next. A crash after a part's file was moved
and written, before the commit, leaves it in the txlog's directory
uncommitted; the batch's replay finds it there and writes the same seqs again.
A file moved into the txlog is committed at most once: only a part whose
first sequence is above its client's high-water mark is patched, and the
commit that adds it raises that mark past the part. A crash between the
commit and the removal of a classified part's file leaves that file behind,
uncommitted (no reader lists the directory; a vacuum removes it). Like the
files delta-rs writes for the txlog, a part's file is not fsynced before the
commit: a crashed process loses nothing, a power cut may.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from replication import failpoints
from replication.config.model import InstanceConfig
from replication.connectors import parquet_in_place
from replication.connectors.delta.log_files import log_file_options
from replication.connectors.delta.stats import (
    constant_stats,
    file_stats,
    merged,
    stats_json,
)
from replication.connectors.s3.access import arrow_location
from replication.connectors.s3.objects import ObjectPath
from replication.ingest.classify import CANDIDATE_SCHEMA, TopicRecorder
from replication.messages import publisher_id
from replication.sow.keys import SowTopics
from replication.storage.layout import StorageLayout, StoragePath
from replication.txlog.schema import REJECTED_SCHEMA, TXLOG_SCHEMA

log = logging.getLogger(__name__)

#: ``source`` of the candidate row that stands for one staged part (its descriptor in ``data``).
STAGED_MARK = "staged-part"
#: The inbox's directory of staged parts (``StorageLayout.backfill_staging``): a part's file is nowhere else.
STAGING = "_backfill"
#: The columns only the ingest writer can fill: written in place.
PATCHED = ("seq", "persist_time")
#: A part with more distinct topics than this names none in its descriptor (the ingest classifies its rows).
MAX_TOPICS = 1000
_TS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class StagedPart:
    """A backfill part waiting in the inbox's staging directory: what its inbox descriptor says."""

    file: str
    """Its file, relative to the inbox table's directory."""
    client: str
    rows: int
    first: int
    """Its first and last ``publisher_seq`` (rows rejected by the backfill are not in it)."""
    last: int
    message_type: str
    origin: str
    topics: tuple[str, ...] | None
    """Its distinct topics (None: more than :data:`MAX_TOPICS`)."""
    stats: dict
    """The file's Delta statistics, but for :data:`PATCHED`."""
    version: int = -1
    """The inbox version that handed it over."""

    def to_json(self) -> str:
        body = {k: v for k, v in self.__dict__.items() if k != "version"}
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes, version: int = -1) -> StagedPart:
        raw = json.loads(text)
        topics = raw.get("topics")
        return cls(raw["file"], raw["client"], int(raw["rows"]), int(raw["first"]), int(raw["last"]),
                   raw["message_type"], raw["origin"], tuple(topics) if topics is not None else None,
                   raw.get("stats") or {}, version)


# -- the backfill's side: writing a part ------------------------------------------------------------


def part_rows(instance: str, client: str, message_type: str, topics: pa.Array, bodies: pa.Array,
              publisher_seqs: pa.Array, now: datetime) -> pa.Table:
    """The txlog rows of publishes of ``client`` at ``instance`` (``seq`` and ``persist_time``: placeholders)."""
    n = len(bodies)
    ts = pa.repeat(pa.scalar(now, _TS), n)
    nulls = pa.nulls(n, pa.string())

    def constant(value: str) -> pa.Array:
        return pa.repeat(pa.scalar(value, pa.string()), n)

    # messages.bookmark(client, seq) of every row, column-wise: "<publisher id>|<seq>|"
    bookmarks = pc.binary_join_element_wise(str(publisher_id(client)), pc.cast(publisher_seqs, pa.string()), "", "|")
    # path: [instance] each (from offsets: pa.repeat of a list scalar is slow)
    path = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), constant(instance))
    columns = {
        "seq": pa.array(np.zeros(n, dtype=np.int64)), "bookmark": bookmarks, "publisher": constant(client),
        "publisher_seq": publisher_seqs, "topic": topics, "message_type": constant(message_type),
        "command": constant("publish"), "sow_key": nulls, "sow_keys": nulls, "filter": nulls, "data": bodies,
        "origin": constant(instance), "received_from": nulls, "received_from_group": nulls, "path": path,
        "publish_time": ts, "persist_time": ts,
    }
    return pa.table([columns[f.name] for f in TXLOG_SCHEMA], schema=TXLOG_SCHEMA)


def write_part(directory: StoragePath, inbox: StoragePath, rows: pa.Table, *, name: str) -> StagedPart:
    """Write ``rows`` (from :func:`part_rows`) as the staged file ``directory/name``; its descriptor (``file``
    relative to the ``inbox`` table's directory). A local path or a key in a bucket."""
    path = directory / name
    where, filesystem = arrow_location(str(path))
    # as the txlog's own files, but for the two columns written in place later
    base = log_file_options(rows.column_names)
    patched = parquet_in_place.writer_options(list(PATCHED), rows.column_names)
    pq.write_table(rows, where, filesystem=filesystem, **{
        **patched, "compression": {c: "NONE" if c in PATCHED else base["compression"] for c in rows.column_names},
        "use_dictionary": [c for c in base["use_dictionary"] if c not in PATCHED],
        "write_statistics": [c for c in base["write_statistics"] if c not in PATCHED]})
    n = rows.num_rows
    # the columns one value fills, without a scan; the others (bookmark, publisher_seq, topic) scanned
    known = merged(*(constant_stats(c, rows[c][0].as_py() if n else None, n) for c in (
        "publisher", "message_type", "command", "origin", "publish_time", "sow_key", "sow_keys", "filter",
        "received_from", "received_from_group")))
    stats = file_stats(rows.drop_columns(list(PATCHED)), given=known)
    topics = pc.unique(rows["topic"])
    seqs = rows["publisher_seq"]
    return StagedPart(
        file=_relative(path, inbox), client=rows["publisher"][0].as_py(), rows=n,
        first=seqs[0].as_py(), last=seqs[-1].as_py(), message_type=rows["message_type"][0].as_py(),
        origin=rows["origin"][0].as_py(), topics=tuple(topics.to_pylist()) if len(topics) <= MAX_TOPICS else None,
        stats=stats)


def _relative(path: StoragePath, inbox: StoragePath) -> str:
    """``path``'s name relative to the ``inbox`` table's directory (on a disk or in a bucket)."""
    if isinstance(path, Path) and isinstance(inbox, Path):
        return path.relative_to(inbox).as_posix()
    prefix = f"{inbox}/"
    if not str(path).startswith(prefix):
        raise ValueError(f"{path} is not in the inbox {inbox}")
    return str(path)[len(prefix):]


def open_staged(path: StoragePath) -> pq.ParquetFile:
    """A staged file, on a disk or in a bucket (read through Arrow's own S3 filesystem)."""
    where, filesystem = arrow_location(str(path))
    return pq.ParquetFile(filesystem.open_input_file(where) if filesystem is not None else where)


# -- the ingest's side: taking parts --------------------------------------------------------------


def markers(parts: list[tuple[int, str]]) -> pa.Table:
    """Candidate rows standing for staged parts: ``(inbox version, descriptor JSON)`` each."""
    n = len(parts)
    described = [StagedPart.from_json(text, version) for version, text in parts]
    columns = {
        "source": pa.repeat(pa.scalar(STAGED_MARK), n), "publisher": pa.array([p.client for p in described]),
        "publisher_seq": pa.array([str(p.first) for p in described]),
        "data": pa.array([text.encode() for _, text in parts], pa.binary()),
        "inbox_version": pa.array([version for version, _ in parts], pa.int64()),
    }
    return pa.table({f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in CANDIDATE_SCHEMA},
                    schema=CANDIDATE_SCHEMA)


@dataclass
class _Stored:
    part: StagedPart
    path: Path
    """Its file in the txlog's directory."""
    first_seq: int


@dataclass
class Taken:
    """What :meth:`StagedParts.take` made of a batch's staged parts."""

    candidates: pa.Table
    """The batch's other rows, with the rows of parts that are classified in their place."""
    stored: list[_Stored] = field(default_factory=list)
    """Parts stored as they are, with the first of the seqs written in: the batch's first seqs."""
    rows: int = 0
    """Rows of ``stored``."""
    duplicates: int = 0
    """Rows of parts stored already (a replayed inbox)."""
    rejected: pa.Table | None = None
    """One row per part whose file is gone (its rows cannot be stored)."""
    consumed: list[StoragePath] = field(default_factory=list)
    """Staged files done with once the batch is committed."""

    def publishers(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stored:
            out[s.part.client] = max(out.get(s.part.client, 0), s.part.last)
        return out

    def publisher_rows(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """client -> runs ``(firsts, lasts)`` of the local seqs its stored parts got."""
        runs: dict[str, list[tuple[int, int]]] = {}
        for s in self.stored:
            spans = runs.setdefault(s.part.client, [])
            last = s.first_seq + s.part.rows - 1
            if spans and spans[-1][1] + 1 == s.first_seq:
                spans[-1] = (spans[-1][0], last)
            else:
                spans.append((s.first_seq, last))
        return {c: (np.array([a for a, _ in r], np.int64), np.array([b for _, b in r], np.int64))
                for c, r in runs.items()}

    def actions(self, txlog: Path, now: datetime) -> list[AddAction]:
        """The add actions of the stored parts' files (their statistics completed with ``seq`` and
        ``persist_time``)."""
        out = []
        for s in self.stored:
            n = s.part.rows
            stats = merged({"numRecords": n}, s.part.stats, constant_stats("persist_time", now, n),
                           {"minValues": {"seq": s.first_seq}, "maxValues": {"seq": s.first_seq + n - 1},
                            "nullCount": {"seq": 0}})
            out.append(AddAction(s.path.relative_to(txlog).as_posix(), s.path.stat().st_size, {},
                                 int(time.time() * 1000), True, stats_json(stats)))
        return out

    def clean_up(self) -> None:
        """Remove the staged files the committed batch is done with (a crash before leaves them: harmless)."""
        for path in self.consumed:
            try:
                path.unlink(missing_ok=True)
            except Exception:  # (a disk's or a bucket's error: the batch is committed; the next backfill removes it)
                log.warning("could not remove %s (a backfill part already stored)", path, exc_info=True)


class StagedParts:
    """The ingest writer's handling of staged backfill parts (see the module docstring)."""

    def __init__(self, cfg: InstanceConfig, layout: StorageLayout, recorded: TopicRecorder) -> None:
        self.instance = cfg.name
        self.inbox = layout.inbox
        self.txlog = layout.txlog
        self.recorded = recorded
        self.sow = SowTopics.of(cfg)
        self.stats = {"stored_as_is": 0, "classified": 0}
        """Parts taken each way (for tests and benchmarks)."""

    def take(self, batch: pa.Table, publishers: dict[str, int], max_seq: int, now: datetime) -> Taken:
        """Split ``batch``'s staged parts into those stored as they are (moved into the txlog's directory and
        given seqs ``max_seq + 1 ...`` and ``persist_time`` ``now``) and those whose rows are classified
        (put in the candidates in their marker's place). ``publishers``: the stored high-water marks."""
        marks = pc.fill_null(pc.equal(batch["source"], STAGED_MARK), False)
        if not pc.any(marks).as_py():
            return Taken(batch)
        at = np.flatnonzero(marks.to_numpy(zero_copy_only=False))
        data, versions = batch["data"], batch["inbox_version"]
        parts = [StagedPart.from_json(data[int(i)].as_py(), versions[int(i)].as_py()) for i in at]
        others = batch.filter(pc.invert(marks))
        elsewhere = set(pc.unique(others["publisher"]).to_pylist()) if others.num_rows else set()
        taken = Taken(batch)
        # 1. per part: stored already, gone, or whether it could be stored as it is
        kind: list[str] = []  # "duplicate", "missing", "as_is", "classify"
        where: list[StoragePath | None] = []
        spans: list[dict | None] = []
        running = dict(publishers)
        missing: list[tuple[StagedPart, str]] = []  # (and why)
        for part in parts:
            top = running.get(part.client, 0)
            path = self._locate(part)
            where.append(path)
            spans.append(None)
            if part.last <= top:
                kind.append("duplicate")
                taken.duplicates += part.rows
                continue
            running[part.client] = part.last
            if path is None:
                kind.append("missing")
                missing.append((part, "is gone from the inbox's staging directory"))
                continue
            if part.first > top and part.client not in elsewhere and self._as_is(part) and isinstance(path, Path):
                spans[-1] = self._spans(path, part)
            kind.append("as_is" if spans[-1] is not None else "classify")
        # 2. a client with a part classified has every part of the batch classified (its order), as has one
        #    whose file could not be written in place (tried again without it, until every write succeeds)
        excluded = {p.client for p, k in zip(parts, kind) if k == "classify"}
        while True:
            taken.stored, seq, failed = [], max_seq + 1, False
            for i, part in enumerate(parts):
                if kind[i] != "as_is" or part.client in excluded:
                    continue
                moved = self.txlog / Path(part.file).name
                staged, part_spans = where[i], spans[i]
                # "as_is": its file found on this disk, its spans read
                assert isinstance(staged, Path) and part_spans is not None
                try:
                    if staged != moved:
                        os.rename(staged, moved)
                        where[i] = moved
                    parquet_in_place.overwrite(str(moved), part_spans, {
                        "seq": np.arange(seq, seq + part.rows, dtype=np.int64),
                        "persist_time": np.full(part.rows, _micros(now), dtype=np.int64)})
                except (OSError, parquet_in_place.NotInPlace) as exc:
                    log.warning("%s: backfill part %s (client %s) could not be stored as it is (%s); its rows are "
                                "classified instead", self.instance, part.file, part.client, exc)
                    excluded.add(part.client)
                    failed = True
                    break
                taken.stored.append(_Stored(part, moved, seq))
                seq += part.rows
                failpoints.hit("ingest.staged_part_written")
            if not failed:
                break
        taken.rows = seq - max_seq - 1
        # 3. the candidates: the others, with the classified parts' rows in their markers' places
        pieces, previous = [], 0
        for i, row in enumerate(at.tolist()):
            pieces.append(batch.slice(previous, row - previous))
            previous = row + 1
            part, path = parts[i], where[i]
            classified = kind[i] == "classify" or (kind[i] == "as_is" and part.client in excluded)
            if classified:
                assert path is not None  # "classify" and "as_is" are given only to a part whose file was found
                try:
                    pieces.append(self._candidates(part, path))
                    self.stats["classified"] += 1
                except (OSError, pa.ArrowException) as exc:  # (a broken file must not stop the ingest: kept)
                    missing.append((part, f"cannot be read ({str(exc).splitlines()[0][:200]})"))
                    continue
            # done with once committed: a classified part's file (staged, or moved into the txlog's directory
            # by an earlier try and not committed), a duplicate's staged one (never one in the txlog's
            # directory: that one is committed)
            if path is not None and (classified or (kind[i] == "duplicate" and str(path.parent) != str(self.txlog))):
                taken.consumed.append(path)
        pieces.append(batch.slice(previous))
        taken.candidates = pa.concat_tables([p for p in pieces if p.num_rows] or [batch.slice(0, 0)])
        self.stats["stored_as_is"] += len(taken.stored)
        if missing:
            taken.rejected = _missing_rows(missing, now)
            for part, why in missing:
                log.error("%s: backfill part %s of client %s (sequences %d..%d) %s: its rows cannot be stored (said "
                          "in rejected/). Fix: backfill those rows again under a new --client", self.instance,
                          part.file, part.client, part.first, part.last, why)
        return taken

    def _locate(self, part: StagedPart) -> StoragePath | None:
        """The part's file: staged, or moved into the txlog's directory by an earlier try of the batch (None:
        neither, or a descriptor naming a file outside the staging directory)."""
        if isinstance(self.inbox, ObjectPath):  # (in a bucket: never moved, see _as_is)
            names = part.file.split("/")
            if names[0] != STAGING or ".." in names or not part.file.endswith(".parquet"):
                return None
            key = self.inbox / part.file
            return key if key.is_file() else None
        staged = self.inbox / part.file
        if not staged.resolve().is_relative_to((self.inbox / STAGING).resolve()) or staged.suffix != ".parquet":
            return None
        for path in (staged, self.txlog / staged.name):
            if path.exists():
                return path
        return None

    def _as_is(self, part: StagedPart) -> bool:
        """Whether classifying the part's rows would store them exactly as its file holds them."""
        if part.origin != self.instance or part.topics is None:
            return False
        if isinstance(self.txlog, ObjectPath):  # no rename in a bucket, no write in place in an object
            log.info("%s: backfill part %s (client %s) is classified: parts are stored as they are on a local "
                     "disk only, and this txlog is in a bucket", self.instance, part.file, part.client)
            return False
        return all(self.recorded(t, part.message_type) and self.sow.index(t, part.message_type) < 0
                   for t in part.topics)

    @staticmethod
    def _spans(path: Path, part: StagedPart) -> dict | None:
        """Where the file's ``seq`` and ``persist_time`` values are; None when it is not the txlog file its
        descriptor says (its rows, its columns and their types) laid out to write them in place."""
        try:
            file = pq.ParquetFile(path)
            if file.metadata.num_rows != part.rows or not file.schema_arrow.equals(TXLOG_SCHEMA):
                return None
            return parquet_in_place.value_spans(str(path), list(PATCHED), file.metadata)
        except (OSError, parquet_in_place.NotInPlace, pa.ArrowException):
            return None

    def _candidates(self, part: StagedPart, path: StoragePath) -> pa.Table:
        """The part's rows as candidate rows (publishes of its client here, as a backfill's inbox rows were)."""
        where, filesystem = arrow_location(str(path))
        rows = pq.read_table(where, filesystem=filesystem, schema=TXLOG_SCHEMA, columns=[
            "publisher", "publisher_seq", "topic", "message_type", "command", "sow_key", "sow_keys", "filter", "data",
            "origin", "received_from", "received_from_group", "path", "publish_time"], partitioning=None)
        n = rows.num_rows
        columns = {
            "source": pa.repeat(pa.scalar("backfill"), n), "publisher_seq": pc.cast(rows["publisher_seq"], pa.string()),
            "inbox_version": pa.repeat(pa.scalar(part.version, pa.int64()), n),
        }
        return pa.table({f.name: columns[f.name] if f.name in columns else
                         rows[f.name] if f.name in rows.column_names else pa.nulls(n, f.type)
                         for f in CANDIDATE_SCHEMA}, schema=CANDIDATE_SCHEMA)


def _missing_rows(parts: list[tuple[StagedPart, str]], now: datetime) -> pa.Table:
    """A rejected row per part whose rows cannot be stored: its first sequence, its range in the reason."""
    n = len(parts)
    return pa.table({
        "reason": [f"backfill part {p.file} {why}: client {p.client}'s messages {p.first}..{p.last} ({p.rows:,}) "
                   "cannot be stored. Fix: backfill those rows again under a new --client" for p, why in parts],
        "source": ["backfill"] * n, "kafka_topic": pa.nulls(n, pa.string()), "kafka_partition": pa.nulls(n, pa.int32()),
        "kafka_offset": pa.nulls(n, pa.int64()), "publisher": [p.client for p, _ in parts],
        "publisher_seq": [str(p.first) for p, _ in parts], "topic": pa.nulls(n, pa.string()),
        "message_type": [p.message_type for p, _ in parts], "command": ["publish"] * n,
        "data": pa.nulls(n, pa.binary()),
        "rejected_time": pa.repeat(pa.scalar(now, _TS), n),
    }, schema=REJECTED_SCHEMA)


def _micros(now: datetime) -> int:
    return int(pa.scalar(now, _TS).value)


def staged_name(first_seq: int) -> str:
    """The file name of a backfill's part whose first row has sequence ``first_seq``: that first (a re-run
    finds the files of a killed run's parts it never handed over)."""
    return f"{first_seq:012d}-{uuid.uuid4().hex}.parquet"
