"""The value model the evaluators and compilers share: each operand as (kind, text, number), compared AMPS's way."""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple, cast

from replication.expressions.syntax import Literal
from replication.messages import TAG_VALUE_TYPES, tag_value_fields

# Every operand evaluates to (kind, text, number):
#   kind "z": NULL (missing, JSON null, empty string)   "o": object or array
#   kind "s": string (JSON booleans too)                 "n": number
# text is the string form (numbers as Spark prints them); number is the numeric
# value of a number, or of a string that looks like one (else None).

_NUMERIC = r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$"
_NUMERIC_RE = re.compile(_NUMERIC)


class _Value(NamedTuple):
    kind: str
    text: str | None = None
    number: float | None = None


_NULL = _Value("z")


def _string_value(s: str) -> _Value:
    if s == "":
        return _NULL
    return _Value("s", s, float(s) if _NUMERIC_RE.match(s) else None)


def _literal_value(lit: Literal) -> _Value:
    if isinstance(lit.value, str):
        return _string_value(lit.value)
    return _Value("n", _java_double(lit.value), float(lit.value))


class _Num:
    """A JSON number kept with its source text, so its string form matches Spark's."""

    __slots__ = ("token",)

    def __init__(self, token: str):
        self.token = token


def _loads(data: Any, message_type: str = "json") -> Any:
    """The body as the evaluator reads it: JSON as parsed, FIX/NVFIX as ``{tag: value}``."""
    if message_type in TAG_VALUE_TYPES:
        if isinstance(data, dict):
            return data
        doc: dict[str, str] = {}
        for tag, value in tag_value_fields(data or b""):
            doc.setdefault(tag, value)  # a repeated tag: the first occurrence counts
        return doc
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data).decode("utf-8", errors="replace")
    if not isinstance(data, str):
        data = json.dumps(data)
    try:
        return json.loads(data, parse_float=_Num, parse_int=_Num)
    except ValueError:
        return None


def _number_text(token: str) -> tuple[str, float]:
    """(text, value) of a JSON number as Spark's variant prints it."""
    value = float(token)
    if "e" not in token.lower():
        try:
            dec = Decimal(token)
        except InvalidOperation:  # pragma: no cover - the JSON parser only hands numbers
            return _java_double(value), value
        digits = len(dec.as_tuple().digits)
        if digits <= 38:
            if dec == dec.to_integral_value() and "." not in token:
                return str(int(dec)), value
            text = format(dec.normalize(), "f")
            return ("0" if text in ("-0", "0") else text), value
    return _java_double(value), value


def _java_double(value: float) -> str:
    """``Double.toString`` of Java (what Spark prints for a double)."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if str(value).startswith("-") else "0.0"
    if 1e-3 <= abs(value) < 1e7:
        text = format(Decimal(repr(value)), "f")
        return text if "." in text else text + ".0"
    sign, digits, exp = Decimal(repr(value)).as_tuple()
    mantissa = "".join(map(str, digits)).rstrip("0") or "0"
    exponent = cast(int, exp) + len(digits) - 1  # finite here: an int, never the "n"/"N"/"F" of NaN and infinity
    return ("-" if sign else "") + f"{mantissa[0]}.{mantissa[1:] or '0'}E{exponent}"


def _field_value(doc: Any, path: tuple[str, ...]) -> _Value:
    node = doc
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return _NULL
        node = node[part]
    if node is None:
        return _NULL
    if isinstance(node, bool):
        return _Value("s", "true" if node else "false", None)
    if isinstance(node, _Num):
        text, value = _number_text(node.token)
        return _Value("n", text, value)
    if isinstance(node, str):
        return _string_value(node)
    return _Value("o")


def _compare(a: _Value, b: _Value, op: str) -> bool | None:
    """``a op b`` in three-valued logic: None (NULL) when a side is NULL or an object."""
    if a.kind in ("z", "o") or b.kind in ("z", "o"):
        return None
    x: Any  # both texts (a kind "s" value always has one) or both numbers
    y: Any
    if a.kind == "s" and b.kind == "s":
        x, y = a.text, b.text
    elif a.number is not None and b.number is not None:
        x, y = a.number, b.number
    elif a.kind == "s":  # a string that is not a number is greater than any number
        return op in (">", ">=", "!=")
    else:
        return op in ("<", "<=", "!=")
    return {
        "=": x == y,
        "!=": x != y,
        "<": x < y,
        "<=": x <= y,
        ">": x > y,
        ">=": x >= y,
    }[op]

