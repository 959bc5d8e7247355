"""What an upstream reads of a destination instance: is it up, what has it acknowledged, where to resume.

All of it comes from the destination's storage root: its heartbeat, its ack
file for this upstream, its per-publisher high-water marks and its txlog's
table id (see :mod:`replication.storage.control` for who writes each file).
"""

from __future__ import annotations

import time

from replication.errors import ReplicationError
from replication.storage.control import Ack, Heartbeat, PublishersSnapshot
from replication.storage.layout import StorageLayout, StoragePath

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
    from replication.connectors.delta.tables import open_table  # (not at import: `status` needs no pyarrow)

    try:
        return open_table(layout.txlog).metadata().id
    except Exception:  # no txlog yet
        return None


class ResyncGapError(ReplicationError):
    """The downstream lacks rows that retention removed here: no resync can give them."""


def resync_start(txlog_path: StoragePath, have: dict[str, int], *, after: int, first_seq: int = 1,
                 first_bookmark: str | None = None) -> int:
    """Local seq to replicate after so that the downstream gets every row it lacks.

    ``have`` is the downstream's highest stored sequence per publisher; rows at
    or below it are skipped by the downstream anyway. ``after`` is a position
    the downstream is known to have everything through (its ack to us).
    ``first_seq``: the first row retention kept (:mod:`replication.txlog.retention`); a downstream that
    lacks a publisher's rows from before it raises :class:`ResyncGapError`, naming ``first_bookmark``.
    """
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from replication.connectors.delta.tables import arrow_dataset, open_table

    table = open_table(txlog_path)
    rows = arrow_dataset(table).to_table(
        columns=["seq", "publisher", "publisher_seq"], filter=ds.field("seq") > after
    )
    if rows.num_rows == 0:
        return after
    if first_seq > after + 1:
        _check_nothing_removed_is_lacking(rows, have, first_seq, first_bookmark)
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


def _check_nothing_removed_is_lacking(rows, have: dict[str, int], first_seq: int, first_bookmark: str | None) -> None:
    """Each publisher's rows before its first retained one were removed here: the downstream must hold them."""
    lowest = rows.group_by("publisher").aggregate([("publisher_seq", "min")])
    short = [(p, low) for p, low in zip(lowest["publisher"].to_pylist(), lowest["publisher_seq_min"].to_pylist(),
                                         strict=True) if have.get(p, 0) < low - 1]
    if short:
        named = ", ".join(f"{p} (holds through {have.get(p, 0)}, kept here from {low})" for p, low in short[:5])
        raise ResyncGapError(
            f"the destination lacks messages that retention removed from this txlog (rows before seq {first_seq:,}; "
            f"first retained bookmark {first_bookmark}): {named}{' ...' if len(short) > 5 else ''}. Fix: bootstrap "
            "the destination from an instance that still holds them (or from this one, accepting the loss), "
            "then restart the link")
