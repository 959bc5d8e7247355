"""Bootstrap: an empty (or rebuilt) instance copies another instance's messages before it serves anything.

AMPS's "Bootstrap Initialization of AMPS Replication", for an instance whose
``<Bootstrap>`` names topics, data types and a source ``<Transport>``:

- it runs at start when the txlog holds no message, or when an earlier
  bootstrap was interrupted (``_control/bootstrap.json`` says ``copying``);
  an instance with messages never bootstraps;
- the source is the first ``<InetAddr>`` holding an instance (a txlog and an
  ``instance.json``), in priority order;
- ``txlog``: the source's txlog rows of the configured topics, in the
  source's order, including rows that originated here (replication never sends
  those back), with their bookmark, publisher, publisher_seq, origin, path and
  publish_time; this instance gives them its own ``seq``. A row that
  originated here counts as published here (``received_from`` null), any other
  as received from the source, so the routing rules treat both as replication
  would have;
- ``sow``: the source's current SOW records of the configured topics that are
  SOW topics here, including records whose txlog rows the source no longer has;
- the copy is one consistent snapshot: the source's txlog up to the seq it had
  when the bootstrap began, and its SOW as of that seq.

Order of effects (each safe to crash after; a restart resumes):

1. the source's SOW records as of the snapshot are staged under ``_bootstrap/``;
2. ``bootstrap.json`` is written (``copying``, the snapshot's position);
3. txlog rows are appended in chunks, each an idempotent commit (app
   transaction ``bootstrap``) whose metadata says how far in the source it got
   and carries its publishers' positions, so the instance's per-publisher
   high-water marks (duplicate detection, resync) come out right;
4. the staged SOW records become this instance's SOW tables, as of the copy's
   last seq (their ``seq`` mapped to the copied rows' by bookmark, 0 for a
   record whose txlog row the copy does not hold);
5. ``bootstrap.json`` says ``done``; the staging is removed.

Two empty instances configured to bootstrap from each other would wait for
each other for ever in AMPS; here the second to look finds the first empty and
configured to bootstrap from it, and stops with the fix.

Per-publisher duplicate detection means a bootstrap that copies only some
topics leaves marks that also cover that publisher's messages on the other
topics: bootstrap every topic the instance takes by replication.
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.exceptions import DeltaError, TableNotFoundError

from replication import failpoints
from replication.config.environment import rows_from_environment
from replication.config.fabric import addresses_of, normalize_address
from replication.config.model import InstanceConfig, TopicSpec
from replication.connectors.delta.tables import (
    IdempotentAppender,
    arrow_dataset,
    commit_metadata_since,
    open_table,
)
from replication.errors import ReplicationError, StorageAccessError
from replication.routing import regex_matches
from replication.sow.keys import SowTopics
from replication.sow.table import SOW_SCHEMA, SowTable, exact_records, topic_id
from replication.storage.control import BootstrapState, read_instance_config
from replication.storage.layout import StorageLayout, StoragePath, remove_tree
from replication.txlog.files import TxlogFiles
from replication.txlog.schema import TXLOG_SCHEMA

log = logging.getLogger(__name__)

#: App transaction of the bootstrap's txlog commits.
APP_ID = "bootstrap"
#: Rows per txlog commit (memory holds one chunk at a time), unless ``REPLICATION_BOOTSTRAP_CHUNK_ROWS`` says.
CHUNK_ROWS = 200_000


def chunk_rows() -> int:
    """Rows per txlog commit of a bootstrap: ``REPLICATION_BOOTSTRAP_CHUNK_ROWS``, else :data:`CHUNK_ROWS`."""
    return rows_from_environment("REPLICATION_BOOTSTRAP_CHUNK_ROWS", CHUNK_ROWS, minimum=1, example="200000")
#: Source seqs read at a time.
READ_SEQS = 200_000

#: ``(rows of the source scanned, rows of the source in the snapshot)``, after each chunk.
Progress = Callable[[int, int], None]


class BootstrapError(ReplicationError):
    """A bootstrap cannot run: no usable source, two empty instances bootstrapping from each other, a source
    that changed under an interrupted bootstrap. Terminal (the message says what to change), but for sources
    that all failed only because their endpoints could not be reached (``transient``)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class Source:
    address: str
    layout: StorageLayout
    cfg: InstanceConfig


@dataclass(frozen=True)
class Result:
    source: str
    rows: int
    """Txlog rows copied."""
    sow_records: int
    seconds: float


def needed(cfg: InstanceConfig, layout: StorageLayout) -> bool:
    """Does this instance bootstrap at start: it has a ``<Bootstrap>``, and an empty txlog or an interrupted
    bootstrap? (An instance with messages never does; that is logged once.)"""
    if cfg.bootstrap is None:
        return False
    state = BootstrapState.read(layout.bootstrap_json)
    if state is not None and state.state == "copying":
        return True
    rows = txlog_rows(layout)
    if rows:
        log.info("%s: the transaction log holds %d messages: no bootstrap (an instance with messages never "
                 "bootstraps)", cfg.name, rows)
    return rows == 0


def run(cfg: InstanceConfig, layout: StorageLayout, *, addresses: tuple[str, ...] | None = None,
        progress: Progress | None = None, log_result: bool = True) -> Result:
    """Bootstrap ``cfg``'s instance (see the module docstring); ``addresses`` overrides the source list (given
    as ``--from``). ``log_result``: log the summary (a command prints it instead)."""
    started = time.monotonic()
    spec = cfg.bootstrap
    topics = spec.topics if spec is not None else cfg.txlog_topics
    data_types = spec.data_types if spec is not None else frozenset({"txlog"} | ({"sow"} if cfg.sow_topics else set()))
    if "sow" in data_types and not any(s.message_type == t.message_type for s in cfg.sow_topics for t in topics):
        log.info("%s: <DataType> names sow, but no bootstrapped topic is a SOW topic here: the txlog alone is "
                 "copied", cfg.name)
    state = BootstrapState.read(layout.bootstrap_json)
    if state is not None and state.state == "copying":
        source = _resume_source(cfg, state)
        log.warning("%s: resuming the bootstrap from %s (%s) interrupted after %d rows", cfg.name, state.source_name,
                    state.source, state.rows_copied)
    else:
        source = choose_source(cfg, addresses, given_by="--from") if addresses else \
            choose_source(cfg, spec.inet_addrs if spec is not None else ())
        src_txlog = TxlogFiles(str(source.layout.txlog))
        staged = _stage_sow(cfg, layout, source, topics, src_txlog) if "sow" in data_types else None
        src_txlog.refresh()  # after the SOW snapshot: the txlog reaches at least as far as the SOW tables
        state = BootstrapState(source.address, source.cfg.name, open_table(str(source.layout.txlog)).metadata().id,
                               src_txlog.version or 0, src_txlog.committed_seq, started=time.time())
        _check_not_mutual(cfg, source, state.source_through)
        if staged is None:
            _remove_staging(layout)
        state.write(layout.bootstrap_json)
    failpoints.hit("bootstrap.before_copy")
    rows = _copy_txlog(cfg, layout, source, state, topics, progress) if "txlog" in data_types else 0
    records = _install_sow(cfg, layout, data_types)
    done = BootstrapState(**{**state.to_json(), "state": "done", "rows_copied": rows, "finished": time.time()})
    done.write(layout.bootstrap_json)
    _remove_staging(layout)
    result = Result(source.address, rows, records, time.monotonic() - started)
    if log_result:
        log.warning("%s: bootstrapped from %s (%s): %d txlog rows, %d SOW records in %.1fs", cfg.name,
                    source.cfg.name, source.address, rows, records, result.seconds)
    return result


# -- the source ---------------------------------------------------------------------------


def choose_source(cfg: InstanceConfig, addresses: tuple[str, ...], *,
                  given_by: str = "<Bootstrap><Transport><InetAddr>") -> Source:
    """The first address holding an instance (a txlog and an ``instance.json``), in priority order;
    ``given_by``: what gave the addresses (the fix names it)."""
    if not addresses:
        raise BootstrapError(f"{cfg.name}: no bootstrap source: give <Bootstrap><Transport><InetAddr> in the config, "
                             "or --from ADDRESS")
    tried = []
    unreachable = 0  # (each said with its own fix)
    down = 0  # of those, endpoints that could not be reached (they may come back)
    mine = addresses_of(cfg)
    for address in addresses:
        if normalize_address(address) in mine:
            tried.append(f"{address}: this instance itself")
            continue
        try:
            layout = StorageLayout.of(address).check_reachable("bootstrap source")
            source_cfg = read_instance_config(layout.instance_json)
            open_table(str(layout.txlog))
        except (FileNotFoundError, NotADirectoryError, TableNotFoundError):
            tried.append(f"{address}: no instance there (no txlog and instance.json: not an instance, or it never "
                         "started)" + (" (a file: an instance is addressed by its storage directory, not its "
                                       "config)" if os.path.isfile(address) else ""))
            continue
        except StorageAccessError as exc:  # (a bucket: its endpoint, credentials or existence)
            tried.append(str(exc))
            unreachable += 1
            down += exc.transient
            continue
        except ReplicationError as exc:
            tried.append(f"{address}: {exc}")
            continue
        except (OSError, DeltaError) as exc:  # (permission denied, an unreadable mount, a broken txlog)
            tried.append(f"{address}: cannot be read ({getattr(exc, 'strerror', None) or exc})")
            continue
        return Source(address, layout, source_cfg)
    fix = "" if unreachable == len(tried) else \
        f". Fix: start the source instance once, or point {given_by} at an instance's storage"
    raise BootstrapError(f"{cfg.name}: no usable bootstrap source; tried " + "; ".join(tried) + fix,
                         transient=bool(tried) and down == len(tried))


def _check_not_mutual(cfg: InstanceConfig, source: Source, source_through: int) -> None:
    if source_through > 0 or source.cfg.bootstrap is None:
        return  # the source has messages, or it does not wait for anyone
    mine = addresses_of(cfg)
    if any(normalize_address(a) in mine for a in source.cfg.bootstrap.inet_addrs):
        raise BootstrapError(
            f"{cfg.name} and {source.cfg.name} both have empty transaction logs and are configured to bootstrap from "
            f"each other: neither can start. Fix: start one of them once without <Bootstrap> (remove it from "
            f"{source.cfg.name}'s config for its first start, or from {cfg.name}'s), then add it back")


def _resume_source(cfg: InstanceConfig, state: BootstrapState) -> Source:
    try:
        source = choose_source(cfg, (state.source,))
        same = open_table(str(source.layout.txlog)).metadata().id == state.source_txlog_id
    except BootstrapError as exc:
        raise BootstrapError(f"{exc}. The interrupted bootstrap of {cfg.name} can only resume from {state.source}; "
                             "or delete this instance's storage to start over", transient=exc.transient) from None
    if not same:
        raise BootstrapError(
            f"{cfg.name}: the interrupted bootstrap read {state.source}'s txlog {state.source_txlog_id}, which is no "
            f"longer the txlog there. Fix: delete this instance's storage and start it again")
    return source


def txlog_rows(layout: StorageLayout) -> int:
    """Messages in the txlog at ``layout`` (0: none, or no txlog yet)."""
    try:
        return open_table(str(layout.txlog)).count()
    except TableNotFoundError:
        return 0


def _topic_mask(rows: pa.Table, topics: tuple[TopicSpec, ...]) -> pa.Array:
    """Rows whose topic and message type a bootstrap ``<Topic>`` names (AMPS topic matching)."""
    pairs = pc.dictionary_encode(pc.binary_join_element_wise(rows["topic"], rows["message_type"], "\x00"))
    pairs = pairs.combine_chunks() if isinstance(pairs, pa.ChunkedArray) else pairs
    wanted = np.array([any(t.message_type == mt and regex_matches(t.name, topic) for t in topics)
                       for topic, mt in (p.split("\x00", 1) for p in pairs.dictionary.to_pylist())] or [False])
    return pa.array(wanted[pc.fill_null(pairs.indices, 0).to_numpy(zero_copy_only=False)])


# -- the txlog ------------------------------------------------------------------------------


def _copy_txlog(cfg: InstanceConfig, layout: StorageLayout, source: Source, state: BootstrapState,
                topics: tuple[TopicSpec, ...], progress: Progress | None) -> int:
    """Append the source's rows of ``topics`` with seq <= ``state.source_through``, in chunks; resumes after the
    last chunk committed."""
    txlog = IdempotentAppender(layout.txlog, TXLOG_SCHEMA, app_id=APP_ID, name=f"{cfg.name} txlog")
    records = commit_metadata_since(txlog.table, -1) or []
    mine = [r for _, r in records if "bootstrap" in r]
    chunk = (txlog.committed_version or 0) + 1 if mine else 0
    after = int(mine[-1]["bootstrap"]["source_seq"]) if mine else 0
    local = max((int(r.get("last_seq", 0)) for _, r in records), default=0)
    copied = sum(int(r["last_seq"]) - int(r["first_seq"]) + 1 for r in mine)
    src = TxlogFiles(str(source.layout.txlog))
    src.refresh()
    after = max(after, src.first_seq - 1)  # rows the source no longer holds (its SOW may still have them)
    through = state.source_through
    pending: list[pa.Table] = []
    pending_rows = 0
    per_chunk = chunk_rows()
    while after < through or pending:
        if after < through:
            end = min(after + min(READ_SEQS, per_chunk), through)
            rows = src.read(after, end)
            rows = rows.filter(_topic_mask(rows, topics))
            after = end
            if rows.num_rows:
                pending.append(rows)
                pending_rows += rows.num_rows
            if pending_rows < per_chunk and after < through:
                continue
        if pending_rows:
            batch = pa.concat_tables(pending)
            local = _commit_chunk(txlog, batch, cfg, source, chunk, local, after)
            copied += batch.num_rows
            chunk += 1
        pending, pending_rows = [], 0
        if progress is not None:
            progress(after, through)
    return copied


def _commit_chunk(txlog: IdempotentAppender, rows: pa.Table, cfg: InstanceConfig, source: Source, chunk: int,
                  local: int, source_seq: int) -> int:
    """Append one chunk as this instance's rows ``local + 1 ...``; returns the new last seq."""
    n = rows.num_rows
    here = pc.equal(rows["origin"], cfg.name)
    received_from = pc.if_else(here, pa.scalar(None, pa.string()), pa.scalar(source.cfg.name))
    received_group = pc.if_else(here, pa.scalar(None, pa.string()), pa.scalar(source.cfg.group or source.cfg.name))
    now = pa.scalar(datetime.now(timezone.utc), pa.timestamp("us", tz="UTC"))
    out = (rows.set_column(rows.schema.get_field_index("seq"), "seq", pa.array(np.arange(local + 1, local + 1 + n)))
           .set_column(rows.schema.get_field_index("received_from"), "received_from", received_from)
           .set_column(rows.schema.get_field_index("received_from_group"), "received_from_group", received_group)
           .set_column(rows.schema.get_field_index("persist_time"), "persist_time", pa.repeat(now, n)))
    top = out.group_by("publisher").aggregate([("publisher_seq", "max")])
    metadata = {
        "batch": -1, "first_seq": local + 1, "last_seq": local + n,
        "publishers": dict(zip(top["publisher"].to_pylist(), top["publisher_seq_max"].to_pylist(), strict=True)),
        "links": {},
        "bootstrap": {"source": source.address, "source_seq": source_seq},
    }
    txlog.append(out, chunk, metadata)
    failpoints.hit("bootstrap.after_chunk")
    return local + n


# -- the SOW --------------------------------------------------------------------------------


def _stage_sow(cfg: InstanceConfig, layout: StorageLayout, source: Source, topics: tuple[TopicSpec, ...],
               src_txlog: TxlogFiles) -> int:
    """Write the source's current SOW records of ``topics`` that are SOW topics here, as of its txlog's end,
    to ``_bootstrap/<topic-id>.parquet`` per SOW topic of this instance; returns how many."""
    staging = layout.bootstrap_staging
    _remove_staging(layout)
    staging.mkdir(parents=True)
    mine = SowTopics.of(cfg)
    theirs = SowTopics.of(source.cfg)
    tables = []
    for index, sow in enumerate(source.cfg.sow_topics):
        try:
            tables.append((index, SowTable(source.layout, sow, create=False)))
        except TableNotFoundError:
            continue
    src_txlog.refresh()
    through = src_txlog.committed_seq  # the SOW tables were opened first: they reach no further than this
    by_topic: dict[int, list[pa.Table]] = {}
    for index, table in tables:
        records = exact_records(table, src_txlog, theirs, index, through=through)
        if not records.num_rows:
            continue
        records = records.filter(_topic_mask(records, topics))
        targets = np.array([mine.index(t, mt) for t, mt in zip(records["topic"].to_pylist(),
                                                                records["message_type"].to_pylist(), strict=True)]
                           or [], dtype=np.int64)
        for target in np.unique(targets[targets >= 0]).tolist():
            by_topic.setdefault(int(target), []).append(records.filter(pa.array(targets == target)))
    count = 0
    for target, parts in by_topic.items():
        staged = pa.concat_tables(parts)
        _write_staged(staged, staging / f"{topic_id(cfg.sow_topics[target].name)}.parquet")
        count += staged.num_rows
    return count


def _remove_staging(layout: StorageLayout) -> None:
    """Remove ``_bootstrap/`` (its objects, on S3)."""
    remove_tree(layout.bootstrap_staging)


def _write_staged(records: pa.Table, path: StoragePath) -> None:
    if isinstance(path, Path):
        pq.write_table(records, path)
    else:  # one PUT of the whole file
        sink = io.BytesIO()
        pq.write_table(records, sink)
        path.write_bytes(sink.getvalue())


def _read_staged(path: StoragePath) -> pa.Table:
    if not path.is_file():
        return SOW_SCHEMA.empty_table()
    return pq.read_table(path if isinstance(path, Path) else pa.BufferReader(path.read_bytes()))


def _install_sow(cfg: InstanceConfig, layout: StorageLayout, data_types: frozenset[str]) -> int:
    """This instance's SOW tables after the txlog copy: the staged source records (``sow`` data type), as of
    the last copied seq; without it, empty tables that fold every copied row."""
    last = _last_seq(layout)
    staging = layout.bootstrap_staging
    count = 0
    for sow in cfg.sow_topics:
        if "sow" not in data_types:
            SowTable(layout, sow, start_seq=0)  # the copied txlog rows make the SOW, as at any start
            continue
        table = SowTable(layout, sow, start_seq=last)
        records = _read_staged(staging / f"{topic_id(sow.name)}.parquet")
        table.replace(_local_seqs(records, layout), last)
        count += records.num_rows
    return count


def _local_seqs(records: pa.Table, layout: StorageLayout) -> pa.Table:
    """Records with ``seq`` = this instance's seq of the txlog row that wrote them (by bookmark), else 0."""
    ours = arrow_dataset(open_table(str(layout.txlog))).to_table(columns=["bookmark", "seq"])
    if not records.num_rows or not ours.num_rows:
        return records.set_column(records.schema.get_field_index("seq"), "seq",
                                  pa.repeat(pa.scalar(0, pa.int64()), records.num_rows))
    position = pc.index_in(records["bookmark"], value_set=ours["bookmark"].combine_chunks())
    seqs = pc.take(ours["seq"].combine_chunks(), pc.fill_null(position, 0))
    local = pc.if_else(pc.is_valid(position), seqs, pa.scalar(0, pa.int64()))
    return records.set_column(records.schema.get_field_index("seq"), "seq", local)


def _last_seq(layout: StorageLayout) -> int:
    txlog = TxlogFiles(str(layout.txlog))
    txlog.refresh()
    return txlog.committed_seq

