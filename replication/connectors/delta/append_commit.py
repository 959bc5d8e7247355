"""Appends to a Delta table committed by writing the commit file itself, on a local disk or on S3.

delta-rs' ``write_deltalake`` spends ~14 ms of CPU on an append of a few
hundred rows, of which the Parquet file is ~2 ms; the rest is its runtime and
the upkeep of its in-memory snapshot. A live instance appends several times a
second per table, on every hop of a message, so that fixed cost is latency.
An append is a data file plus one commit file, ``_delta_log/<version>.json``,
holding ``commitInfo``, ``txn`` and ``add`` actions (the Delta protocol):
:class:`AppendCommitter` writes both, ~3 ms in all.

The commit file is created only if absent, Delta's rule for a commit: with
``link(2)`` from a temporary file on a local disk (:class:`LocalFiles`), with
a conditional put (``If-None-Match: *``) on S3 (:class:`ObjectFiles`), as
delta-rs does there. Each commit takes the version after the last one the
committer knows, so *any* commit another writer made since (a removal of old
rows, a compaction, a schema or protocol change) makes it fail. The caller
then brings its table up to date and hands that append to delta-rs, which
checks it against the new commits as it always did
(:class:`~replication.connectors.delta.tables.IdempotentAppender`).

Only tables whose protocol asks nothing of an append beyond its ``add`` action
take this path (:func:`unsupported_reason`); a table with a feature the committer
does not write (row tracking, in-commit timestamps, column mapping, constraints
or generated columns to check, partitions) is appended to by delta-rs.

Checkpoints are made as delta-rs makes them after its own commits: every
``delta.checkpointInterval`` versions, followed by the cleanup of expired log
files unless ``delta.enableExpiredLogCleanup`` is false.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from replication.connectors.delta.log_files import add_action, data_file_name, encode_file, write_file
from replication.connectors.s3.objects import ObjectPath, PreconditionFailed

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

#: delta-rs' checkpoint interval when a table sets none.
DEFAULT_CHECKPOINT_INTERVAL = 100
#: Writer features an append honours by writing only ``add`` actions (any constraint or generated
#: column they bring is refused in :func:`unsupported_reason`).
APPEND_ONLY_WRITER_FEATURES = frozenset(
    {"appendOnly", "invariants", "changeDataFeed", "checkConstraints", "generatedColumns", "timestampNtz"})
#: Field metadata that asks a writer to check or compute values.
FIELD_METADATA_CHECKED = ("delta.invariants", "delta.generationExpression", "delta.identity", "delta.columnMapping")
ENGINE_INFO = "replication-append-commit"


class VersionTaken(Exception):  # noqa: N818 - a condition the caller handles, not a failure
    """Another writer committed the version this commit was to take."""


def unsupported_reason(table: DeltaTable, schema: pa.Schema) -> str | None:
    """Why appends of ``schema`` rows to ``table`` (as it is now) must go through delta-rs; None: they need not."""
    protocol = table.protocol()
    readers = set(protocol.reader_features or ())
    writers = set(protocol.writer_features or ())
    if protocol.min_reader_version not in (1, 2, 3) or protocol.min_writer_version not in range(1, 8):
        return f"protocol {protocol.min_reader_version}/{protocol.min_writer_version}"
    if protocol.min_reader_version == 2 or (protocol.min_reader_version == 3 and readers - {"timestampNtz"}):
        return f"reader protocol {protocol.min_reader_version} {sorted(readers)}"
    if protocol.min_writer_version in (5, 6) or (protocol.min_writer_version == 7
                                                and writers - APPEND_ONLY_WRITER_FEATURES):
        return f"writer protocol {protocol.min_writer_version} {sorted(writers - APPEND_ONLY_WRITER_FEATURES)}"
    metadata = table.metadata()
    if metadata.partition_columns:
        return "partitioned"
    configuration = metadata.configuration
    if any(key.startswith("delta.constraints.") for key in configuration):
        return "check constraints"
    if configuration.get("delta.columnMapping.mode", "none") != "none":
        return "column mapping"
    for field in table.schema().fields:
        if any(key.startswith(FIELD_METADATA_CHECKED) for key in field.metadata):
            return f"column {field.name}: invariants, generated or identity values"
    if not pa.schema(table.schema().to_arrow()).equals(schema, check_metadata=False):
        return "the table's schema differs from the rows'"
    return None


class CommitStore(Protocol):
    """Where a table's files go: a local directory or an S3 prefix."""

    def write_rows(self, rows: pa.Table, compression: str) -> AddAction:
        """Write ``rows`` as a new data file of the table (not committed); its add action."""
        ...

    def remove(self, name: str) -> None:
        """Remove data file ``name``, never committed."""
        ...

    def put_if_absent(self, version: int, body: bytes) -> None:
        """Create the commit file of ``version`` unless it exists (:class:`VersionTaken`)."""
        ...


class LocalFiles:
    """A table in a local directory; commit files made with ``link(2)``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def write_rows(self, rows: pa.Table, compression: str) -> AddAction:
        return write_file(self.directory, rows, compression)

    def remove(self, name: str) -> None:
        (self.directory / name).unlink(missing_ok=True)

    def put_if_absent(self, version: int, body: bytes) -> None:
        log = self.directory / "_delta_log"
        temporary = log / f".{uuid.uuid4()}.json.tmp"  # (a hidden name: Delta readers list only versions)
        temporary.write_bytes(body)
        target = log / f"{version:020d}.json"
        try:
            os.link(temporary, target)
        except FileExistsError:
            # (on NFS a retried LINK can answer "exists" for the link it made: then the commit is ours)
            if not os.path.samefile(temporary, target):
                raise VersionTaken(f"version {version} of {self.directory} was committed by another writer") from None
        finally:
            temporary.unlink(missing_ok=True)


class ObjectFiles:
    """A table under an S3 prefix; commit files made with a conditional put."""

    def __init__(self, root: ObjectPath) -> None:
        self.root = root

    def write_rows(self, rows: pa.Table, compression: str) -> AddAction:
        name = data_file_name(compression)
        data = encode_file(rows, compression)
        (self.root / name).write_bytes(data)
        return add_action(name, len(data), rows)

    def remove(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def put_if_absent(self, version: int, body: bytes) -> None:
        try:
            (self.root / "_delta_log" / f"{version:020d}.json").write_bytes(body, if_none_match=True)
        except PreconditionFailed:
            raise VersionTaken(f"version {version} of {self.root} was committed by another writer") from None


def store_of(location: object) -> CommitStore | None:
    """The store of a table at ``location`` (a local path or an S3 address); None: delta-rs commits there."""
    if isinstance(location, Path):
        return LocalFiles(location)
    if isinstance(location, ObjectPath):
        return ObjectFiles(location)
    return None


class AppendCommitter:
    """Commits appends to the Delta table in ``store`` by writing their commit files (see the module).

    ``version``: the table's latest version as this committer knows it; the
    next commit takes ``version + 1``. Not thread-safe: its caller serialises commits.
    """

    def __init__(self, store: CommitStore, version: int, configuration: dict[str, str]) -> None:
        self.store = store
        self.version = version
        self.checkpoint_interval = int(configuration.get("delta.checkpointInterval", DEFAULT_CHECKPOINT_INTERVAL))
        self.clean_up_logs = configuration.get("delta.enableExpiredLogCleanup", "true").lower() != "false"

    def commit(self, adds: list[AddAction], *, rows: int, app_id: str, app_version: int,
               custom: dict[str, str]) -> int:
        """Commit ``adds`` (files already in the table, ``rows`` rows in all) in one version, recording
        ``Transaction(app_id, app_version)`` and ``custom`` in its commitInfo; the version.

        Raises :class:`VersionTaken` when the version exists: another writer's, or (a put retried after a
        lost answer) this one's: the caller tells them apart by the app transaction.
        """
        now = int(time.time() * 1000)
        actions = [
            {"commitInfo": {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Append"},
                            "isBlindAppend": True, "engineInfo": ENGINE_INFO, **custom,
                            "operationMetrics": {"num_added_files": len(adds), "num_added_rows": rows,
                                                 "num_removed_files": 0}}},
            {"txn": {"appId": app_id, "version": app_version, "lastUpdated": now}},
            *({"add": _add_json(add)} for add in adds),
        ]
        version = self.version + 1
        body = "\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n"
        self.store.put_if_absent(version, body.encode())
        self.version = version
        return version

    def checkpoint_due(self) -> bool:
        """Whether delta-rs would have made a checkpoint after the last commit (it makes them at versions
        ``interval - 1``, ``2 * interval - 1``, ...)."""
        return self.checkpoint_interval > 0 and (self.version + 1) % self.checkpoint_interval == 0

    def checkpoint(self, table: DeltaTable) -> None:
        """The checkpoint delta-rs would have made (``table``: at this committer's version or later), then the
        log cleanup."""
        table.create_checkpoint()
        if self.clean_up_logs:
            table.cleanup_metadata()


def _add_json(add: AddAction) -> dict:
    return {"path": add.path, "partitionValues": dict(add.partition_values or {}), "size": add.size,
            "modificationTime": add.modification_time, "dataChange": add.data_change, "stats": add.stats}
