"""Replication configuration validation: the nine checks of AMPS and one of this engine, run when a link starts.

"Replication Configuration Validation" (spec) compares the configs at the two
ends of a link and refuses links that could lose messages or let instances
differ, unless a check is excluded with ``<ExcludeValidation>`` on the
destination's ``<Topic>``. "This instance" is the upstream (it sends), the
"downstream" receives. Checks, per ``<Topic>`` of the destination:

==================  ===========================================================
txlog               the topic is in the downstream's transaction log
replicate           the downstream replicates the topic back to this instance
sow                 a SOW topic here is a SOW topic downstream
cascade             the downstream enforces (does not exclude) every check this
                    link enforces, on every destination that replicates the topic
queue               a queue here is a queue downstream (cannot be excluded)
keys                a SOW topic on both sides has the same ``<Key>`` definitions
replicate_filter    a ``<Filter>`` here is used, identically, by the downstream
                    when it replicates the topic back
queue_passthrough   for a queue here, the downstream passes through this group
queue_underlying    a queue on both sides has the same underlying topic and
                    filter (cannot be excluded)
entitlement         the downstream's ``<Entitlement>`` admits this instance and
                    the topic (this engine's tenth check; rows it does not admit
                    would be rejected there)
==================  ===========================================================

Before the topics, the link itself: a destination that declares a ``<Group>``
reaches only an instance of that group (``group``; AMPS refuses the connection
otherwise, and so does this engine: the link is not started). A destination
written without ``<Group>`` accepts any.

Topic names are regexes; two are compared as the spec's configs are: equal
names match, a regex such as ``.*`` covers any name it matches, and
``^/orders/`` covers ``^/orders/.*`` (anchors stripped). Anything subtler is
reported, and writing the same ``<Name>`` on both ends fixes it.

The replicator calls, on link start::

    findings = validation.validate_link(cfg, dest, downstream_cfg)

and refuses the link (logging each finding) when the list is not empty.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from replication.config.fabric import addresses_of, normalize_address
from replication.config.model import MANDATORY_CHECKS, VALIDATION_CHECKS
from replication.errors import ConfigError
from replication.routing import is_literal, regex_matches

if TYPE_CHECKING:
    from replication.config.model import (
        Destination,
        DestinationTopic,
        InstanceConfig,
        QueueTopic,
        SowTopic,
    )
    from replication.expressions import Filter

__all__ = ["Finding", "enforced_checks", "topic_covers", "validate_link"]


@dataclass(frozen=True)
class Finding:
    """One failed check on one link, with the change that would make it pass."""

    upstream: str
    downstream: str
    destination: str
    """The upstream's ``<Destination><Name>``."""
    topic: str
    """The destination ``<Topic><Name>`` that was checked."""
    message_type: str
    check: str
    """One of :data:`replication.config.model.VALIDATION_CHECKS`, or ``group`` (the link's own check: a
    destination's declared ``<Group>`` is the downstream's; it cannot be excluded)."""
    problem: str
    """What differs between the two configs."""
    fix: str
    """The element to add or change, or the exclusion to set."""
    where: str = ""
    """``file:line`` of the upstream's ``<Topic>`` element, when known."""

    def __str__(self) -> str:
        at = f" [{self.where}]" if self.where else ""
        return (
            f"{self.upstream} -> {self.downstream} (destination {self.destination}, topic "
            f"{self.topic!r} {self.message_type}): {self.check} check failed: {self.problem}{at}\n"
            f"    fix: {self.fix}"
        )

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


# --------------------------------------------------------------------------- topic comparison


def _strip_anchors(pattern: str) -> str:
    return re.sub(r"\$$", "", re.sub(r"^\^", "", pattern))


def topic_covers(outer: str, inner: str) -> bool:
    """True when every topic ``inner`` names is also named by ``outer`` (both AMPS topic regexes)."""
    if outer == inner:
        return True
    if _strip_anchors(outer) in (".*", ""):
        return True
    if is_literal(inner):
        return regex_matches(outer, inner)
    if is_literal(outer):
        return False
    # Prefix-style regexes: ^/orders/ covers ^/orders/.* and /orders/x.*
    stripped = _strip_anchors(inner)
    return regex_matches(outer, stripped) and not outer.endswith("$")


def _overlaps(a: str, b: str) -> bool:
    return topic_covers(a, b) or topic_covers(b, a)


def enforced_checks(topic: DestinationTopic) -> frozenset[str]:
    """The checks a destination ``<Topic>`` enforces (all but its exclusions)."""
    return frozenset(VALIDATION_CHECKS) - topic.exclude_validation


# --------------------------------------------------------------------------- helpers


def _dests_back_to(down: InstanceConfig, up: InstanceConfig) -> list[Destination]:
    """The downstream's destinations that can lead back to the upstream instance."""
    up_addrs = addresses_of(up)
    return [
        d
        for d in down.destinations
        if d.name == up.name or any(normalize_address(a) in up_addrs for a in d.inet_addrs)
    ]


def _replicating(cfg: InstanceConfig, name: str, message_type: str, *, covers: bool = True):
    """(destination, topic) pairs of ``cfg`` that replicate ``name``."""
    for d in cfg.destinations:
        for t in d.topics:
            if t.message_type != message_type:
                continue
            if (topic_covers(t.name, name) if covers else _overlaps(t.name, name)):
                yield d, t


def _sow_topics(cfg: InstanceConfig, topic: DestinationTopic) -> list[SowTopic]:
    return [s for s in cfg.sow_topics if s.message_type == topic.message_type and topic_covers(topic.name, s.name)]


def _queues(cfg: InstanceConfig, topic: DestinationTopic) -> list[QueueTopic]:
    return [q for q in cfg.queues if q.message_type == topic.message_type and topic_covers(topic.name, q.name)]


def _same_queue(cfg: InstanceConfig, q: QueueTopic) -> QueueTopic | None:
    for other in cfg.queues:
        if other.message_type == q.message_type and other.name == q.name:
            return other
    return None


def _same_sow(cfg: InstanceConfig, s: SowTopic) -> SowTopic | None:
    for other in cfg.sow_topics:
        if other.message_type == s.message_type and topic_covers(other.name, s.name):
            return other
    return None


def _filter_form(flt: Filter | None) -> str | None:
    """The canonical form of a filter: two filters that read the same compare equal."""
    return str(flt) if flt is not None else None


def _topic_xml(t: DestinationTopic | SowTopic | QueueTopic, *, with_filter: Filter | None = None) -> str:
    parts = f"<Name>{t.name}</Name><MessageType>{t.message_type}</MessageType>"
    if with_filter:
        parts += f"<Filter>{_xml_escape(with_filter.text)}</Filter>"
    return f"<Topic>{parts}</Topic>"


def _text(flt: Filter | None) -> str | None:
    return flt.text if flt is not None else None


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _exclude_hint(up: InstanceConfig, dest: Destination, topic: DestinationTopic, check: str) -> str:
    checks = [c for c in VALIDATION_CHECKS if c in topic.exclude_validation or c == check]
    return (
        f"in {up.name}'s config set <ExcludeValidation>{','.join(checks)}</ExcludeValidation> on "
        f"<Topic><Name>{topic.name}</Name> of destination {dest.name}"
    )


# --------------------------------------------------------------------------- the nine checks


def validate_link(up: InstanceConfig, dest: Destination, down: InstanceConfig) -> list[Finding]:
    """Run every check ``dest``'s topics enforce on the link ``up`` -> ``down``; [] means the link may start.

    Args:
        up: this (sending) instance's config.
        dest: the destination of ``up`` being connected.
        down: the downstream's effective config (its ``_control/instance.json``
            via :mod:`replication.config.effective`, or its parsed XML).

    Raises:
        ConfigError: a topic tries to exclude ``queue`` or ``queue_underlying``.

    Example:
        >>> for f in validate_link(cfg, cfg.destination("amps-2"), amps2_cfg):  # doctest: +SKIP
        ...     print(f)
    """
    findings: list[Finding] = []
    down_group = down.group or down.name
    if dest.group_declared and dest.group != down_group:
        # link-level and mandatory: AMPS refuses the connection
        findings.append(Finding(
            upstream=up.name, downstream=down.name, destination=dest.name, topic="*", message_type="*",
            check="group",
            problem=f"destination {dest.name} declares <Group>{dest.group}</Group>, but {down.name} at this "
                    f"address is in group {down_group}",
            fix=f"write <Group>{down_group}</Group> in destination {dest.name} if {down.name} is the instance "
                f"meant, or point its <InetAddr> at an instance of group {dest.group}",
            where=str(dest.source) if dest.source.file else "",
        ))
    for topic in dest.topics:
        bad = topic.exclude_validation & MANDATORY_CHECKS
        if bad:
            raise ConfigError(
                f"{topic.source}: {up.name}, destination {dest.name}, topic {topic.name!r}: "
                f"{', '.join(sorted(bad))} cannot be excluded (mandatory validation checks); "
                "remove it from <ExcludeValidation>",
                file=topic.source.file,
                line=topic.source.line or None,
            )
        enforced = enforced_checks(topic)
        for check in VALIDATION_CHECKS:
            if check in enforced:
                for problem, fix in _CHECKS[check](up, dest, topic, down):
                    findings.append(
                        Finding(
                            upstream=up.name,
                            downstream=down.name,
                            destination=dest.name,
                            topic=topic.name,
                            message_type=topic.message_type,
                            check=check,
                            problem=problem,
                            fix=fix,
                            where=str(topic.source) if topic.source.file else "",
                        )
                    )
    return findings


def _check_txlog(up, dest, topic, down):
    if any(t.message_type == topic.message_type and topic_covers(t.name, topic.name) for t in down.txlog_topics):
        return
    recorded = ", ".join(f"{t.name!r} ({t.message_type})" for t in down.txlog_topics) or "nothing"
    yield (
        f"{down.name}'s transaction log does not record topic {topic.name!r} ({topic.message_type}); "
        f"it records {recorded}",
        f"in {down.name}'s config add <TransactionLog>{_topic_xml(topic)}</TransactionLog>, or "
        + _exclude_hint(up, dest, topic, "txlog"),
    )


def _check_replicate(up, dest, topic, down):
    back = _dests_back_to(down, up)
    for d in back:
        if any(t.message_type == topic.message_type and topic_covers(t.name, topic.name) for t in d.topics):
            return
    if back:
        where = f"add {_topic_xml(topic)} to its destination {back[0].name}"
        problem = f"{down.name} replicates to {up.name} (destination {back[0].name}) but not topic {topic.name!r}"
    else:
        inbox = up.replication_transport.inet_addr if up.replication_transport else up.storage
        where = (
            f"add <Replication><Destination><Name>{up.name}</Name><Group>{up.group}</Group>"
            f"<SyncType>{dest.sync_type}</SyncType>{_topic_xml(topic)}<Transport><Type>amps-replication"
            f"</Type><InetAddr>{inbox}</InetAddr></Transport></Destination></Replication>"
        )
        problem = f"{down.name} does not replicate topic {topic.name!r} ({topic.message_type}) back to {up.name}"
    yield (
        problem,
        f"in {down.name}'s config {where}; or, if one-way replication is intended (a view server, "
        f"a lower tier), {_exclude_hint(up, dest, topic, 'replicate')}",
    )


def _check_sow(up, dest, topic, down):
    for s in _sow_topics(up, topic):
        if _same_sow(down, s) is None:
            keys = "".join(f"<Key>{k}</Key>" for k in s.keys)
            yield (
                f"topic {s.name!r} ({s.message_type}) is a SOW topic in {up.name} but not in {down.name}",
                f"in {down.name}'s config add <SOW><Topic><Name>{s.name}</Name><MessageType>{s.message_type}"
                f"</MessageType>{keys}</Topic></SOW>, or " + _exclude_hint(up, dest, topic, "sow"),
            )


def _check_cascade(up, dest, topic, down):
    wanted = enforced_checks(topic)
    for d, t in _replicating(down, topic.name, topic.message_type, covers=False):
        missing = [c for c in VALIDATION_CHECKS if c in wanted and c not in enforced_checks(t)]
        if not missing:
            continue
        yield (
            f"{down.name} excludes {','.join(missing)} for topic {t.name!r} on its destination {d.name}, "
            f"which this link enforces",
            f"if {down.name}'s relaxed checks are intended, "
            + _exclude_hint(up, dest, topic, "cascade")
            + f"; otherwise remove {','.join(missing)} from <ExcludeValidation> of destination {d.name} "
            f"in {down.name}'s config",
        )


def _check_queue(up, dest, topic, down):
    for q in _queues(up, topic):
        if _same_queue(down, q) is None:
            yield (
                f"topic {q.name!r} ({q.message_type}) is a queue ({q.kind}) in {up.name} but not in {down.name}",
                f"in {down.name}'s config add <SOW><{q.kind}><Name>{q.name}</Name><MessageType>"
                f"{q.message_type}</MessageType><UnderlyingTopic>{q.underlying_topic}</UnderlyingTopic>"
                f"</{q.kind}></SOW> (this check cannot be excluded)",
            )


def _check_keys(up, dest, topic, down):
    for s in _sow_topics(up, topic):
        other = _same_sow(down, s)
        if other is not None and set(other.keys) != set(s.keys):
            keys = "".join(f"<Key>{k}</Key>" for k in s.keys)
            yield (
                f"SOW topic {s.name!r} has Key {', '.join(s.keys)} in {up.name} but "
                f"{', '.join(other.keys) or 'none'} in {down.name}",
                f"in {down.name}'s config make the keys of SOW topic {other.name!r} {keys}, or "
                + _exclude_hint(up, dest, topic, "keys"),
            )


def _check_replicate_filter(up, dest, topic, down):
    if topic.filter is None:
        return
    mine = _filter_form(topic.filter)
    back = [
        t
        for d in _dests_back_to(down, up)
        for t in d.topics
        if t.message_type == topic.message_type and _overlaps(t.name, topic.name)
    ]
    if any(_filter_form(t.filter) == mine for t in back):
        return
    if not back:
        used = f"does not replicate topic {topic.name!r} back to {up.name} at all"
    else:
        used = "replicates it back to " + up.name + " with " + ", ".join(
            f"filter {t.filter.text!r}" if t.filter else "no filter" for t in back
        )
    yield (
        f"this link filters topic {topic.name!r} with {topic.filter.text!r} but {down.name} {used}",
        f"in {down.name}'s destination to {up.name} use "
        f"{_topic_xml(topic, with_filter=topic.filter)}, or, if the partition is intended, "
        + _exclude_hint(up, dest, topic, "replicate_filter"),
    )


def _check_queue_passthrough(up, dest, topic, down):
    group = up.group or up.name
    for q in _queues(up, topic):
        for d, _t in _replicating(down, q.name, q.message_type):
            if d.pass_through is not None and regex_matches(d.pass_through, group):
                continue
            have = f"PassThrough {d.pass_through!r}" if d.pass_through else "no PassThrough"
            yield (
                f"queue {q.name!r}: {down.name}'s destination {d.name} has {have}, so queue messages "
                f"{down.name} receives from group {group} do not reach {d.name}",
                f"in {down.name}'s config set <PassThrough>.*</PassThrough> (or a regex matching {group}) "
                f"on destination {d.name}, or " + _exclude_hint(up, dest, topic, "queue_passthrough"),
            )


def _check_queue_underlying(up, dest, topic, down):
    for q in _queues(up, topic):
        other = _same_queue(down, q)
        if other is None:
            continue  # the queue check reports the missing queue
        diffs = []
        if other.kind != q.kind:
            diffs.append(f"kind {q.kind} vs {other.kind}")
        if other.underlying_topic != q.underlying_topic:
            diffs.append(f"UnderlyingTopic {q.underlying_topic!r} vs {other.underlying_topic!r}")
        if _filter_form(other.filter) != _filter_form(q.filter):
            diffs.append(f"Filter {_text(q.filter)!r} vs {_text(other.filter)!r}")
        mine_owner, their_owner = getattr(q, "initial_owner", None), getattr(other, "initial_owner", None)
        if mine_owner != their_owner:
            diffs.append(f"InitialOwner {mine_owner!r} vs {their_owner!r}")
        if diffs:
            yield (
                f"queue {q.name!r} differs between {up.name} and {down.name}: {'; '.join(diffs)}",
                f"in {down.name}'s config define <{q.kind}><Name>{q.name}</Name> exactly as in {up.name} "
                f"(UnderlyingTopic {q.underlying_topic!r}, Filter {_text(q.filter)!r}); this check cannot be excluded",
            )


def _check_entitlement(up, dest, topic, down):
    rules = down.replication_transport.entitlements if down.replication_transport is not None else None
    if rules is None:
        return
    mine = [r for r in rules if r.admits(up.name, up.group or up.name)]
    if not mine:
        yield (
            f"{down.name}'s <Entitlement> does not admit {up.name} (group {up.group or up.name}): every row "
            "this destination sends would be rejected there",
            f"in {down.name}'s config add <Upstream><Name>{up.name}</Name><Topic>{_xml_escape(topic.name)}"
            "</Topic></Upstream> to its incoming transport's <Entitlement>, or "
            + _exclude_hint(up, dest, topic, "entitlement"),
        )
        return
    allowed = [p for r in mine for p in r.topics]
    if any(topic_covers(p, topic.name) for p in allowed):
        return
    yield (
        f"{down.name}'s <Entitlement> lets {up.name} send {', '.join(repr(p) for p in allowed)}, which does not "
        f"cover topic {topic.name!r}: its rows would be rejected there",
        f"in {down.name}'s config add <Topic>{_xml_escape(topic.name)}</Topic> to the <Upstream> of {up.name} "
        f"in its <Entitlement>, or narrow this destination's topics, or "
        + _exclude_hint(up, dest, topic, "entitlement"),
    )


_CHECKS = {
    "txlog": _check_txlog,
    "replicate": _check_replicate,
    "sow": _check_sow,
    "cascade": _check_cascade,
    "queue": _check_queue,
    "keys": _check_keys,
    "replicate_filter": _check_replicate_filter,
    "queue_passthrough": _check_queue_passthrough,
    "queue_underlying": _check_queue_underlying,
    "entitlement": _check_entitlement,
}
assert tuple(_CHECKS) == VALIDATION_CHECKS
