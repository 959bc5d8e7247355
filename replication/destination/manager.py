"""One driver thread per destination: choose an address, validate, resync, replicate, watch acks.

Lifecycle of a destination (its state is in ``_control/links/<destination>.json``):

1. try the ``<InetAddr>`` list in priority order; an address is usable when
   the instance there has a fresh heartbeat and says it is running;
2. read its ``_control/instance.json`` and run replication validation; on
   findings the link is ``validation failed`` (each finding is logged with its
   fix) and the next address is tried;
3. resume from the link file (and the replicator's app transaction in the
   downstream's inbox) when the same downstream (same txlog id) is at the
   same address, else resync: start after the earliest txlog row the
   downstream lacks, judged by its per-publisher high-water marks;
4. run the replicator (a driver thread), and every few milliseconds read the downstream's
   ack for this instance, which moves the link's acknowledged position (only
   while rows wait for it: an idle link reads it once a second, and on object
   storage, where each read is a billed request, every 100 ms at most);
5. when the heartbeat goes stale or the replicator fails, stop and go back to 1;
   after the end of the list, wait with growing back-off.

A transient failure (the destination down, a table being written) is retried
as above. A terminal one (:mod:`replication.errors`: a config the engine
cannot act on, an address it cannot use) stops this destination with state
``config error`` and the message, in the log and in ``replication status``,
until the configuration is fixed and the instance restarted.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from replication import validation
from replication.config.model import Destination, InstanceConfig
from replication.destination import replicator
from replication.destination.link import Link
from replication.destination.resync import (
    ResyncGapError,
    downstream_ack,
    heartbeat_fresh,
    read_ack,
    resync_start,
    stored_per_publisher,
    txlog_id,
)
from replication.errors import ReplicationError, StorageError
from replication.storage.control import Heartbeat, RetentionState, read_instance_config
from replication.storage.layout import StorageLayout, link_name

if TYPE_CHECKING:
    from replication.txlog.recent import RecentTxlog

log = logging.getLogger(__name__)

#: The ack watch's pace on a local or mounted disk while a sent row waits for the destination's ack: the read
#: is of one small file, and it is the persisted ack's last hop (every 50 ms, it was ~26 ms of it at p50).
ACK_POLL_S = 0.02
#: Its pace when no row waits: the replicator's liveness and the idle ack read
#: (:data:`IDLE_ACK_READ_S`) need no faster turns, and an idle pair costs little.
IDLE_POLL_S = 0.05
#: The ack watch's pace toward a destination on object storage: each read is a billed request (and, on a
#: local S3 server, one queued with the Delta commits).
ACK_POLL_OBJECT_STORAGE_S = 0.1
#: How often an idle link (no row waiting for its ack) reads the ack anyway.
IDLE_ACK_READ_S = 1.0
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 15.0
#: How often the addresses are looked at during a back-off, for an instance that has started at one.
ADDRESS_CHECK_S = 0.5


class DestinationManager:
    """Keeps one destination replicating (see the module docstring)."""

    def __init__(
        self,
        cfg: InstanceConfig,
        dest: Destination,
        *,
        layout: StorageLayout,
        link: Link,
        on_ack: Callable[[], object],  # (its result is not used)
        min_batch_interval_s: float = 0.0,
        recent: RecentTxlog | None = None,
    ) -> None:
        """``recent``: the ingest's latest committed rows, which the replicator takes instead of reading them
        back. ``min_batch_interval_s``: the least time between the starts of two replicator batches (the
        instance's trigger interval)."""
        self.recent = recent
        self.cfg = cfg
        self.dest = dest
        self.layout = layout
        self.link = link
        self.on_ack = on_ack
        self.min_batch_interval_s = min_batch_interval_s
        self.replicator: replicator.Replicator | None = None
        """The running replicator (its counters stay readable after it stops)."""
        self._stop = threading.Event()
        self.name = link_name(cfg.name, dest.name)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> DestinationManager:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self._stop_replicator()
        self.link.set(state="stopped")
        self.link.save()  # (an acknowledgement read as the watch stopped)

    # -- the loop ---------------------------------------------------------
    def _run(self) -> None:
        backoff = BACKOFF_START_S
        while not self._stop.is_set():
            connected = False
            for index, address in enumerate(self.dest.inet_addrs):
                if self._stop.is_set():
                    return
                try:
                    down = StorageLayout.of(address)
                    if not heartbeat_fresh(down) or not self._connect(index, address, down):
                        continue
                except Exception as exc:  # a destination problem must not kill the instance
                    if isinstance(exc, ReplicationError) and not exc.transient:
                        self._give_up(address, exc)
                        return
                    log.exception("%s: connecting to %s failed", self.name, address)
                    self.link.set(state="waiting", detail=f"connect to {address} failed: {exc}")
                    self._stop_replicator()
                    continue
                connected = True
                started = time.monotonic()
                failed = self._watch(down)
                self._stop_replicator()
                if not failed or time.monotonic() - started > BACKOFF_MAX_S:
                    backoff = BACKOFF_START_S  # the destination went away, or the replicator had been healthy
                if failed:
                    # A replicator that dies (a txlog file it could not read, a bad inbox...) is retried
                    # with growing, jittered back-off, not at once.
                    if self._stop.wait(backoff * random.uniform(0.5, 1.5)):
                        return
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                break
            if not connected:
                state = self.link.snapshot().state
                if state not in ("validation failed", "resync impossible"):
                    self.link.set(state="waiting", detail=f"no usable address; retrying in {backoff:.1f}s")
                if self._wait_for_an_address(backoff):
                    return
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _wait_for_an_address(self, backoff: float) -> bool:
        """Wait ``backoff`` seconds before the addresses are tried again, or less: an instance that starts (or
        restarts) at one of them ends the wait, so a destination back up is used at once, not up to
        ``BACKOFF_MAX_S`` later. True when the manager is stopped meanwhile."""
        before = {address: self._started_at(address) for address in self.dest.inet_addrs}
        deadline = time.monotonic() + backoff
        while (left := deadline - time.monotonic()) > 0:
            if self._stop.wait(min(left, ADDRESS_CHECK_S)):
                return True
            if any(self._started_at(a) not in (None, before[a]) for a in self.dest.inet_addrs):
                return False
        return self._stop.is_set()

    @staticmethod
    def _started_at(address: str) -> float | None:
        """When the instance running at ``address`` started (None: none runs there, by its heartbeat)."""
        try:
            down = StorageLayout.of(address)
            beat = Heartbeat.read(down.heartbeat_json) if heartbeat_fresh(down) else None
            return beat.started if beat is not None else None
        except Exception:  # an unreadable address is not usable yet
            return None

    def _give_up(self, address: str, exc: ReplicationError) -> None:
        """A terminal error: waiting will not fix it, so the link stops and says why until a restart."""
        log.error("%s: config error at %s: %s. This destination stays stopped until the configuration is fixed "
                  "and the instance restarted", self.name, address, exc)
        self._stop_replicator()
        self.link.set(state="config error", address=address, detail=str(exc))

    def _connect(self, index: int, address: str, down: StorageLayout) -> bool:
        if self.replicator is not None and self.replicator.is_active:
            # Stopping gave up on a batch still under way (a destination's storage that does not answer): a
            # second replicator of this link beside it would append the same rows or reset the link under it.
            raise StorageError(f"{self.name}: the last replicator's batch is still under way (its "
                               "destination's storage is not answering); retrying once it has ended")
        down_cfg = read_instance_config(down.instance_json)
        findings = validation.validate_link(self.cfg, self.dest, down_cfg)
        if findings:
            for finding in findings:
                log.error("%s at %s: replication validation failed: %s", self.name, address, finding)
            self.link.set(state="validation failed", address=address, downstream=down_cfg.name,
                          detail="; ".join(str(f) for f in findings))
            return False
        state = self.link.snapshot()
        down_id = txlog_id(down)
        # (the replicator's checkpoint is its app transaction in that inbox: see replication.destination.replicator)
        resume = state.incarnation and state.address == address and state.downstream_txlog_id == down_id
        if not resume:
            kept = RetentionState.read(self.layout.retention_json)
            try:
                start = resync_start(self.layout.txlog, stored_per_publisher(down),
                                     after=downstream_ack(down, self.cfg.name),
                                     first_seq=kept.first_seq if kept else 1,
                                     first_bookmark=kept.first_bookmark if kept else None)
            except ResyncGapError as exc:
                log.error("%s at %s: resync impossible: %s", self.name, address, exc)
                self.link.set(state="resync impossible", address=address, downstream=down_cfg.name, detail=str(exc))
                return False
            log.warning("%s: resync toward %s (%s) from local seq %d",
                        self.name, down_cfg.name, address, start)
            self.link.reset(start_seq=start, epoch=state.epoch + 1, address=address, downstream=down_cfg.name,
                            txlog_id=down_id)
            state = self.link.snapshot()
        self.replicator = replicator.Replicator(
            self.cfg, self.dest,
            txlog=self.layout.txlog, inbox=down.inbox, incarnation=state.incarnation, link=self.link,
            target=down_cfg.name,
            recent=self.recent, min_interval_s=self.min_batch_interval_s,
        ).start()
        self.link.set(state="connected" if index == 0 else "failed over", detail="")
        return True

    def _watch(self, down: StorageLayout) -> bool:
        """Follow acks until the replicator dies (True) or the destination goes away or we stop (False)."""
        last_beat_check = last_read = 0.0
        reported = -1
        on_disk = isinstance(down.root, Path)
        pace = watch_pace(False, on_disk)
        while not self._stop.wait(pace):
            # The acknowledged position moves on downstream acks, and also when a
            # batch was entirely filtered out (nothing to wait for).
            awaiting = self.link.awaiting_ack()
            pace = watch_pace(awaiting, on_disk)
            if ack_read_due(awaiting, time.monotonic(), last_read):
                last_read = time.monotonic()
                ack = read_ack(down, self.cfg.name)
                self.link.on_ack(ack.seq, ack.runs)
            if self.link.version != reported:
                reported = self.link.version
                self.on_ack()
            self.link.save()  # (after the release: the persisted acks do not wait for the link file)
            running = self.replicator
            if running is None or not running.is_active:
                error = running.error if running is not None else None
                log.error("%s: replicator stopped: %s", self.name, error)
                self.link.set(state="waiting", detail=f"replicator stopped: {error}")
                return True
            now = time.time()
            if now - last_beat_check >= 1.0:
                last_beat_check = now
                if not heartbeat_fresh(down, now=now):
                    log.warning("%s: %s stopped answering; failing over",
                                self.name, self.link.snapshot().address)
                    self.link.set(state="waiting", detail="destination heartbeat stale")
                    return False
        return False

    def _stop_replicator(self) -> None:
        if self.replicator is not None:
            self.replicator.stop()


def watch_pace(awaiting: bool, on_disk: bool) -> float:
    """Seconds to the ack watch's next turn: :data:`ACK_POLL_S` on disk while a sent row waits for its ack,
    :data:`IDLE_POLL_S` when none does; toward object storage :data:`ACK_POLL_OBJECT_STORAGE_S` either way."""
    if not on_disk:
        return ACK_POLL_OBJECT_STORAGE_S
    return ACK_POLL_S if awaiting else IDLE_POLL_S


def ack_read_due(awaiting: bool, now: float, last_read: float) -> bool:
    """Does the ack watch read the downstream's ack now: while a sent row waits for it, at every turn;
    else once every :data:`IDLE_ACK_READ_S` (an idle pair costs no steady stream of reads)."""
    return awaiting or now - last_read >= IDLE_ACK_READ_S

