"""Do two instances of one group hold the same SOW? The SOW part of ``replication verify``.

For each ``<SOW><Topic>`` both instances keep (same topic, message type and
keys), the exact current records of each (:func:`replication.sow.table.exact_records`:
the table's base plus the txlog after it) are compared key by key, on the
topics the two replicate to each other: a record only one holds, or held by
both with different bodies, is a finding.

A running fabric verifies clean because keys still changing are left out:
every key that a row not yet acknowledged on a link into either instance
touches (the link's upstream rows past its acknowledged position, read after
the records). A sow_delete by filter on its way could remove any key, so a
topic with one in flight is reported as not checked this time.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from replication.config.fabric import Fabric
from replication.config.model import InstanceConfig, SowTopic
from replication.connectors.delta.tables import arrow_dataset, open_table
from replication.sow.keys import SowTopics, split_keys
from replication.sow.table import SowTable, exact_records
from replication.storage.layout import StorageLayout
from replication.txlog.files import TxlogFiles
from replication.verify.report import LISTED, Compared, Finding, listed

#: The txlog columns that tell which SOW keys a row changes.
KEY_COLUMNS = ["seq", "topic", "message_type", "command", "sow_key", "filter"]


def compare_sows(fabric: Fabric, a: InstanceConfig, b: InstanceConfig, shared: Callable[[str, str], bool],
                 in_flight: dict[str, list[tuple[str, int]]]) -> list[Compared]:
    """One :class:`Compared` per SOW topic ``a`` and ``b`` both keep.

    ``shared(topic, message_type)``: the two replicate that topic to each other.
    ``in_flight``: instance -> (upstream, acknowledged seq) of each link into it.
    """
    out = []
    for index_a, sow in enumerate(a.sow_topics):
        index_b = next((i for i, s in enumerate(b.sow_topics) if _same(s, sow)), None)
        if index_b is None:
            continue
        compared = Compared(a.name, None, b.name, topic=sow.name)
        out.append(compared)
        try:
            records_a = _records(a, sow, index_a)
            records_b = _records(b, b.sow_topics[index_b], index_b)
            changing = _changing_keys(fabric, sow, in_flight.get(a.name, []) + in_flight.get(b.name, []))
        except Exception as exc:  # a table that cannot be read is a finding, not a crash of the whole check
            compared.findings.append(Finding("unreadable", a.name, b.name, None,
                                             f"SOW {sow.name!r}: a table could not be read: {exc}", topic=sow.name))
            continue
        if changing is None:
            compared.not_checked = "a sow_delete by filter is on its way to one of them"
            continue
        records_a, records_b = (_settled(r, shared, changing) for r in (records_a, records_b))
        compared.messages = max(records_a.num_rows, records_b.num_rows)
        only_a, only_b, differ = _differences(records_a, records_b)
        for keys, what in ((only_a, f"held by {a.name} only"), (only_b, f"held by {b.name} only"),
                           (differ, "with different bodies")):
            if keys:
                compared.findings.append(Finding(
                    "sow", a.name, b.name, None,
                    f"group {a.group}: SOW {sow.name!r}: {len(keys):,} record(s) {what}: key {listed(keys, len(keys))}",
                    topic=sow.name, keys=tuple(keys[:LISTED])))
    return out


def _same(one: SowTopic, other: SowTopic) -> bool:
    return (one.name, one.message_type, one.keys) == (other.name, other.message_type, other.keys)


def _records(cfg: InstanceConfig, sow: SowTopic, index: int) -> pa.Table:
    layout = StorageLayout.of(cfg.storage)
    return exact_records(SowTable(layout, sow, create=False), TxlogFiles(str(layout.txlog)),
                         SowTopics.of(cfg), index).select(["topic", "message_type", "sow_key", "data"])


def _changing_keys(fabric: Fabric, sow: SowTopic, links: list[tuple[str, int]]) -> set[tuple[str, str]] | None:
    """(topic, key) of every record a row past a link's acknowledged position changes; None when one of those
    rows is a sow_delete by filter."""
    topics = SowTopics((sow,))
    changing: set[tuple[str, str]] = set()
    for upstream, acked in links:
        path = StorageLayout.of(fabric[upstream].storage).txlog
        rows = arrow_dataset(open_table(path)).to_table(
            columns=KEY_COLUMNS, filter=ds.field("seq") > acked)
        columns = [rows[c].to_pylist() for c in ("topic", "message_type", "command", "sow_key", "filter")]
        for topic, message_type, command, sow_key, by_filter in zip(*columns, strict=True):
            if topics.index(topic, message_type) != 0:
                continue
            if command == "sow_delete" and by_filter is not None:
                return None
            for key in split_keys(sow_key) if command == "sow_delete" and sow_key else [sow_key]:
                if key is not None:
                    changing.add((topic, key))
    return changing


def _settled(records: pa.Table, shared: Callable[[str, str], bool], changing: set[tuple[str, str]]) -> pa.Table:
    """The records on topics both replicate, without the keys still changing."""
    pairs = zip(*(records[c].to_pylist() for c in ("topic", "message_type", "sow_key")), strict=True)
    keep = [shared(topic, message_type) and (topic, key) not in changing for topic, message_type, key in pairs]
    return records.filter(pa.array(keep, pa.bool_()))


def _differences(a: pa.Table, b: pa.Table) -> tuple[list[str], list[str], list[str]]:
    """Keys (``topic`` + key, as ``replication sow`` shows them) held only by ``a``, only by ``b``, by both
    with different bodies."""
    joined = a.select(["topic", "sow_key", "data"]).join(
        b.select(["topic", "sow_key", "data"]).rename_columns(["topic", "sow_key", "data_b"]),
        keys=["topic", "sow_key"], join_type="full outer")
    only_a = joined.filter(pc.is_null(joined["data_b"]))
    only_b = joined.filter(pc.is_null(joined["data"]))
    both = joined.filter(pc.and_(pc.is_valid(joined["data"]), pc.is_valid(joined["data_b"])))
    differ = both.filter(pc.not_equal(both["data"], both["data_b"]))
    return _named(only_a), _named(only_b), _named(differ)


def _named(rows: pa.Table) -> list[str]:
    """Keys in order; prefixed by their topic when the SOW topic is a regex over several."""
    ordered = rows.sort_by([("topic", "ascending"), ("sow_key", "ascending")])
    topics, keys = ordered["topic"].to_pylist(), ordered["sow_key"].to_pylist()
    if len(set(topics)) <= 1:
        return keys
    return [f"{topic}:{key}" for topic, key in zip(topics, keys, strict=True)]
