"""Message identity and the checks a message must pass to be accepted (pure Python).

The publish wire format is DESIGN §7: a Kafka record whose headers name the
client (``amps-client``), its sequence number (``amps-seq``), and optionally
the AMPS topic, command and message type.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

HEADER_CLIENT = "amps-client"
HEADER_SEQ = "amps-seq"
HEADER_TOPIC = "amps-topic"
HEADER_COMMAND = "amps-command"
HEADER_TYPE = "amps-type"

#: Commands stored in the txlog. ``logon`` is answered, never stored.
STORED_COMMANDS = ("publish", "delta_publish", "sow_delete")
LOGON = "logon"

MAX_MESSAGE_BYTES = 8 * 1024 * 1024


@lru_cache(maxsize=65536)
def publisher_id(client: str) -> int:
    """Stable unsigned 64-bit id of a client name (blake2b; never Python ``hash()``)."""
    return int.from_bytes(hashlib.blake2b(client.encode(), digest_size=8).digest(), "big")


def bookmark(client: str, publisher_seq: int) -> str:
    """AMPS-style bookmark ``<publisher_id>|<publisher_seq>|``."""
    return f"{publisher_id(client)}|{publisher_seq}|"


def body_error(message_type: str, data: bytes) -> str | None:
    """Why ``data`` does not parse as ``message_type``, or None when it does."""
    if message_type == "json":
        try:
            json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
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
