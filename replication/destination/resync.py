"""What an upstream reads of a destination instance: is it up, what has it acknowledged, where to resume.

All of it comes from the destination's storage root: its heartbeat, its ack
file for this upstream, its per-publisher high-water marks and its txlog's
table id (see :mod:`replication.storage.control` for who writes each file).
"""

from __future__ import annotations

import time
from pathlib import Path

from replication.storage.control import Ack, Heartbeat, PublishersSnapshot
from replication.storage.layout import StorageLayout

#: A heartbeat older than this means the instance is not running.
HEARTBEAT_STALE_S = 5.0


def heartbeat_fresh(layout: StorageLayout, *, now: float | None = None) -> bool:
    """Is an instance running at this storage root, by its heartbeat file?"""
    try:
        beat = Heartbeat.read(layout.heartbeat_json)
    except Exception:  # a file being replaced, an unreadable mount: not usable right now
        return False
    return beat is not None and beat.fresh(HEARTBEAT_STALE_S, now=now or time.time())


def downstream_ack(layout: StorageLayout, upstream: str) -> int:
    """What the instance at ``layout`` acknowledges to ``upstream``: the prefix (in the upstream's seq space)."""
    return read_ack(layout, upstream).seq


def read_ack(layout: StorageLayout, upstream: str) -> Ack:
    """The instance at ``layout``'s acknowledgement to ``upstream``: prefix and runs above it."""
    try:
        ack = Ack.read(layout.ack_file(upstream))
    except Exception:  # unreadable for now: nothing acknowledged yet
        return Ack(0)
    return ack or Ack(0)


def stored_per_publisher(layout: StorageLayout) -> dict[str, int]:
    """The destination's highest stored sequence per publisher (its ``publishers.json``)."""
    saved = PublishersSnapshot.read(layout.publishers_json)
    return dict(saved.publishers) if saved else {}


def txlog_id(layout: StorageLayout) -> str | None:
    """The Delta table id of the destination's txlog: a new id is a new (rebuilt) instance."""
    from deltalake import DeltaTable

    try:
        return DeltaTable(str(layout.txlog)).metadata().id
    except Exception:  # no txlog yet
        return None


def resync_start(txlog_path: Path, have: dict[str, int], *, after: int) -> int:
    """Local seq to replicate after so that the downstream gets every row it lacks.

    ``have`` is the downstream's highest stored sequence per publisher; rows at
    or below it are skipped by the downstream anyway. ``after`` is a position
    the downstream is known to have everything through (its ack to us).
    """
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    from deltalake import DeltaTable

    table = DeltaTable(str(txlog_path))
    rows = table.to_pyarrow_dataset().to_table(
        columns=["seq", "publisher", "publisher_seq"], filter=ds.field("seq") > after
    )
    if rows.num_rows == 0:
        return after
    lacking = None
    grouped = rows.group_by("publisher").aggregate([("publisher_seq", "max")])
    for publisher, top in zip(grouped["publisher"].to_pylist(), grouped["publisher_seq_max"].to_pylist(), strict=True):
        if top <= have.get(publisher, 0):
            continue  # the downstream has all of this publisher
        mask = pc.and_(pc.equal(rows["publisher"], publisher),
                       pc.greater(rows["publisher_seq"], have.get(publisher, 0)))
        first = pc.min(pc.filter(rows["seq"], mask)).as_py()
        lacking = first if lacking is None else min(lacking, first)
    if lacking is None:
        return int(pc.max(rows["seq"]).as_py())
    return lacking - 1
