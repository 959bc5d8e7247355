"""Spark's record of a micro-batch undone when the engine's own commit of that batch did not happen.

The ingest writer returns from ``foreachBatch`` as soon as it has the rows of
a backlog's batch and commits them to the txlog on a thread of its own, so that
Spark plans and reads the next batch meanwhile
(:class:`replication.ingest.writer.IngestWriter`). Spark
writes ``commits/<N>`` once ``foreachBatch`` returns: a crash, or a failed
commit, before the txlog holds batch N leaves Spark's checkpoint one batch
ahead, and a query started from it would go on with batch N+1, N's rows never
read again.

:func:`rewind` puts the checkpoint back where the txlog is, before the query
starts: it removes ``offsets/<N+1>`` (the next batch, planned, never
committed anywhere) and then ``commits/<N>``, so Spark runs batch N again with
the offsets it logged for it: the same rows. In that order a crash between
the two removals leaves a checkpoint the next rewind still recognises.

The writer lets Spark run at most one batch ahead (batch N+1's call waits for
N's commit before it returns), so a checkpoint further ahead than that was not
left by it (a txlog restored from a backup, a checkpoint from another
instance): it is left as it is and said so in the log.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def rewind(spark: Any, location: str, committed: int | None, *, name: str) -> int | None:
    """Undo Spark's commit of the batch after ``committed`` (the last batch the engine committed; None: none),
    in the checkpoint at ``location`` (as Spark names it: a local path or ``s3a://``). Returns the batch id
    whose Spark commit was removed (Spark runs it again), or None when the checkpoint is not ahead."""
    jvm = spark._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path
    root = hadoop_path(location)
    fs = root.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
    commits = _batch_ids(fs, hadoop_path(root, "commits"))
    done = -1 if committed is None else committed
    ahead = [batch for batch in commits if batch > done]
    if not ahead:
        return None
    latest = max(ahead)
    if latest != done + 1:
        log.warning("%s: Spark's checkpoint %s has committed batches through %d, the txlog only through %d; "
                    "that is not what a crash of this engine leaves, so the checkpoint is left as it is",
                    name, location, latest, done)
        return None
    for batch in sorted(_batch_ids(fs, hadoop_path(root, "offsets")), reverse=True):
        if batch > latest:  # planned after it, never run to its end
            fs.delete(hadoop_path(hadoop_path(root, "offsets"), str(batch)), False)
    fs.delete(hadoop_path(hadoop_path(root, "commits"), str(latest)), False)
    log.warning("%s: Spark had committed ingest batch %d, the txlog had not (a stop or a failure between the "
                "two); Spark runs it again", name, latest)
    return latest


def _batch_ids(fs: Any, folder: Any) -> list[int]:
    """The batch ids of a checkpoint log folder's entries (Spark names them by their id)."""
    if not fs.exists(folder):
        return []
    return [int(status.getPath().getName()) for status in fs.listStatus(folder)
            if status.getPath().getName().isdigit()]
