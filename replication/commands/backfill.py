"""``replication backfill CONFIG --input PATH... --client NAME``: rows of files as messages published at an instance.

Every input row becomes a message of client ``--client`` with the row's
position in the input as its sequence number (see :mod:`replication.backfill`),
so a run repeated, or re-run after a kill, stores nothing twice. Spark reads
the inputs in bounded chunks; a progress bar on stderr shows rows, rate and
time left. Rows the instance cannot take (topic not recorded, a body that is
not of its message type) go to ``rejected/`` with file and row; they are
listed on stderr and make the exit code 1, on a re-run too (the rejects of parts an
earlier run committed stand: their sequence numbers are taken). ``--wait``
returns once the instance has stored every row it was given, by this run or
an earlier one; a stopped instance is said at once (it stores them when it
starts).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from replication import backfill, config
from replication.commands.progress import ProgressBar
from replication.config.model import MESSAGE_TYPES
from replication.connectors.files import FORMATS, expand
from replication.destination.resync import heartbeat_fresh, stored_per_publisher
from replication.errors import ReplicationError
from replication.storage.layout import StorageLayout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="config XML of the instance to backfill")
    parser.add_argument("--input", nargs="+", required=True, metavar="PATH",
                        help="input files or directories, in order (a directory: its files sorted by name)")
    parser.add_argument("--format", dest="fmt", choices=FORMATS, required=True)
    parser.add_argument("--client", required=True, help="the publisher's client name the messages carry")
    topic = parser.add_mutually_exclusive_group(required=True)
    topic.add_argument("--topic", help="the AMPS topic of every message")
    topic.add_argument("--topic-column", help="the column holding each message's topic")
    parser.add_argument("--data-column",
                        help="the column holding each message's body (default: the whole row as a JSON object)")
    parser.add_argument("--type", dest="message_type", choices=MESSAGE_TYPES, default="json",
                        help="message type of the bodies (default json)")
    parser.add_argument("--wait", type=float, nargs="?", const=600.0, default=None, metavar="SECONDS",
                        help="then wait until the instance has stored every row (default at most 600 s)")


def run(args: argparse.Namespace) -> int:
    # Spark: the engine's imports load only when this command runs
    from replication.connectors.spark.session import session

    cfg = config.load(args.config)
    options = backfill.Options(args.client, args.fmt, args.topic, args.topic_column, args.data_column,
                               args.message_type)
    # what needs no Spark is said before it starts (and prints its banner): options that could store
    # nothing, a missing input
    backfill.check(cfg, options)
    expand(args.input, args.fmt)
    spark = session(f"replication backfill {cfg.name}", short_lived=True)
    with ProgressBar(f"backfill {cfg.name}", "rows") as bar:
        result = backfill.run(spark, cfg, args.input, options, progress=bar.update)
    for line in result.bad or []:
        print(f"rejected: {line}", file=sys.stderr)
    rejected = result.rejected + result.rejected_earlier
    if rejected > len(result.bad or []):
        print(f"rejected: ... {rejected - len(result.bad or []):,} more (see {cfg.storage}/rejected)",
              file=sys.stderr)
    if result.rejected_earlier:
        print(f"rejected: {result.rejected_earlier:,} of these rows were rejected by an earlier run of this backfill "
              "and stay so: their sequence numbers are taken. Fix their cause, then backfill those rows under a new "
              "--client", file=sys.stderr)
    earlier = f" ({result.rejected_earlier:,} rejected by an earlier run)" if result.rejected_earlier else ""
    print(f"{cfg.name}: backfilled {result.rows:,} rows as client {args.client} (sequences 1..{result.last_seq:,}): "
          f"{result.stored:,} written, {result.rejected:,} rejected{earlier}, in {result.parts:,} new commit(s)")
    if args.wait is not None and result.last_stored_seq:
        _wait_stored(cfg, args.client, result.last_stored_seq, args.wait)
    return 1 if rejected else 0


def _wait_stored(cfg: config.InstanceConfig, client: str, seq: int, timeout: float,
                 stream: TextIO | None = None) -> None:
    """Until the instance has stored the client's ``seq``; a stopped instance is said at once (it stores the
    rows when it starts), and an instance still stopped at the timeout is the error's reason."""
    layout = StorageLayout.of(cfg.storage)
    deadline = time.monotonic() + timeout
    stored = stored_per_publisher(layout).get(client, 0)
    said_stopped = False
    with ProgressBar(f"stored by {cfg.name}", "messages", start=stored, stream=stream) as bar:
        while True:
            stored = stored_per_publisher(layout).get(client, 0)
            bar.update(stored, seq)
            if stored >= seq:
                break
            running = heartbeat_fresh(layout)
            if time.monotonic() > deadline:
                why = ("it is not running (no fresh heartbeat in its storage); it stores the rest when it starts"
                       if not running else "it is running but has not caught up; see `replication status`")
                raise ReplicationError(f"{cfg.name} has stored client {client} through {stored:,} of {seq:,} after "
                                       f"{timeout:.0f}s: {why}")
            if not running and not said_stopped:
                bar.note(f"{cfg.name} is not running (no fresh heartbeat in {layout.heartbeat_json}): it stores the "
                         f"rows when it starts; waiting up to {timeout:.0f}s")
                said_stopped = True
            time.sleep(0.5)
    print(f"{cfg.name}: stored every backfilled row (client {client} through {seq:,})")
