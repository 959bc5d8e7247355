"""The replicator of one destination: txlog rows, routed, appended to the destination's inbox.

A driver thread, not a Spark query: every batch was read and routed in the
driver already (the rows the ingest has just committed, from memory), so a
micro-batch of its own only added Spark's fixed work per trigger (~30 ms of
planning and offset/commit logs) and its polling sleep to each hop. The
thread wakes when the ingest hands over a commit
(:meth:`replication.txlog.recent.RecentTxlog.wait_past`), and otherwise looks
at the txlog's Delta log every :data:`POLL_S` (:data:`POLL_OBJECT_STORAGE_S` on
object storage) for rows committed by a backfill, or by an ingest before a
restart.

Order of effects for a batch (rows with local seq in (s, t], at most
:data:`BATCH_ROWS`, :data:`BODY_ROUTED_BATCH_ROWS` when a content filter reads
bodies; s is the link's ``sent_seq``):

1. read the rows: from memory when this process's ingest has just committed
   every one of them (:mod:`replication.txlog.recent`), else from the txlog's
   Parquet files; and mark each routed or not with
   :func:`replication.routing.route_mask` (the loop rule asks whether the
   instance actually reached, by its ``instance.json``, is on the row's path);
2. append the routed rows to the destination's ``inbox/`` with app transaction
   ``<this>-><destination>#<incarnation>``, version ``t``;
3. tell the link which seqs were written and that (s, t] is decided: rows
   filtered out never wait for this destination's acknowledgement.

The inbox's app transaction is the replicator's checkpoint: its version is
the last seq of the latest batch appended. At a restart, a version past the
link's ``sent_seq`` is a batch whose step 3 a crash prevented: its range is
routed again and the link told, with nothing appended. A crash before step
2 leaves nothing to find: the restart starts after ``sent_seq``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from replication import failpoints, routing
from replication.config.model import DEFAULT_BATCH_ROWS, Destination, InstanceConfig
from replication.connectors.delta.tables import IdempotentAppender
from replication.inbox import signing
from replication.inbox.schema import INBOX_SCHEMA, INBOX_TABLE_CONFIGURATION
from replication.storage.layout import StoragePath, link_name
from replication.txlog.files import TxlogFiles
from replication.txlog.runs import runs_of

if TYPE_CHECKING:
    from replication.destination.link import Link
    from replication.txlog.recent import RecentTxlog

log = logging.getLogger(__name__)

#: The most rows of one batch (one inbox commit).
BATCH_ROWS = DEFAULT_BATCH_ROWS
#: The most when a content filter reads message bodies: each is parsed in the driver, holding the GIL the
#: ingest and the durability loop share (~3.5 µs a row).
BODY_ROUTED_BATCH_ROWS = 50_000
#: How often the txlog's Delta log is looked at for rows this process's ingest did not hand over (the ingest's
#: own commits wake the replicator at once): on a local or mounted disk, a look for the next commit file.
POLL_S = 0.05
#: The same on object storage, where each look is a billed request.
POLL_OBJECT_STORAGE_S = 0.5

_CODECS = {"zstd": "ZSTD", "snappy": "SNAPPY", "gzip": "GZIP", "lz4": "LZ4_RAW", "none": "UNCOMPRESSED"}

class Replicator:
    """One destination's replicator thread (see the module docstring for the order of effects)."""

    def __init__(self, cfg: InstanceConfig, dest: Destination, *, txlog: StoragePath, inbox: StoragePath,
                 incarnation: str, link: Link, target: str,
                 recent: RecentTxlog | None = None, min_interval_s: float = 0.0) -> None:
        self.cfg = cfg
        self.dest = dest
        self.link = link
        self.target = target
        """The instance at the address in use (its ``instance.json`` name): the loop rule's subject. A
        destination named by its group, or failing over, reaches an instance of another name."""
        self.name = link_name(cfg.name, dest.name, incarnation)
        self.inbox = IdempotentAppender(
            inbox,
            INBOX_SCHEMA,
            app_id=self.name,
            name=f"{dest.name} inbox",
            configuration=INBOX_TABLE_CONFIGURATION,
            compression=_CODECS[dest.compression],
        )
        reads_bodies = "data" in routing.spark_condition_columns(cfg, dest, target=target)
        self.batch_rows = BODY_ROUTED_BATCH_ROWS if reads_bodies else BATCH_ROWS
        """The most rows of one batch: fewer when the routing parses message bodies."""
        self.txlog = TxlogFiles(str(txlog))
        self.poll_s = POLL_S if isinstance(txlog, Path) else POLL_OBJECT_STORAGE_S
        self.recent = recent
        """The rows the ingest committed last, taken from memory rather than read back from the txlog's files
        (:mod:`replication.txlog.recent`; None: always from the files)."""
        self.min_interval_s = min_interval_s
        """The least time from one batch's start to the next (the instance's trigger interval)."""
        self.rows_sent = 0
        self.batches = 0
        self.ranges_from_memory = 0
        """Txlog ranges taken from :attr:`recent` (the others were read from the txlog's files)."""
        self.signing_key = dest.signing_key.reveal().encode() if dest.signing_key is not None else None
        """HMAC key of this link's commits (the destination's ``<Authenticator>``, :mod:`replication.inbox.signing`)."""
        self.error: BaseException | None = None
        """Why the thread stopped on its own (None while it runs, or when stopped)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> Replicator:
        if self.recent is not None:
            self.recent.attach(self.dest.name, self.link.snapshot().sent_seq)
        self._thread.start()
        return self

    @property
    def is_active(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop after the batch under way, and let go of the rows held for this replicator."""
        self._stop.set()  # (a wait for the ingest's next commit ends within poll_s)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self.recent is not None:
            self.recent.detach(self.dest.name)

    # -- the loop ---------------------------------------------------------
    def _run(self) -> None:
        try:
            position = self._resume()
            while not self._stop.is_set():
                latest = self._latest(position)
                if latest <= position:
                    self._wait(position)
                    continue
                through = min(latest, position + self.batch_rows)
                started = time.monotonic()
                self._replicate(position, through)
                position = through
                if self.min_interval_s > 0:
                    self._stop.wait(max(0.0, self.min_interval_s - (time.monotonic() - started)))
        except BaseException as exc:  # noqa: BLE001 - the manager sees it and retries with back-off
            self.error = exc
            log.error("%s: replicator stopped: %s", self.name, exc, exc_info=True)

    def _resume(self) -> int:
        """Where the first batch starts: after the link's ``sent_seq``, or after the batch the inbox holds past it
        (appended before a crash, the link not told yet), whose range is routed again and told to the link."""
        sent = self.link.snapshot().sent_seq
        appended = self.inbox.committed_version
        if appended is None or appended <= sent:
            return sent
        log.info("%s: seqs %d-%d were appended to the inbox before the restart; the link is told", self.name,
                 sent + 1, appended)
        for after in range(sent, appended, self.batch_rows):  # (a link file far behind: in batch-sized pieces)
            self._replicate(after, min(after + self.batch_rows, appended), appended=True)
        return appended

    def _latest(self, position: int) -> int:
        """The highest seq committed to the txlog, as far as is known: the ingest's last hand-over when it is past
        ``position``, else the txlog's Delta log."""
        if self.recent is not None and self.recent.latest > position:
            return self.recent.latest
        self.txlog.refresh()
        return self.txlog.committed_seq

    def _wait(self, position: int) -> None:
        """Until the ingest hands over a commit past ``position``, the replicator is stopped, or :attr:`poll_s`
        passed."""
        if self.recent is not None:
            self.recent.wait_past(position, self.poll_s)
        else:
            self._stop.wait(self.poll_s)

    # -- one batch --------------------------------------------------------
    def _replicate(self, after: int, through: int, *, appended: bool = False) -> None:
        """Batch (after, through]; ``appended``: already in the inbox (the link is told, nothing appended)."""
        rows, mask = self._read_and_route(after, through)
        routed_seqs = rows["seq"].to_numpy()[mask]
        if not routed_seqs.size or appended:
            routed = None
        else:  # (every row routed, the common case: no copy of the batch's bodies)
            routed = rows if routed_seqs.size == rows.num_rows else rows.filter(pa.array(mask))
        self._send(routed, routed_seqs, through)
        self.batches += 1

    def _read_and_route(self, after: int, through: int) -> tuple[pa.Table, np.ndarray]:
        """Txlog rows (after, through] and which of them are routed here."""
        rows = self._txlog_rows(after, through)
        return rows, routing.route_mask(self.cfg, self.dest, rows, target=self.target)

    def _txlog_rows(self, after: int, through: int) -> pa.Table:
        """Txlog rows (after, through] in seq order: from memory when the ingest just committed them all."""
        held = self.recent.read(after, through) if self.recent is not None else None
        if held is not None:
            self.ranges_from_memory += 1
            return held
        if self.txlog.committed_seq < through:
            self.txlog.refresh()
        return self.txlog.read(after, through)

    def _send(self, routed: pa.Table | None, routed_seqs: np.ndarray, through: int) -> None:
        """Append the routed rows to the inbox (one idempotent commit), then tell the link."""
        if routed is not None and routed.num_rows:
            rows = self._inbox_rows(routed)
            failpoints.hit("replicator.before_inbox_commit")
            if self.inbox.append(rows, through, {"link": self.cfg.name, "through": through},
                                 commit_info=self._signature(rows, through)):
                self.rows_sent += routed.num_rows
        failpoints.hit("replicator.after_inbox_commit")
        self.link.on_sent(runs_of(routed_seqs), through)
        if self.recent is not None:
            self.recent.passed(self.dest.name, through)

    def _signature(self, rows: pa.Table, through: int) -> dict[str, str] | None:
        """The commit's signature with the destination's ``<Authenticator>`` key (none without one)."""
        if self.signing_key is None:
            return None
        return {signing.SIGNATURE_KEY: signing.sign(self.signing_key, upstream=self.cfg.name, to=self.target,
                                                    app_id=self.inbox.app_id, batch=through, rows=rows)}

    def _inbox_rows(self, routed: pa.Table) -> pa.Table:
        n = routed.num_rows
        columns = {name: routed[name] for name in INBOX_SCHEMA.names if name in routed.column_names}
        columns["upstream_seq"] = routed["seq"]
        columns["link"] = pa.repeat(pa.scalar(self.cfg.name, pa.string()), n)
        columns["link_group"] = pa.repeat(pa.scalar(self.cfg.group, pa.string()), n)
        return pa.table({name: columns[name] for name in INBOX_SCHEMA.names}, schema=INBOX_SCHEMA)
