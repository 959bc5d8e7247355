"""Txlog retention: AMPS's ``amps-action-do-remove-journal``, tied to replication.

::

    <Actions><Action>
      <On><Module>amps-action-on-schedule</Module><Options><Every>1h</Every></Options></On>
      <Do><Module>amps-action-do-remove-journal</Module><Options><Age>7d</Age></Options></Do>
    </Action></Actions>

On each tick the txlog's oldest data files go, as AMPS removes its oldest journal files, when every row in
them is older than ``Age`` and is no longer needed:

- every destination (sync or async, downgraded or not, connected or down) has acknowledged it, or it was
  never to be sent there (AMPS: "will not remove a journal file until all messages in that journal file have
  been replicated to, and acknowledged by, the destination"); a destination never connected holds
  everything;
- it is durable, and each SOW table is compacted past it (a restart rebuilds the SOW from the table and
  the txlog rows after it).

Only a prefix of the log goes (files in ``seq`` order, up to the first that must stay), so what remains is
``seq >= first_seq`` with no hole. Removal is Delta's own: one ``DELETE seq <= N`` commit that drops whole
files (Delta readers, delta-spark included, see the smaller table), then, one ``Every`` later, the files
themselves are deleted from storage, exactly those (a reader still on an older snapshot has had that long
to finish; a general VACUUM with no retention could also take files a writer has not committed yet).

The same runs clean the inbox of the rows the instance has stored (:mod:`replication.inbox.cleanup`).

What was removed is kept in ``_control/retention.json`` (:class:`~replication.storage.control.RetentionState`):
the first retained seq, its bookmark and time, the rows and files removed. ``replication status`` shows it; a
bookmark replay or a resync from before it is an error that names that bookmark.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from replication.actions import ON_SCHEDULE
from replication.config.model import InstanceConfig
from replication.connectors.delta.tables import IdempotentAppender
from replication.connectors.s3.access import arrow_location
from replication.inbox import cleanup as inbox_cleanup
from replication.storage.control import RetentionState
from replication.storage.layout import StorageLayout
from replication.txlog.files import TxlogFiles

log = logging.getLogger(__name__)

DO_REMOVE_JOURNAL = "amps-action-do-remove-journal"


@dataclass(frozen=True)
class RetentionPolicy:
    every: float
    """Seconds between runs (``<Every>``); also how long a removed file stays in storage."""
    age: float
    """Rows younger than this many seconds always stay (``<Age>``)."""


def retention_policy(cfg: InstanceConfig) -> RetentionPolicy | None:
    """The config's ``amps-action-do-remove-journal`` action, or None."""
    for action in cfg.actions:
        if action.on.module != ON_SCHEDULE:
            continue
        for step in action.do:
            if step.module == DO_REMOVE_JOURNAL and step.age is not None:
                return RetentionPolicy(every=action.on.every or 60.0, age=step.age)
    return None


class Retention:
    """Runs the policy on a thread of the instance (see the module docstring).

    ``kept_through()``: the highest seq that nothing still needs, and what holds it there (for the log).
    """

    def __init__(self, layout: StorageLayout, policy: RetentionPolicy,
                 kept_through: Callable[[], tuple[int, str]], txlog: IdempotentAppender,
                 inbox_stored: Callable[[], tuple[int, dict[str, int]]] | None = None) -> None:
        """``txlog``: the ingest writer's appender, through which the removal is committed between its appends.
        ``inbox_stored``: the inbox version stored through, and the seq acknowledged to each upstream (None: no
        inbox; see :mod:`replication.inbox.cleanup`)."""
        self.layout = layout
        self.txlog = txlog
        self.policy = policy
        self.kept_through = kept_through
        self.inbox_stored = inbox_stored
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retention", daemon=True)
        self._held_by = ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.policy.every):
            try:
                self.tick()
            except Exception:  # storage trouble, a commit race: the next tick tries again
                log.warning("txlog retention of %s failed; it runs again in %.0fs", self.layout.root,
                            self.policy.every, exc_info=True)

    def tick(self, now: float | None = None) -> int:
        """One run: delete the files removed a period ago, then remove what may go. Rows removed."""
        now = time.time() if now is None else now
        state = RetentionState.read(self.layout.retention_json) or RetentionState()
        state = self._delete_removed_files(state, now)
        if self.inbox_stored is not None:
            state = self._clean_inbox(state, now)
        limit, holder = self.kept_through()
        files = _files_in_seq_order(str(self.layout.txlog))
        cut, paths, rows = _removable_prefix(files, limit, now - self.policy.age)
        if not paths:
            if holder != self._held_by and limit < _first_young_seq(files, now - self.policy.age):
                log.info("txlog retention: rows after seq %d stay: %s has not acknowledged them", limit, holder)
            self._held_by = holder
            replace(state, last_run=now).write(self.layout.retention_json)
            return 0
        metrics = self.txlog.delete(f"seq <= {cut}")
        if metrics.get("num_added_files"):
            log.warning("txlog retention: %d files held rows on both sides of seq %d and were rewritten",
                        metrics["num_added_files"], cut)
        first = _first_row(str(self.layout.txlog), cut)
        state = replace(state, first_seq=cut + 1, first_bookmark=first[0], first_persisted=first[1],
                        removed_rows=state.removed_rows + rows, removed_files=state.removed_files + len(paths),
                        last_run=now, pending=[*state.pending, *([p, now] for p in paths)])
        state.write(self.layout.retention_json)
        log.info("txlog retention: removed %d rows in %d files, through seq %d (older than %.0fs, acknowledged "
                 "by every destination); first retained bookmark %s", rows, len(paths), cut, self.policy.age,
                 first[0])
        return rows

    def _delete_removed_files(self, state: RetentionState, now: float) -> RetentionState:
        """Delete from storage the files removed at least one period ago."""
        keep = []
        for path, removed_at in state.pending:
            if now - float(removed_at) < self.policy.every:
                keep.append([path, removed_at])
                continue
            _delete_file(str(self.layout.txlog), str(path))
        return replace(state, pending=keep) if len(keep) != len(state.pending) else state

    def _clean_inbox(self, state: RetentionState, now: float) -> RetentionState:
        """Delete the inbox files removed a period ago (once the ingest read past their removal), then remove
        the files whose rows are stored and acknowledged upstream."""
        assert self.inbox_stored is not None
        stored_version, acked = self.inbox_stored()
        keep = []
        for path, removed_at, version in state.inbox_pending:
            if now - float(removed_at) < self.policy.every or stored_version < int(version):
                keep.append([path, removed_at, version])
            else:
                _delete_file(str(self.layout.inbox), str(path))
        state = replace(state, inbox_pending=keep)
        removal = inbox_cleanup.clean(str(self.layout.inbox), stored_version, acked)
        if removal is None:
            return state
        log.info("inbox cleanup: removed %d stored and acknowledged rows in %d files (inbox version %d)",
                 removal.rows, len(removal.files), removal.version)
        pending = [[p, now, removal.version] for p in removal.files + removal.change_files]
        state = replace(state, inbox_removed_rows=state.inbox_removed_rows + removal.rows,
                        inbox_removed_files=state.inbox_removed_files + len(removal.files),
                        inbox_pending=[*state.inbox_pending, *pending])
        state.write(self.layout.retention_json)  # (before the txlog's run: what is pending must not be lost)
        return state


def _files_in_seq_order(txlog: str) -> pa.Table:
    """The snapshot's data files: ``path``, ``lo``/``hi`` seq, ``newest`` persist time (epoch µs), ``rows``."""
    from replication.connectors.delta.tables import open_table

    actions = pa.table(open_table(txlog).get_add_actions(flatten=True))
    n = actions.num_rows

    def column(name: str, kind: pa.DataType) -> pa.Array:
        if name not in actions.column_names:
            return pa.nulls(n, kind)
        return pc.cast(actions.column(name), kind).combine_chunks()

    files = pa.table({
        "path": actions.column("path").combine_chunks(),
        "lo": column("min.seq", pa.int64()),
        "hi": column("max.seq", pa.int64()),
        "newest": pc.cast(column("max.persist_time", pa.timestamp("us", tz="UTC")), pa.int64()),
        "rows": column("num_records", pa.int64()),
    })
    return files.sort_by([("lo", "ascending")])


def _removable_prefix(files: pa.Table, limit: int, older_than: float) -> tuple[int, list[str], int]:
    """``(cut, paths, rows)``: the leading files whose rows are all ``<= limit`` and persisted before
    ``older_than`` (epoch s). A file without statistics stops the prefix."""
    cut, paths, rows = 0, [], 0
    micros = int(older_than * 1_000_000)
    for path, lo, hi, newest, count in zip(*(files[c].to_pylist() for c in ("path", "lo", "hi", "newest", "rows")),
                                           strict=True):
        if lo is None or hi is None or newest is None or hi > limit or newest >= micros:
            break
        cut, rows = hi, rows + int(count or 0)
        paths.append(path)
    return cut, paths, rows


def _first_young_seq(files: pa.Table, older_than: float) -> int:
    """The lowest seq of a file with a row persisted at or after ``older_than`` (a large number: none)."""
    micros = int(older_than * 1_000_000)
    young = files.filter(pc.fill_null(pc.greater_equal(files["newest"], micros), True))
    return int(pc.min(young["lo"]).as_py() or 0) if young.num_rows else 2**62


def _first_row(txlog: str, after: int) -> tuple[str | None, float | None]:
    """Bookmark and persist time (epoch s) of the row ``after + 1`` (None, None: not committed yet)."""
    files = TxlogFiles(txlog)
    files.refresh()
    if files.committed_seq <= after:
        return None, None
    row = files.read(after, after + 1).select(["bookmark", "persist_time"]).to_pylist()[0]
    stamp = row["persist_time"]
    return row["bookmark"], stamp.timestamp() if stamp is not None else None


def _delete_file(table_uri: str, path: str) -> None:
    """Delete one data file of the table (a relative path as the Delta log writes it, or a URI)."""
    from pyarrow import fs

    target = unquote(path) if "://" not in path else path
    if "://" not in target and "://" not in table_uri:
        try:
            os.remove(os.path.join(table_uri, target))
        except FileNotFoundError:
            pass
        return
    uri = target if "://" in target else f"{table_uri.rstrip('/')}/{target}"
    where, filesystem = arrow_location(uri)  # (an s3:// file with this process's S3 settings)
    if filesystem is None:
        filesystem, where = fs.FileSystem.from_uri(uri)
    try:
        filesystem.delete_file(where)
    except FileNotFoundError:
        pass
