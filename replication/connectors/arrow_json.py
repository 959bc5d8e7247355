"""JSON text built column-wise from Arrow arrays: values' bytes in place, members, whole objects.

For output of many rows at once (the query commands' JSON lines, a backfill's message bodies): a
string column is read where it lies in memory and joined into objects by Arrow, with no Python value
per row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc


def value_offsets(array: pa.Array) -> np.ndarray:
    """Where each value of a binary or string array (large ones too) starts in its data buffer, and where the
    last one ends: ``len(array) + 1`` positions, read in place."""
    kind = np.int64 if pa.types.is_large_binary(array.type) or pa.types.is_large_string(array.type) else np.int32
    width = np.dtype(kind).itemsize
    return np.frombuffer(array.buffers()[1], dtype=kind, count=len(array) + 1, offset=array.offset * width)


def value_bytes(array: pa.Array) -> pa.Buffer:
    """The values of a binary or string array (large ones too) one after another, where they lie (no copy)."""
    offsets = value_offsets(array)
    return array.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def needs_json_escape(values: pa.Array | pa.ChunkedArray) -> bool:
    """Whether a string array holds a character a JSON string cannot hold as it is (``"``, ``\\``, a control
    character), read from its bytes in place (a regex per value costs ~3x)."""
    for chunk in values.chunks if isinstance(values, pa.ChunkedArray) else [values]:
        if not len(chunk) or chunk.buffers()[2] is None:
            continue
        text = np.frombuffer(value_bytes(chunk), dtype=np.uint8)
        if (text < 0x20).any() or (text == 0x22).any() or (text == 0x5C).any():
            return True
    return False


def json_member(values: pa.Array | pa.ChunkedArray) -> tuple[pa.Array | pa.ChunkedArray, bool] | None:
    """``values`` (integers, booleans or strings) as ``(values, quote)`` of a :func:`json_objects` member: the
    JSON text of each (``null`` for a null), or strings with no null and nothing to escape, to be quoted. None
    for another type, or a string that needs escaping (its caller takes a per-row path)."""
    kind = values.type
    if pa.types.is_integer(kind):
        return pc.fill_null(pc.cast(values, pa.string()), "null"), False
    if pa.types.is_boolean(kind):
        return pc.fill_null(pc.if_else(values, "true", "false"), "null"), False
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)) or needs_json_escape(values):
        return None
    text = values.cast(pa.string())
    if values.null_count == 0:
        return text, True
    return pc.fill_null(pc.binary_join_element_wise('"', text, '"', ""), "null"), False


def json_objects(members: Sequence[tuple[str, pa.Array | pa.ChunkedArray, bool]], end: str = "}") -> pa.Array:
    """One JSON object per row, its members in order (then ``end``): ``(name, values, quote)`` where ``values``
    is each row's JSON text, or with ``quote`` string values with no null and no character to escape (see
    :func:`needs_json_escape`), whose quotes go in the literal text between members (no join of their own)."""
    pieces: list = []
    text = ""  # literal text since the last member's values
    for position, (name, values, quote) in enumerate(members):
        text += ("{" if position == 0 else ",") + orjson.dumps(name).decode() + ":"
        pieces += [text + '"' if quote else text, values]
        text = '"' if quote else ""
    return pc.binary_join_element_wise(*pieces, text + end, "")
