"""Check config files without starting anything: ``python -m replication.config_check FILE...``.

Prints ``FILE: OK (instance NAME)`` per good file and the error (file, line,
fix) per bad one on stderr; exits 0 if all are good, 2 otherwise.
"""

from __future__ import annotations

import sys

from replication.config import load
from replication.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    files = list(sys.argv[1:] if argv is None else argv)
    if not files or any(f in ("-h", "--help") for f in files):
        print("usage: python -m replication.config_check FILE...", file=sys.stderr)
        return 0 if files else 2
    status = 0
    for path in files:
        try:
            cfg = load(path)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            status = 2
        else:
            print(f"{path}: OK (instance {cfg.name})")
    return status


if __name__ == "__main__":
    sys.exit(main())
