"""``replication queue CONFIG --topic QUEUE``: a queue's depth, leases and acknowledgements, per consumer.

``replication queue CONFIG --enable-proxied-transfer --for INSTANCE`` (``--disable-...`` to end it): the
instance of CONFIG takes over the queue messages INSTANCE owns, as the spec's ``enable_proxied_transfer``
does while INSTANCE is down. Use it with care: a message INSTANCE delivered before it went down may be
delivered twice if INSTANCE comes back, or if another instance also stands in for it. Disable it when
INSTANCE is back, or once its messages are processed.

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
from replication.queues.book import QueueBook
from replication.storage.control import Heartbeat, ProxiedTransfer, update_json
from replication.storage.layout import StorageLayout
from replication.txlog.reader import TxlogReader


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="the instance's config XML file")
    parser.add_argument("--topic", help="the queue topic, e.g. /work")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    proxied = parser.add_mutually_exclusive_group()
    proxied.add_argument("--enable-proxied-transfer", action="store_true",
                         help="take over the queue messages of the instance named by --for while it is down")
    proxied.add_argument("--disable-proxied-transfer", action="store_true",
                         help="stop taking over the messages of the instance named by --for")
    parser.add_argument("--for", dest="owner", metavar="INSTANCE", help="the instance proxied transfer is for")


def run(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)
    if args.enable_proxied_transfer or args.disable_proxied_transfer:
        return _proxied_transfer(cfg, args.owner, enable=args.enable_proxied_transfer)
    if args.owner is not None:
        raise ConfigError("--for names the instance of --enable-proxied-transfer or --disable-proxied-transfer; "
                          "give one of them")
    if args.topic is None:
        raise ConfigError("give --topic QUEUE (the queue to show), or --enable-proxied-transfer --for INSTANCE")
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
        book.fold_txlog(TxlogReader(layout, cfg.name), now)
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
    transfers = status["transfers"]
    print(f"  transfers: requested {transfers['requested']}, granted {transfers['granted']}, received "
          f"{transfers['received']}; typical publish-to-ack {status['typical_ack_seconds']}s")
    if status["proxied_transfer_for"]:
        print(f"  proxied transfer for: {', '.join(status['proxied_transfer_for'])}")
    consumers = status["consumers"]
    if consumers:
        # (acknowledging: checked, its batch being stored; it no longer counts against the backlog)
        print(f"  {'consumer':<24} {'leased':>7} {'acknowledging':>14} {'delivered':>10} {'acknowledged':>13} "
              f"{'backlog':>8}  seen")
        for client, c in consumers.items():
            print(f"  {client:<24} {c['leased']:>7} {c['acknowledging']:>14} {c['delivered']:>10} "
                  f"{c['acknowledged']:>13} {c['max_backlog']:>8}  {c['seen_seconds_ago']}s ago")
    else:
        print("  no consumer subscribed")
    return 0


def _proxied_transfer(cfg, owner: str | None, *, enable: bool) -> int:
    """Write the instances ``cfg``'s instance stands in for; the running instance reads it within a second."""
    if not owner:
        raise ConfigError("--for INSTANCE: name the instance whose queue messages to take over (or stop taking)")
    if owner == cfg.name:
        raise ConfigError(f"--for {owner}: an instance cannot stand in for itself; name another instance")
    if not cfg.queues:
        raise ConfigError(f"{cfg.name} has no queue: proxied transfer is for the messages of a queue")
    layout = StorageLayout.of(cfg.storage)

    def changed(saved: dict | None) -> dict:  # (two operators at once: neither change is lost)
        instances = set(ProxiedTransfer.from_json(saved).instances) if saved else set()
        instances = instances | {owner} if enable else instances - {owner}
        return ProxiedTransfer(sorted(instances), time.time()).to_json()

    update_json(layout.proxied_transfer_json, changed)
    if enable:
        print(f"{cfg.name} now takes over the queue messages owned by {owner} (within a second if it runs). "
              f"Careful: a message {owner} delivered before it went down may be delivered twice if {owner} comes "
              "back, or if another instance also stands in for it; disable this once it is back "
              f"(replication queue {cfg.source.file or 'CONFIG'} --disable-proxied-transfer --for {owner})")
    else:
        print(f"{cfg.name} no longer takes over the queue messages owned by {owner}")
    return 0
