"""Entitled incoming replication: which upstreams may replicate which topics into this instance.

The incoming transport's ``<Entitlement>`` (module ``replication-topic-entitlement``) lists upstream
instances (``<Name>``) or groups (``<Group>``) and the topics (regexes) each may send. A row from an
upstream no rule names, or on a topic its rules do not list, is refused with the reason
(:class:`replication.ingest.inputs.InboxRows` sends it to ``rejected/``). A backfill's rows are this
instance's own publishes, not an upstream's: they are not entitled here.

The same rules let an upstream check, before it sends anything, that its destination admits what it
would send (validation's ``entitlement`` check, :mod:`replication.validation`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replication.config.model import UpstreamEntitlement
from replication.messages import BACKFILL_LINK
from replication.routing import regex_matches


def refusal(rules: Iterable[UpstreamEntitlement], instance: str, upstream: str, group: str | None,
            topic: str) -> str | None:
    """Why ``upstream`` (of ``group``) may not replicate ``topic`` into ``instance``; None: it may."""
    mine = [r for r in rules if r.admits(upstream, group)]
    if not mine:
        return (f"upstream {upstream} (group {group}) is not entitled to replicate into {instance}: its "
                "<Entitlement> names neither")
    if any(regex_matches(pattern, topic) for r in mine for pattern in r.topics):
        return None
    allowed = ", ".join(repr(p) for r in mine for p in r.topics)
    return f"topic {topic!r} from upstream {upstream} is not entitled in {instance}: it may send {allowed}"


class Entitlements:
    """The rules of one instance, applied to inbox rows (``link``, ``link_group``, ``topic`` columns)."""

    def __init__(self, instance: str, rules: tuple[UpstreamEntitlement, ...]) -> None:
        self.instance = instance
        self.rules = rules
        self._cache: dict[tuple[str, str | None, str], str | None] = {}

    def refusals(self, rows: pa.Table) -> pa.Array | None:
        """Per row, why it is refused (null: entitled); None when every row is."""
        n = rows.num_rows
        if n == 0:
            return None
        keys = pa.table({"link": rows["link"], "link_group": rows["link_group"], "topic": rows["topic"]})
        distinct = keys.group_by(["link", "link_group", "topic"]).aggregate([])
        reasons = [self._reason(link, group, topic) for link, group, topic in zip(
            distinct["link"].to_pylist(), distinct["link_group"].to_pylist(), distinct["topic"].to_pylist(),
            strict=True)]
        if not any(reasons):
            return None
        joined = _joined(keys)
        at = pc.index_in(joined, value_set=_joined(distinct).combine_chunks()).to_numpy(zero_copy_only=False)
        return pa.array(np.array(reasons, dtype=object)[at.astype(np.int64)], pa.string())

    def _reason(self, link: str, group: str | None, topic: str) -> str | None:
        key = (link, group, topic)
        if key not in self._cache:
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[key] = None if link == BACKFILL_LINK else refusal(self.rules, self.instance, link, group,
                                                                         topic)
        return self._cache[key]


def _joined(keys: pa.Table) -> pa.ChunkedArray:
    nul = pa.scalar("\x00")
    return pc.binary_join_element_wise(pc.fill_null(keys["link"], ""), pc.fill_null(keys["link_group"], ""),
                                       pc.fill_null(keys["topic"], ""), nul)
