"""Settings read from the environment that are a number of rows (docs/operations.md, "Settings read from the
environment"): read where they are used, a bad value named with its fix."""

from __future__ import annotations

import os

from replication.errors import ConfigError


def rows_from_environment(variable: str, default: int, *, minimum: int, example: str) -> int:
    """``variable``'s number of rows, or ``default`` when it is unset or empty; a value that is not a whole number
    of at least ``minimum`` raises :class:`ConfigError` naming the variable, the value and ``example``."""
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < minimum:
        raise ConfigError(f"{variable}={raw!r}: give a number of rows, e.g. {example}, or unset it")
    return int(raw)
