"""Inbox cleanup: the inbox rows an instance has stored go, on its retention schedule.

Upstream replicators append to the inbox; the instance copies each row into its txlog (or drops it as a
duplicate) and acknowledges it upstream. After that the inbox row serves nothing, so on every run of the
``amps-action-do-remove-journal`` action (:mod:`replication.txlog.retention`) the inbox files go whose every
row is

- stored: the file was committed at an inbox version the ingest has stored (``inbox_version`` of the
  txlog's commits), so no read of the inbox still needs it;
- acknowledged to its upstream (the durable ``upstreams`` acks): a restart re-reads only the rows after
  that ack to learn which of its rows each waits for.

Removal is Delta's own, one ``DELETE`` commit per run whose predicate takes whole files only: per upstream,
``link = 'X' AND upstream_seq <= cut``, with each cut placed where no live file of that upstream straddles it
(so nothing is rewritten, and nothing not yet stored matches). Upstreams appending while it commits try their
append again on the new snapshot (:class:`~replication.connectors.delta.tables.IdempotentAppender`); the
ingest reads a removal commit as adding nothing (:func:`replication.connectors.delta.log.appends_after`).
The removed files, and the change-data files the DELETE wrote, are deleted from storage one period later,
once the ingest has read past the DELETE's version.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from replication.connectors.delta.log import commit_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Removal:
    """What one cleanup run committed: the DELETE's version, the data files it removed, the change-data files
    it wrote, and rows removed."""

    version: int
    files: list[str]
    change_files: list[str]
    rows: int


def _files(actions: pa.Table) -> pa.Table:
    """``path``, ``first``/``last`` link, ``lo``/``hi`` upstream seq, ``rows`` of each data file (nulls where a
    file has no statistics)."""
    n = actions.num_rows

    def column(name: str, kind: pa.DataType) -> pa.Array:
        if name not in actions.column_names:
            return pa.nulls(n, kind)
        return pc.cast(actions.column(name), kind).combine_chunks()

    return pa.table({
        "path": actions.column("path").combine_chunks(),
        "first": column("min.link", pa.string()),
        "last": column("max.link", pa.string()),
        "lo": column("min.upstream_seq", pa.int64()),
        "hi": column("max.upstream_seq", pa.int64()),
        "rows": column("num_records", pa.int64()),
    })


def cuts(live: pa.Table, stored: set[str], acked: dict[str, int]) -> dict[str, tuple[int, list[str], int]]:
    """Per upstream: ``(cut, paths, rows)``, the files ``link = upstream AND upstream_seq <= cut`` takes whole.

    ``live``: the inbox's files now (:func:`_files`); ``stored``: the paths of those committed at a stored
    version; ``acked``: each upstream's acknowledged seq. A file without statistics stops everything; a file
    holding several upstreams' rows holds each of them below its lowest seq.
    """
    rows = live.to_pylist()
    if any(r["first"] is None or r["lo"] is None or r["hi"] is None for r in rows):
        return {}
    out = {}
    for upstream, ack in acked.items():
        mine = [r for r in rows if r["first"] <= upstream <= r["last"]]
        takes = [r for r in mine if r["first"] == r["last"] and r["path"] in stored and r["hi"] <= ack]
        taken = {r["path"] for r in takes}
        cut = min([ack] + [r["lo"] - 1 for r in mine if r["path"] not in taken])
        while True:  # a file that would be cut in two stays whole, with everything after its first row
            straddling = [r["lo"] - 1 for r in takes if r["lo"] <= cut < r["hi"]]
            if not straddling:
                break
            cut = min(straddling)
        chosen = [r for r in takes if r["hi"] <= cut]
        if chosen:
            out[upstream] = (cut, [r["path"] for r in chosen], sum(int(r["rows"] or 0) for r in chosen))
    return out


def predicate(chosen: dict[str, tuple[int, list[str], int]]) -> str:
    """The DELETE predicate of :func:`cuts`' answer."""
    def quoted(text: str) -> str:
        return "'" + text.replace("'", "''") + "'"

    return " OR ".join(f"(link = {quoted(upstream)} AND upstream_seq <= {cut})"
                       for upstream, (cut, _paths, _rows) in sorted(chosen.items()))


def clean(inbox: str, stored_version: int, acked: dict[str, int]) -> Removal | None:
    """One run on the inbox at ``inbox`` (see the module docstring); None when nothing may go."""
    from deltalake.exceptions import TableNotFoundError

    from replication.connectors.delta.tables import open_table

    if stored_version < 0 or not acked:
        return None
    try:
        table = open_table(inbox)
        stored = open_table(inbox, version=stored_version)
    except (TableNotFoundError, OSError, ValueError) as exc:  # (a version whose log was cleaned up)
        log.info("inbox cleanup of %s skipped: %s", inbox, exc)
        return None
    stored_paths = set(pa.table(stored.get_add_actions(flatten=True)).column("path").to_pylist())
    chosen = cuts(_files(pa.table(table.get_add_actions(flatten=True))), stored_paths, acked)
    if not chosen:
        return None
    metrics = table.delete(predicate(chosen))
    if metrics.get("num_copied_rows"):
        log.warning("inbox cleanup rewrote %d rows it meant to keep whole", metrics["num_copied_rows"])
    version = table.version()
    return Removal(version, [p for _cut, paths, _rows in chosen.values() for p in paths],
                   _change_files(table.table_uri, version), int(metrics.get("num_deleted_rows", 0)))


def _change_files(table_uri: str, version: int) -> list[str]:
    """The change-data files commit ``version`` wrote (its ``cdc`` actions)."""
    text = commit_text(table_uri, version) or ""
    return [json.loads(line)["cdc"]["path"] for line in text.splitlines() if line.startswith('{"cdc"')]
