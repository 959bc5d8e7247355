"""How query commands (``replay``, ``sow``) show a stored message's body and times in JSON output."""

from __future__ import annotations

import base64

import orjson


def body_value(message_type: str, data: bytes | None) -> object:
    """A body as JSON output shows it: a json body parsed; other text as text; binary (or bytes that are not
    UTF-8) as base64 text."""
    if data is None:
        return None
    if message_type == "json":
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    if message_type != "binary":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return base64.b64encode(data).decode("ascii")


#: ``pyarrow.compute.strftime`` format of times in JSON output: ISO 8601, UTC, microseconds.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
