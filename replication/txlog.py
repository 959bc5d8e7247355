"""The transaction log: its schema, the per-publisher state the ingest query keeps, and runs of local seqs.

Duplicate detection keeps one number per publisher: the highest sequence
stored (AMPS rule: a publisher's sequence numbers only increase). The state is
snapshotted to ``_control/publishers.json`` after each commit and, because a
crash can fall between the two, each txlog commit also carries its own deltas
in the commit metadata. Recovery = snapshot + the commits after it: cost grows
with the number of publishers and recent commits, never with the log's size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replication.connectors.delta.tables import commit_metadata_since
from replication.storage.control import PublishersSnapshot

log = logging.getLogger(__name__)

TXLOG_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("bookmark", pa.string(), nullable=False),
        pa.field("publisher", pa.string(), nullable=False),
        pa.field("publisher_seq", pa.int64(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("message_type", pa.string(), nullable=False),
        pa.field("command", pa.string(), nullable=False),
        # The SOW record key(s) this row changed here: a publish's key; the keys a sow_delete removed.
        pa.field("sow_key", pa.string()),
        # A sow_delete as published, replicated so each instance applies it to its own SOW:
        # by keys (the amps-sow-keys header as given) or by filter (amps-filter); by data: neither, the body.
        pa.field("sow_keys", pa.string()),
        pa.field("filter", pa.string()),
        pa.field("data", pa.binary()),
        pa.field("origin", pa.string(), nullable=False),
        pa.field("received_from", pa.string()),
        pa.field("received_from_group", pa.string()),
        pa.field("path", pa.list_(pa.string())),
        pa.field("publish_time", pa.timestamp("us", tz="UTC")),
        pa.field("persist_time", pa.timestamp("us", tz="UTC")),
    ]
)

REJECTED_SCHEMA = pa.schema(
    [
        pa.field("reason", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("kafka_topic", pa.string()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_offset", pa.int64()),
        pa.field("publisher", pa.string()),
        pa.field("publisher_seq", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("message_type", pa.string()),
        pa.field("command", pa.string()),
        pa.field("data", pa.binary()),
        pa.field("rejected_time", pa.timestamp("us", tz="UTC")),
    ]
)


@dataclass
class PublisherState:
    """What the ingest query knows of the txlog: high-water marks and the last ``seq``."""

    txlog_version: int = -1
    """Delta version this state reflects."""
    max_seq: int = 0
    """Highest local ``seq`` assigned (0: empty log)."""
    publishers: dict[str, int] = field(default_factory=dict)
    """client name -> highest ``publisher_seq`` stored."""
    links: dict[str, int] = field(default_factory=dict)
    """upstream instance -> highest upstream ``seq`` stored from it."""

    def apply(self, version: int, record: dict) -> None:
        """Fold one commit's metadata record into the state."""
        self.txlog_version = max(self.txlog_version, version)
        self.max_seq = max(self.max_seq, int(record.get("last_seq", 0)))
        for client, seq in record.get("publishers", {}).items():
            if seq > self.publishers.get(client, 0):
                self.publishers[client] = seq
        for link, seq in record.get("links", {}).items():
            if seq > self.links.get(link, 0):
                self.links[link] = seq

    def snapshot(self) -> PublishersSnapshot:
        return PublishersSnapshot(self.txlog_version, self.max_seq, dict(self.publishers), dict(self.links))

    @classmethod
    def from_snapshot(cls, saved: PublishersSnapshot) -> "PublisherState":
        return cls(
            txlog_version=int(saved.txlog_version),
            max_seq=int(saved.max_seq),
            publishers={k: int(v) for k, v in saved.publishers.items()},
            links={k: int(v) for k, v in saved.links.items()},
        )

    def save(self, path: Path) -> None:
        """Write ``publishers.json``."""
        self.snapshot().write(path)


def recover_state(table, snapshot_path: Path) -> PublisherState:
    """Rebuild :class:`PublisherState` from the snapshot plus the txlog commits after it."""
    saved = PublishersSnapshot.read(snapshot_path)
    state = PublisherState.from_snapshot(saved) if saved else PublisherState()
    records = commit_metadata_since(table, state.txlog_version)
    if records is None:
        log.warning("txlog commits after the publishers snapshot were cleaned up; rebuilding from data")
        return rebuild_from_data(table)
    for version, record in records:
        state.apply(version, record)
    state.txlog_version = max(state.txlog_version, table.version())
    return state


def rebuild_from_data(table) -> PublisherState:
    """Full scan of the txlog (only when the commit history is gone)."""
    table.update_incremental()
    data = table.to_pyarrow_table(columns=["seq", "publisher", "publisher_seq", "received_from"])
    state = PublisherState(txlog_version=table.version())
    if data.num_rows == 0:
        return state
    state.max_seq = int(pc.max(data["seq"]).as_py())
    grouped = data.group_by("publisher").aggregate([("publisher_seq", "max")])
    state.publishers = dict(
        zip(grouped["publisher"].to_pylist(), grouped["publisher_seq_max"].to_pylist(), strict=True)
    )
    return state


# -- runs of local seqs ------------------------------------------------------

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
    if (codes == codes[0]).all():  # one key: no grouping
        return {int(codes[0]): run_bounds(seqs)} if codes[0] >= 0 else {}
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    bounds = np.flatnonzero(sorted_codes[1:] != sorted_codes[:-1]) + 1
    return {int(sorted_codes[segment[0]]): run_bounds(seqs[order[segment]])
            for segment in np.split(np.arange(codes.size), bounds) if sorted_codes[segment[0]] >= 0}


def runs_by_value(values, seqs: np.ndarray) -> dict[str, Runs]:
    """Runs of ``seqs`` (ascending) per distinct value of the Arrow string column ``values`` (nulls left out)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    encoded = pc.dictionary_encode(values)
    labels = encoded.dictionary.to_pylist()
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return {labels[code]: runs for code, runs in runs_by_code(codes, seqs).items()}
