"""``replication status CONFIG...``: each instance's liveness and, per destination, where and how far it is."""

from __future__ import annotations

import argparse
import json
import time

from replication import config
from replication.config.model import InstanceConfig
from replication.destination.resync import HEARTBEAT_STALE_S
from replication.storage.control import Heartbeat, LinkState
from replication.storage.layout import StorageLayout

#: Link states whose ``detail`` is printed under the link: what the operator must fix.
EXPLAINED_STATES = ("validation failed", "config error")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="instance config XML file(s)")
    parser.add_argument("--format", choices=("text", "json"), default="text")


def collect(cfg: InstanceConfig, *, now: float | None = None) -> dict:
    """One instance's status from its control files (works whether or not it is running)."""
    now = now or time.time()
    layout = StorageLayout.of(cfg.storage)
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
        "links": links,
    }


def state_text(link: dict) -> str:
    """A link's state as shown: ``config error: <message>`` for a link stopped by a terminal error."""
    state = link.get("state", "?")
    if state == "config error" and link.get("detail"):
        return f"config error: {link['detail']}"
    return state


def run(args: argparse.Namespace) -> int:
    statuses = [collect(config.load(path)) for path in args.configs]
    if args.format == "json":
        print(json.dumps(statuses, indent=2, sort_keys=True))
        return 0
    header = f"{'instance':<14} {'destination':<14} {'state':<18} {'sync':<6} {'sent':>10} {'acked':>10} " \
             f"{'lag msgs':>9} {'lag s':>7}  address"
    print(header)
    print("-" * len(header))
    for st in statuses:
        alive = "up" if st["alive"] else "DOWN"
        print(f"{st['instance']:<14} {'(instance)':<14} {alive:<18} {'':<6} {st['max_seq']:>10,} "
              f"{st['durable_seq']:>10,} {'':>9} {'':>7}  " + (f"error: {st['error']}" if st["error"] else ""))
        for name, link in sorted(st["links"].items()):
            mode = link.get("sync_type", "")
            if link.get("downgraded"):
                mode = "async*"
            print(f"{'':<14} {name:<14} {link.get('state', '?'):<18} {mode:<6} {link.get('sent_seq', 0):>10,} "
                  f"{link.get('acked_seq', 0):>10,} {link.get('lag_messages', 0):>9,} "
                  f"{link.get('lag_seconds', 0.0):>7.1f}  {link.get('address') or ''}")
            if link.get("state") in EXPLAINED_STATES and link.get("detail"):
                print(f"{'':<14}   {state_text(link) if link['state'] == 'config error' else link['detail']}")
    return 0

