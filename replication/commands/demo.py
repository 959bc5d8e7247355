"""``replication demo``: an embedded broker, the two-way sync pair of ``conf/``, and a publisher per instance.

Everything runs locally: the broker is a single-node Apache Kafka (KRaft) started from
``jvm/pom.xml``'s jars (``replication.connectors.kafka.broker``), its log directories in a temporary
folder removed when the demo ends; the instances' tables go under ``var/demo/<timestamp>/``, and one publisher
per instance publishes JSON orders at ``--rate`` messages per second. The
progress line shows each instance's local seq, its rate, and what is durable.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

DEFAULT_CONFIGS = ("amps-1.xml", "amps-2.xml")


def _repo_conf() -> Path:
    here = Path(__file__).resolve().parents[2] / "conf"
    return here if here.is_dir() else Path.cwd() / "conf"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--conf-dir", type=Path, default=None, help="directory of instance configs (default: conf/)")
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), help="config files in --conf-dir")
    parser.add_argument("--home", type=Path, default=None, help="where the demo's tables go (default: var/demo/<time>)")
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second per publisher (default 1000)")
    parser.add_argument("--messages", type=int, default=0,
                        help="stop once each publisher has this many messages persisted (default: run until Ctrl-C)")


def _publish_loop(pub, count: int, rate: float, stop: threading.Event) -> None:
    interval = 1.0 / rate if rate > 0 else 0.0
    next_at = time.monotonic()
    i = 0
    while not stop.is_set() and (count == 0 or i < count):
        if interval:
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0 and stop.wait(delay):
                break
        pub.publish(f"/orders/{i % 10}", json.dumps({"id": i, "qty": (i * 37) % 1000, "sym": "DEMO"}).encode())
        i += 1


def run(args: argparse.Namespace) -> int:
    # the engine (Spark, Kafka clients) loads only when this command runs: `replication --help` stays fast
    from replication import config
    from replication.client import Publisher
    from replication.connectors.kafka.broker import EmbeddedBroker
    from replication.runner import run_until_stopped, start_instances

    conf_dir = args.conf_dir or _repo_conf()
    home = (args.home or Path.cwd() / "var" / "demo" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    with EmbeddedBroker() as broker:
        os.environ["KAFKA_BOOTSTRAP"] = broker.bootstrap
        os.environ["REPLICATION_HOME"] = str(home)
        configs = [config.load(str(conf_dir / name)) for name in args.configs]
        print(f"demo: broker {broker.bootstrap}, tables under {home}", flush=True)
        instances = start_instances(configs)
        stop = threading.Event()
        publishers = []
        threads = []
        for cfg in configs:
            if not cfg.kafka_transports:
                continue
            pub = Publisher(f"demo-{cfg.name}", bootstrap=broker.bootstrap, topic=cfg.kafka_transports[0].topics[0],
                            instance=cfg.name, store_path=home / f"demo-{cfg.name}.store")
            publishers.append(pub)
            threads.append(threading.Thread(target=_publish_loop, args=(pub, args.messages, args.rate, stop),
                                            daemon=True))
        for t in threads:
            t.start()
        print("demo: publishing " + ", ".join(p.name for p in publishers) + " (Ctrl-C to stop)", flush=True)

        def all_persisted() -> bool:
            return bool(args.messages) and all(p.persisted_seq >= args.messages for p in publishers)

        try:
            run_until_stopped(instances, stop=stop, until=all_persisted)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=5)
            for pub in publishers:
                print(f"demo: {pub.name} persisted through {pub.persisted_seq}", flush=True)
                pub.close()
    return 0
