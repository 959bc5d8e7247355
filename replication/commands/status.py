"""``replication status CONFIG... [--check]``: each instance's liveness and, per destination, where and how far it is.

Reads control files only (heartbeats, link files): no Spark, and it works
whether the instances run or not. ``--check`` turns it into a monitor (cron,
Nagios, a Kubernetes probe): it exits 1 and names each cause when an instance
is not running, a link is refused (replication validation, a config error), a
link has had rows waiting and no progress for longer than ``--stall-after``,
or a link's oldest unacknowledged row is older than ``--max-lag``; 0 when
none holds. Data on stdout, logs on stderr.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

from replication import config
from replication.config.model import InstanceConfig
from replication.destination.resync import HEARTBEAT_STALE_S
from replication.storage.control import Heartbeat, LinkState, RetentionState
from replication.storage.layout import StorageLayout

#: Link states whose ``detail`` is printed under the link: what the operator must fix.
EXPLAINED_STATES = ("validation failed", "config error", "resync impossible")
#: ``--check`` defaults: a link stalled this long, or this far behind, is a problem.
DEFAULT_STALL_AFTER_S = 60.0
DEFAULT_MAX_LAG_S = 300.0
#: ``--check`` reports a clash of client names, or a refused inbox commit, for this long after it was seen.
CLASH_REPORT_S = 3600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="instance config XML file(s)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 naming each problem (instance down, link refused, stalled or lagging); 0 if none")
    parser.add_argument("--stall-after", type=_seconds, default=DEFAULT_STALL_AFTER_S, metavar="SECONDS",
                        help="--check: rows waiting with no progress this long is a stall "
                             f"(default {DEFAULT_STALL_AFTER_S:g})")
    parser.add_argument("--max-lag", type=_seconds, default=DEFAULT_MAX_LAG_S, metavar="SECONDS",
                        help="--check: a link whose oldest unacknowledged row is older lags "
                             f"(default {DEFAULT_MAX_LAG_S:g})")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (e.g. 60)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def collect(cfg: InstanceConfig, *, now: float | None = None) -> dict:
    """One instance's status from its control files (works whether or not it is running)."""
    now = now or time.time()
    layout = StorageLayout.of(cfg.storage).check_reachable()
    beat = Heartbeat.read(layout.heartbeat_json) or Heartbeat(cfg.name)
    alive = beat.fresh(HEARTBEAT_STALE_S, now=now)
    links = dict(beat.links)
    for dest in cfg.destinations:
        if dest.name not in links:
            saved = LinkState.read(layout.link_file(dest.name))
            links[dest.name] = saved.to_json() if saved else {"state": "never started"}
        # a link stopped by a config error says so even once the instance is down: that is what to fix
        if not alive and links[dest.name].get("state") != "config error":
            links[dest.name] = dict(links[dest.name], state="instance down")
    return {
        "instance": cfg.name,
        "alive": alive,
        "heartbeat_age_s": round(now - beat.time, 1) if beat.time else None,
        "max_seq": beat.max_seq,
        "durable_seq": beat.durable_seq,
        "error": beat.error,
        "stalled": beat.stalled if alive else {},
        "clashes": beat.clashes if alive else {},
        "refusals": beat.refusals if alive else {},
        "retention": _retention(layout),
        "links": links,
    }


def _retention(layout: StorageLayout) -> dict | None:
    """What txlog retention removed: the first retained seq and bookmark, rows and files removed (None: it
    never ran)."""
    state = RetentionState.read(layout.retention_json)
    if state is None:
        return None
    return {"first_seq": state.first_seq, "first_bookmark": state.first_bookmark,
            "removed_rows": state.removed_rows, "removed_files": state.removed_files, "last_run": state.last_run,
            "inbox_removed_rows": state.inbox_removed_rows, "inbox_removed_files": state.inbox_removed_files}


@dataclass(frozen=True)
class Problem:
    """One reason ``--check`` fails: where, which kind, and what it says."""

    instance: str
    destination: str | None
    cause: str
    """``down``, ``refused``, ``stalled``, ``lagging``, ``clash`` or ``refused-commits``."""
    message: str


def check(statuses: list[dict], *, stall_after: float, max_lag: float, now: float | None = None) -> list[Problem]:
    """The problems in ``statuses`` (from :func:`collect`), each with its cause named."""
    now = now or time.time()
    problems: list[Problem] = []
    for st in statuses:
        name = st["instance"]
        if not st["alive"]:
            age = st["heartbeat_age_s"]
            seen = f"last heartbeat {age:.0f}s ago" if age is not None else "it never wrote a heartbeat"
            problems.append(Problem(name, None, "down", f"{name} is not running ({seen})"))
        elif st["error"]:
            problems.append(Problem(name, None, "down", f"{name}: its ingest query failed: {st['error']}"))
        for client, clash in sorted((st.get("clashes") or {}).items()):
            if now - clash["at"] < CLASH_REPORT_S:
                problems.append(Problem(name, None, "clash",
                                        f"{name}: client name {client!r} is used by two publishers at once "
                                        f"(sessions {clash['earlier']} and {clash['later']})"))
        for upstream, seen in sorted((st.get("refusals") or {}).items()):
            if now - seen["at"] < CLASH_REPORT_S:
                problems.append(Problem(name, None, "refused-commits",
                                        f"{name}: {seen['rows']:,} rows from {upstream} refused since start "
                                        f"({seen['commits']} whole commits); last: {seen['last']}"))
        for dest, link in sorted(st["links"].items()):
            state = link.get("state")
            if state in EXPLAINED_STATES:
                problems.append(Problem(name, dest, "refused",
                                        f"{name} -> {dest}: {state}: {link.get('detail') or 'see the log'}"))
                continue
            if not st["alive"]:
                continue  # the instance being down says it all
            since = link.get("waiting_since")
            if since is not None and now - since > stall_after:
                problems.append(Problem(
                    name, dest, "stalled",
                    f"{name} -> {dest}: stalled: rows have waited for it with no progress for {now - since:.0f}s "
                    f"(state {state}, sent {link.get('sent_seq', 0):,}, acknowledged {link.get('acked_seq', 0):,})"))
            lag = float(link.get("lag_seconds") or 0.0)
            if lag > max_lag:
                problems.append(Problem(
                    name, dest, "lagging",
                    f"{name} -> {dest}: lagging: its oldest unacknowledged row is {lag:.0f}s old "
                    f"(over {max_lag:g}s; {link.get('lag_messages', 0):,} rows behind)"))
    return problems


def state_text(link: dict) -> str:
    """A link's state as shown: ``config error: <message>`` for a link stopped by a terminal error."""
    state = link.get("state", "?")
    if state == "config error" and link.get("detail"):
        return f"config error: {link['detail']}"
    return state


def run(args: argparse.Namespace) -> int:
    statuses = [collect(config.load(path)) for path in args.configs]
    problems = check(statuses, stall_after=args.stall_after, max_lag=args.max_lag) if args.check else []
    if args.format == "json":
        payload: object = statuses
        if args.check:
            payload = {"ok": not problems, "problems": [asdict(p) for p in problems], "instances": statuses}
        print(json.dumps(payload, indent=2, sort_keys=True))
        return 1 if problems else 0
    if args.check:
        for problem in problems:
            print(f"{problem.cause.upper()}: {problem.message}")
        if not problems:
            print(f"OK: {len(statuses)} instance{'s' if len(statuses) != 1 else ''} running, "
                  f"{sum(len(st['links']) for st in statuses)} links moving")
        return 1 if problems else 0
    _print_table(statuses)
    return 0


def _print_table(statuses: list[dict]) -> None:
    header = f"{'instance':<14} {'destination':<14} {'state':<18} {'sync':<6} {'sent':>10} {'acked':>10} " \
             f"{'lag msgs':>9} {'lag s':>7}  address"
    print(header)
    print("-" * len(header))
    for st in statuses:
        alive = "up" if st["alive"] else "DOWN"
        print(f"{st['instance']:<14} {'(instance)':<14} {alive:<18} {'':<6} {st['max_seq']:>10,} "
              f"{st['durable_seq']:>10,} {'':>9} {'':>7}  " + (f"error: {st['error']}" if st["error"] else ""))
        for client, clash in sorted((st.get("clashes") or {}).items()):
            print(f"{'':<14}   CLASH: client name {client!r} used by two publishers at once "
                  f"(sessions {clash['earlier']} and {clash['later']})")
        if st.get("retention"):
            kept = st["retention"]
            print(f"{'':<14}   retention: first retained seq {kept['first_seq']:,} (bookmark "
                  f"{kept['first_bookmark']}), {kept['removed_rows']:,} rows removed; inbox: "
                  f"{kept['inbox_removed_rows']:,} stored rows removed")
        for upstream, seen in sorted((st.get("refusals") or {}).items()):
            print(f"{'':<14}   REFUSED from {upstream}: {seen['rows']:,} rows ({seen['commits']} whole commits) "
                  f"since start; last: {seen['last']}")
        for name, link in sorted(st["links"].items()):
            mode = link.get("sync_type", "")
            if link.get("downgraded"):
                mode = "async*"
            state = link.get("state", "?")
            if name in st.get("stalled", {}):
                state = f"{state} STALLED"
            print(f"{'':<14} {name:<14} {state:<18} {mode:<6} {link.get('sent_seq', 0):>10,} "
                  f"{link.get('acked_seq', 0):>10,} {link.get('lag_messages', 0):>9,} "
                  f"{link.get('lag_seconds', 0.0):>7.1f}  {link.get('address') or ''}")
            if link.get("state") in EXPLAINED_STATES and link.get("detail"):
                print(f"{'':<14}   {state_text(link) if link['state'] == 'config error' else link['detail']}")
            if link.get("manual"):
                print(f"{'':<14}   downgraded by an operator: async until `replication upgrade`")
