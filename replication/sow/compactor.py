"""The driver thread that keeps an instance's SOW tables up to date with its txlog.

Every ``<CompactionInterval>`` of a SOW topic, its table is compacted up to
the position the ingest writer has folded (:meth:`SowTable.compact`); once
more when the instance stops, so a stopped instance's tables are current. A
compaction that fails is logged and tried again at the next tick: the txlog
still holds every change, and readers that need the exact state fold it.
The ingest writer hands over each batch's committed rows (:meth:`Compactor.committed`),
so a compaction folds them from memory (:mod:`replication.sow.recent`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from replication.sow.keys import SowTopics
from replication.sow.recent import RecentRows
from replication.sow.table import TAIL_SCHEMA, SowTable
from replication.txlog.files import TxlogFiles

log = logging.getLogger(__name__)

#: How often the thread looks at the clock (the intervals themselves are per SOW topic).
TICK_S = 0.25


class Compactor:
    """Compacts each SOW table every its topic's ``compaction_interval`` (see the module docstring)."""

    def __init__(self, name: str, tables: list[SowTable], topics: SowTopics, txlog_path: str,
                 folded_seq: Callable[[], int]) -> None:
        self.name = name
        self.tables = tables
        self.topics = topics
        self.txlog = TxlogFiles(txlog_path)
        self.folded_seq = folded_seq
        """The txlog position the SOW state has folded: compactions go up to it."""
        self.compactions = 0
        self.recent = RecentRows(TAIL_SCHEMA)
        """The ingest writer's latest committed SOW rows (:meth:`committed`): compactions read them here."""
        self._due = [time.monotonic() + t.sow.compaction_interval for t in tables]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"{name}-sow-compactor", daemon=True)

    def start(self) -> Compactor:
        if self.tables:
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, then bring every table up to date once more."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=120)
        self.compact_all()

    def committed(self, rows, first_seq: int, last_seq: int) -> None:
        """The ingest writer committed ``rows`` (txlog seqs ``first_seq`` .. ``last_seq``)."""
        if self.tables:
            self.recent.add(rows, first_seq, last_seq)

    def compact_all(self) -> None:
        for index in range(len(self.tables)):
            self._compact(index)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            now = time.monotonic()
            for index, table in enumerate(self.tables):
                if now >= self._due[index]:
                    self._compact(index)
                    self._due[index] = time.monotonic() + table.sow.compaction_interval

    def _compact(self, index: int) -> None:
        table = self.tables[index]
        with self._lock:
            try:
                if table.compact(self.txlog, self.topics, index, self.folded_seq(), self.recent):
                    self.compactions += 1
                self.recent.drop_through(min(t.compacted_through for t in self.tables))
            except Exception:  # the txlog keeps every change: the next tick tries again
                log.exception("%s: compacting SOW topic %s failed; retrying at the next interval",
                              self.name, table.sow.name)
