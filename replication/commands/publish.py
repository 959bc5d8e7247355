"""``replication publish``: publish messages through the HA publisher (publish store, logon, persisted acks).

Bodies come from ``--count N`` generated JSON messages or from standard input,
one message per line. Without ``--no-wait`` it returns once every message is
persisted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from replication import config
from replication.config.security import check_security
from replication.connectors.kafka.security import PLAINTEXT, KafkaSecurity


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("where to publish (a config, or all three of bootstrap/topic/instance)")
    target.add_argument("--config", help="instance config XML: take bootstrap, topic and instance name from it")
    target.add_argument("--bootstrap", help="Kafka bootstrap servers host:port[,host:port]")
    target.add_argument("--kafka-topic", help="the instance's publish topic")
    target.add_argument("--instance", help="instance name (persisted acks come on <instance>.acks)")
    parser.add_argument("--client", required=True, help="client name, unique per publisher across the fabric")
    parser.add_argument("--store", help="publish store file (default: <client>.store in the working directory)")
    parser.add_argument("--topic", default="/demo", help="AMPS topic of the messages (default /demo)")
    parser.add_argument("--count", type=int, help="publish N generated JSON messages instead of reading stdin")
    parser.add_argument("--rate", type=float, default=0.0, help="messages per second (default: as fast as possible)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for persisted acks")
    parser.add_argument("--logon-timeout", type=float, default=60.0,
                        help="seconds to wait for the instance: its acks topic, then its answer to the logon")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for persisted acks")


def _target(args: argparse.Namespace) -> tuple[str, str, str, KafkaSecurity]:
    """Where to publish: the config's first Kafka transport (with its <Security>), or the arguments."""
    if args.config:
        cfg = config.load(args.config)
        if not cfg.kafka_transports:
            raise SystemExit(f"{args.config}: instance {cfg.name} has no kafka Transport to publish to")
        transport = cfg.kafka_transports[0]
        check_security(transport)
        return ",".join(transport.bootstrap_servers), transport.topics[0], cfg.name, transport.security
    if not (args.bootstrap and args.kafka_topic and args.instance):
        raise SystemExit("replication publish: give --config, or all of --bootstrap, --kafka-topic and --instance")
    return args.bootstrap, args.kafka_topic, args.instance, PLAINTEXT


def _bodies(args: argparse.Namespace):
    if args.count is not None:
        for i in range(args.count):
            yield json.dumps({"id": i, "client": args.client, "time": time.time()}).encode()
    else:
        for line in sys.stdin.buffer:
            line = line.rstrip(b"\n")
            if line:
                yield line


def run(args: argparse.Namespace) -> int:
    # the engine (Spark, Kafka clients) loads only when this command runs: `replication --help` stays fast
    from replication.client import Publisher

    bootstrap, kafka_topic, instance, security = _target(args)
    pub = Publisher(args.client, bootstrap=bootstrap, topic=kafka_topic, instance=instance,
                    store_path=args.store or f"{args.client}.store", security=security,
                    logon_timeout=args.logon_timeout)
    try:
        resent = pub.resent
        print(f"logged on to {instance} as {args.client}: persisted through {pub.last_logon_seq}; "
              f"re-sent {len(resent)} message(s)" + (f" ({resent[0]}..{resent[-1]})" if resent else ""), flush=True)
        interval = 1.0 / args.rate if args.rate > 0 else 0.0
        next_at = time.monotonic()
        count = 0
        for body in _bodies(args):
            if interval:
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            pub.publish(args.topic, body)
            count += 1
        refused = pub.flush(timeout=args.timeout) if not args.no_wait else []
        print(f"published {count} message(s); persisted through {pub.persisted_seq}", flush=True)
        for failed in refused:
            print(f"message {failed.seq} refused by {instance}: {failed.reason}", file=sys.stderr, flush=True)
    finally:
        pub.close()
    return 1 if refused else 0
