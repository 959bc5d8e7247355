"""State of one outgoing replication link, and which local rows still wait for its acknowledgement.

Positions are local ``seq`` values of this instance's txlog. The replicator
reports each batch as the *runs* of seqs it wrote to the destination (rows
filtered out are not in any run) and ``through``, the last seq the batch
covered. The destination acknowledges in the same seq space
(``_control/acks/<this instance>.json`` under its storage): an ack of N means
every row sent through N is durable there, and its ``runs`` name rows above N
that are durable too (a row held up at the destination does not hold back the
acknowledgement of the rows after it; see :mod:`replication.durability`).

A local row waits for this link only if it was sent on it and is not yet
acknowledged. Rows the link filtered out never wait, which is what keeps a
two-way sync pair from waiting on itself: a row received from the partner is
not sent back (loop rule), so nothing holds it.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
import uuid

import numpy as np

from replication import failpoints
from replication.storage.control import LinkState
from replication.storage.layout import StoragePath
from replication.txlog.runs import Runs


class Link:
    """Thread-safe tracker of one link: sends, acks, state; persisted to its link file on every change (an
    acknowledgement's by :meth:`save`, once the ack watch has released what it made durable).

    ``version`` increases on every change, so a watcher knows when to re-check durability.
    """

    def __init__(self, path: StoragePath, destination: str, sync_type: str) -> None:
        self.path = path
        saved = LinkState.read(path)
        self.state = dataclasses.replace(saved or LinkState(destination, sync_type), sync_type=sync_type)
        self._lock = threading.Lock()
        self.version = 0
        self._unacked_arrays: tuple[int, np.ndarray, np.ndarray] = (-1, np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._last_ack: tuple[int, tuple] | None = None
        self._unsaved = False
        """An acknowledgement changed the state since the link file was written (:meth:`save`)."""

    @property
    def sync(self) -> bool:
        return self.state.sync_type == "sync"

    @property
    def downgraded(self) -> bool:
        with self._lock:
            return self.state.downgraded

    @property
    def manual(self) -> bool:
        """Downgraded by an operator: only ``replication upgrade`` ends it."""
        with self._lock:
            return self.state.manual

    @property
    def acked_seq(self) -> int:
        with self._lock:
            return self.state.acked_seq

    def awaiting_ack(self) -> bool:
        """Does a row sent to the destination wait for its acknowledgement?"""
        with self._lock:
            return bool(self.state.unacked)

    def holds(self, first: int, last: int) -> bool:
        """Does any local row in [first, last] still wait for this link?

        True when the replicator has not yet decided about the whole range, or
        when a row of it was sent and is not acknowledged.
        """
        with self._lock:
            if self.state.sent_seq < last:
                return True
            runs = self.state.unacked
            # the first run that ends at or after ``first``
            i = bisect.bisect_left(runs, first, key=lambda run: run[1])
            return i < len(runs) and runs[i][0] <= last

    def oldest_waiting(self) -> int:
        """The first local seq this link still waits for: its first unacknowledged row, or the first
        row its replicator has not decided yet (``sent_seq + 1``)."""
        with self._lock:
            unacked = self.state.unacked
            return unacked[0][0] if unacked else self.state.sent_seq + 1

    def decided_through(self) -> int:
        """The last local seq the replicator has decided (every later row waits for this link)."""
        with self._lock:
            return self.state.sent_seq

    def holds_all(self, first: int, last: int) -> bool:
        """Does every local row in [first, last] still wait for this link? (A cheap answer for a batch
        in flight: then no row of it can be acknowledged yet.)"""
        with self._lock:
            sent = self.state.sent_seq
            if first > sent:
                return True
            runs = self.state.unacked
            i = bisect.bisect_left(runs, first, key=lambda run: run[1])  # the first run ending at or after first
            return i < len(runs) and runs[i][0] <= first and (last <= runs[i][1] or runs[i][1] >= sent)

    def handed_through(self, seq: int) -> bool:
        """Has the replicator decided every row through ``seq``, writing the routed ones to the
        destination's inbox (its storage; an acknowledgement may still be pending)?"""
        with self._lock:
            return self.state.sent_seq >= seq

    def held_mask(self, seqs: np.ndarray) -> np.ndarray:
        """For each local seq of ``seqs``: does it still wait for this link? (:meth:`holds`, per row.)"""
        with self._lock:
            sent = self.state.sent_seq
            unacked = self.state.unacked
            if unacked and self._unacked_arrays[0] != self.version:
                self._unacked_arrays = (self.version, np.array([r[0] for r in unacked], dtype=np.int64),
                                        np.array([r[1] for r in unacked], dtype=np.int64))
            _, run_firsts, run_lasts = self._unacked_arrays if unacked else (0, None, None)
        held = seqs > sent
        if run_firsts is not None and run_lasts is not None and run_firsts.size:  # both set, or neither
            # the first run ending at or after each seq
            i = np.searchsorted(run_lasts, seqs, side="left")
            inside = i < run_lasts.size
            held[inside] |= run_firsts[i[inside]] <= seqs[inside]
        return held

    def holds_any(self, runs: Runs) -> bool:
        """Does any local row of ``runs`` still wait for this link? (:meth:`holds` for many runs at once.)"""
        firsts, lasts = runs
        if lasts.size == 0:
            return False
        top = int(lasts.max())
        with self._lock:
            if self.state.sent_seq < top:
                return True
            unacked = self.state.unacked
            if not unacked or top < unacked[0][0]:
                return False  # all at or below the acknowledged position
            if self._unacked_arrays[0] != self.version:
                self._unacked_arrays = (self.version, np.array([r[0] for r in unacked], dtype=np.int64),
                                        np.array([r[1] for r in unacked], dtype=np.int64))
            _, run_firsts, run_lasts = self._unacked_arrays
        # for each of our runs, the first unacknowledged run that ends at or after its first row
        i = np.searchsorted(run_lasts, firsts, side="left")
        inside = i < run_lasts.size
        return bool(np.any(run_firsts[i[inside]] <= lasts[inside]))

    def on_sent(self, runs: list[tuple[int, int]], through: int) -> None:
        """A replicator batch committed ``runs`` to the destination and covered seqs through ``through``."""
        with self._lock:
            sent = self.state.sent_seq
            if through <= sent:
                return  # a replayed batch
            unacked = list(self.state.unacked)
            for first, last in runs:
                if last > sent:
                    first = max(first, sent + 1)
                    if unacked and unacked[-1][1] == first - 1:
                        unacked[-1] = (unacked[-1][0], last)  # one run for a stream of routed rows
                    else:
                        unacked.append((first, last))
            self._change_locked(sent_seq=through, unacked=_trimmed(unacked, self.state.downstream_ack))

    def on_ack(self, downstream_ack: int, runs: tuple[tuple[int, int], ...] | list = ()) -> None:
        """The destination acknowledged every row sent through local seq ``downstream_ack``, and the
        rows in ``runs`` (``(first, last)``, above it)."""
        with self._lock:
            key = (downstream_ack, tuple(map(tuple, runs)))
            if key == self._last_ack:
                return  # the same file read again (every 50 ms)
            self._last_ack = key
            unacked = self.state.unacked
            if downstream_ack > self.state.downstream_ack:
                unacked = _trimmed(list(unacked), downstream_ack)
            if runs and unacked:
                unacked = _without(unacked, key[1])
            if downstream_ack <= self.state.downstream_ack and unacked == self.state.unacked:
                return
            # Written by save(), after the acks this releases: the destination's ack file is the record (a
            # restart reads it again), and the link file's write is then off the persisted ack's path.
            self._change_locked(downstream_ack=max(downstream_ack, self.state.downstream_ack), unacked=unacked,
                                write=False)

    def save(self) -> None:
        """Write the link file if an acknowledgement changed the state since it was last written."""
        with self._lock:
            if self._unsaved:
                failpoints.hit("link.before_ack_save")
                self._write_locked()

    def reset(self, *, start_seq: int, epoch: int, address: str, downstream: str, txlog_id: str | None) -> None:
        """A resync: the link starts over after ``start_seq`` toward a (possibly new) downstream."""
        with self._lock:
            self._last_ack = None
            self._change_locked(
                epoch=epoch, incarnation=f"{epoch}-{uuid.uuid4().hex[:12]}", address=address, downstream=downstream,
                downstream_txlog_id=txlog_id, sent_seq=start_seq, unacked=(), downstream_ack=0,
            )

    def upgrade_unless_manual(self) -> bool:
        """Back to sync unless an operator downgraded it (checked and changed as one step); True if upgraded."""
        with self._lock:
            if self.state.manual or not self.state.downgraded:
                return False
            self._change_locked(downgraded=False)
            return True

    def set(self, **changes) -> None:
        with self._lock:
            if all(getattr(self.state, k) == v for k, v in changes.items()):
                return
            self._change_locked(**changes)

    def snapshot(self) -> LinkState:
        with self._lock:
            return self.state

    def _change_locked(self, *, write: bool = True, **changes) -> None:
        self.state = dataclasses.replace(self.state, updated=time.time(), **changes)
        self.version += 1
        if write:
            self._write_locked()
        else:
            self._unsaved = True

    def _write_locked(self) -> None:
        failpoints.hit("link.before_write")
        self.state.write(self.path)
        self._unsaved = False


def _trimmed(runs: list[tuple[int, int]], ack: int) -> tuple[tuple[int, int], ...]:
    """``runs`` without what the acknowledgement ``ack`` covers."""
    i = 0
    while i < len(runs) and runs[i][1] <= ack:
        i += 1
    kept = runs[i:]
    if kept and kept[0][0] <= ack:
        kept[0] = (ack + 1, kept[0][1])
    return tuple(kept)


def _without(runs: tuple[tuple[int, int], ...], acked: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """``runs`` minus the rows of ``acked`` (both ascending, non-overlapping)."""
    out: list[tuple[int, int]] = []
    j = 0
    for first, last in runs:
        while j < len(acked) and acked[j][1] < first:
            j += 1
        k = j
        while first <= last:
            if k >= len(acked) or acked[k][0] > last:
                out.append((first, last))
                break
            a_first, a_last = acked[k]
            if a_first > first:
                out.append((first, a_first - 1))
            first = max(first, a_last + 1)
            k += 1
    return tuple(out)
