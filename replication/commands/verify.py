"""``replication verify CONFIG... [--topic REGEX] [--engine auto|arrow|spark]``: check that every link
delivered what it acknowledged, and that instances of one group agree (messages and SOW).

See :mod:`replication.verify` for what is compared. Reads tables and control
files only (Spark only for txlogs too large to compare in this process), and
runs while the instances run. Exit code: 0 when everything compared is
consistent, 1 with findings (each printed with the instances, the publisher
and the ``publisher_seq`` ranges, bookmarks or SOW keys), 2 for bad arguments
or a config that does not parse.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from replication.config.fabric import Fabric
from replication.errors import ConfigError
from replication.storage.layout import StorageLayout
from replication.verify import ARROW_MAX_BYTES, verify
from replication.verify.report import Compared, Report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="instance config files (XML)")
    parser.add_argument("--topic", default=None, metavar="REGEX",
                        help="compare only messages whose topic matches this regex (searched, as AMPS does)")
    parser.add_argument("--engine", choices=("auto", "arrow", "spark"), default="auto",
                        help="what compares the txlogs: this process (arrow) or Spark; auto: Spark when the "
                             f"txlogs together exceed {ARROW_MAX_BYTES >> 20} MB (default: auto)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="report format (default: text)")


def run(args: argparse.Namespace) -> int:
    if args.topic is not None:
        try:
            re.compile(args.topic)
        except re.error as exc:
            raise ConfigError(f"--topic {args.topic!r} is not a valid regular expression ({exc}); "
                              "write e.g. --topic '^/orders'") from None
    fabric = Fabric.load(args.configs)
    for cfg in fabric:  # a bucket that cannot be used: one line with the fix, not a report of missing rows
        StorageLayout.of(cfg.storage).check_reachable()
    report = verify(fabric, topic=args.topic, engine=args.engine)
    if args.format == "json":
        json.dump({"ok": report.ok, "engine": report.engine, "links": [c.to_dict() for c in report.links],
                   "groups": [c.to_dict() for c in report.groups], "sows": [c.to_dict() for c in report.sows],
                   "queues": [c.to_dict() for c in report.queues],
                   "findings": [f.to_dict() for f in report.findings]}, sys.stdout, indent=2)
        print()
    else:
        print(render(report))
    return 0 if report.ok else 1


def render(report: Report) -> str:
    lines = []
    for c in report.links:
        lines.append(_line(c, f"{c.upstream} -> {c.downstream or '?'} (destination {c.destination})"))
    for c in report.groups:
        lines.append(_line(c, f"group of {c.upstream} and {c.downstream}"))
    for c in report.sows:
        lines.append(_line(c, f"SOW {c.topic} of {c.upstream} and {c.downstream}", unit="records"))
    for c in report.queues:
        lines.append(_line(c, f"queue {c.topic} at {c.upstream}", unit="acknowledged messages"))
    checked = [c for c in report.links if not c.not_checked]
    failed = [c for c in report.links + report.groups + report.sows + report.queues if c.findings]
    sows = [c for c in report.sows if not c.not_checked]
    lines.append("")
    lines.append(
        f"{len(checked)} links and {len(report.groups)} group pairs compared, "
        f"{sum(c.messages for c in checked):,} acknowledged messages"
        + (f", {len(sows)} SOW topics ({sum(c.messages for c in sows):,} records)" if report.sows else "")
        + (f", {len(report.queues)} queues" if report.queues else "") + ": "
        + (f"{len(report.findings)} findings in {len(failed)}" if failed else "consistent")
        + (f"; {len(report.links) - len(checked)} links not checked" if len(checked) < len(report.links) else ""))
    return "\n".join(lines)


def _line(c: Compared, label: str, *, unit: str = "messages") -> str:
    if c.not_checked:
        return f"?     {label}: not checked ({c.not_checked})"
    upto = f" up to seq {c.acked_seq:,}" if unit == "messages" else ""
    head = f"{'FAIL' if c.findings else 'ok  '}  {label}: {c.messages:,} {unit}{upto}"
    return "\n".join([head] + [f"      {f.message}" for f in c.findings])
