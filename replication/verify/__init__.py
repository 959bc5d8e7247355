"""Does a fabric hold what its routing rules and acknowledgements promise? The checks of ``replication verify``.

Reads tables and control files only (deltalake and pyarrow, no Spark), so it
runs beside running instances. For every link among the given configs (an
upstream's destination, as its link file says: the instance reached at the
address in use and the upstream seq it has acknowledged), it takes the
upstream's txlog rows up to that acknowledged position, keeps those the
routing rules send to that instance (:func:`replication.routing.route_mask`,
the engine's own rules) and looks them up, by bookmark, in the downstream's
txlog:

- **missing**: an acknowledged message the downstream does not hold, listed
  per publisher as ranges of ``publisher_seq``;
- **body**: the same bookmark with a different body on the two sides.

For two instances of one ``<Group>`` that replicate to each other it also
compares the bookmarks of the topics each replicates to the other (whatever
the filters and PassThrough say: instances of one group are meant to be
equivalent), each side up to what its link to the other has acknowledged:
**group** findings name what one holds and the other lacks.

Rows past an acknowledged position are never compared (they may be in
flight), so a running fabric verifies clean. A link never connected, or to an
instance whose config is not given, is listed as not checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replication import routing
from replication.config.fabric import Fabric
from replication.config.model import Destination, InstanceConfig
from replication.storage.control import LinkState
from replication.storage.layout import StorageLayout
from replication.txlog import run_bounds

#: The txlog columns the checks read (routing's, the message's identity, its body).
COLUMNS = ["seq", "bookmark", "publisher", "publisher_seq", "topic", "message_type", "received_from",
           "received_from_group", "path", "origin", "data"]

Kind = Literal["missing", "body", "group", "unreadable"]


@dataclass(frozen=True)
class Finding:
    """One inconsistency: what kind, between which instances, which messages."""

    kind: Kind
    upstream: str
    downstream: str
    destination: str | None
    message: str
    publisher: str | None = None
    seq_ranges: tuple[tuple[int, int], ...] = ()
    """``publisher_seq`` ranges of the messages concerned (missing, group)."""
    bookmarks: tuple[str, ...] = ()
    """Bookmarks concerned (body)."""

    def to_dict(self) -> dict:
        return {"kind": self.kind, "upstream": self.upstream, "downstream": self.downstream,
                "destination": self.destination, "message": self.message, "publisher": self.publisher,
                "seq_ranges": [list(r) for r in self.seq_ranges], "bookmarks": list(self.bookmarks)}


@dataclass
class Compared:
    """One link or group pair: what was compared, and what was found."""

    upstream: str
    destination: str | None
    downstream: str | None
    acked_seq: int = 0
    """The upstream seq compared up to (its link's acknowledged position)."""
    messages: int = 0
    """Messages compared."""
    not_checked: str | None = None
    """Why this link was not compared (never connected, downstream not among the configs)."""
    findings: list[Finding] = field(default_factory=list)

    @property
    def status(self) -> str:
        return "not checked" if self.not_checked else ("failed" if self.findings else "ok")

    def to_dict(self) -> dict:
        return {"upstream": self.upstream, "destination": self.destination, "downstream": self.downstream,
                "acked_seq": self.acked_seq, "messages": self.messages, "status": self.status,
                "not_checked": self.not_checked, "findings": [f.to_dict() for f in self.findings]}


@dataclass
class Report:
    links: list[Compared] = field(default_factory=list)
    groups: list[Compared] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.links + self.groups for f in c.findings]

    @property
    def ok(self) -> bool:
        return not self.findings


def verify(fabric: Fabric, *, topic: str | None = None) -> Report:
    """Compare every link of ``fabric`` (and every group pair) up to its acknowledged position.

    Args:
        fabric: the configs, as :class:`replication.config.fabric.Fabric` reads them.
        topic: a regex; only messages whose topic it matches (searched, as AMPS matches) are compared.
    """
    pattern = re.compile(topic) if topic is not None else None
    logs = _Txlogs(fabric, pattern)
    report = Report()
    used: dict[tuple[str, str], tuple[Destination, int]] = {}
    for cfg in fabric:
        for dest in cfg.destinations:
            compared = _check_link(fabric, logs, cfg, dest)
            report.links.append(compared)
            if compared.downstream is not None and not compared.not_checked:
                used[(cfg.name, compared.downstream)] = (dest, compared.acked_seq)
    for (a, b), (dest_ab, acked_ab) in used.items():
        if a < b and (b, a) in used and fabric[a].group == fabric[b].group:
            dest_ba, acked_ba = used[(b, a)]
            report.groups.append(_check_group(logs, fabric[a], dest_ab, acked_ab, fabric[b], dest_ba, acked_ba))
    return report


class _Txlogs:
    """Each instance's txlog, read once (only the topics asked for)."""

    def __init__(self, fabric: Fabric, pattern: re.Pattern[str] | None) -> None:
        self.fabric = fabric
        self.pattern = pattern
        self._tables: dict[str, pa.Table | Exception] = {}

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
        from deltalake import DeltaTable

        path = StorageLayout.of(self.fabric[name].storage).txlog
        table = DeltaTable(str(path)).to_pyarrow_dataset().to_table(columns=COLUMNS).sort_by("seq")
        if self.pattern is not None and table.num_rows:
            topics = table["topic"].unique().to_pylist()
            keep = [t for t in topics if self.pattern.search(t)]
            table = table.filter(pc.is_in(table["topic"], pa.array(keep, pa.string())))
        return table


def _check_link(fabric: Fabric, logs: _Txlogs, cfg: InstanceConfig, dest: Destination) -> Compared:
    state = LinkState.read(StorageLayout.of(cfg.storage).link_file(dest.name))
    if state is None or not state.downstream:
        return Compared(cfg.name, dest.name, None, not_checked="never connected")
    down = state.downstream
    compared = Compared(cfg.name, dest.name, down, acked_seq=state.acked_seq)
    if down not in fabric:
        compared.not_checked = f"{down}'s config is not among those given"
        return compared
    try:
        up_rows = logs.rows(cfg.name)
        down_rows = logs.rows(down)
    except Exception as exc:
        compared.findings.append(Finding("unreadable", cfg.name, down, dest.name, f"a txlog could not be read: {exc}"))
        return compared
    window = up_rows.filter(pc.less_equal(up_rows["seq"], state.acked_seq))
    routed = window.filter(pa.array(routing.route_mask(cfg, dest, window, target=down))) if window.num_rows else window
    compared.messages = routed.num_rows
    where = f"{cfg.name} -> {down} (destination {dest.name})"
    missing, differ = _compare(routed, down_rows)
    for publisher, ranges in _ranges_by_publisher(missing).items():
        compared.findings.append(Finding(
            "missing", cfg.name, down, dest.name,
            f"{where}: {_count(ranges)} acknowledged message(s) of publisher {publisher} missing at {down}: "
            f"publisher_seq {_ranges_text(ranges)}", publisher=publisher, seq_ranges=ranges))
    if differ.num_rows:
        bookmarks = tuple(differ["bookmark"].to_pylist())
        compared.findings.append(Finding(
            "body", cfg.name, down, dest.name,
            f"{where}: {len(bookmarks)} message(s) with a different body at {down}: "
            f"bookmark {', '.join(bookmarks[:5])}{' ...' if len(bookmarks) > 5 else ''}", bookmarks=bookmarks))
    return compared


def _check_group(logs: _Txlogs, a: InstanceConfig, dest_ab: Destination, acked_ab: int,
                 b: InstanceConfig, dest_ba: Destination, acked_ba: int) -> Compared:
    """A and B, one group, replicating to each other: each holds what the other holds on those topics."""
    compared = Compared(a.name, None, b.name, acked_seq=min(acked_ab, acked_ba))
    try:
        a_rows, b_rows = logs.rows(a.name), logs.rows(b.name)
    except Exception as exc:
        compared.findings.append(Finding("unreadable", a.name, b.name, None, f"a txlog could not be read: {exc}"))
        return compared
    for here, rows, acked, there, other_rows in ((a, a_rows, acked_ab, b, b_rows), (b, b_rows, acked_ba, a, a_rows)):
        window = rows.filter(pc.less_equal(rows["seq"], acked))
        shared = window.filter(pa.array(_on_shared_topics(window, dest_ab, dest_ba)))
        compared.messages += shared.num_rows
        missing, _ = _compare(shared, other_rows)
        for publisher, ranges in _ranges_by_publisher(missing).items():
            compared.findings.append(Finding(
                "group", here.name, there.name, None,
                f"group {a.group}: {here.name} holds {_count(ranges)} message(s) of publisher {publisher} on "
                f"topics the two replicate to each other that {there.name} lacks: publisher_seq "
                f"{_ranges_text(ranges)}", publisher=publisher, seq_ranges=ranges))
    return compared


def _on_shared_topics(rows: pa.Table, one: Destination, other: Destination) -> np.ndarray:
    """Rows whose topic and message type both destinations replicate (filters and PassThrough aside)."""
    keys = pc.binary_join_element_wise(rows["topic"], rows["message_type"], "\x00").to_pylist()
    answers = {}
    for key in set(keys):
        topic, message_type = key.split("\x00", 1)
        answers[key] = all(any(t.message_type == message_type and routing.regex_matches(t.name, topic)
                               for t in d.topics) for d in (one, other))
    return np.array([answers[k] for k in keys], dtype=bool)


def _compare(expected: pa.Table, held: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(rows of ``expected`` whose bookmark ``held`` lacks, rows whose body differs there)."""
    if expected.num_rows == 0:
        return expected, expected.select(["bookmark"])
    there = held.select(["bookmark", "data"]).rename_columns(["bookmark", "held_data"])
    joined = expected.select(["bookmark", "publisher", "publisher_seq", "data"]).join(
        there, keys="bookmark", join_type="left outer")
    absent = pc.is_null(joined["held_data"])
    held_here = pc.invert(absent)
    differs = pc.and_(held_here, pc.not_equal(pc.fill_null(joined["data"], b""), pc.fill_null(joined["held_data"], b"")))
    return joined.filter(absent), joined.filter(pc.fill_null(differs, False)).select(["bookmark"])


def _ranges_by_publisher(rows: pa.Table) -> dict[str, tuple[tuple[int, int], ...]]:
    out: dict[str, tuple[tuple[int, int], ...]] = {}
    if rows.num_rows == 0:
        return out
    for publisher in sorted(set(rows["publisher"].to_pylist())):
        seqs = np.sort(rows.filter(pc.equal(rows["publisher"], publisher))["publisher_seq"].to_numpy())
        firsts, lasts = run_bounds(np.unique(seqs))
        out[publisher] = tuple(zip(firsts.tolist(), lasts.tolist()))
    return out


def _count(ranges: tuple[tuple[int, int], ...]) -> int:
    return sum(last - first + 1 for first, last in ranges)


def _ranges_text(ranges: tuple[tuple[int, int], ...], limit: int = 8) -> str:
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:limit]]
    return ", ".join(parts) + (f" and {len(ranges) - limit} more ranges" if len(ranges) > limit else "")
