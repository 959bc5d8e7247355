"""Options of the project's Python Spark sources, parsed from Spark's ``.option(...)`` strings."""

from __future__ import annotations

from collections.abc import Mapping

from replication.errors import ConfigError


def int_option(opts: Mapping[str, str], name: str, fmt: str, *, minimum: int, example: int) -> int | None:
    """Option ``name`` (looked up lower-cased) as an int >= ``minimum``; None when absent."""
    raw = opts.get(name.lower())
    if raw in (None, ""):
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(
            f"{fmt}: {name} must be {kind}, got {raw!r}; e.g. .option('{name}', {example}), or leave it out"
        )
    return value


def bool_option(opts: Mapping[str, str], name: str, fmt: str) -> bool:
    """Option ``name`` (looked up lower-cased) as ``true``/``false`` (absent: false)."""
    raw = str(opts.get(name.lower(), "false")).strip().lower()
    if raw not in ("true", "false"):
        raise ConfigError(f"{fmt}: {name} must be true or false, got {raw!r}; e.g. .option('{name}', 'true')")
    return raw == "true"
