"""What ``replication verify`` found: findings, what each comparison covered, and how ranges are written."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from replication.storage.control import RetentionState
from replication.storage.layout import StorageLayout
from replication.txlog.runs import run_bounds

if TYPE_CHECKING:
    from replication.config.model import InstanceConfig

Kind = Literal["missing", "body", "group", "sow", "queue", "unreadable"]

#: Bookmarks or keys kept per finding (the count in its message is always exact).
LISTED = 1000

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Finding:
    """One inconsistency: what kind, between which instances, which messages or records."""

    kind: Kind
    upstream: str
    downstream: str
    destination: str | None
    message: str
    publisher: str | None = None
    seq_ranges: Ranges = ()
    """``publisher_seq`` ranges of the messages concerned (missing, group)."""
    bookmarks: tuple[str, ...] = ()
    """Bookmarks concerned (body; queue: acknowledged more than once), at most :data:`LISTED`."""
    topic: str | None = None
    """The SOW topic (sow), the queue topic (queue)."""
    keys: tuple[str, ...] = ()
    """SOW keys whose records differ (sow), at most :data:`LISTED`."""

    def to_dict(self) -> dict:
        return {"kind": self.kind, "upstream": self.upstream, "downstream": self.downstream,
                "destination": self.destination, "message": self.message, "publisher": self.publisher,
                "seq_ranges": [list(r) for r in self.seq_ranges], "bookmarks": list(self.bookmarks),
                "topic": self.topic, "keys": list(self.keys)}


@dataclass
class Compared:
    """One link, group pair, SOW topic of a group pair or queue of an instance: what was compared, and what was
    found."""

    upstream: str
    destination: str | None
    downstream: str | None
    acked_seq: int = 0
    """The upstream seq compared up to (its link's acknowledged position)."""
    messages: int = 0
    """Messages compared (a SOW comparison: records compared; a queue: messages acknowledged)."""
    not_checked: str | None = None
    """Why this was not compared (never connected, downstream not among the configs, ...)."""
    topic: str | None = None
    """The SOW topic of a SOW comparison, the queue topic of a queue's."""
    findings: list[Finding] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "not checked" if self.not_checked else ("failed" if self.findings else "ok")

    def to_dict(self) -> dict:
        return {"upstream": self.upstream, "destination": self.destination, "downstream": self.downstream,
                "acked_seq": self.acked_seq, "messages": self.messages, "status": self.status,
                "not_checked": self.not_checked, "topic": self.topic,
                "findings": [f.to_dict() for f in self.findings]}


@dataclass
class Report:
    links: list[Compared] = field(default_factory=list)
    groups: list[Compared] = field(default_factory=list)
    sows: list[Compared] = field(default_factory=list)
    queues: list[Compared] = field(default_factory=list)
    """One per queue of each instance: its acknowledgements (:mod:`replication.verify.queues`)."""
    engine: str = "arrow"
    """What read the txlogs: ``arrow`` (deltalake and pyarrow in this process) or ``spark``."""

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.links + self.groups + self.sows + self.queues for f in c.findings]

    @property
    def ok(self) -> bool:
        return not self.findings


@dataclass
class Outcome:
    """What one comparison of messages found, whichever engine read the tables."""

    messages: int = 0
    missing: dict[str, Ranges] = field(default_factory=dict)
    """publisher -> ``publisher_seq`` ranges of the messages the other side lacks."""
    differ: tuple[str, ...] = ()
    """Bookmarks held on both sides with different bodies (at most :data:`LISTED`)."""
    differ_count: int = 0


def ranges_of(seqs: np.ndarray) -> Ranges:
    """Sorted distinct ``seqs`` as (first, last) runs."""
    firsts, lasts = run_bounds(np.unique(seqs))
    return tuple(zip(firsts.tolist(), lasts.tolist()))


def count(ranges: Ranges) -> int:
    return sum(last - first + 1 for first, last in ranges)


def ranges_text(ranges: Ranges, limit: int = 8) -> str:
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:limit]]
    return ", ".join(parts) + (f" and {len(ranges) - limit} more ranges" if len(ranges) > limit else "")


def listed(items: tuple[str, ...] | list[str], total: int, limit: int = 5) -> str:
    """The first few ``items``, and how many more of ``total`` there are."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {total - limit:,} more" if total > limit else "")


def retained_since(cfg: InstanceConfig) -> float | None:
    """When the first row ``cfg``'s txlog still holds was persisted (epoch s), if retention removed rows: a
    message persisted elsewhere before then may be gone there, and is not looked for."""
    state = RetentionState.read(StorageLayout.of(cfg.storage).retention_json)
    if state is None or state.first_seq <= 1:
        return None
    return state.first_persisted if state.first_persisted is not None else time.time()
