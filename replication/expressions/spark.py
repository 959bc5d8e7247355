"""The Spark compiler: a filter as a native Spark boolean column (no Python UDF)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

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
from replication.expressions.values import _NUMERIC, _compare, _literal_value, _Value
from replication.messages import FIELD_TYPES, TAG_VALUE_TYPES

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["json_path", "parse_json_column", "to_spark_column"]

def json_path(path: tuple[str, ...]) -> str:
    """The Spark JSON path (``$['a']['b']``) of a ``/a/b`` field."""
    return "$" + "".join("['" + p.replace("'", "\\'") + "']" for p in path)


def parse_json_column(data_col: str | Column = "data") -> Column:
    """The message body parsed once into a VARIANT (NULL when the body is not JSON)."""
    from pyspark.sql import functions as F

    col = F.col(data_col) if isinstance(data_col, str) else data_col
    return F.try_parse_json(col.cast("string"))


@dataclass(frozen=True)
class _SparkValue:
    kind: Column
    text: Column
    number: Column
    literal: _Value | None = None


def to_spark_column(expr: Expr, data_col: str | Column = "data", *, variant: Column | None = None,
                    message_type: str | Column = "json") -> Column:
    """Compile the filter to a native Spark boolean column (no Python UDF); NULL results become false.

    A JSON body is parsed with ``try_parse_json`` into a VARIANT (which keeps
    JSON types, so numbers and strings compare as AMPS says) and fields are
    read with ``try_variant_get``; a FIX/NVFIX field is the first
    ``<tag>=value`` of the body, found with ``regexp_extract``. Everything is
    code-generated; Spark's common sub-expression elimination shares the
    parse between the references that are always evaluated. Measured on a
    busy 2-core machine, ``/qty > 100`` costs 1-2x a plain
    ``get_json_object`` comparison.

    Args:
        expr: a parsed filter.
        data_col: the message body column (binary or string).
        variant: the JSON body already parsed with :func:`parse_json_column`,
            when the caller has it (several filters over the same rows).
        message_type: the bodies' message type (json, fix, nvfix), or a column
            holding each row's (rows of any other type do not match).

    Example:
        >>> df.where(to_spark_column(parse("/qty > 100")))  # doctest: +SKIP
    """
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    col = F.col(data_col) if isinstance(data_col, str) else data_col
    if isinstance(message_type, Column):
        out = F.lit(False)
        for kind in reversed(FIELD_TYPES):
            out = F.when(message_type == kind, to_spark_column(expr, col, variant=variant, message_type=kind)
                         ).otherwise(out)
        return out
    if message_type in TAG_VALUE_TYPES:
        body = F.concat(F.lit("\x01"), col.cast("string"))
        bound = {f.path: _tag_field_struct(body, f.path) for f in fields(expr)}
    elif message_type == "json":
        parsed = variant if variant is not None else parse_json_column(col)
        bound = {f.path: _field_struct(parsed, f.path) for f in fields(expr)}
    else:
        return F.lit(False)  # bodies without fields never match
    return F.coalesce(_SparkCompiler(bound).visit(expr), F.lit(False))


def _tag_field_struct(body: Column, path: tuple[str, ...]) -> dict[str, Column]:
    """Kind, text and numeric value of a FIX/NVFIX field: the first ``tag=value`` (``body`` starts with SOH)."""
    from pyspark.sql import functions as F

    if len(path) != 1:  # tag=value bodies are flat: a nested path finds nothing
        return {"k": F.lit("z"), "t": F.lit(None).cast("string"), "n": F.lit(None).cast("double")}
    # \Q...\E quotes the tag for Java's regex; the value runs to the next SOH
    text = F.regexp_extract(body, "\x01\\Q" + path[0] + "\\E=([^\x01]*)", 1)
    return {
        "k": F.when(text == "", F.lit("z")).otherwise(F.lit("s")),
        "t": text,
        "n": F.when(text.rlike(_NUMERIC), text.try_cast("double")),
    }


def _field_struct(v: Column, path: tuple[str, ...]) -> dict[str, Column]:
    """Kind, text and numeric value of one field (see the value model in :mod:`replication.expressions.values`)."""
    from pyspark.sql import functions as F

    jpath = json_path(path)
    raw = F.try_variant_get(v, jpath, "variant")
    first = F.substring(F.to_json(raw), 1, 1)
    text = F.try_variant_get(v, jpath, "string")
    kind = (
        F.when(raw.isNull() | (first == "n"), F.lit("z"))
        .when(first == '"', F.when(text == "", F.lit("z")).otherwise(F.lit("s")))
        .when(first.isin("t", "f"), F.lit("s"))
        .when(first.isin("{", "["), F.lit("o"))
        .otherwise(F.lit("n"))
    )
    number = (
        F.when(first == '"', F.when(text.rlike(_NUMERIC), text.try_cast("double")))
        .when(~first.isin("n", "t", "f", "{", "["), F.try_variant_get(v, jpath, "double"))
    )
    return {"k": kind, "t": text, "n": number}


class _SparkOperand(OperandVisitor[_SparkValue]):
    """An operand's columns: a literal's resolved at compile time, a field's from ``bound`` (path -> columns)."""

    def __init__(self, bound: dict):
        self.bound = bound

    def visit_Literal(self, node: Literal) -> _SparkValue:
        from pyspark.sql import functions as F

        val = _literal_value(node)
        return _SparkValue(
            F.lit(val.kind),
            F.lit(val.text).cast("string"),
            F.lit(val.number).cast("double"),
            val,
        )

    def visit_Field(self, node: Field) -> _SparkValue:
        s = self.bound[node.path]
        return _SparkValue(s["k"], s["t"], s["n"])


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!="}


def _apply(op: str, x: Column, y: Column) -> Column:
    return {"=": x == y, "!=": x != y, "<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]


def _spark_compare(a: _SparkValue, b: _SparkValue, op: str) -> Column:
    """The AMPS comparison of the value model; literal sides are resolved at compile time."""
    from pyspark.sql import functions as F

    null = F.lit(None).cast("boolean")
    if a.literal is not None and b.literal is not None:
        return F.lit(_compare(a.literal, b.literal, op)).cast("boolean")
    if a.literal is not None:
        a, b, op = b, a, _FLIP[op]
    if b.literal is not None:
        lit = b.literal
        if lit.kind == "z":
            return null
        if lit.kind == "n":  # numbers and numeric strings compare numerically; other strings are greater
            return F.when(a.number.isNotNull(), _apply(op, a.number, F.lit(lit.number))).when(
                a.kind == "s", F.lit(op in (">", ">=", "!="))
            )
        by_number = (_apply(op, a.number, F.lit(lit.number)) if lit.number is not None
                     else F.lit(op in ("<", "<=", "!=")))
        return F.when(a.kind == "s", _apply(op, a.text, F.lit(lit.text))).when(a.kind == "n", by_number)
    null_side = a.kind.isin("z", "o") | b.kind.isin("z", "o")
    return (
        F.when(null_side, null)
        .when((a.kind == "s") & (b.kind == "s"), _apply(op, a.text, b.text))
        .when(a.number.isNotNull() & b.number.isNotNull(), _apply(op, a.number, b.number))
        .when(a.kind == "s", F.lit(op in (">", ">=", "!=")))
        .otherwise(F.lit(op in ("<", "<=", "!=")))
    )


class _SparkCompiler(Visitor["Column"]):
    """A node's boolean column (NULL where AMPS says NULL), its fields read from ``bound``."""

    def __init__(self, bound: dict):
        self.operand = _SparkOperand(bound).visit

    def visit_Compare(self, node: Compare) -> Column:
        return _spark_compare(self.operand(node.left), self.operand(node.right), node.op)

    def visit_InList(self, node: InList) -> Column:
        val = self.operand(node.operand)
        r = _reduce("OR", [_spark_compare(val, self.operand(i), "=") for i in node.items])
        return ~r if node.negated else r

    def visit_Between(self, node: Between) -> Column:
        val = self.operand(node.operand)
        r = _spark_compare(val, self.operand(node.low), ">=") & _spark_compare(val, self.operand(node.high), "<=")
        return ~r if node.negated else r

    def visit_Like(self, node: Like) -> Column:
        from pyspark.sql import functions as F

        val = self.operand(node.operand)
        r = F.when(val.kind.isin("z", "o"), F.lit(None).cast("boolean")).otherwise(val.text.rlike(node.pattern))
        return ~r if node.negated else r

    def visit_IsNull(self, node: IsNull) -> Column:
        is_null = self.operand(node.operand).kind == "z"
        return ~is_null if node.negated else is_null

    def visit_Not(self, node: Not) -> Column:
        return ~self.visit(node.item)

    def visit_BoolOp(self, node: BoolOp) -> Column:
        return _reduce(node.op, [self.visit(i) for i in node.items])

    def visit_Literal(self, node: Literal) -> Column:
        from pyspark.sql import functions as F

        return F.lit(str(node.value).lower() == "true")


def _reduce(op: str, cols: list[Column]) -> Column:
    out = cols[0]
    for c in cols[1:]:
        out = (out & c) if op == "AND" else (out | c)
    return out
