"""What the ingest query knows of the txlog: the per-publisher high-water marks and the last ``seq``.

Duplicate detection keeps one number per publisher: the highest sequence
stored (AMPS rule: a publisher's sequence numbers only increase). The state is
snapshotted to ``_control/publishers.json`` every second, off the batches' path
(the instance's heartbeat), and each txlog commit also carries its own deltas
in the commit metadata, so the snapshot may trail the txlog. Recovery = snapshot
+ the commits after it: cost grows with the number of publishers and recent
commits, never with the log's size.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow.compute as pc

from replication.connectors.delta.tables import arrow_dataset, commit_metadata_since
from replication.storage.control import PublishersSnapshot
from replication.storage.layout import StoragePath

log = logging.getLogger(__name__)


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
    inbox_version: int = -1
    """Every inbox version through this one is stored (-1: none yet)."""

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
        self.inbox_version = max(self.inbox_version, int(record.get("inbox_version", -1)))

    def snapshot(self) -> PublishersSnapshot:
        return PublishersSnapshot(self.txlog_version, self.max_seq, dict(self.publishers), dict(self.links),
                                  inbox_version=self.inbox_version)

    @classmethod
    def from_snapshot(cls, saved: PublishersSnapshot) -> PublisherState:
        return cls(
            txlog_version=int(saved.txlog_version),
            max_seq=int(saved.max_seq),
            publishers={k: int(v) for k, v in saved.publishers.items()},
            links={k: int(v) for k, v in saved.links.items()},
            inbox_version=int(saved.inbox_version),
        )

    def save(self, path: StoragePath) -> None:
        """Write ``publishers.json``."""
        self.snapshot().write(path)


def recover_state(table, snapshot_path: StoragePath) -> PublisherState:
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
    data = arrow_dataset(table).to_table(columns=["seq", "publisher", "publisher_seq", "received_from"])
    state = PublisherState(txlog_version=table.version())
    if data.num_rows == 0:
        return state
    state.max_seq = int(pc.max(data["seq"]).as_py())
    grouped = data.group_by("publisher").aggregate([("publisher_seq", "max")])
    state.publishers = dict(
        zip(grouped["publisher"].to_pylist(), grouped["publisher_seq_max"].to_pylist(), strict=True)
    )
    return state
