"""``replication status CONFIG...``: each instance's liveness and, per destination, where and how far it is."""

from __future__ import annotations

import argparse
import json
import time

from replication import config
from replication.destinations import HEARTBEAT_STALE_S
from replication.storage import StorageLayout, read_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="instance config XML file(s)")
    parser.add_argument("--format", choices=("text", "json"), default="text")


def collect(cfg: config.InstanceConfig, *, now: float | None = None) -> dict:
    """One instance's status from its control files (works whether or not it is running)."""
    now = now or time.time()
    layout = StorageLayout.of(cfg.storage)
    beat = read_json(layout.heartbeat_json) or {}
    alive = bool(beat.get("running")) and now - float(beat.get("time", 0)) < HEARTBEAT_STALE_S
    links = beat.get("links") or {}
    for dest in cfg.destinations:
        if dest.name not in links:
            links[dest.name] = read_json(layout.link_file(dest.name)) or {"state": "never started"}
        if not alive:
            links[dest.name] = dict(links[dest.name], state="instance down")
    return {
        "instance": cfg.name,
        "alive": alive,
        "heartbeat_age_s": round(now - float(beat["time"]), 1) if beat.get("time") else None,
        "max_seq": beat.get("max_seq", 0),
        "durable_seq": beat.get("durable_seq", 0),
        "error": beat.get("error"),
        "links": links,
    }


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
            if link.get("state") == "validation failed" and link.get("detail"):
                print(f"{'':<14}   {link['detail']}")
    return 0
