"""``replication trace``: where a message published at one instance goes, by which paths, and why not elsewhere.

This is the check the AMPS guide asks people to do by hand ("start at each
instance that will receive publishes and trace the possible replication
paths, applying these rules"), done with :func:`replication.routing.decide`,
the module the replicator itself uses. Every route a copy can take is
followed: each instance sends to each destination's first reachable address
(the failover list, skipping instances given with ``--without``), and the
loop rule ends every route. An instance is reached when some route gets there.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field

from replication import routing
from replication.config.fabric import Fabric
from replication.errors import ConfigError

MAX_ROUTES = 100_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="instance config files (XML)")
    parser.add_argument("--from", dest="start", required=True, metavar="INSTANCE",
                        help="instance the message is published to")
    parser.add_argument("--topic", required=True, help="AMPS topic of the message")
    parser.add_argument("--type", dest="message_type", default="json", help="message type (default: json)")
    parser.add_argument("--message", default=None, metavar="JSON", help="message body, for content filters")
    parser.add_argument(
        "--without", action="append", default=[], metavar="INSTANCE", help="treat this instance as down (repeatable)"
    )
    parser.add_argument("--format", choices=("text", "json"), default="text", help="report format (default: text)")


@dataclass(frozen=True)
class Hop:
    """A copy that was not sent: who would have sent it, to whom, and the rule that stopped it."""

    sender: str
    destination: str
    target: str
    """The instance the copy was for (for ``down``: every address of the destination, ``/``-joined)."""
    rule: str
    reason: str


@dataclass
class Trace:
    start: str
    topic: str
    message_type: str
    without: tuple[str, ...]
    routes: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)
    """Reached instance -> every path by which a copy arrives (shortest first)."""
    blocked: list[Hop] = field(default_factory=list)
    outside: list[tuple[str, str, str]] = field(default_factory=list)
    """(sender, destination, address) of copies sent to instances not among the configs (not followed)."""
    accepted: bool = True
    """False when the start instance does not record the topic (the publish is rejected)."""
    queues: list[dict] = field(default_factory=list)
    """The queues the message enters (as a message of an underlying topic) or manages (the queue topic itself:
    acknowledgements and transfers): which reached instances hold it, and which one delivers it."""

    def reached(self) -> list[str]:
        return list(self.routes)

    def not_reached(self, fabric: Fabric) -> dict[str, list[str]]:
        """Instance -> the reasons no copy arrived."""
        out: dict[str, list[str]] = {}
        for cfg in fabric:
            if cfg.name in self.routes:
                continue
            if cfg.name in self.without:
                out[cfg.name] = ["down (--without)"]
                continue
            reasons = []
            for hop in self.blocked:
                if hop.target == cfg.name:
                    line = f"{hop.sender} -> {cfg.name}: {hop.reason}"
                    if line not in reasons:
                        reasons.append(line)
            senders = {hop.sender for hop in self.blocked if hop.target == cfg.name}
            reasons += _feeder_reasons(fabric, self.routes, set(self.without), cfg.name, skip=senders)
            out[cfg.name] = reasons
        return out


def _feeder_reasons(fabric: Fabric, routes: dict, down: set[str], name: str, *, skip: set[str]) -> list[str]:
    """Why the instances whose destinations can lead to ``name`` did not bring it a copy."""
    reasons: list[str] = []
    for link in fabric.all_links():
        if link.downstream != name or link.upstream in skip:
            continue
        up = link.upstream
        if up not in routes:
            reason = f"{up} (destination {link.destination.name}) is itself not reached"
        else:
            used = fabric.connected(fabric[up], link.destination, down)
            used_name = used.downstream if used else None
            reason = (
                f"{up} sends destination {link.destination.name} to {used_name} "
                f"(failover order: {name} is address {link.priority}, used only when those before it are down)"
            )
        if reason not in reasons:
            reasons.append(reason)
    if not reasons and not skip:
        reasons.append("no destination of any given config leads to it")
    return reasons


def trace(
    fabric: Fabric,
    start: str,
    topic: str,
    *,
    message_type: str = "json",
    data: object = None,
    without: tuple[str, ...] | list[str] = (),
) -> Trace:
    """Follow every route of a message published at ``start`` through the fabric."""
    if start not in fabric:
        raise ConfigError(f"--from {start}: no given config is named {start!r}; instances: {', '.join(fabric.configs)}")
    if start in without:
        raise ConfigError(f"--from {start} is also given with --without: a message cannot be published to a down "
                          "instance")
    unknown = [w for w in without if w not in fabric]
    if unknown:
        raise ConfigError(f"--without {', '.join(unknown)}: no such instance; instances: {', '.join(fabric.configs)}")
    down = set(without)
    result = Trace(start, topic, message_type, tuple(without))
    first = routing.published(topic, start, message_type=message_type, data=data)
    cfg = fabric[start]
    if not any(routing.regex_matches(t.name, topic) and t.message_type == message_type for t in cfg.txlog_topics):
        result.accepted = False
        return result
    stack = [(start, first)]
    seen_hops: set[tuple] = set()
    count = 0
    while stack:
        name, msg = stack.pop()
        count += 1
        if count > MAX_ROUTES:
            raise ConfigError(f"more than {MAX_ROUTES} routes: the fabric is too large to trace every route")
        result.routes.setdefault(name, []).append(msg.path)
        here = fabric[name]
        for dest in here.destinations:
            link = fabric.connected(here, dest, down)
            links = fabric.links(here, dest)
            if link is None and any(lk.downstream is None for lk in links):
                # the destination leads out of the given configs: apply the rules, do not follow
                d = routing.decide(here, dest, msg, target=dest.name)
                addr = next(lk.address for lk in links if lk.downstream is None)
                if d.sent:
                    entry = (name, dest.name, addr)
                    if entry not in result.outside:
                        result.outside.append(entry)
                    continue
                hop = Hop(name, dest.name, dest.name, d.rule or "", d.reason)
            elif link is None:
                targets = [lk.downstream or lk.address for lk in links]
                hop = Hop(name, dest.name, "/".join(targets), "down",
                          f"every address of destination {dest.name} is down: {', '.join(targets)}")
            else:
                assert link.downstream is not None  # connected() returns only a link to a given config
                d = routing.decide(here, dest, msg, target=link.downstream)
                if d.sent:
                    stack.append((link.downstream, routing.forwarded(msg, here, link.downstream)))
                    continue
                hop = Hop(name, dest.name, link.downstream, d.rule or "", d.reason)
            key = (hop.sender, hop.destination, hop.target, hop.rule, hop.reason)
            if key not in seen_hops:
                seen_hops.add(key)
                result.blocked.append(hop)
    result.queues = _queues(fabric, result, topic, message_type, data)
    for paths in result.routes.values():
        paths.sort(key=lambda p: (len(p), p))
    order = {c.name: i for i, c in enumerate(fabric)}
    result.routes = dict(sorted(result.routes.items(), key=lambda kv: (len(kv[1][0]), order[kv[0]])))
    return result


def _queues(fabric: Fabric, result: Trace, topic: str, message_type: str, data: object) -> list[dict]:
    """Per queue the message touches: the reached instances holding it, and who delivers it there."""
    found: dict[str, dict] = {}
    for name in result.routes:
        for q in fabric[name].queues:
            if q.message_type != message_type:
                continue
            if q.name == topic:
                role = "the queue topic: its acknowledgements and transfers go where this message goes"
            elif routing.regex_matches(q.underlying_topic, topic) and (
                    q.filter is None or data is None or q.filter.matches(data, message_type)):
                role = "a message of the queue"
            else:
                continue
            entry = found.setdefault(q.name, {"queue": q.name, "kind": q.kind, "role": role, "held_at": []})
            entry["held_at"].append(name)
            if role.startswith("a message"):
                entry["delivered_by"] = (q.initial_owner if q.kind == "GroupLocalQueue" and q.initial_owner
                                         else "each instance, its own copy" if q.kind == "LocalQueue"
                                         else result.start)
    return list(found.values())


def run(args: argparse.Namespace) -> int:
    fabric = Fabric.load(args.configs)
    data = None
    if args.message is not None:
        try:
            data = json.loads(args.message)
        except ValueError as exc:
            raise ConfigError(f"--message is not valid JSON ({exc}); write e.g. --message '{{\"qty\": 150}}'") from None
    result = trace(fabric, args.start, args.topic, message_type=args.message_type, data=data, without=args.without)
    if args.format == "json":
        json.dump(_as_json(fabric, result), sys.stdout, indent=2)
        print()
    else:
        print(render(fabric, result))
    return 0


def _as_json(fabric: Fabric, r: Trace) -> dict:
    return {
        "from": r.start,
        "topic": r.topic,
        "message_type": r.message_type,
        "without": list(r.without),
        "accepted": r.accepted,
        "reached": {name: [list(p) for p in paths] for name, paths in r.routes.items()},
        "not_reached": r.not_reached(fabric),
        "not_sent": [hop.__dict__ for hop in r.blocked],
        "outside": [{"sender": s, "destination": d, "address": a} for s, d, a in r.outside],
        "queues": r.queues,
    }


def render(fabric: Fabric, r: Trace, *, max_paths: int = 3) -> str:
    lines = [f"Message: topic {r.topic!r} ({r.message_type}) published at {r.start}"]
    if r.without:
        lines.append(f"Down: {', '.join(r.without)}")
    if not r.accepted:
        lines.append(
            f"Not accepted: {r.start} does not record topic {r.topic!r} ({r.message_type}) in its transaction log, "
            "so the publish is rejected and goes nowhere"
        )
        return "\n".join(lines)
    total = len(fabric)
    lines += ["", f"Reaches {len(r.routes)} of {total} instances:"]
    width = max(len(n) for n in fabric.configs)
    for name, paths in r.routes.items():
        shown = [" -> ".join(p) for p in paths[:max_paths]]
        first = "published here" if paths[0] == (r.start,) else shown[0]
        more = shown[1:] if paths[0] != (r.start,) else []
        extra = f"(+{len(paths) - max_paths} more paths)" if len(paths) > max_paths else ""
        lines.append(f"  {name:<{width}}  {first}")
        for p in more:
            lines.append(f"  {'':<{width}}  {p}")
        if extra:
            lines.append(f"  {'':<{width}}  {extra}")
    missing = r.not_reached(fabric)
    if missing:
        lines += ["", f"Does not reach {len(missing)}:"]
        for name, reasons in missing.items():
            lines.append(f"  {name:<{width}}  {reasons[0]}")
            for reason in reasons[1:]:
                lines.append(f"  {'':<{width}}  {reason}")
    else:
        lines += ["", "Does not reach: none"]
    if r.outside:
        lines += ["", "Leaves the given configs (sent, not followed further):"]
        for sender, dest, addr in r.outside:
            lines.append(f"  {sender} -> {addr} (destination {dest})")
    for q in r.queues:
        lines += ["", f"Queue {q['queue']} ({q['kind']}): {q['role']}; held at {', '.join(q['held_at'])}"]
        if "delivered_by" in q and q["kind"] == "LocalQueue":
            lines.append("  delivered by each instance holding it, from its own copy (a LocalQueue is not replicated)")
        elif "delivered_by" in q:
            lines.append(f"  delivered by {q['delivered_by']} (its owner; another instance only after a transfer)")
    stopped = [h for h in r.blocked if h.rule != "loop"]
    loops = [h for h in r.blocked if h.rule == "loop"]
    if stopped:
        lines += ["", "Copies the rules did not send:"]
        for hop in stopped:
            to = hop.target
            lines.append(f"  {hop.sender} -> {to} (destination {hop.destination}): [{hop.rule}] {hop.reason}")
    if loops:
        copies = "copy" if len(loops) == 1 else "copies"
        lines.append(f"\n({len(loops)} {copies} not sent back to instances already on their path: loop rule)")
    return "\n".join(lines)
