"""Spark's trigger interval syntax (``"0 seconds"``, ``"100 milliseconds"``, ``"interval 1 minute 30 seconds"``)
in seconds: the instance's ``--trigger`` paces its ingest query (Spark reads the text) and its replicators
(threads, which need the number). Checked when the command line is read, before anything starts."""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")
_UNITS = {
    "": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "us": 1e-6, "microsecond": 1e-6, "microseconds": 1e-6, "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hour": 3600.0, "hours": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "week": 604800.0, "weeks": 604800.0,
}


def trigger_seconds(text: str) -> float:
    """``text`` in seconds; ValueError, naming the value and the form expected, for anything else."""
    body = text.strip().lower().removeprefix("interval").strip()
    parts = _PART.findall(body)
    if not parts or _PART.sub("", body).strip() or any(unit not in _UNITS for _, unit in parts):
        raise ValueError(f"trigger interval {text!r}: expected numbers with units, e.g. '100 milliseconds' or "
                         "'1 minute 30 seconds'")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def checked_trigger(text: str) -> str:
    """``argparse`` type of ``--trigger``: the text as given, once it reads as an interval."""
    import argparse

    try:
        trigger_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
