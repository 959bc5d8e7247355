"""The source ranges Spark planned for a micro-batch, so a writer can read a small batch itself.

A ``foreachBatch`` function that collects its DataFrame makes Spark run a job:
schedule a task, ship it, read the rows, convert them to Arrow, serve them to
Python. For the few hundred rows of a live micro-batch that is 50-200 ms of a
query's ~250 ms batch on 2 cores (bench/ingest.py, bench/replicate.py), almost
all of it fixed cost. The engine's writers can read their sources directly
(Kafka offsets, txlog seqs, inbox versions), so for a small batch they ask
:class:`PlannedBatch` for the range and read it without a job; large batches
(a backlog) are still read by Spark tasks in parallel.

The range comes from the query's offset log, where Spark writes each batch's
end offsets (``offsets/<batch id>``) before it runs the batch; the previous
entry is where the batch starts. Those are exactly the offsets Spark hands the
source for that batch, and a batch re-run after a crash is re-run with the
same entry, so both paths read the same rows. Only Spark's ``v1`` offset-log
format is read (in a local checkpoint or one in a bucket); anything else
returns None and the writer collects its DataFrame as before. The first batch's start is not logged: the caller
gives the sources' initial offsets.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from replication.connectors.s3.objects import ObjectPath
from replication.connectors.spark.driver_read import DRIVER_READ_MAX_ROWS
from replication.errors import StorageError

__all__ = ["DRIVER_READ_MAX_ROWS", "PlannedBatch", "query_id"]


def query_id(checkpoint: str | Path | ObjectPath) -> str | None:
    """The id Spark gave the query of ``checkpoint`` (its ``metadata`` file, written at the query's first start
    and kept while the checkpoint is): a new checkpoint has a new one. None: not readable."""
    try:
        where = checkpoint if isinstance(checkpoint, ObjectPath) else Path(checkpoint)
        found = json.loads((where / "metadata").read_text()).get("id")
    except (OSError, ValueError, AttributeError):  # (an S3 failure other than a missing key propagates: the
        # batch fails and is run again, rather than committing under another app id)
        return None
    return found if isinstance(found, str) and found else None


class PlannedBatch:
    """Reads the start and end offsets of a query's micro-batches from its checkpoint."""

    def __init__(self, checkpoint: str | Path | ObjectPath) -> None:
        """``checkpoint``: a local folder, or a prefix on S3 (read with the same code: one GET per entry)."""
        self.offsets = (checkpoint if isinstance(checkpoint, ObjectPath) else Path(checkpoint)) / "offsets"
        self._last: tuple[int, list[dict] | None] | None = None
        """The last entry read: a batch's end is the next batch's start."""

    def ranges(self, batch_id: int,
               initial: Callable[[], list[dict] | None] | None = None) -> list[tuple[dict, dict]] | None:
        """(start, end) offsets of each source of batch ``batch_id``, in the query's source order.

        The first batch starts at the sources' initial offsets, which Spark does not log: ``initial`` gives
        them (without it, or when it gives None, the first batch is not known here). None also for an entry
        Spark has not written, or a format this module does not know.
        """
        if batch_id == 0 and initial is not None:
            end = self._entry(0)
            first = initial() if end is not None else None
            if first is None or end is None or len(first) != len(end):
                return None
            return list(zip(first, end, strict=True))
        if batch_id < 1:
            return None
        start = self._entry(batch_id - 1)  # usually the entry read last, as the previous batch's end
        end = self._entry(batch_id) if start is not None else None
        if start is None or end is None or len(start) != len(end):
            return None
        return list(zip(start, end, strict=True))

    def _entry(self, batch_id: int) -> list[dict] | None:
        # Spark never rewrites an entry (a re-run batch reuses its own), so one read each is enough.
        if self._last is not None and self._last[0] == batch_id:
            return self._last[1]
        entry = self._read(batch_id)
        if entry is not None:
            self._last = (batch_id, entry)
        return entry

    def _read(self, batch_id: int) -> list[dict] | None:
        try:
            lines = (self.offsets / str(batch_id)).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError, StorageError):
            return None
        # v1: the version, the batch metadata, then one offset per source ("-": none yet).
        if len(lines) < 3 or lines[0].strip() != "v1":
            return None
        offsets: list[dict] = []
        for line in lines[2:]:
            try:
                value = json.loads(line)
            except ValueError:
                if line.strip() == "-":  # a source with no offset yet (a Kafka topic not created yet): no rows
                    offsets.append({})
                    continue
                return None
            if not isinstance(value, dict):
                return None
            offsets.append(value)
        return offsets
