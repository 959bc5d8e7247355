"""The ``replication`` command line: one subcommand per module in :mod:`replication.commands`.

Subcommand modules are imported only when chosen, so ``replication validate``
never pays for starting Spark.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from replication.errors import ConfigError, InputError, ReplicationError, StorageAccessError

#: subcommand -> (module under replication.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "run one or several instances in one Spark application"),
    "demo": ("demo", "run the local demo: embedded broker, instances from conf/, a publisher"),
    "publish": ("publish", "publish messages to an instance (HA publisher with a publish store)"),
    "status": ("status", "show each instance's links: address, state, sent/acked positions, lag (--check: monitor)"),
    "sow": ("sow", "print the current records of a SOW topic (exact, without Spark)"),
    "validate": ("validate", "check every replication link among the given configs"),
    "trace": ("trace", "show where a message published at an instance goes, and why not elsewhere"),
    "topology": ("topology", "draw the fabric as SVG, PNG or Mermaid"),
    "verify": ("verify", "check that each link's destination holds what it acknowledged, and groups agree"),
    "bootstrap": ("bootstrap", "copy another instance's messages into an empty instance, then exit"),
    "backfill": ("backfill", "publish the rows of files (parquet, jsonl, csv, delta) at an instance"),
    "replay": ("replay", "print a txlog's messages from a bookmark, optionally following new ones"),
    "queue": ("queue", "show a queue's depth, leases and acknowledgements, per consumer"),
    "downgrade": ("downgrade", "make a sync destination async until `replication upgrade` (admin)"),
    "upgrade": ("downgrade", "end an operator's downgrade: the destination is sync again (admin)"),
}


#: Query commands: they answer from deltalake and Arrow alone, and a user waits for their first line.
QUERY_COMMANDS = frozenset({"sow", "replay", "status", "queue"})


class _WithoutPandas:
    """An import hook under which pandas is not installed.

    The first time pyarrow turns a Python value into Arrow it imports pandas
    (~0.3 s, a sixth of a query's time) only to ask whether the value is a
    pandas object. A query command never hands pyarrow one, so its process
    runs as if pandas were absent, and pyarrow skips the import.
    """

    def find_spec(self, name: str, path=None, target=None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"{name} is not used by replication's query commands", name=name)


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr (what is wrong, where help is), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="replication", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or only == name:
            _module(module_name).add_arguments(p)
    return parser


def _module(module_name: str):
    return importlib.import_module(f"replication.commands.{module_name}")


def main(argv: list[str] | None = None) -> int:
    """The ``replication`` command (``argv`` None: this process's arguments; the process is the command's own,
    so a query command may hide pandas from it)."""
    own_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    if own_process and chosen in QUERY_COMMANDS and "pandas" not in sys.modules:
        sys.meta_path.insert(0, _WithoutPandas())
    parser = build_parser(only=chosen if chosen in COMMANDS else None)
    args = parser.parse_args(argv)
    try:
        return int(_module(COMMANDS[args.command][0]).run(args) or 0)
    except (ConfigError, InputError, StorageAccessError) as exc:  # the user's input: what to change, no traceback
        print(f"replication {args.command}: {exc}", file=sys.stderr)
        return 2
    except ReplicationError as exc:
        print(f"replication {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
