"""Which SOW topic a message belongs to, and its SOW key.

A record is identified by its topic and its key: the values of the topic's
``<Key>`` fields, or, for a SOW topic defined with no ``<Key>``, the
``amps-sow-key`` header. The key as stored (the txlog's and the SOW table's
``sow_key`` column, and what ``amps-sow-keys`` and ``replication sow --key``
take) is the field values as text joined with ``|``; a ``\\``, ``|`` or ``,``
inside a value is escaped with ``\\``, so a comma-separated list of keys
splits back unambiguously. JSON strings are taken as they are, numbers as
written, booleans as ``true``/``false``; a missing, null or empty field, or an
object or array, is no key.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from replication.config.model import InstanceConfig, SowTopic
from replication.errors import SowRefusal
from replication.messages import TAG_VALUE_TYPES, tag_value_fields
from replication.routing import regex_matches

_ESCAPE = re.compile(r"([\\|,])")
_UNESCAPED_COMMA = re.compile(r"(?<!\\)((?:\\\\)*),")


class SowTopics:
    """The SOW topics of an instance: which ``<SOW><Topic>`` (by position) holds a topic of a message type."""

    def __init__(self, topics: tuple[SowTopic, ...]) -> None:
        self.topics = topics
        self._cache: dict[tuple[str, str], int] = {}

    @classmethod
    def of(cls, cfg: InstanceConfig) -> SowTopics:
        return cls(cfg.sow_topics)

    def __bool__(self) -> bool:
        return bool(self.topics)

    def index(self, topic: str, message_type: str) -> int:
        """Position of the first ``<SOW><Topic>`` matching ``topic`` and ``message_type``; -1 for none."""
        hit = self._cache.get((topic, message_type))
        if hit is None:
            hit = next((i for i, s in enumerate(self.topics)
                        if s.message_type == message_type and regex_matches(s.name, topic)), -1)
            if len(self._cache) < 100_000:
                self._cache[(topic, message_type)] = hit
        return hit

    def indexes(self, rows: pa.Table) -> np.ndarray:
        """:meth:`index` of each row (its ``topic`` and ``message_type`` columns), one lookup per distinct
        pair; -1 for a row on no SOW topic."""
        if not self.topics:
            return np.full(rows.num_rows, -1, dtype=np.int64)
        pairs = pc.dictionary_encode(pc.binary_join_element_wise(
            pc.fill_null(rows["topic"], ""), pc.fill_null(rows["message_type"], ""), "\x00")).combine_chunks()
        # a message type holds no NUL, so the last one splits the pair
        lookup = np.array([self.index(*p.rsplit("\x00", 1)) for p in pairs.dictionary.to_pylist()] or [-1],
                          dtype=np.int64)
        return lookup[pc.fill_null(pairs.indices, 0).to_numpy(zero_copy_only=False)]


def escape(value: str) -> str:
    if "\\" in value or "|" in value or "," in value:
        return _ESCAPE.sub(r"\\\1", value)
    return value


def split_keys(text: str) -> list[str]:
    """A comma-separated list of keys (as shown in ``sow_key``) -> the keys; empty items are dropped."""
    parts = _UNESCAPED_COMMA.sub(lambda m: m.group(1) + "\x00", text).split("\x00")
    return [p.strip() for p in parts if p.strip()]


def join_keys(keys: list[str]) -> str:
    return ",".join(keys)


def parse_body(message_type: str, data: bytes | None) -> Any:
    """The body as keys and merges read it: a JSON value, or a FIX/NVFIX field list. Raises
    :class:`~replication.errors.SowRefusal` for a body that is not of its message type."""
    if message_type in TAG_VALUE_TYPES:
        fields = tag_value_fields(data or b"")
        if not fields or any(not tag for tag, _ in fields):
            raise SowRefusal(f"body is not {message_type}: expected tag=value fields separated by \\x01")
        return fields
    try:
        return orjson.loads(data or b"")
    except orjson.JSONDecodeError as exc:
        raise SowRefusal(f"body is not valid JSON ({exc})") from None


def key_of(sow: SowTopic, doc: Any) -> str | None:
    """The key of a parsed body on a keyed SOW topic; None when a key field has no value."""
    values = []
    for path in sow.key_paths:
        value = _field_text(sow.message_type, doc, path)
        if value is None:
            return None
        values.append(escape(value))
    return "|".join(values)


def missing_key_fields(sow: SowTopic, doc: Any) -> list[str]:
    """The ``<Key>`` paths that have no value in a parsed body (for the rejection reason)."""
    return [key for key, path in zip(sow.keys, sow.key_paths, strict=True)
            if _field_text(sow.message_type, doc, path) is None]


def bucket_of(topic: str, key: str, buckets: int) -> int:
    """The SOW table partition of a record: a stable hash of topic and key (never Python ``hash()``)."""
    return zlib.crc32(f"{topic}\x00{key}".encode()) % buckets


def _field_text(message_type: str, doc: Any, path: tuple[str, ...]) -> str | None:
    if message_type in TAG_VALUE_TYPES:
        if len(path) != 1:
            return None
        value = next((v for tag, v in doc if tag == path[0]), None)
        return value or None
    node = doc
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return _json_text(node)


def value_text(node: Any) -> str | None:
    """A JSON field's value as a key (escaped, see the module docstring); None when it has none."""
    text = _json_text(node)
    return escape(text) if text is not None else None


def _json_text(node: Any) -> str | None:
    kind = type(node)
    if kind is str:
        return node or None
    if kind is int:
        return str(node)
    if kind is bool:
        return "true" if node else "false"
    if kind is float:
        return repr(node)  # 7.5 -> "7.5", 7.0 -> "7.0"
    return None  # missing, null, an object or an array
