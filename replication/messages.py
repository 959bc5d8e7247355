"""Message identity, bookmarks, and the checks a message must pass to be accepted (pure Python).

The publish wire format is DESIGN §7: a Kafka record whose headers name the
client (``amps-client``), its sequence number (``amps-seq``), and optionally
the AMPS topic, command and message type. A message's bookmark is
``<publisher_id>|<publisher_seq>|``; a replay names where to start with the
bookmark forms of :func:`parse_bookmarks`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache

import orjson

from replication.errors import InputError

HEADER_CLIENT = "amps-client"
HEADER_SEQ = "amps-seq"
HEADER_TOPIC = "amps-topic"
HEADER_COMMAND = "amps-command"
HEADER_TYPE = "amps-type"
HEADER_SOW_KEY = "amps-sow-key"
"""The record's SOW key, for a SOW topic defined with no ``<Key>``."""
HEADER_SOW_KEYS = "amps-sow-keys"
"""sow_delete by keys: comma-separated SOW keys."""
HEADER_FILTER = "amps-filter"
"""sow_delete by filter: an AMPS content filter (``1=1``: every record of the topic)."""
HEADER_SESSION = "amps-session"
"""The publisher's session (one per publisher object): two sessions of one client name at once are a clash."""

#: The inbox ``link`` of rows a backfill wrote: publishes of the instance itself, not replicated rows
#: (no instance can have this name: ``#`` is not allowed in names).
BACKFILL_LINK = "#backfill"

#: Commands stored in the txlog. ``logon`` is answered, never stored.
STORED_COMMANDS = ("publish", "delta_publish", "sow_delete")
LOGON = "logon"

MAX_MESSAGE_BYTES = 8 * 1024 * 1024

#: Message types whose bodies have fields (``/a/b`` in JSON, ``/55`` a FIX tag, ``/Name`` an NVFIX
#: name): content filters, SOW keys and delta_publish merges read them.
FIELD_TYPES: tuple[str, ...] = ("json", "fix", "nvfix")
#: Message types whose bodies are ``tag=value`` fields separated by SOH (\x01).
TAG_VALUE_TYPES: tuple[str, ...] = ("fix", "nvfix")
FIELD_SEPARATOR = b"\x01"


@lru_cache(maxsize=65536)
def publisher_id(client: str) -> int:
    """Stable unsigned 64-bit id of a client name (blake2b; never Python ``hash()``)."""
    return int.from_bytes(hashlib.blake2b(client.encode(), digest_size=8).digest(), "big")


def bookmark(client: str, publisher_seq: int) -> str:
    """AMPS-style bookmark ``<publisher_id>|<publisher_seq>|``."""
    return f"{publisher_id(client)}|{publisher_seq}|"


# -- bookmarks as a replay names them ---------------------------------------------


@dataclass(frozen=True)
class Epoch:
    """``0``: the beginning of the transaction log."""


@dataclass(frozen=True)
class Now:
    """``0|1|``: the end of the transaction log when the replay starts (only later messages)."""


@dataclass(frozen=True)
class MessageBookmark:
    """One message's bookmark, as stored in the txlog's ``bookmark`` column."""

    publisher_id: int
    publisher_seq: int

    @property
    def text(self) -> str:
        """The form the txlog stores (no leading zeros)."""
        return f"{self.publisher_id}|{self.publisher_seq}|"


@dataclass(frozen=True)
class PersistedAt:
    """``YYYYMMDDThhmmss[.ffffff][Z]``: the first message persisted at or after this time (UTC)."""

    time: datetime

    @property
    def micros(self) -> int:
        """Microseconds since the epoch, as the txlog's timestamps are stored."""
        delta = self.time - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


#: One point of a bookmark list.
BookmarkPoint = Epoch | Now | MessageBookmark | PersistedAt

#: The accepted forms, as every bookmark error lists them.
BOOKMARK_FORMS = (
    "0 (EPOCH: the beginning of the txlog), 0|1| (NOW: only messages committed from now on), "
    "<publisher_id>|<publisher_seq>| (a bookmark from the txlog's bookmark column: the messages after it), "
    "YYYYMMDDThhmmss[.ffffff][Z] (a UTC time: messages persisted at or after it, e.g. 20261123T093000Z), "
    "or a comma-separated list of these"
)

_STORED = re.compile(r"(\d+)\|(\d+)\|")
_TIME = re.compile(r"(\d{8}T\d{6})(?:\.(\d{1,6}))?Z?")


def parse_bookmarks(text: str) -> tuple[BookmarkPoint, ...]:
    """The points of a bookmark or a comma-separated list of them (AMPS's forms; see :data:`BOOKMARK_FORMS`).

    Raises :class:`~replication.errors.InputError` naming the part that is not
    a bookmark and the accepted forms.

    Example:
        >>> parse_bookmarks("0")
        (Epoch(),)
        >>> parse_bookmarks("15|3|,20261123T093000Z")[0]
        MessageBookmark(publisher_id=15, publisher_seq=3)
    """
    parts = [part.strip() for part in str(text).split(",")]
    if not any(parts):
        raise InputError(f"empty bookmark; write one of: {BOOKMARK_FORMS}")
    return tuple(_parse_point(part, text) for part in parts)


def _parse_point(part: str, whole: str) -> BookmarkPoint:
    if part == "0":
        return Epoch()
    if part == "0|1|":
        return Now()
    stored = _STORED.fullmatch(part)
    if stored:
        return MessageBookmark(int(stored.group(1)), int(stored.group(2)))
    when = _TIME.fullmatch(part)
    if when:
        try:
            moment = datetime.strptime(when.group(1), "%Y%m%dT%H%M%S")
        except ValueError:
            moment = None  # e.g. month 13: reported below like any malformed part
        if moment is not None:
            micros = int((when.group(2) or "0").ljust(6, "0"))
            return PersistedAt(moment.replace(microsecond=micros, tzinfo=timezone.utc))
    where = f" in {whole!r}" if part != whole else ""
    raise InputError(f"{part!r}{where} is not a bookmark; write one of: {BOOKMARK_FORMS}")


def body_error(message_type: str, data: bytes) -> str | None:
    """Why ``data`` does not parse as ``message_type``, or None when it does."""
    if message_type == "json":
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            return f"body is not valid JSON ({exc})"
        return None
    if message_type in ("fix", "nvfix"):
        return _tag_value_error(message_type, data)
    if message_type == "xml":
        from lxml import etree

        try:
            etree.fromstring(data, etree.XMLParser(resolve_entities=False, no_network=True))
        except etree.XMLSyntaxError as exc:
            return f"body is not well-formed XML ({exc})"
        return None
    return None  # binary: any bytes


def body_errors(message_type: str, bodies: list[bytes | None]) -> dict[int, str]:
    """:func:`body_error` of many bodies of one type: position -> reason, for those that do not parse.

    JSON, the common case, takes one bare loop: two Python calls per body cost more than orjson itself.
    """
    if message_type != "json":
        return {k: why for k, body in enumerate(bodies) if (why := body_error(message_type, body or b""))}
    out = {}
    loads, error = orjson.loads, orjson.JSONDecodeError
    for k, body in enumerate(bodies):
        try:
            loads(body or b"")
        except error as exc:
            out[k] = f"body is not valid JSON ({exc})"
    return out


def tag_value_fields(data: bytes | str) -> list[tuple[str, str]]:
    """The ``(tag, value)`` fields of a FIX or NVFIX body, in order (empty fields skipped).

    A field without ``=`` gets the value ``""``; :func:`body_error` says whether a body is well-formed.
    """
    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray, memoryview)) else data
    out = []
    for field in text.split("\x01"):
        if field:
            tag, _, value = field.partition("=")
            out.append((tag, value))
    return out


def tag_value_body(fields: list[tuple[str, str]]) -> bytes:
    """A FIX or NVFIX body from its fields: each ``tag=value`` followed by SOH."""
    return "".join(f"{tag}={value}\x01" for tag, value in fields).encode()


def _tag_value_error(message_type: str, data: bytes) -> str | None:
    separator = b"\x01"
    fields = [f for f in data.split(separator) if f]
    if not fields:
        return f"body is empty; a {message_type} message needs tag=value fields separated by \\x01"
    for field in fields:
        tag, eq, _ = field.partition(b"=")
        if not eq or not tag:
            shown = field[:40].decode("utf-8", "replace")
            return f"body is not {message_type}: field {shown!r} is not tag=value (fields separated by \\x01)"
        if message_type == "fix" and not tag.isdigit():
            return f"body is not fix: tag {tag[:20].decode('utf-8', 'replace')!r} is not numeric"
    return None
