"""``replication verify``'s comparisons in this process: each txlog read once with deltalake, joined in Arrow.

For fabrics whose txlogs fit in memory (see :data:`replication.verify.ARROW_MAX_BYTES`);
:mod:`replication.verify.spark` does the same on larger ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replication import routing
from replication.config.fabric import Fabric
from replication.config.model import Destination, InstanceConfig
from replication.storage.layout import StorageLayout
from replication.verify.report import LISTED, Outcome, ranges_of, retained_since

#: The txlog columns the checks read (routing's, the message's identity, its body).
COLUMNS = ["seq", "bookmark", "publisher", "publisher_seq", "topic", "message_type", "received_from",
           "received_from_group", "path", "origin", "data", "persist_time"]


class ArrowTxlogs:
    """Each instance's txlog, read once (only the topics asked for), and the comparisons over them."""

    name = "arrow"

    def __init__(self, fabric: Fabric, pattern: re.Pattern[str] | None) -> None:
        self.fabric = fabric
        self.pattern = pattern
        self._tables: dict[str, pa.Table | Exception] = {}

    def link(self, up: InstanceConfig, dest: Destination, down: str, acked: int) -> Outcome:
        """The messages of ``up``'s txlog through seq ``acked`` that routing sends ``dest`` (reaching
        ``down``), looked up by bookmark in ``down``'s txlog."""
        rows = self.rows(up.name)
        window = _still_held(rows.filter(pc.less_equal(rows["seq"], acked)), self.fabric[down])
        routed = window.filter(pa.array(routing.route_mask(up, dest, window, target=down))) if window.num_rows \
            else window
        missing, differ = _compare(routed, self.rows(down))
        bookmarks = sorted(differ["bookmark"].to_pylist())
        return Outcome(routed.num_rows, _ranges_by_publisher(missing), tuple(bookmarks[:LISTED]), len(bookmarks))

    def group(self, here: str, acked: int, there: str, shared: Callable[[str, str], bool],
              in_flight: list[tuple[str, int]]) -> Outcome:
        """``here``'s messages through seq ``acked`` on the topics ``shared`` accepts that ``there`` lacks,
        except those still on their way: held by an upstream of ``there`` past what that link acknowledged
        (``in_flight``: (upstream, acknowledged seq) of each link into ``there``)."""
        rows = self.rows(here)
        window = rows.filter(pc.less_equal(rows["seq"], acked))
        window = window.filter(pa.array(_on(window, shared), pa.bool_()))
        window = _still_held(window, self.fabric[there])
        missing, _ = _compare(window, self.rows(there))
        for upstream, upstream_acked in in_flight:
            if not missing.num_rows:
                break
            theirs = self.rows(upstream)
            on_the_way = theirs.filter(pc.greater(theirs["seq"], upstream_acked))["bookmark"]
            missing = missing.filter(pc.invert(pc.is_in(missing["bookmark"], value_set=on_the_way)))
        return Outcome(window.num_rows, _ranges_by_publisher(missing))

    def rows(self, name: str) -> pa.Table:
        """The instance's txlog rows in seq order; raises what reading it raised."""
        if name not in self._tables:
            try:
                self._tables[name] = self._read(name)
            except Exception as exc:  # reported as a finding by the caller
                self._tables[name] = exc
        table = self._tables[name]
        if isinstance(table, Exception):
            raise table
        return table

    def _read(self, name: str) -> pa.Table:
        from replication.connectors.delta.tables import arrow_dataset, open_table

        path = str(StorageLayout.of(self.fabric[name].storage).txlog)
        table = arrow_dataset(open_table(path)).to_table(
            columns=COLUMNS).sort_by("seq")
        if self.pattern is not None and table.num_rows:
            topics = table["topic"].unique().to_pylist()
            keep = [t for t in topics if self.pattern.search(t)]
            table = table.filter(pc.is_in(table["topic"], pa.array(keep, pa.string())))
        return table


def _still_held(rows: pa.Table, holder: InstanceConfig) -> pa.Table:
    """``rows`` less those ``holder``'s retention may have removed: persisted (here) before its first
    retained row was persisted (there, later than here)."""
    since = retained_since(holder)
    if since is None or not rows.num_rows:
        return rows
    stamp = pa.scalar(int(since * 1_000_000), pa.int64())
    return rows.filter(pc.fill_null(pc.greater_equal(pc.cast(rows["persist_time"], pa.int64()), stamp), True))


def _on(rows: pa.Table, shared: Callable[[str, str], bool]) -> np.ndarray:
    """``shared(topic, message_type)`` of each row, asked once per distinct pair."""
    keys = pc.binary_join_element_wise(rows["topic"], rows["message_type"], "\x00")
    encoded = pc.dictionary_encode(keys).combine_chunks()
    answers = np.array([shared(*k.split("\x00", 1)) for k in encoded.dictionary.to_pylist()] or [False], dtype=bool)
    return answers[pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)] if rows.num_rows \
        else np.zeros(0, dtype=bool)


def _compare(expected: pa.Table, held: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(rows of ``expected`` whose bookmark ``held`` lacks, rows whose body differs there)."""
    if expected.num_rows == 0:
        return expected.select(["bookmark", "publisher", "publisher_seq"]), expected.select(["bookmark"])
    # presence by a marker column: a sow_delete by keys or filter has no body (data is null)
    there = held.select(["bookmark", "data"]).rename_columns(["bookmark", "held_data"])
    there = there.append_column("held", pa.array(np.ones(there.num_rows, dtype=bool)))
    joined = expected.select(["bookmark", "publisher", "publisher_seq", "data"]).join(
        there, keys="bookmark", join_type="left outer")
    absent = pc.is_null(joined["held"])
    data, held_data = joined["data"], joined["held_data"]
    same = pc.if_else(pc.or_(pc.is_null(data), pc.is_null(held_data)),
                      pc.equal(pc.is_null(data), pc.is_null(held_data)), pc.equal(data, held_data))
    differs = pc.and_(pc.invert(absent), pc.invert(same))
    return (joined.filter(absent).select(["bookmark", "publisher", "publisher_seq"]),
            joined.filter(pc.fill_null(differs, False)).select(["bookmark"]))


def _ranges_by_publisher(rows: pa.Table) -> dict[str, tuple[tuple[int, int], ...]]:
    out: dict[str, tuple[tuple[int, int], ...]] = {}
    if rows.num_rows == 0:
        return out
    for publisher in sorted(set(rows["publisher"].to_pylist())):
        out[publisher] = ranges_of(rows.filter(pc.equal(rows["publisher"], publisher))["publisher_seq"].to_numpy())
    return out
