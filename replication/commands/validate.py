"""``replication validate CONFIG...``: run the replication validation checks on every link among the configs.

Each address of each destination is a possible link (a failover list gives
several). A link whose downstream is among the given configs is checked with
:func:`replication.validation.validate_link`; one whose address matches no
given config is listed as not checked. Exit code: 0 when every checked link
is clean (``--strict``: and every link could be checked), 1 otherwise, 2 for
a config that does not parse.
"""

from __future__ import annotations

import argparse
import json
import sys

from replication.config.fabric import Fabric, Link
from replication.validation import Finding, validate_link


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="instance config files (XML)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="report format (default: text)")
    parser.add_argument(
        "--strict", action="store_true", help="also fail when a link leads to an instance not among the configs"
    )


def check(fabric: Fabric) -> list[tuple[Link, list[Finding]]]:
    """Every link of the fabric with its findings (``[]`` when clean; links to unknown instances too)."""
    out: list[tuple[Link, list[Finding]]] = []
    for link in fabric.all_links():
        if link.downstream is None:
            out.append((link, []))
            continue
        out.append((link, validate_link(fabric[link.upstream], link.destination, fabric[link.downstream])))
    return out


def run(args: argparse.Namespace) -> int:
    fabric = Fabric.load(args.configs)
    results = check(fabric)
    findings = [f for _link, fs in results for f in fs]
    unknown = [link for link, _fs in results if link.downstream is None]
    ok = not findings and not (args.strict and unknown)
    if args.format == "json":
        json.dump(_as_json(fabric, results, ok), sys.stdout, indent=2)
        print()
    else:
        _print_text(fabric, results)
    return 0 if ok else 1


def _status(link: Link, findings: list[Finding]) -> str:
    if link.downstream is None:
        return "not checked"
    return "failed" if findings else "ok"


def _as_json(fabric: Fabric, results, ok: bool) -> dict:
    return {
        "ok": ok,
        "instances": [{"name": c.name, "group": c.group, "file": fabric.files.get(c.name, "")} for c in fabric],
        "links": [
            {
                "upstream": link.upstream,
                "destination": link.destination.name,
                "address": link.address,
                "priority": link.priority,
                "downstream": link.downstream,
                "status": _status(link, fs),
                "findings": [f.to_dict() for f in fs],
            }
            for link, fs in results
        ],
        "findings": [f.to_dict() for _link, fs in results for f in fs],
    }


def _print_text(fabric: Fabric, results) -> None:
    checked = [(link, fs) for link, fs in results if link.downstream is not None]
    failed = [(link, fs) for link, fs in checked if fs]
    unknown = [link for link, _fs in results if link.downstream is None]
    for link, fs in checked:
        where = f" (failover {link.priority})" if link.priority > 1 else ""
        guessed = (f"  [address {link.address} matches no config; taken as {link.downstream} by name]"
                   if link.by_name else "")
        print(f"{'FAIL' if fs else 'ok  '}  {link.label}{where}{guessed}")
        for f in fs:
            print("      " + str(f).replace("\n", "\n      "))
    for link in unknown:
        print(f"?     {link.upstream} -> {link.address or '(no address)'} (destination {link.destination.name}): "
              "no given config has this address; not checked (add its config to check it)")
    n_find = sum(len(fs) for _l, fs in failed)
    print()
    print(
        f"{len(fabric)} instances, {len(checked)} links checked: "
        + (f"{len(failed)} failed with {n_find} finding{'s' if n_find != 1 else ''}" if failed else "all clean")
        + (f"; {len(unknown)} not checked (destination not among the configs)" if unknown else "")
    )
