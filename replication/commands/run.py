"""``replication run CONFIG...``: run one or several instances in one Spark application."""

from __future__ import annotations

import argparse
import logging

from replication import config
from replication.connectors.spark.trigger import checked_trigger


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="instance config XML file(s)")
    parser.add_argument(
        "--trigger", default="0 seconds", type=checked_trigger,
        help="micro-batch trigger interval, e.g. '100 milliseconds' (default: as fast as possible)"
    )
    parser.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")


def run(args: argparse.Namespace) -> int:
    # the engine (Spark, Kafka clients) loads only when this command runs: `replication --help` stays fast
    from replication.runner import run_until_stopped, start_instances, stop_on_sigterm

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("botocore", "boto3", "urllib3", "s3transfer"):  # their DEBUG lines print request headers,
        logging.getLogger(chatty).setLevel(max(logging.INFO, logging.getLogger().level))  # session tokens too
    configs = [config.load(path) for path in args.configs]  # all configs checked before Spark starts
    stop = stop_on_sigterm()  # from now on: a SIGTERM during start-up stops the instances once started
    instances = start_instances(configs, trigger_interval=args.trigger, stop=stop)
    print("running " + ", ".join(i.name for i in instances) + " (Ctrl-C to stop)", flush=True)
    run_until_stopped(instances, stop=stop)
    return 0
