"""Stage 3 of a backfill, the driver's commits: the inbox and ``rejected/``, and what earlier runs committed."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.transaction import AddAction

from replication.backfill import BackfillBusyError, BackfillInputError
from replication.backfill.plan import NumberedFile
from replication.config.model import InstanceConfig
from replication.connectors.delta.tables import COMMIT_RETRIES, arrow_dataset, open_table
from replication.connectors.s3.objects import ObjectPath
from replication.inbox import staged_parts
from replication.inbox.schema import INBOX_SCHEMA, STAGED_PART_KEY
from replication.storage import lease
from replication.storage.control import read_json, write_json_atomic
from replication.storage.layout import StorageLayout, StoragePath
from replication.txlog.schema import REJECTED_SCHEMA

#: The app transaction of a client's parts, in the inbox and ``rejected/``: its version is the last sequence
#: number committed.
APP_ID = "backfill-seq:{client}"
#: The app transaction of a client's parts committed before parts ended at their last sequence: its version is
#: a part number, each part ``LEGACY_PART_ROWS`` rows of a file.
LEGACY_APP_ID = "backfill:{client}"
LEGACY_PART_ROWS = 100_000


# -- what earlier runs committed ----------------------------------------------------------------


def committed_through(inbox: DeltaTable, client: str, numbered: list[NumberedFile], layout: StorageLayout) -> int:
    """The client's last sequence committed to the inbox (0: none): its app transaction's version, or, for a
    client whose parts were committed before parts ended at their last sequence (the earlier app id, whose
    version is a part number), the last sequence of that part."""
    version = inbox.transaction_version(APP_ID.format(client=client))
    if version is not None:
        return version
    legacy = inbox.transaction_version(LEGACY_APP_ID.format(client=client))
    if legacy is None:
        return 0
    # the files as that run numbered them: its record's, else this run's (the same input, or it is refused)
    previous = read_json(layout.backfill_input(client), {}).get("files") or [[f.path, f.rows] for f in numbered]
    return _legacy_part_last_seq([rows for _name, rows, *_ in previous], legacy)


def _legacy_part_last_seq(rows_per_file: list[int], part: int) -> int:
    """The last sequence of part number ``part`` as parts were numbered under :data:`LEGACY_APP_ID`: from 1,
    across the files (of ``rows_per_file`` rows), each file's rows in parts of ``LEGACY_PART_ROWS`` (at least
    one)."""
    seq, number, last = 1, 1, 0
    for rows in rows_per_file:
        if number > part:
            break
        last = seq + min(rows, (part - number + 1) * LEGACY_PART_ROWS) - 1
        seq, number = seq + rows, number + max(1, -(-rows // LEGACY_PART_ROWS))
    return last


def earlier_rejects(layout: StorageLayout, client: str, through: int) -> tuple[int, list[str], int]:
    """The client's backfilled rows ``<= through`` in ``rejected/``: how many, the first ``20`` reasons (in
    sequence order), and the highest sequence ``<= through`` not rejected (0: none). Only their sequence
    numbers are read whole: an earlier run may have rejected millions."""
    if through <= 0:
        return 0, [], 0
    dataset = arrow_dataset(open_table(layout.rejected))
    mine = (pc.field("source") == "backfill") & (pc.field("publisher") == client)
    seqs = pc.cast(dataset.to_table(columns=["publisher_seq"], filter=mine)["publisher_seq"], pa.int64()).to_numpy()
    seqs = np.unique(seqs[seqs <= through])  # (sorted)
    reasons: list[str] = []
    if seqs.size:
        first = [str(s) for s in seqs[:20].tolist()]
        found = dataset.to_table(columns=["publisher_seq", "reason"],
                                 filter=mine & pc.field("publisher_seq").isin(first))
        by_seq = dict(zip(found["publisher_seq"].to_pylist(), found["reason"].to_pylist()))
        reasons = [by_seq[s] for s in first if s in by_seq]
    # below the run of rejected sequences that ends at ``through`` (if one does): its length is where the
    # sequences, from the top, first leave through, through - 1, ...
    gaps = np.flatnonzero(seqs[::-1] != through - np.arange(seqs.size))
    run = int(gaps[0]) if gaps.size else seqs.size
    return int(seqs.size), reasons, through - run


def check_and_record_input(cfg: InstanceConfig, layout: StorageLayout, client: str, numbered: list[NumberedFile],
                           done: int) -> None:
    """Refuse inputs that differ from those whose rows (through sequence ``done``) a previous backfill by
    ``client`` committed, then record this run's (before it commits anything).

    A client's sequence numbers are its rows' positions in the input, and a re-run skips the rows already
    committed: other files in their place would have their rows taken for those already stored, silently.
    Files are compared by name and row count (a file may be given by another path); more may follow.
    """
    path = layout.backfill_input(client)
    previous = read_json(path, {}).get("files", [])
    files_now = [[Path(f.path).name, f.rows, f.first_seq] for f in numbered]
    first_seq = 1
    for k, (name, rows, *_) in enumerate(previous):  # (each file's first sequence: the rows before it, plus 1)
        if first_seq > done:
            break  # (nothing of this file or those after it is committed)
        first_seq += rows
        now = files_now[k] if k < len(files_now) else None
        if now is None or now[:2] != [name, rows]:
            given = f"{now[0]} ({now[1]:,} rows)" if now else "no file"
            raise BackfillInputError(
                f"client {client} has backfilled other input into {cfg.name}: its file {k + 1} was {name} "
                f"({rows:,} rows), this run's is {given}. Its sequence numbers are the rows' positions, so a "
                "re-run must give the same files first (more may follow). Fix: give the same input to finish or "
                "extend that backfill, or a new --client for other data")
    write_json_atomic(path, {"client": client, "files": files_now})


@contextlib.contextmanager
def client_lock(layout: StorageLayout, cfg: InstanceConfig, client: str) -> Iterator[Callable[[], None]]:
    """Hold the client's backfill lock: two runs of one client at once would each take the other's parts for
    its own. On a local disk a ``flock`` (let go when the process ends, even by kill -9); on S3 a leased
    object (:mod:`replication.storage.lease`). Yields a check to make before each commit: it raises once the
    lock was lost (a lease taken over)."""
    path = layout.backfill_input(client).with_suffix(".lock")
    busy = (f"another backfill by client {client} into {cfg.name} is running (it holds {path}). Fix: wait for it "
            "to end, then run this one: it stores nothing the other stored")
    if isinstance(path, ObjectPath):
        try:
            with lease.held(path, what=f"backfill by client {client} into {cfg.name}") as held:
                yield held.check
        except lease.LeaseHeld:
            raise BackfillBusyError(busy) from None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise BackfillBusyError(busy) from None
        yield lambda: None


def remove_unclaimed_staged_files(staging: StoragePath, done: int, stored: int) -> None:
    """Staged files no one will take: a killed run's parts never handed over (their rows after sequence
    ``done``), and parts the instance has stored (through ``stored``) whose file stayed (it crashed between
    its commit and their removal)."""
    if not staging.is_dir():
        return
    for path in staging.glob("*.parquet"):
        first = path.name.split("-", 1)[0]
        if not first.isdigit():
            continue
        try:
            taken = int(first) <= done and _last_publisher_seq(path) <= stored
        except (OSError, pa.ArrowException, TypeError):
            taken = False  # (unreadable: the instance says so when it comes to it)
        if int(first) > done or taken:
            path.unlink(missing_ok=True)


def _last_publisher_seq(path: StoragePath) -> int:
    """The highest ``publisher_seq`` of a staged file, from its footer's statistics."""
    metadata = staged_parts.open_staged(path).metadata
    column = metadata.schema.names.index("publisher_seq")
    return max(metadata.row_group(g).column(column).statistics.max for g in range(metadata.num_row_groups))


# -- this run's commits -------------------------------------------------------------------------


def commit_rejected_file(layout: StorageLayout, rejected: DeltaTable, add: dict, app_id: str, number: int) -> bool:
    """Commit one part's rejected rows to ``rejected/``: the data file a task wrote (``add``, its add action's
    fields), app transaction ``app_id`` version ``number``; False when that version is in already (this run's
    file is then removed)."""
    return _commit_once(rejected, REJECTED_SCHEMA, app_id, number, add=add, written=layout.rejected / add["path"])


def commit_staged_part(layout: StorageLayout, inbox: DeltaTable, descriptor: str | None, app_id: str,
                       number: int) -> bool:
    """Hand the instance one staged part (None: none, the position alone): an inbox commit of its descriptor,
    app transaction ``app_id`` version ``number``; False when that version is in already (this run's staged
    file is then removed)."""
    if descriptor is None:
        return _commit_once(inbox, INBOX_SCHEMA, app_id, number)
    return _commit_once(inbox, INBOX_SCHEMA, app_id, number, metadata={STAGED_PART_KEY: descriptor},
                        written=layout.inbox / staged_parts.StagedPart.from_json(descriptor).file)


def _commit_once(table: DeltaTable, schema: pa.Schema, app_id: str, number: int, *, add: dict | None = None,
                 written: StoragePath | None = None, metadata: dict | None = None) -> bool:
    """One commit of app transaction ``app_id`` version ``number``: the data file ``add`` (None: none, the
    version alone) and ``metadata``; False when that version is in already (``written``, this run's copy of
    what it hands over, is then removed: never in a log, its name is this run's own)."""
    table.update_incremental()
    if (table.transaction_version(app_id) or 0) >= number:
        if written is not None:
            written.unlink(missing_ok=True)
        return False
    table.create_write_transaction(
        [AddAction(add["path"], add["size"], {}, add["modification_time"], True, add["stats"])] if add else [],
        mode="append", schema=schema,
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, number)],
                                           custom_metadata={"replication.backfill": app_id, **(metadata or {})},
                                           max_commit_retries=COMMIT_RETRIES),
    )
    return True
