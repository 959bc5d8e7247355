"""A micro-batch's rows read as soon as Spark has planned it, while Spark gets ready to run it.

Spark writes a batch's end offsets to the query's offset log
(:mod:`replication.connectors.spark.planned_batch`) and only then plans
and runs it: at 2k msg/s the ``foreachBatch`` function is called ~35 ms
after the entry appears (bench/replicate.py). A writer that reads its small
batches itself (``ingest.inputs.DriverRead``) knows from that entry alone
which rows the batch holds, so :class:`PlannedReadAhead` waits on a thread for
the next batch's entry and reads its rows then; the call finds them read.

The rows are those the call would read: an entry is never rewritten (a
re-run batch reuses its own), and the caller compares the ranges read
ahead with its own before taking them. Anything not read ahead in time,
read for another batch, or whose read failed, is read by the call as
before. Local checkpoints only: on object storage each look for the entry
would be a billed request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from replication.connectors.s3.objects import ObjectPath
from replication.connectors.spark.planned_batch import PlannedBatch

log = logging.getLogger(__name__)

#: How often the thread looks for the next entry: while batches follow one another, and once they have not
#: for :data:`BUSY_S` (an idle instance's thread then wakes 50 times a second, not 200).
BUSY_POLL_S = 0.005
IDLE_POLL_S = 0.02
BUSY_S = 1.0

T = TypeVar("T")


class PlannedReadAhead(Generic[T]):
    """``read(batch_id)`` on a thread once ``offsets/<batch_id>`` exists; :meth:`take` gives its answer.

    ``read`` returns what the caller will use (None: nothing to read ahead, e.g. a batch too big for the
    driver). It may use the objects the caller reads with (a Kafka consumer, say): the thread never runs
    while the caller reads, since :meth:`take` waits for it first. That wait is at most one read of the
    batch, which gives up after its own stall limit (the caller then reads the batch again itself).
    """

    def __init__(self, offsets: Path, read: Callable[[int], T | None], name: str) -> None:
        self.offsets = offsets
        self.read = read
        self.name = name
        self.hits = 0
        """Batches whose rows were read ahead and used."""
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._done: tuple[int, T] | None = None
        self._closed = False
        self._lock = threading.Lock()
        """Guards starting and stopping the thread (the writer's and a stopping instance's threads)."""

    @classmethod
    def of_checkpoint(cls, checkpoint: str | Path | ObjectPath, read: Callable[[PlannedBatch, int], T | None],
                      name: str) -> PlannedReadAhead[T] | None:
        """The read-ahead of a query's checkpoint: ``read`` is given a :class:`PlannedBatch` of its own (one
        keeps the entry it read last, so the caller's is not shared). None on object storage."""
        if isinstance(checkpoint, ObjectPath):
            return None
        plans = PlannedBatch(checkpoint)
        return cls(Path(checkpoint) / "offsets", lambda batch_id: read(plans, batch_id), name)

    def start(self, batch_id: int) -> None:
        """Wait for batch ``batch_id``'s entry on a thread, and read it then."""
        with self._lock:
            self._finish(None)
            if self._closed:
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(batch_id, self._stop, time.monotonic()),
                                            name=f"{self.name}-read-ahead", daemon=True)
            self._thread.start()

    def take(self, batch_id: int, wanted: Callable[[T], bool] = lambda _read: True) -> T | None:
        """What was read ahead for ``batch_id`` if ``wanted`` says it is what the call would read (waiting for a
        read under way), else None; the thread ends either way."""
        with self._lock:
            self._finish(None)
            done, self._done = self._done, None
        if done is None or done[0] != batch_id or not wanted(done[1]):
            return None
        self.hits += 1
        return done[1]

    def close(self, timeout: float) -> bool:
        """Stop, waiting up to ``timeout`` seconds for a read under way; False if it is still under way."""
        with self._lock:
            self._closed = True
            return self._finish(timeout)

    def _finish(self, timeout: float | None) -> bool:
        """Stop the thread: a read already under way completes (its answer kept), no new one begins. False if
        the thread is still running after ``timeout``."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            self._thread = thread
            return False
        return True

    def _run(self, batch_id: int, stop: threading.Event, since: float) -> None:
        entry = self.offsets / str(batch_id)
        while not entry.exists():
            pace = BUSY_POLL_S if time.monotonic() - since < BUSY_S else IDLE_POLL_S
            if stop.wait(pace):
                return
        if stop.is_set():
            return
        try:
            got = self.read(batch_id)
        except Exception:  # noqa: BLE001 - the call reads the batch itself, and reports a real failure
            log.debug("%s batch %d: reading it ahead failed; the batch reads itself", self.name, batch_id,
                      exc_info=True)
            return
        if got is not None:
            self._done = (batch_id, got)
