"""A content filter over many bodies at once: JSON parsed in bulk by Arrow, the value model in numpy.

A sow_delete by filter and ``replication sow --filter`` test every record of a
SOW topic. Per record (orjson, then the compiled closures) that costs ~3-7 us;
here the bodies are read in pieces (a SOW read's chunk per file, where it lies
in memory), Arrow's JSON reader parses only the fields the filter reads (in
C++, pieces side by side on every core), and the comparisons run on whole
columns: ~0.5 us a record.

The answer is the one :meth:`Filter.matches` gives for each body, the same
value model (see :mod:`replication.expressions.values`): NULL for a missing field,
JSON null and the empty string; a string that looks like a number compares
as one with numbers; a non-numeric string is greater than any number; booleans
are the strings ``true``/``false``. Arrow's reader is stricter than the
per-record path, which is what keeps this exact: it needs one type per field
in a piece. Whenever it cannot give the per-record answer (a field that is a
number in one body and a string in another of the same piece, an object or
array where the filter reads a value, a body that is not one JSON object on
one line, LIKE on a number, FIX and NVFIX bodies) :func:`matching` takes the
per-record path for the whole set.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from replication.connectors.arrow_json import value_bytes, value_offsets
from replication.expressions import Filter
from replication.expressions.syntax import (
    Between,
    BoolOp,
    Compare,
    Expr,
    Field,
    InList,
    IsNull,
    Like,
    Literal,
    Not,
    OperandVisitor,
    Visitor,
    fields,
)
from replication.expressions.values import _NUMERIC_RE, _literal_value, _string_value

#: Bodies parsed at a time (bounded memory; offsets stay 32-bit).
CHUNK = 1 << 18
#: Pieces of fewer bodies are joined before parsing (each parse has a fixed cost).
MIN_PIECE = 1 << 12
#: Bytes per block of Arrow's JSON reader: a piece parsed alone is cut into blocks read side by side
#: (8 MB blocks left a 20 MB piece mostly on one core: 1 MB parses it ~2.5x faster on two).
BLOCK_BYTES = 1 << 20
#: Bytes per block when pieces already parse side by side, one thread each (fewer blocks, less overhead).
PIECE_BLOCK_BYTES = 8 << 20
#: Bodies read to guess each field's type before the bulk parse.
SAMPLE = 64
#: Numeric strings as the per-record path sees them, for RE2: Python's ``\s`` on ASCII (RE2's lacks \v, \x1c-\x1f).
_ASCII_NUMERIC = _NUMERIC_RE.pattern.replace(r"\s", r"[ \t\n\r\f\v\x1c-\x1f]")


class _Fallback(Exception):
    """This set of bodies needs the per-record path."""


def matching(flt: Filter, bodies: pa.Array | pa.ChunkedArray, message_type: str = "json", *,
             valid_json: bool = False) -> np.ndarray:
    """A boolean mask: ``flt.matches(body, message_type)`` for every body, computed column-wise when it can be.
    ``valid_json``: each body is known to be one JSON document (a SOW record's body was parsed at ingest),
    which lets Arrow read bodies that are objects where they lie.

    Example:
        >>> bodies = pa.array([b'{"qty": 5}', b'{"qty": "12"}', b'{}'], pa.binary())
        >>> matching(Filter("/qty > 7"), bodies).tolist()
        [False, True, False]
    """
    mask = column_wise(flt, bodies, message_type, valid_json=valid_json)
    if mask is not None:
        return mask
    return np.fromiter((flt.matches(body, message_type) for body in bodies.to_pylist()), dtype=bool,
                       count=len(bodies))


def column_wise(flt: Filter, bodies: pa.Array | pa.ChunkedArray, message_type: str = "json", *,
                valid_json: bool = False) -> np.ndarray | None:
    """:func:`matching`'s column-wise answer, or None where these bodies need the per-record path."""
    if message_type != "json":
        return None
    pieces = list(_pieces(bodies))
    try:
        if len(pieces) <= 1:
            masks = [_json_mask(flt.expr, piece, valid_json, threads=True) for piece in pieces]
        else:  # Arrow's reader and numpy release the GIL: pieces parse side by side, one thread each
            with ThreadPoolExecutor(min(len(pieces), os.cpu_count() or 1)) as pool:
                masks = list(pool.map(lambda piece: _json_mask(flt.expr, piece, valid_json, threads=False), pieces))
    except _Fallback:
        return None
    return np.concatenate(masks or [np.zeros(0, dtype=bool)])


def _pieces(bodies: pa.Array | pa.ChunkedArray) -> Iterator[pa.Array]:
    """The bodies in pieces of at most :data:`CHUNK` rows: chunks as they are (one per file read; no copy of
    hundreds of MB), chunks under :data:`MIN_PIECE` rows joined, big ones cut."""
    group: list[pa.Array] = []
    rows = 0
    for chunk in bodies.chunks if isinstance(bodies, pa.ChunkedArray) else [bodies]:
        for start in range(0, len(chunk), CHUNK):
            piece = chunk.slice(start, CHUNK)
            if not group and len(piece) >= MIN_PIECE:
                yield piece
                continue
            group.append(piece)
            rows += len(piece)
            if rows >= MIN_PIECE:
                yield group[0] if len(group) == 1 else pa.concat_arrays(group)
                group, rows = [], 0
    if group:
        yield group[0] if len(group) == 1 else pa.concat_arrays(group)


# --------------------------------------------------------------------------- the columns a filter reads


class _Values(NamedTuple):
    """One operand over every row, in the value model: kind masks, texts of strings, numbers."""

    null: np.ndarray
    """kind "z": missing, JSON null, empty string."""
    string: np.ndarray
    """kind "s" (JSON strings and booleans)."""
    text: pa.Array | pa.Scalar
    """The text of each string (other rows: anything)."""
    number: np.ndarray
    """float64: a number's value, or a numeric string's; NaN where there is none."""
    numeric: np.ndarray
    """Where ``number`` holds a value."""
    is_number: np.ndarray
    """kind "n" (LIKE reads a number's text as Spark prints it: not here)."""


def _json_mask(expr: Expr, bodies: pa.Array, valid_json: bool, threads: bool) -> np.ndarray:
    paths = sorted(f.path for f in fields(expr))
    columns = _parse_columns(bodies, paths, valid_json, threads) if paths else {}
    known, value = _ColumnEvaluator(columns, len(bodies)).visit(expr)
    return known & value


def _parse_columns(bodies: pa.Array, paths: list[tuple[str, ...]], valid_json: bool,
                   threads: bool) -> dict[tuple[str, ...], _Values]:
    """The filter's fields of every body, parsed by Arrow with one type per field guessed from a sample."""
    schema = _schema(_sample_types(bodies, paths))
    # An empty or missing body is an object with no fields (as the per-record path sees it).
    empty = pc.fill_null(pc.equal(pc.binary_length(bodies), 0), True)
    bodies = bodies.cast(pa.binary())
    if pc.any(empty).as_py():
        bodies = pc.if_else(empty, pa.scalar(b"{}"), bodies)
    offsets = value_offsets(bodies)
    raw = np.frombuffer(bodies.buffers()[2], dtype=np.uint8)
    if valid_json and (raw[offsets[:-1]] == ord("{")).all() and (raw[offsets[1:] - 1] == ord("}")).all():
        # Whole JSON objects one after another parse as one row each: Arrow reads the bodies where they lie.
        buffer, body_schema = value_bytes(bodies), schema
    else:
        # Each body wrapped as {"v": body}: exactly one row per body, or the parse fails (two objects in
        # one body, a body of blanks, half a body cannot shift the rows).
        joined = pc.binary_join_element_wise(pa.scalar(b'{"v":'), bodies, pa.scalar(b"}\n"), pa.scalar(b""))
        buffer = value_bytes(joined)
        body_schema = pa.schema([pa.field("v", pa.struct(schema))])
    read = pj.ReadOptions(block_size=BLOCK_BYTES if threads else PIECE_BLOCK_BYTES, use_threads=threads)
    try:
        table = pj.read_json(
            pa.BufferReader(buffer), read_options=read,
            parse_options=pj.ParseOptions(explicit_schema=body_schema, unexpected_field_behavior="ignore",
                                          newlines_in_values=True))
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:  # a type that changes, a body that is not JSON
        raise _Fallback(str(exc)) from None
    if table.num_rows != len(bodies):
        raise _Fallback("a body is not one JSON object")
    fields_ = pa.StructArray.from_arrays(
        [table.column(i).combine_chunks() for i in range(table.num_columns)], names=table.column_names)
    if body_schema is not schema:
        fields_ = fields_.field(0)
    return {path: _values_of(_column(fields_, path)) for path in paths}


def _sample_types(bodies: pa.Array, paths: list[tuple[str, ...]]) -> dict[tuple[str, ...], pa.DataType]:
    """Each path's Arrow type from the first bodies that have a value there (string when none has)."""
    found: dict[tuple[str, ...], pa.DataType] = {}
    for body in bodies.slice(0, SAMPLE).to_pylist():
        try:
            doc = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            raise _Fallback("a body is not JSON") from None
        for path in paths:
            if path in found:
                continue
            node: Any = doc
            for part in path:
                node = node.get(part) if type(node) is dict else None
            if node is None:
                continue
            if type(node) is bool:
                found[path] = pa.bool_()
            elif type(node) in (int, float):
                found[path] = pa.float64()
            elif type(node) is str:
                found[path] = pa.string()
            else:
                raise _Fallback("the filter reads an object or array")
    return {path: found.get(path, pa.string()) for path in paths}


def _schema(types: dict[tuple[str, ...], pa.DataType]) -> pa.Schema:
    """Nested struct fields for ``/a/b`` paths; a path that is both a value and a parent needs the per-record path."""
    tree: dict[str, Any] = {}
    for path, type_ in types.items():
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise _Fallback("a field is read both as a value and as an object")
        if path[-1] in node:
            raise _Fallback("a field is read both as a value and as an object")
        node[path[-1]] = type_

    def build(node: dict[str, Any]) -> list[pa.Field]:
        return [pa.field(name, pa.struct(build(sub)) if isinstance(sub, dict) else sub) for name, sub in node.items()]

    return pa.schema(build(tree))


def _column(body: pa.StructArray, path: tuple[str, ...]) -> pa.Array:
    column = body
    for part in path:
        column = pc.struct_field(column, part)  # a missing parent gives a null child
    return column


def _values_of(column: pa.Array) -> _Values:
    n = len(column)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    nothing: np.ndarray = np.zeros(n, dtype=bool)
    if pa.types.is_floating(column.type):
        number = column.to_numpy(zero_copy_only=False).astype(np.float64)
        if not np.isfinite(number[valid]).all():  # NaN / Infinity: not JSON to orjson
            raise _Fallback("a body has a number orjson does not read")
        return _Values(~valid, nothing, pa.scalar("", pa.string()), np.where(valid, number, np.nan), valid, valid)
    if pa.types.is_boolean(column.type):
        text = pc.if_else(column, pa.scalar("true"), pa.scalar("false"))
        return _Values(~valid, valid, text, np.full(n, np.nan), nothing, nothing)
    if pa.types.is_null(column.type):
        return _Values(np.ones(n, dtype=bool), nothing, pa.scalar("", pa.string()), np.full(n, np.nan), nothing,
                       nothing)
    text = column.cast(pa.string())
    string = valid & pc.fill_null(pc.not_equal(text, ""), False).to_numpy(zero_copy_only=False)
    number = np.full(n, np.nan)
    ascii_ = pc.fill_null(pc.string_is_ascii(text), True).to_numpy(zero_copy_only=False)
    looks = string & ascii_ & pc.fill_null(pc.match_substring_regex(text, _ASCII_NUMERIC), False).to_numpy(
        zero_copy_only=False)
    candidates = np.flatnonzero(looks)
    if candidates.size:
        number[candidates] = [float(s) for s in text.take(pa.array(candidates)).to_pylist()]
    others = np.flatnonzero(string & ~ascii_)  # non-ASCII: Python's own rules (its \s and \d are wider)
    for i, s in zip(others.tolist(), text.take(pa.array(others, pa.int64())).to_pylist()):
        value = _string_value(s).number
        if value is not None:
            number[i] = value
    return _Values(~string, string, text, number, ~np.isnan(number), nothing)


def _literal(lit: Literal, n: int) -> _Values:
    value = _literal_value(lit)
    is_string, has_number = value.kind == "s", value.number is not None
    return _Values(np.full(n, value.kind == "z"), np.full(n, is_string), pa.scalar(value.text or "", pa.string()),
                   np.full(n, value.number if has_number else np.nan), np.full(n, has_number),
                   np.full(n, value.kind == "n"))


# --------------------------------------------------------------------------- three-valued logic on columns
#
# A result is (known, value): known False is NULL.

_TEXT_OPS = {"=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater,
             ">=": pc.greater_equal}
_NUMBER_OPS = {"=": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
               ">=": np.greater_equal}


def _compare(a: _Values, b: _Values, op: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    known = ~(a.null | b.null)
    both_strings = a.string & b.string
    text = _TEXT_OPS[op](a.text, b.text)
    text = (np.full(n, bool(text.as_py())) if isinstance(text, pa.Scalar)
            else pc.fill_null(text, False).to_numpy(zero_copy_only=False))
    with np.errstate(invalid="ignore"):
        number = _NUMBER_OPS[op](a.number, b.number)
    # a string that is not a number is greater than any number
    string_first, number_first = op in (">", ">=", "!="), op in ("<", "<=", "!=")
    value = np.where(both_strings, text,
                     np.where(a.numeric & b.numeric, number, np.where(a.string, string_first, number_first)))
    return known, value & known


def _and(results: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    false = np.logical_or.reduce([k & ~v for k, v in results])
    true = np.logical_and.reduce([k & v for k, v in results])
    return false | true, true


def _or(results: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    true = np.logical_or.reduce([k & v for k, v in results])
    false = np.logical_and.reduce([k & ~v for k, v in results])
    return false | true, true


def _not(result: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    known, value = result
    return known, known & ~value


class _ColumnOperand(OperandVisitor[_Values]):
    """An operand over every row: a field's parsed column, or a literal repeated."""

    def __init__(self, columns: dict[tuple[str, ...], _Values], n: int):
        self.columns, self.n = columns, n

    def visit_Field(self, node: Field) -> _Values:
        return self.columns[node.path]

    def visit_Literal(self, node: Literal) -> _Values:
        return _literal(node, self.n)


class _ColumnEvaluator(Visitor[tuple[np.ndarray, np.ndarray]]):
    """A node's (known, value) over every row of ``columns``."""

    def __init__(self, columns: dict[tuple[str, ...], _Values], n: int):
        self.n = n
        self.operand = _ColumnOperand(columns, n).visit

    def visit_Compare(self, node: Compare) -> tuple[np.ndarray, np.ndarray]:
        return _compare(self.operand(node.left), self.operand(node.right), node.op, self.n)

    def visit_InList(self, node: InList) -> tuple[np.ndarray, np.ndarray]:
        v = self.operand(node.operand)
        r = _or([_compare(v, self.operand(i), "=", self.n) for i in node.items])
        return _not(r) if node.negated else r

    def visit_Between(self, node: Between) -> tuple[np.ndarray, np.ndarray]:
        v = self.operand(node.operand)
        r = _and([_compare(v, self.operand(node.low), ">=", self.n),
                  _compare(v, self.operand(node.high), "<=", self.n)])
        return _not(r) if node.negated else r

    def visit_IsNull(self, node: IsNull) -> tuple[np.ndarray, np.ndarray]:
        null = self.operand(node.operand).null
        return np.ones(self.n, dtype=bool), (~null if node.negated else null)

    def visit_Not(self, node: Not) -> tuple[np.ndarray, np.ndarray]:
        return _not(self.visit(node.item))

    def visit_BoolOp(self, node: BoolOp) -> tuple[np.ndarray, np.ndarray]:
        results = [self.visit(i) for i in node.items]
        return _and(results) if node.op == "AND" else _or(results)

    def visit_Like(self, node: Like) -> tuple[np.ndarray, np.ndarray]:
        return _like(node, self.operand(node.operand), self.n)

    def visit_Literal(self, node: Literal) -> tuple[np.ndarray, np.ndarray]:
        return np.ones(self.n, dtype=bool), np.full(self.n, str(node.value).lower() == "true")


def _like(node: Like, v: _Values, n: int) -> tuple[np.ndarray, np.ndarray]:
    if v.is_number.any():  # a number's text is how Spark prints it: the per-record path knows that
        raise _Fallback("LIKE on a number")
    known = v.string.copy()
    value: np.ndarray = np.zeros(n, dtype=bool)
    at = np.flatnonzero(known)
    if at.size:
        search = re.compile(node.pattern).search
        texts = v.text.take(pa.array(at)).to_pylist() if isinstance(v.text, pa.Array) else [v.text.as_py()] * at.size
        value[at] = [search(t) is not None for t in texts]
    if node.negated:
        value = known & ~value
    return known, value
