"""``replication downgrade|upgrade CONFIG --destination NAME``: an operator's downgrade of a sync destination.

AMPS's administrative console can downgrade a sync destination to async and
upgrade it back. Here the command writes (downgrade) or removes (upgrade)
``_control/downgraded/<destination>.json`` in the instance's storage; the
running instance applies it within a second (its heartbeat), a stopped one at
its next start, and ``replication status`` shows the link as ``async*
(manual)``. The automatic upgrade action never undoes it. Exit code 0, 2 for
a config that does not parse or a destination that is not a sync destination
of the instance.
"""

from __future__ import annotations

import argparse
import time

from replication import config
from replication.errors import InputError
from replication.storage.control import Heartbeat, ManualDowngrade
from replication.storage.layout import StorageLayout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="the instance's config file (XML)")
    parser.add_argument("--destination", required=True, metavar="NAME", help="the destination's <Name>")
    parser.add_argument("--reason", default="", help="why (kept in the control file, for the next operator)")


def run(args: argparse.Namespace) -> int:
    cfg = config.load(args.config)
    dest = next((d for d in cfg.destinations if d.name == args.destination), None)
    if dest is None:
        names = ", ".join(d.name for d in cfg.destinations) or "none"
        raise InputError(f"{cfg.name} has no destination {args.destination!r} (its destinations: {names})")
    if dest.sync_type != "sync":
        raise InputError(f"destination {dest.name} of {cfg.name} is async: only a sync destination is downgraded "
                         "or upgraded")
    layout = StorageLayout.of(cfg.storage)
    path = layout.manual_downgrade_file(dest.name)
    beat = Heartbeat.read(layout.heartbeat_json)
    when = "within a second" if beat is not None and beat.fresh(10) else "at its next start"
    if args.command == "downgrade":
        ManualDowngrade(dest.name, time.time(), args.reason).write(path)
        print(f"{cfg.name} -> {dest.name}: downgraded to async until `replication upgrade` ({cfg.name} applies "
              f"it {when})")
    else:
        existed = path.exists()
        path.unlink(missing_ok=True)
        print(f"{cfg.name} -> {dest.name}: " + (f"sync again ({cfg.name} applies it {when})" if existed
                                                   else "was not downgraded by an operator; nothing to do"))
    return 0
