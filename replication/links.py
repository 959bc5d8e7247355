"""State of one outgoing replication link, and which local rows still wait for its acknowledgement.

Positions are local ``seq`` values of this instance's txlog. The replicator
reports each batch as the *runs* of seqs it wrote to the destination (rows
filtered out are not in any run) and ``through``, the last seq the batch
covered. The destination acknowledges in the same seq space
(``_control/acks/<this instance>.json`` under its storage): an ack of N means
every row sent through N is durable there.

A local row waits for this link only if it was sent on it and is not yet
acknowledged. Rows the link filtered out never wait, which is what keeps a
two-way sync pair from waiting on itself: a row received from the partner is
not sent back (loop rule), so nothing holds it.
"""

from __future__ import annotations

import bisect
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from replication.storage import read_json, write_json_atomic



@dataclass
class LinkState:
    """What ``_control/links/<destination>.json`` holds."""

    destination: str
    sync_type: str
    address: str | None = None
    downstream: str | None = None
    """Instance name found at ``address``."""
    downstream_txlog_id: str | None = None
    """Delta table id of the downstream's txlog: a new id means a new downstream, so resync."""
    state: str = "connecting"
    """connecting, connected, failed over (on a later address), waiting, validation failed, stopped."""
    epoch: int = 0
    """Incremented at each resync (for people reading the status)."""
    incarnation: str = ""
    """New at each resync: names the replicator checkpoint and the inbox app transaction, so a
    lost link file can never make a new replicator reuse an old one's checkpoint or batch ids."""
    sent_seq: int = 0
    """Replicated (or filtered) through this local seq."""
    unacked: list[list[int]] = field(default_factory=list)
    """Runs [first, last] of local seqs sent and not yet acknowledged, in order."""
    downstream_ack: int = 0
    """The destination's last acknowledgement (local seq)."""
    downgraded: bool = False
    detail: str = ""
    updated: float = field(default_factory=time.time)

    @property
    def acked_seq(self) -> int:
        """Everything through this seq is acknowledged or was never sent."""
        return self.unacked[0][0] - 1 if self.unacked else self.sent_seq

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        out["acked_seq"] = self.acked_seq
        return out

    @classmethod
    def from_json(cls, payload: dict) -> "LinkState":
        known = {k: v for k, v in payload.items() if k in cls.__dataclass_fields__}
        return cls(**known)


class Link:
    """Thread-safe tracker of one link: sends, acks, state; persisted to its link file.

    ``version`` increases on every change, so a watcher knows when to re-check durability.
    """

    def __init__(self, path: Path, destination: str, sync_type: str) -> None:
        self.path = path
        payload = read_json(path)
        self.state = LinkState.from_json(payload) if payload else LinkState(destination, sync_type)
        self.state.sync_type = sync_type
        self._lock = threading.Lock()
        self.version = 0
        self._unacked_arrays: tuple[int, np.ndarray, np.ndarray] = (-1, np.zeros(0, np.int64), np.zeros(0, np.int64))

    @property
    def sync(self) -> bool:
        return self.state.sync_type == "sync"

    @property
    def downgraded(self) -> bool:
        with self._lock:
            return self.state.downgraded

    @property
    def acked_seq(self) -> int:
        with self._lock:
            return self.state.acked_seq

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
            if through <= self.state.sent_seq:
                return  # a replayed batch
            unacked = self.state.unacked
            for first, last in runs:
                if last > self.state.sent_seq:
                    first = max(first, self.state.sent_seq + 1)
                    if unacked and unacked[-1][1] == first - 1:
                        unacked[-1][1] = last  # one run for a stream of routed rows, however many batches
                    else:
                        unacked.append([first, last])
            self.state.sent_seq = through
            self._trim_locked()
            self._changed_locked()

    def on_ack(self, downstream_ack: int) -> None:
        """The destination acknowledged every row sent through local seq ``downstream_ack``."""
        with self._lock:
            if downstream_ack <= self.state.downstream_ack:
                return
            self.state.downstream_ack = downstream_ack
            self._trim_locked()
            self._changed_locked()

    def reset(self, *, start_seq: int, epoch: int, address: str, downstream: str, txlog_id: str | None) -> None:
        """A resync: the link starts over after ``start_seq`` toward a (possibly new) downstream."""
        with self._lock:
            self.state.epoch = epoch
            self.state.incarnation = f"{epoch}-{uuid.uuid4().hex[:12]}"
            self.state.address = address
            self.state.downstream = downstream
            self.state.downstream_txlog_id = txlog_id
            self.state.sent_seq = start_seq
            self.state.unacked = []
            self.state.downstream_ack = 0
            self._changed_locked()

    def set(self, **changes) -> None:
        with self._lock:
            if all(getattr(self.state, k) == v for k, v in changes.items()):
                return
            for key, value in changes.items():
                setattr(self.state, key, value)
            self._changed_locked()

    def snapshot(self) -> LinkState:
        with self._lock:
            return LinkState.from_json(self.state.to_json())

    def _trim_locked(self) -> None:
        ack = self.state.downstream_ack
        runs = self.state.unacked
        while runs and runs[0][1] <= ack:
            runs.pop(0)
        if runs and runs[0][0] <= ack:
            runs[0][0] = ack + 1

    def _changed_locked(self) -> None:
        self.version += 1
        self.state.updated = time.time()
        write_json_atomic(self.path, self.state.to_json())


#: Runs of local seqs as two arrays: ``(firsts, lasts)``, ascending, each run ``[first, last]``.
Runs = tuple[np.ndarray, np.ndarray]


def run_bounds(seqs) -> Runs:
    """Consecutive runs of an ascending sequence of ints, as ``(firsts, lasts)`` arrays."""
    values = np.asarray(seqs, dtype=np.int64)
    if values.size == 0:
        return values, values
    breaks = np.flatnonzero(np.diff(values) != 1)
    return values[np.concatenate(([0], breaks + 1))], values[np.concatenate((breaks, [values.size - 1]))]


def runs_of(seqs) -> list[tuple[int, int]]:
    """Consecutive runs [first, last] of an ascending sequence of ints."""
    firsts, lasts = run_bounds(seqs)
    return list(zip(firsts.tolist(), lasts.tolist()))


def runs_by_code(codes: np.ndarray, seqs: np.ndarray) -> dict[int, Runs]:
    """Runs of ``seqs`` (ascending) per key code, codes < 0 left out: which rows belong to each key."""
    if codes.size == 0:
        return {}
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    bounds = np.flatnonzero(sorted_codes[1:] != sorted_codes[:-1]) + 1
    return {int(sorted_codes[segment[0]]): run_bounds(seqs[order[segment]])
            for segment in np.split(np.arange(codes.size), bounds) if sorted_codes[segment[0]] >= 0}


def runs_by_value(values, seqs: np.ndarray) -> dict[str, Runs]:
    """Runs of ``seqs`` (ascending) per distinct value of the Arrow string column ``values`` (nulls left out)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = pc.dictionary_encode(values)
    labels = encoded.dictionary.to_pylist()
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return {labels[code]: runs for code, runs in runs_by_code(codes, seqs).items()}
