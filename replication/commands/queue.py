"""``replication queue CONFIG --topic QUEUE``: a queue's depth, leases and acknowledgements, per consumer.

While the instance runs, the answer is its heartbeat's (written every second): messages waiting, leased,
owned by another instance, delivered, redelivered and acknowledged, and each consumer's share. When the
instance is not running, the queue is folded from its txlog (deltalake and Arrow, no Spark): what is
still queued and what was acknowledged; nobody holds a lease then. Data on stdout, logs on stderr.
"""

from __future__ import annotations

import argparse
import json
import time

from replication import config
from replication.destination.resync import HEARTBEAT_STALE_S
from replication.errors import ConfigError
from replication.queues.book import COLUMNS, QueueBook
from replication.storage.control import Heartbeat
from replication.storage.layout import StorageLayout
from replication.txlog.reader import TxlogReader


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="the instance's config XML file")
    parser.add_argument("--topic", required=True, help="the queue topic, e.g. /work")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")


def run(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)
    names = [q.name for q in cfg.queues]
    if args.topic not in names:
        raise ConfigError(f"--topic {args.topic!r} is not a queue of {cfg.name} (its queues: "
                          f"{', '.join(names) or 'none'}): give a <SOW> queue's <Name>")
    layout = StorageLayout.of(cfg.storage)
    beat = Heartbeat.read(layout.heartbeat_json)
    now = time.time()
    if beat is not None and beat.fresh(HEARTBEAT_STALE_S, now=now) and args.topic in beat.queues:
        status, source = beat.queues[args.topic], "running"
    else:
        book = QueueBook(cfg)
        reader = TxlogReader(layout, cfg.name)
        through = reader.committed_seq() if reader.exists() else 0
        for rows in reader.read(0, through) if through else ():
            book.apply(rows.select(COLUMNS))
        status, source = book.queues[args.topic].status(now), "not running: folded from the txlog"
    status = {"instance": cfg.name, "state": source, **status}
    if args.format == "json":
        print(json.dumps(status, sort_keys=True))
        return 0
    print(f"{cfg.name} {args.topic} ({status['kind']}, {status['semantics']}; instance {source})")
    print(f"  depth {status['depth']}: {status['waiting']} waiting, {status['leased']} leased, "
          f"{status['owned_elsewhere']} owned by other instances")
    print(f"  delivered {status['delivered']}, redelivered {status['redelivered']}, "
          f"acknowledged {status['acknowledged']}")
    consumers = status["consumers"]
    if consumers:
        print(f"  {'consumer':<24} {'leased':>7} {'delivered':>10} {'acknowledged':>13} {'backlog':>8}  seen")
        for client, c in consumers.items():
            print(f"  {client:<24} {c['leased']:>7} {c['delivered']:>10} {c['acknowledged']:>13} "
                  f"{c['max_backlog']:>8}  {c['seen_seconds_ago']}s ago")
    else:
        print("  no consumer subscribed")
    return 0
