"""Value parsers of the config: an element's text to a checked value, or a located error with its fix.

Each parser takes the element's text (already read by :meth:`Node.text`:
``${VAR}`` substituted, stripped, not empty) and ``at``, the element it came
from, which places the :class:`ConfigError` (file, line, element path) and
names the tag in the fix; :meth:`Node.read` calls one on an element. The schema
that decides which element takes which value is in :mod:`replication.config.parser`.

Storage locations (``<Storage>``, the ``<InetAddr>`` of replication transports,
destinations and bootstrap) may be ``file:///abs/path``, an absolute path or a
relative path; they come back as normalised absolute paths. A relative path is
resolved against the directory of the config file (not the working directory),
so a config means the same wherever the instance is started from. ``<Storage>``
also takes an S3 prefix (``s3://bucket/prefix``, :func:`storage_location`);
other remote URIs (``abfss://``, ``gs://``..., and ``s3://`` for replication
and bootstrap addresses) are refused as not supported yet: a location the
engine cannot use must stop the start, not a link later.
"""

from __future__ import annotations

import os
import re
from typing import cast
from urllib.parse import unquote, urlsplit

from replication.config.model import (
    FILTERABLE_TYPES,
    MANDATORY_CHECKS,
    MESSAGE_TYPES,
    SYNC_TYPES,
    VALIDATION_CHECKS,
    MessageType,
    SyncType,
)
from replication.config.xml_reader import Node, did_you_mean
from replication.errors import ConfigError
from replication.expressions import Filter, FilterSyntaxError

__all__ = [
    "NAME",
    "comma_list",
    "content_filter",
    "count",
    "enum",
    "exclusions",
    "interval",
    "kafka_servers",
    "kafka_topic",
    "location",
    "message_type",
    "name",
    "parse_interval",
    "parse_location",
    "positive_int",
    "regex",
    "sow_key",
    "sync_type",
]

# Instance names end up in file names (_control/acks/<name>.json) and in the Kafka
# topic "<name>.acks", so they must be legal Kafka topic names.
NAME = re.compile(r"[A-Za-z0-9._-]{1,200}\Z")
_KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}\Z")
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# AMPS configs address instances by host:port or a bare port; ours by storage root.
_NETWORK_ADDR = re.compile(r"(\d+|[\w.-]+:\d+)\Z")
# Recognised, to say "not supported yet" rather than "unknown scheme".
_REMOTE_SCHEMES = frozenset(
    {"s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "adl", "hdfs", "lakefs", "memory"}
)

# ---------------------------------------------------------------------------
# Intervals


_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
_INTERVAL = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*\Z")


def parse_interval(text: str) -> float:
    """Return an AMPS interval such as ``15s``, ``500ms``, ``5m``, ``1h``, ``2d`` in seconds.

    A bare number means seconds. Raises :class:`ValueError` naming the value and the units.

    >>> parse_interval("500ms"), parse_interval("5m"), parse_interval("30")
    (0.5, 300.0, 30.0)
    """
    m = _INTERVAL.match(text)
    if not m:
        raise ValueError(
            f"'{text}' is not an interval: write a number and a unit, e.g. 500ms, 15s, 5m, 1h, 2d"
        )
    unit = m.group(2) or "s"
    if unit not in _UNITS:
        hint = f" (did you mean '{unit.lower()}'?)" if unit.lower() in _UNITS else ""
        raise ValueError(
            f"unknown unit '{unit}' in interval '{text}'{hint}: units are {', '.join(_UNITS)}"
        )
    return float(m.group(1)) * _UNITS[unit]


def interval(value: str, at: Node, *, allow_zero: bool = False) -> float:
    """An interval in seconds, greater than 0 (or 0 too with ``allow_zero``)."""
    try:
        seconds = parse_interval(value)
    except ValueError as exc:
        at.fail(str(exc), f"write an interval such as <{at.tag}>15s</{at.tag}> (units: {', '.join(_UNITS)})")
    if seconds <= 0 and not allow_zero:
        at.fail(f"interval '{value}' must be greater than 0", f"write e.g. <{at.tag}>15s</{at.tag}>")
    return seconds


# ---------------------------------------------------------------------------
# Words, names, numbers, lists


def enum(value: str, at: Node, choices: tuple[str, ...], *, item: bool = False) -> str:
    """``value``, which must be one of ``choices``; ``item``: it is one item of the element's comma list."""
    if value in choices:
        return value
    guess, hint = did_you_mean(value, choices)
    valid = ", ".join(choices)
    what = f"'{value}' is not a valid {at.tag}; valid values are: {valid}"
    if guess:
        fix = f"replace '{value}' with '{guess}'" if item else f"write <{at.tag}>{guess}</{at.tag}>"
        at.fail(f"{what}{hint}", fix)
    at.fail(what, f"write one of {valid}, e.g. <{at.tag}>{choices[0]}</{at.tag}>")


def message_type(value: str, at: Node) -> MessageType:
    return cast(MessageType, enum(value, at, MESSAGE_TYPES))  # enum accepts only MESSAGE_TYPES


def sync_type(value: str, at: Node) -> SyncType:
    return cast(SyncType, enum(value, at, SYNC_TYPES))  # enum accepts only SYNC_TYPES


def regex(value: str, at: Node) -> str:
    """A topic pattern: ``value`` itself, once it compiles."""
    try:
        re.compile(value)
    except re.error as exc:
        at.fail(
            f"'{value}' is not a valid regular expression: {exc}",
            "correct the regex (Python re syntax); escape literal ( ) [ ] . * + ? with a backslash",
        )
    return value


def name(value: str, at: Node, what: str) -> str:
    """An instance or destination name; ``what`` says which, in the error."""
    if not NAME.match(value) or value in (".", ".."):
        at.fail(
            f"{what} '{value}' is not a valid name",
            "use only letters, digits, '.', '_' and '-' (the name is used in file names "
            "and in the Kafka topic '<name>.acks')",
        )
    return value


def kafka_topic(value: str, at: Node) -> str:
    if not _KAFKA_TOPIC.match(value) or value in (".", ".."):
        at.fail(
            f"'{value}' is not a legal Kafka topic name",
            "use only letters, digits, '.', '_' and '-'; an AMPS topic such as /orders/1 "
            "goes in the amps-topic header of each record, not here",
        )
    return value


def positive_int(value: str, at: Node) -> int:
    if not re.fullmatch(r"\d+", value) or int(value) <= 0:
        at.fail(
            f"'{value}' is not a positive integer",
            f"write a whole number greater than 0, e.g. <{at.tag}>100000</{at.tag}>",
        )
    return int(value)


def count(value: str, at: Node) -> int:
    """A whole number, 0 included."""
    if not value.isdigit():
        at.fail(f"'{value}' is not a whole number", f"write e.g. <{at.tag}>1</{at.tag}>")
    return int(value)


def comma_list(value: str, at: Node) -> list[str]:
    items = [item.strip() for item in value.split(",")]
    if any(not item for item in items):
        at.fail(f"'{value}' has an empty item", "separate items with single commas, e.g. sow,txlog")
    return items


def exclusions(value: str, at: Node) -> frozenset[str]:
    """``<ExcludeValidation>``: validation checks, comma-separated, none of them mandatory."""
    checks = comma_list(value, at)
    excludable = tuple(c for c in VALIDATION_CHECKS if c not in MANDATORY_CHECKS)
    for check in checks:
        if check in MANDATORY_CHECKS:
            at.fail(
                f"'{check}' cannot be excluded: queue and queue_underlying are mandatory validation checks",
                f"remove '{check}' from <ExcludeValidation>; a replicated queue must be a queue with the "
                "same underlying topic on both instances",
            )
        if check not in VALIDATION_CHECKS:
            guess, hint = did_you_mean(check, excludable)
            at.fail(
                f"'{check}' is not a validation check{hint} (checks that can be excluded: {', '.join(excludable)})",
                f"replace '{check}' with {repr(guess) if guess else 'one of them'}, comma-separated, "
                "e.g. <ExcludeValidation>replicate,cascade</ExcludeValidation>",
            )
    return frozenset(checks)


# ---------------------------------------------------------------------------
# Addresses


def storage_location(value: str, at: Node) -> str:
    """``<Storage>``: what :func:`location` takes, or an S3 prefix ``s3://bucket/prefix`` (``s3a://`` too),
    returned as ``s3://bucket/prefix``."""
    scheme_match = _URI.match(value)
    if scheme_match and scheme_match.group(1).lower() in ("s3", "s3a"):
        parts = urlsplit(value)
        prefix = parts.path.strip("/")
        if not parts.netloc or parts.query or parts.fragment or "//" in prefix:
            at.fail(f"'{value}' is not an S3 prefix", "write s3://BUCKET/PREFIX (a bucket, then the instance's "
                    "folder in it; no ? or #)")
        return f"s3://{parts.netloc}/{prefix}" if prefix else f"s3://{parts.netloc}"
    return location(value, at)


def location(value: str, at: Node) -> str:
    """A storage root: file URI, absolute or config-relative path (remote URIs: not supported yet)."""
    try:
        return parse_location(value, base_dir=at.ctx.base_dir)
    except _BadLocation as exc:
        at.fail(exc.what, exc.fix)


class _BadLocation(ConfigError):
    # Carries the problem and the fix apart: a command-line caller words its own fix.
    def __init__(self, what: str, fix: str) -> None:
        super().__init__(f"{what}. Fix: {fix}")
        self.what, self.fix = what, fix


def parse_location(value: str, *, base_dir: str) -> str:
    """A storage location as configs take it (``file:///abs/path`` or a path relative to ``base_dir``),
    normalised; a :class:`ConfigError` naming the problem and the fix otherwise (remote URIs: not
    supported yet)."""
    scheme_match = _URI.match(value)
    if scheme_match:
        scheme = scheme_match.group(1).lower()
        if scheme == "file":
            parts = urlsplit(value)
            if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
                raise _BadLocation(f"'{value}' is not a local file URI",
                                   "write file:///absolute/path (three slashes, no host, no ? or #)")
            return os.path.normpath(unquote(parts.path))
        if scheme in _REMOTE_SCHEMES:
            raise _BadLocation(
                f"'{value}': {scheme}:// locations are not supported yet (an instance's control files, "
                "its heartbeat, acknowledgements and link state, need a local or mounted filesystem)",
                "use file:///absolute/path, an absolute path, or a path relative to this config file "
                "(a mounted bucket works as a local path)",
            )
        _, hint = did_you_mean(scheme, tuple(sorted(_REMOTE_SCHEMES | {"file"})), shown="'{}://'")
        raise _BadLocation(
            f"'{value}' uses the unsupported scheme '{scheme}://'{hint}",
            "use file:///absolute/path, an absolute path, or a path relative to this config file",
        )
    if _NETWORK_ADDR.match(value):
        raise _BadLocation(f"'{value}' looks like an AMPS network address (host:port); instances are "
                           "addressed here by their storage root",
                           "write the instance's <Storage> location, e.g. file:///var/lib/replication/amps-2")
    path = value if os.path.isabs(value) else os.path.join(base_dir, value)
    return os.path.normpath(path)


def kafka_servers(value: str, at: Node) -> list[str]:
    """An ``<InetAddr>`` of a Kafka transport: ``host:port``, or several comma-separated."""
    servers = [s.strip() for s in value.split(",")]
    for server in servers:
        host, _, port = server.rpartition(":") if ":" in server else (server, "", "")
        ok = bool(host) and " " not in server and "://" not in server
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            ok = False
        if not ok:
            at.fail(
                f"'{server}' is not a Kafka bootstrap server",
                "write host:port, e.g. <InetAddr>localhost:9092</InetAddr> (one <InetAddr> per server)",
            )
    return servers


# ---------------------------------------------------------------------------
# Message content


def content_filter(value: str, at: Node, message_type: str) -> Filter:
    """The ``<Filter>``, parsed now: a filter that does not parse, or on a message type whose bodies
    have no fields to filter on, stops the start with the file and line."""
    if message_type not in FILTERABLE_TYPES:
        at.fail(
            f"a <Filter> on {message_type} messages cannot be applied: content filters read fields of "
            f"{', '.join(FILTERABLE_TYPES)} messages only",
            f"remove the <Filter>, or filter a topic whose <MessageType> is {' or '.join(FILTERABLE_TYPES)}",
        )
    try:
        return Filter(value)
    except FilterSyntaxError as exc:
        first, *caret = str(exc).splitlines() or [""]
        problem = re.sub(r"^invalid filter( at position \d+)?:\s*", "", first)
        error = at.error(
            f"invalid filter '{value}' at position {exc.position + 1}: {problem}",
            "correct the AMPS filter expression, e.g. <Filter>/qty &gt; 100 AND /side = 'buy'</Filter>",
        )
        # the expression module's picture of where the fault is
        raise ConfigError("\n".join([str(error), *caret]), file=error.file, line=error.line) from None


def sow_key(value: str, at: Node, message_type: str) -> str:
    """A ``<Key>`` field path, on a message type whose bodies have fields."""
    if message_type not in FILTERABLE_TYPES:
        at.fail(
            f"a <Key> on {message_type} messages cannot be read: SOW keys are fields of "
            f"{', '.join(FILTERABLE_TYPES)} messages",
            f"remove the <Key> elements: each {message_type} message then names its key in the amps-sow-key "
            "header; or keep a SOW topic of a message type with fields",
        )
    if not value.startswith("/") or len(value) < 2 or any(ch.isspace() for ch in value) or "//" in value:
        at.fail(f"'{value}' is not a SOW key path", "write a field path such as <Key>/id</Key> (nested: /order/id)")
    if message_type in ("fix", "nvfix") and value.count("/") > 1:
        at.fail(
            f"'{value}' is a nested path, but {message_type} fields are flat",
            "name the tag itself, e.g. <Key>/55</Key>" if message_type == "fix"
            else "name the field, e.g. <Key>/Symbol</Key>",
        )
    return value
