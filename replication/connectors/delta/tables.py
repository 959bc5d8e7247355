"""Idempotent appends to a Delta table, keyed by an app transaction (DESIGN §2).

A streaming batch may run twice (crash after the Delta commit, before Spark's
checkpoint). Each append records ``Transaction(app_id, version)`` in the same
commit; a replay finds the version already there and writes nothing.
delta-rs itself does not refuse a repeated version, so the check is ours; it
is sound because each table has exactly one writer per app id.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.schema import Field as DeltaField
from deltalake.transaction import AddAction

from replication.connectors.delta.append_commit import AppendCommitter, VersionTaken, store_of, unsupported_reason
from replication.connectors.delta.log_files import log_writer_properties, write_file
from replication.connectors.s3.access import arrow_location, delta_options_for
from replication.connectors.s3.objects import ObjectPath

if TYPE_CHECKING:
    import pyarrow.dataset

log = logging.getLogger(__name__)

#: Key of this product's record in each commit's commitInfo.
COMMIT_METADATA_KEY = "replication.batch"
#: A DeltaTable object that commits again and again gets slower with every
#: commit it has made (delta-rs keeps growing in-memory log state: ~0.14 ms more
#: per commit, 23 ms -> 163 ms over 1,000 commits); re-opening it from the
#: latest checkpoint resets that. Same cadence as ``delta.checkpointInterval``.
REOPEN_EVERY_COMMITS = 50
#: Times an append is tried when a concurrent removal of rows (a DELETE commit) made it fail.
APPEND_ATTEMPTS = 5
#: What delta-rs says when a commit lost to a concurrent removal of rows.
CONCURRENT_DELETE = "concurrent transaction deleted data"
#: Times delta-rs tries one commit against other writers' new versions (its default, 15, gives up when
#: three writers race on a slow object store; each retry only re-reads the versions it lost to).
COMMIT_RETRIES = 200

def open_table(location: Path | str | ObjectPath, version: int | None = None) -> DeltaTable:
    """The Delta table at ``location`` (a local path, or an ``s3://`` URI reached with this process's S3
    settings), at its newest version or ``version``."""
    uri = str(location)
    return DeltaTable(uri, version=version, storage_options=delta_options_for(uri))


def arrow_dataset(table: DeltaTable) -> pyarrow.dataset.Dataset:
    """``table``'s current files as a pyarrow dataset. On S3 it is read through Arrow's own S3 filesystem with
    this process's settings: deltalake's default there is a filesystem written in Python, whose calls from
    Arrow's IO threads take the GIL, and a process exiting while one still did aborted with SIGABRT
    ("terminate called without an active exception") after its work was done."""
    location, filesystem = arrow_location(table.table_uri)
    if filesystem is None:
        return table.to_pyarrow_dataset()
    from pyarrow.fs import SubTreeFileSystem  # (here: a source's planner must not import pandas with it)

    return table.to_pyarrow_dataset(filesystem=SubTreeFileSystem(location, filesystem))


def open_or_create(
    path: Path | str | ObjectPath, schema: pa.Schema, *, name: str, configuration: dict[str, str] | None = None,
    storage_options: dict[str, str] | None = None,
) -> DeltaTable:
    """Open the Delta table at ``path`` (a local path, or an object-store URI with its ``storage_options``),
    creating it empty with ``schema`` if absent.

    ``configuration`` adds table properties at creation (e.g. change data feed).
    A table written by an earlier version that lacks nullable columns of
    ``schema`` gets them added (one schema-change commit); old rows read them as null.
    """
    if storage_options is None and isinstance(path, ObjectPath):
        storage_options = path.storage_options
    try:
        table = DeltaTable(str(path), storage_options=storage_options)
    except TableNotFoundError:
        if isinstance(path, Path):
            path.mkdir(parents=True, exist_ok=True)
        return DeltaTable.create(
            str(path),
            schema,
            mode="ignore",
            name=name,
            configuration={"delta.checkpointInterval": "50", **(configuration or {})},
            storage_options=storage_options,
        )
    have = set(table.schema().to_arrow().names)
    missing = [f for f in schema if f.name not in have and f.nullable]
    if missing:
        table.alter.add_columns([DeltaField.from_arrow(f) for f in missing])
    return table


class IdempotentAppender:
    """The single writer of one app id on one Delta table.

    Other app ids may write the same table concurrently (several upstreams
    appending to one inbox): blind appends do not conflict, and delta-rs
    retries a commit that lost the race. A removal of old rows makes a
    concurrent append fail (delta-rs takes an append for a read of the whole
    table): the append is tried again on the new snapshot (another process's
    removal: inbox cleanup), and this instance's own removals go through
    :meth:`delete`, one at a time with its appends.
    """

    def __init__(
        self,
        path: Path | str | ObjectPath,
        schema: pa.Schema,
        *,
        app_id: str,
        name: str,
        configuration: dict[str, str] | None = None,
        compression: str = "SNAPPY",
        storage_options: dict[str, str] | None = None,
    ) -> None:
        """``compression``: the data files' Parquet codec, a key of :data:`PYARROW_CODECS`. ``path``: a local
        path, or an object-store URI (``s3://...``) reached with ``storage_options``."""
        self.path = path
        if storage_options is None and isinstance(path, ObjectPath):
            storage_options = path.storage_options
        self.storage_options = storage_options
        self.schema = schema
        self.app_id = app_id
        self.compression = compression
        self.writer_properties = log_writer_properties(compression)
        self.table = open_or_create(path, schema, name=name, configuration=configuration,
                                    storage_options=storage_options)
        self._committed = self.table.transaction_version(app_id)
        self._commits = 0
        self._lock = threading.Lock()
        self._store = store_of(path)
        """Where the engine commits appends itself (see :mod:`.append_commit`); None: delta-rs commits them all
        (an address given as a string)."""
        self._own: AppendCommitter | None = None
        """Commits the next append; None while delta-rs commits them."""
        self._checkpointing: threading.Thread | None = None
        """Makes the checkpoint due after one of :attr:`_own`'s commits (:meth:`_checkpoint_behind`)."""
        self._reopened: DeltaTable | None = None
        """The table as that thread re-opened it: :attr:`table` from the next append on."""
        self._track_table()

    @property
    def committed_version(self) -> int | None:
        """Highest app-transaction version committed (None before the first commit)."""
        return self._committed

    @property
    def version(self) -> int:
        """The table's version after this appender's last commit (or as last read from the table)."""
        return self._own.version if self._own is not None else self.table.version()

    def refresh(self) -> None:
        """Re-read the committed version from the table (after a failure of unknown extent)."""
        self.table.update_incremental()
        self._committed = self.table.transaction_version(self.app_id)
        self._track_table()

    def _track_table(self) -> None:
        """Commit the next appends from ``self.table``'s version, if its protocol allows it."""
        if self._store is None or unsupported_reason(self.table, self.schema):
            self._own = None
            return
        self._own = AppendCommitter(self._store, self.table.version(), self.table.metadata().configuration)

    def committed_version_of(self, app_id: str) -> int | None:
        """The highest version app transaction ``app_id`` has committed, as the table says now."""
        with self._lock:
            self.table.update_incremental()
            return self.table.transaction_version(app_id)

    def rebind(self, app_id: str) -> None:
        """Commit as ``app_id`` from now on (its committed version read from the table)."""
        with self._lock:
            self.app_id = app_id
            self.refresh()

    def is_committed(self, version: int) -> bool:
        return self._committed is not None and self._committed >= version

    def append(self, rows: pa.Table, version: int, metadata: dict[str, Any] | None = None,
               files: list[AddAction] | None = None, commit_info: dict[str, str] | None = None) -> bool:
        """Append ``rows`` as app-transaction ``version``; False if that version is already in.

        An empty ``rows`` still commits, so the version (and ``metadata``) is
        recorded and a replay of the batch finds it. ``files``: data files
        already in the table's directory, added in the same commit before
        ``rows``' file (which is then written here rather than by delta-rs):
        in the txlog, their rows have the commit's first seqs. ``commit_info``: more ``commitInfo`` entries
        (an inbox commit's signature).
        """
        with self._lock:
            for attempt in range(1, APPEND_ATTEMPTS + 1):
                try:
                    return self._append(rows, version, metadata, files, commit_info)
                except CommitFailedError as exc:
                    # another process's removal of old rows (inbox cleanup) committed after our snapshot:
                    # delta-rs takes a blind append for a read of the whole table. The append is still right.
                    if CONCURRENT_DELETE not in str(exc) or attempt == APPEND_ATTEMPTS:
                        raise
                    self.table.update_incremental()
            raise AssertionError("unreachable")

    def delete(self, predicate: str) -> dict[str, Any]:
        """Delete the rows matching ``predicate`` (Delta's DELETE), between appends; its metrics."""
        with self._lock:
            self.table.update_incremental()
            retrying = CommitProperties(max_commit_retries=COMMIT_RETRIES)
            metrics = self.table.delete(predicate, commit_properties=retrying)
            self.table.update_incremental()
            self._track_table()
            return metrics

    def _append(self, rows: pa.Table, version: int, metadata: dict[str, Any] | None,
                files: list[AddAction] | None, commit_info: dict[str, str] | None) -> bool:
        if self.is_committed(version):
            return False
        reopened, self._reopened = self._reopened, None
        if reopened is not None and self._own is not None:  # (delta-rs commits from the object it last updated)
            self.table = reopened
        custom = {COMMIT_METADATA_KEY: json.dumps(metadata, separators=(",", ":"))} if metadata else {}
        custom.update(commit_info or {})
        rows = rows.cast(self.schema) if rows.schema != self.schema else rows
        if self._own is not None and (not files or isinstance(self.path, Path)) \
                and self._append_directly(rows, version, files, custom):
            return True
        commit = CommitProperties(app_transactions=[Transaction(self.app_id, version)],
                                  custom_metadata=custom or None, max_commit_retries=COMMIT_RETRIES)
        if files:
            if not isinstance(self.path, Path):
                raise ValueError(f"files written in place are local-disk only; {self.path} is not local")
            adds = list(files) + ([write_file(self.path, rows, self.compression)] if rows.num_rows else [])
            self.table.create_write_transaction(adds, mode="append", schema=self.schema, commit_properties=commit)
            self.table.update_incremental()  # (unlike write_deltalake, this leaves the object at its old version)
        else:
            write_deltalake(self.table, rows, mode="append", writer_properties=self.writer_properties,
                            commit_properties=commit)
        self._committed = version
        self._commits += 1
        if self._commits % REOPEN_EVERY_COMMITS == 0:
            self.table = DeltaTable(str(self.path), storage_options=self.storage_options)
        if self._store is not None:
            self._track_table()
        return True

    def _append_directly(self, rows: pa.Table, version: int, files: list[AddAction] | None,
                         custom: dict[str, str]) -> bool:
        """Commit the append with :class:`AppendCommitter`; False (nothing committed) when delta-rs must make
        it: another writer committed since, or rows with a null where the schema has none (delta-rs refuses
        them, naming the column)."""
        own, store = self._own, self._store
        assert own is not None and store is not None
        if any(rows.column(f.name).null_count for f in self.schema if not f.nullable):
            return self._hand_over_to_delta_rs()
        written = store.write_rows(rows, self.compression) if rows.num_rows else None
        try:
            own.commit(list(files or []) + ([written] if written else []), rows=rows.num_rows,
                       app_id=self.app_id, app_version=version, custom=custom)
        except VersionTaken:
            if self._landed(version):  # (ours after all: a put retried after its answer was lost)
                self._committed = version
                self._track_table()
                return True
            if written is not None:
                store.remove(written.path)
            return self._hand_over_to_delta_rs()
        except BaseException:
            if written is not None and not self._maybe_landed(version):
                store.remove(written.path)
            raise
        self._committed = version
        if own.checkpoint_due():
            self._checkpoint_behind(own)
        return True

    def _landed(self, version: int) -> bool:
        """Whether app-transaction ``version`` is in the table (``self.table`` brought up to date)."""
        self.table.update_incremental()
        return (self.table.transaction_version(self.app_id) or -1) >= version

    def _maybe_landed(self, version: int) -> bool:
        """:meth:`_landed`, True when the table cannot be read (a file it may name is kept: unreferenced at
        worst)."""
        try:
            return self._landed(version)
        except Exception:  # noqa: BLE001 - the table cannot be read now
            return True

    def _checkpoint_behind(self, own: AppendCommitter) -> None:
        """The checkpoint delta-rs would have made at ``own``'s version, on a thread of its own while the next
        appends go on: a re-open and the checkpoint take ~60 ms (delta-rs lets the GIL go meanwhile), which
        on the batch's path was every 50th batch's latency. The re-opened table replaces :attr:`table` (see
        :data:`REOPEN_EVERY_COMMITS`). A failure is logged: the commit stands, readers replay the log from the
        previous checkpoint. Not a daemon: a process exits once its checkpoint is written."""
        self.wait_for_checkpoint()
        version = own.version

        def run() -> None:
            try:
                table = DeltaTable(str(self.path), version=version, storage_options=self.storage_options)
                own.checkpoint(table)
            except Exception as exc:  # noqa: BLE001 - a checkpoint only shortens the next reader's replay
                log.warning("%s: no checkpoint at version %d (%s); the next one is due in %d commits",
                            self.path, version, exc, own.checkpoint_interval)
                return
            self._reopened = table

        self._checkpointing = threading.Thread(target=run, name=f"checkpoint {self.path}")
        self._checkpointing.start()

    def wait_for_checkpoint(self) -> None:
        """Wait for a checkpoint being made (:meth:`_checkpoint_behind`)."""
        if self._checkpointing is not None:
            self._checkpointing.join()
            self._checkpointing = None

    def _hand_over_to_delta_rs(self) -> bool:
        """Bring ``self.table`` up to date (delta-rs checks the append against the commits it has not seen
        yet) for delta-rs to commit the next append; False."""
        self.table.update_incremental()
        self._own = None
        return False


def commit_metadata_since(table: DeltaTable, after_version: int) -> list[tuple[int, dict]] | None:
    """This product's commit records of versions > ``after_version``, oldest first.

    Returns None when the log no longer holds all of them (old commits cleaned
    up), so the caller must rebuild from the data instead.
    """
    table.update_incremental()
    latest = table.version()
    if latest <= after_version:
        return []
    entries = table.history(limit=latest - after_version)
    versions = {e.get("version") for e in entries}
    if any(v not in versions for v in range(after_version + 1, latest + 1)):
        return None
    out = []
    for entry in sorted(entries, key=lambda e: e["version"]):
        raw = entry.get(COMMIT_METADATA_KEY)
        if raw:
            out.append((entry["version"], json.loads(raw)))
    return out
