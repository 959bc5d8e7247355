"""Every file under an instance's ``_control/``: a frozen dataclass each, with its reader and writer.

All are JSON, replaced atomically (on a filesystem: temporary file in the same
directory, fsync, rename; on S3: one put, which replaces an object whole), so a
reader never sees a torn file; a file two writers may update is updated with
:func:`update_json` (a conditional put on S3). A missing file reads as
None. Who writes each file and who reads it is the protocol between instances:

==========================  ===================================  ==========================================
file                        written by                           read by
==========================  ===================================  ==========================================
``instance.json``           the instance, at start (its          every upstream's destination manager, on
                            effective config)                    connect: replication validation
``heartbeat.json``          the instance, every second           upstreams (is the destination up?);
                                                                 ``replication status``
``publishers.json``         the ingest writer, after each        the instance at restart; upstreams at
                            txlog commit                         resync (what it has per publisher)
``durable.json``            the durability tracker, when acks    the instance at restart; ``fully_durable``
                            are released or ``durable_seq``      replays (``replication.replay``), for
                            moves                                ``durable_seq``
``acks/<upstream>.json``    the durability tracker, once the     ``<upstream>``'s destination manager,
                            rows received from ``<upstream>``    every 20 ms while rows wait for it
                            are durable here                     (100 ms on S3), else once a second:
                                                                 its link's acknowledged position
                                                                 moves, and with it the upstream's
                                                                 own acks
``links/<destination>.json``  this instance's destination        the instance at restart;
                            manager and replicator               ``replication status``
``bootstrap.json``          a bootstrap, when it starts and      the instance at start: an interrupted
                            when it ends                         bootstrap resumes
``downgraded/<dest>.json``  ``replication downgrade`` (removed   the instance, every second and at start:
                            by ``replication upgrade``)          the destination stays async while present
``proxied_transfer.json``   ``replication queue --enable-/       the queue dispatcher, every second: it
                            --disable-proxied-transfer``         delivers those instances' messages
==========================  ===================================  ==========================================

The acknowledgement chain: upstream U's replicator appends rows to our inbox
(``upstream_seq`` = U's seq); our ingest commits them to our txlog; once they
are durable here (and at our own sync destinations), we write
``acks/U.json`` ``{"seq": N}``; U reads it, marks its rows through N
acknowledged on that link, and releases its publishers' persisted acks.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from replication.config import effective
from replication.config.model import InstanceConfig
from replication.connectors.s3.objects import ObjectPath, PreconditionFailed
from replication.errors import ConfigError, StorageError
from replication.storage.layout import StoragePath

T = TypeVar("T", bound="ControlFile")


def _dumps(payload: Any, indent: int | None) -> str:
    return json.dumps(payload, indent=indent, separators=(",", ": ") if indent else (",", ":"), sort_keys=True)


def write_json_atomic(path: StoragePath, payload: Any, *, indent: int | None = None) -> None:
    """Replace ``path`` with ``payload`` as JSON so readers never see a torn file (on S3 a put replaces an
    object whole; on a filesystem a temporary file is renamed over it)."""
    if isinstance(path, ObjectPath):
        path.write_bytes(_dumps(payload, indent).encode())
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(_dumps(payload, indent))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_json(path: StoragePath, default: Any = None) -> Any:
    """Read a control file; a missing file gives ``default``."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StorageError(f"control file {path} is not valid JSON ({exc}); delete it to rebuild it") from exc


def update_json(path: StoragePath, change: Callable[[Any], Any], *, attempts: int = 20) -> Any:
    """Replace the JSON at ``path`` with ``change(what it holds)`` (None when missing) and return it, never
    losing another writer's update: on S3 the put is conditional on the object read (``If-Match``, or
    ``If-None-Match`` when there was none) and is done again over the newer one when refused; on a
    filesystem the update holds an exclusive ``flock`` beside the file."""
    if not isinstance(path, ObjectPath):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(f".{path.name}.lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            new = change(read_json(path))
            write_json_atomic(path, new)
            return new
    for _ in range(attempts):
        try:
            body, etag = path.read_with_etag()
            current: Any = json.loads(body)
        except FileNotFoundError:
            current, etag = None, None
        new = change(current)
        try:
            path.write_bytes(_dumps(new, None).encode(), if_match=etag, if_none_match=etag is None)
            return new
        except PreconditionFailed:
            continue  # another writer got there first: change what it wrote
    raise StorageError(f"{path}: {attempts} updates in a row were overtaken by other writers; try again")


class ControlFile:
    """Base of the control-file dataclasses: JSON fields are the dataclass fields; unknown keys are ignored
    (a file written by a newer version still reads), missing ones take their defaults."""

    @classmethod
    def from_json(cls: type[T], payload: dict) -> T:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in payload.items() if k in names})

    def to_json(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def read(cls: type[T], path: StoragePath) -> T | None:
        payload = read_json(path)
        return cls.from_json(payload) if payload else None

    def write(self, path: StoragePath) -> None:
        write_json_atomic(path, self.to_json())


@dataclass(frozen=True)
class RetentionState(ControlFile):
    """``retention.json``: what retention removed from the txlog (:mod:`replication.txlog.retention`)."""

    first_seq: int = 1
    """The txlog's first retained seq."""
    first_bookmark: str | None = None
    """Its bookmark: a replay or resync from before it is an error that names it."""
    first_persisted: float | None = None
    """When that row was persisted (epoch seconds)."""
    removed_rows: int = 0
    removed_files: int = 0
    last_run: float = 0.0
    pending: list = field(default_factory=list)
    """``[path, removed_at]`` of data files removed from the table and not yet deleted from storage."""
    inbox_removed_rows: int = 0
    inbox_removed_files: int = 0
    inbox_pending: list = field(default_factory=list)
    """As ``pending``, for the inbox (:mod:`replication.inbox.cleanup`)."""


@dataclass(frozen=True)
class Heartbeat(ControlFile):
    """``heartbeat.json``: liveness, positions and counters, rewritten every second."""

    instance: str
    group: str = ""
    time: float = 0.0
    """When it was written (epoch seconds): a destination is usable while this is fresh."""
    started: float = 0.0
    running: bool = False
    max_seq: int = 0
    txlog_version: int = -1
    publishers: int = 0
    durable_seq: int = 0
    counters: dict[str, Any] = field(default_factory=dict)
    links: dict[str, dict] = field(default_factory=dict)
    """Destination name -> its :class:`LinkState` as JSON, plus ``lag_messages``, ``lag_seconds`` (age of the
    oldest row it has not acknowledged, sync or async) and ``waiting_since`` (since when rows have waited for
    it with no progress; None when none waits)."""
    input_rows_per_second: float | None = None
    error: str | None = None
    restarts: int = 0
    batch: dict | None = None
    """The ingest batch in progress: id, step, seconds (None when idle)."""
    clashes: dict[str, dict] = field(default_factory=dict)
    """Client name -> the last clash seen on it (two publishers at once): ``earlier`` and ``later`` sessions,
    ``at`` (epoch seconds)."""
    refusals: dict[str, dict] = field(default_factory=dict)
    """Upstream -> inbox commits refused since start (unsigned, forged, tampered, replayed): ``commits``,
    ``rows``, the ``last`` reason and when (``at``, epoch seconds)."""
    sow: dict[str, dict] = field(default_factory=dict)
    """Per ``<SOW><Topic>``: ``records`` held now, and the txlog seq its table is ``compacted_through``."""
    queues: dict[str, dict] = field(default_factory=dict)
    """Per queue: depth, waiting, leased, owned elsewhere, delivered, acknowledged, and per consumer
    (:meth:`replication.queues.state.QueueState.status`)."""
    stalled: dict[str, float] = field(default_factory=dict)
    """Destination -> since when (epoch seconds) it has had rows waiting for it and made no progress, for
    each destination stalled longer than the instance's stall report threshold (``replication status
    --check`` applies its own threshold to each link's ``waiting_since``)."""

    def fresh(self, stale_after: float, *, now: float | None = None) -> bool:
        """Is the instance running, by this heartbeat?"""
        return self.running and (now or time.time()) - self.time < stale_after


@dataclass(frozen=True)
class PublishersSnapshot(ControlFile):
    """``publishers.json``: what the txlog holds per publisher and per upstream, as of one txlog version."""

    txlog_version: int = -1
    max_seq: int = 0
    publishers: dict[str, int] = field(default_factory=dict)
    """Client name -> highest ``publisher_seq`` stored: duplicate detection, and what upstreams resync from."""
    links: dict[str, int] = field(default_factory=dict)
    """Upstream instance -> highest upstream ``seq`` stored from it."""
    format: int = 1
    inbox_version: int = -1
    """Every inbox version through this one is stored (what inbox cleanup may remove, with its acks)."""


@dataclass(frozen=True)
class DurableState(ControlFile):
    """``durable.json``: what was acknowledged, to publishers and to upstreams."""

    durable_seq: int = 0
    """Every local row through this seq is acknowledged by every sync destination (not downgraded)."""
    publishers: dict[str, int] = field(default_factory=dict)
    """Client name -> highest sequence acknowledged as persisted."""
    upstreams: dict[str, int] = field(default_factory=dict)
    """Upstream instance -> highest upstream seq acknowledged to it."""


@dataclass(frozen=True)
class Ack(ControlFile):
    """``acks/<upstream>.json``: every row ``<upstream>`` sent through its seq ``seq`` is durable here, and so
    are the rows in ``runs`` above it.

    Acknowledging per row, not only a prefix, is what keeps a ring of sync links from stalling: a row that
    waits for this instance's own sync destinations must not hold back the rows received after it, whose
    acknowledgement the ring may need first (see :mod:`replication.durability`).
    """

    seq: int
    time: float = 0.0
    runs: tuple[tuple[int, int], ...] = ()
    """``(first, last)`` runs of ``<upstream>``'s seqs above ``seq`` that are durable here, ascending."""

    def to_json(self) -> dict:
        return {**super().to_json(), "runs": [list(run) for run in self.runs]}

    @classmethod
    def from_json(cls, payload: dict) -> Ack:
        ack = super().from_json(payload)
        return dataclasses.replace(ack, runs=tuple((int(a), int(b)) for a, b in ack.runs))


@dataclass(frozen=True)
class LinkState(ControlFile):
    """``links/<destination>.json``: one outgoing link's state."""

    destination: str
    sync_type: str
    address: str | None = None
    downstream: str | None = None
    """Instance name found at ``address``."""
    downstream_txlog_id: str | None = None
    """Delta table id of the downstream's txlog: a new id means a new downstream, so resync."""
    state: str = "connecting"
    """connecting, connected, failed over (on a later address), waiting, validation failed, config error,
    stopped."""
    epoch: int = 0
    """Incremented at each resync (for people reading the status)."""
    incarnation: str = ""
    """New at each resync: names the replicator's app transaction in the inbox (its checkpoint), so a
    lost link file can never make a new replicator take an old one's batches for its own."""
    sent_seq: int = 0
    """Replicated (or filtered) through this local seq."""
    unacked: tuple[tuple[int, int], ...] = ()
    """Runs (first, last) of local seqs sent and not yet acknowledged, in order."""
    downstream_ack: int = 0
    """The destination's last acknowledgement (local seq)."""
    downgraded: bool = False
    manual: bool = False
    """Downgraded by an operator (``replication downgrade``): no automatic upgrade undoes it."""
    detail: str = ""
    updated: float = field(default_factory=time.time)

    @property
    def acked_seq(self) -> int:
        """Everything through this seq is acknowledged or was never sent."""
        return self.unacked[0][0] - 1 if self.unacked else self.sent_seq

    def to_json(self) -> dict:
        return {**super().to_json(), "unacked": [list(run) for run in self.unacked], "acked_seq": self.acked_seq}

    @classmethod
    def from_json(cls, payload: dict) -> LinkState:
        state = super().from_json(payload)
        return dataclasses.replace(state, unacked=tuple((int(a), int(b)) for a, b in state.unacked))


@dataclass(frozen=True)
class ManualDowngrade(ControlFile):
    """``downgraded/<destination>.json``: an operator made a sync destination async until ``upgrade``."""

    destination: str
    at: float = 0.0
    """When it was asked (epoch seconds)."""
    reason: str = ""


@dataclass(frozen=True)
class ProxiedTransfer(ControlFile):
    """``proxied_transfer.json``: the instances whose queue messages this one takes over while they are down
    (``replication queue --enable-proxied-transfer``; the spec's ``enable_proxied_transfer``)."""

    instances: list = field(default_factory=list)
    updated: float = 0.0


@dataclass(frozen=True)
class BootstrapState(ControlFile):
    """``bootstrap.json``: a bootstrap from another instance, in progress (``copying``) or ``done``."""

    source: str
    """Address (storage root) of the source instance."""
    source_name: str
    source_txlog_id: str
    """The source txlog's Delta table id: a resumed bootstrap reads the same table."""
    source_version: int
    """The source txlog's Delta version the copy reads: one consistent snapshot, also when resumed."""
    source_through: int
    """The source's highest seq in that snapshot."""
    state: str = "copying"
    rows_copied: int = 0
    started: float = 0.0
    finished: float = 0.0


def write_instance_config(cfg: InstanceConfig, path: StoragePath) -> None:
    """``instance.json``: the effective config (see :mod:`replication.config.effective`)."""
    write_json_atomic(path, effective.to_dict(cfg), indent=2)


def read_instance_config(path: StoragePath) -> InstanceConfig:
    """Read ``instance.json``; a layout this version cannot read is a :class:`ConfigError`
    (terminal: waiting will not fix it). A missing file raises ``FileNotFoundError``."""
    text = path.read_text(encoding="utf-8")
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}): an instance writes it whole at each start. Fix: "
                          "start that instance again to rewrite it", file=str(path)) from None
    try:
        return effective.from_dict(payload)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        problem = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ConfigError(
            f"{path}: {problem}. Fix: run the same version of replication on both instances", file=str(path)
        ) from None
