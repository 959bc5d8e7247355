"""``replication bootstrap CONFIG [--from ADDRESS]``: copy another instance's messages into this one, then exit.

The same bootstrap an instance runs at start when its txlog is empty (see
:mod:`replication.bootstrap`), without starting the instance: the
``<Bootstrap>`` of the config decides topics, data types and the source list;
``--from`` names the source instead. A progress bar on stderr shows the
source rows read, rate and time left; the summary goes to stdout.
"""

from __future__ import annotations

import argparse
import sys

from replication import bootstrap, config
from replication.commands.progress import ProgressBar
from replication.config.values import parse_location
from replication.connectors.delta.tables import open_or_create
from replication.connectors.s3.access import S3Address
from replication.errors import ConfigError, InputError, StorageAccessError
from replication.storage.control import write_instance_config
from replication.storage.layout import StorageLayout
from replication.txlog.schema import TXLOG_SCHEMA


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="config XML of the instance to fill")
    parser.add_argument("--from", dest="source", metavar="ADDRESS",
                        help="the source instance's storage (default: the <Bootstrap> <InetAddr> list)")


def run(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)
    if cfg.bootstrap is None and args.source is None:
        raise ConfigError(f"{args.config}: instance {cfg.name} has no <Bootstrap>: give the source with "
                          "--from ADDRESS, or add <Bootstrap> to the config")
    addresses = None
    if args.source is not None:  # (a wrong --from is a bad argument: said before anything is written here)
        if not args.source.strip():
            raise InputError("--from is empty. Fix: give the source instance's storage directory, or leave --from "
                             "out to use the config's <Bootstrap>")
        try:
            s3 = S3Address.parse(args.source)
            addresses = (s3.uri if s3 is not None else parse_location(args.source, base_dir="."),)
        except StorageAccessError as exc:  # (an S3 address with no bucket: its own fix)
            raise InputError(f"--from {exc}") from None
        except ConfigError as exc:  # (a config's fix names its paths; --from is the shell's)
            what = getattr(exc, "what", str(exc))
            raise InputError(f"--from {what}. Fix: give the source instance's storage: a path, "
                             "file:///absolute/path or s3://bucket/prefix") from None
        try:
            bootstrap.choose_source(cfg, addresses, given_by="--from")
        except bootstrap.BootstrapError as exc:
            raise InputError(str(exc)) from None
    layout = StorageLayout.of(cfg.storage).check_reachable()
    layout.root.mkdir(parents=True, exist_ok=True)
    write_instance_config(cfg, layout.instance_json)  # what the source checks: do we bootstrap from it?
    open_or_create(layout.txlog, TXLOG_SCHEMA, name=f"{cfg.name} txlog")
    if cfg.bootstrap is not None and not bootstrap.needed(cfg, layout) or \
            cfg.bootstrap is None and bootstrap.txlog_rows(layout):
        print(f"{cfg.name}: nothing to do: its transaction log holds messages (an instance with messages never "
              "bootstraps)", file=sys.stderr)
        return 0
    with ProgressBar(f"bootstrap {cfg.name}", "source rows") as bar:
        result = bootstrap.run(cfg, layout, addresses=addresses, progress=bar.update, log_result=False)
    print(f"{cfg.name}: bootstrapped from {result.source}: {result.rows:,} txlog rows, {result.sow_records:,} SOW "
          f"records in {result.seconds:.1f} s")
    return 0
