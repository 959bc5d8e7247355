"""The Python evaluator: a filter's answer for one message, straight from the syntax tree."""

from __future__ import annotations

import re
from typing import Any

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
)
from replication.expressions.values import _compare, _field_value, _literal_value, _loads, _Value

__all__ = ["evaluate"]


def evaluate(expr: Expr, message: Any, message_type: str = "json") -> bool:
    """True when ``message`` matches; NULL counts as no match.

    ``message`` is a body (bytes or text) of ``message_type`` (json, fix or
    nvfix), or an already parsed JSON document (a dict).

    Example:
        >>> evaluate(parse("/order/qty >= 10"), b'{"order": {"qty": 12}}')
        True
        >>> evaluate(parse("/55 = 'IBM' AND /38 > 100"), b"35=D\x0155=IBM\x0138=200\x01", "fix")
        True
    """
    doc = _loads(message, message_type)
    return _eval(expr, doc) is True


# --------------------------------------------------------------------------- three-valued logic


def _and(values: list[bool | None]) -> bool | None:
    if any(v is False for v in values):
        return False
    return None if any(v is None for v in values) else True


def _or(values: list[bool | None]) -> bool | None:
    if any(v is True for v in values):
        return True
    return None if any(v is None for v in values) else False


def _not(value: bool | None) -> bool | None:
    return None if value is None else not value


# --------------------------------------------------------------------------- the walk


class _Operand(OperandVisitor[_Value]):
    """An operand's value in a parsed document."""

    def visit_Field(self, node: Field, doc: Any) -> _Value:
        return _field_value(doc, node.path)

    def visit_Literal(self, node: Literal, doc: Any) -> _Value:
        return _literal_value(node)


_operand = _Operand().visit


class _Evaluator(Visitor["bool | None"]):
    """A node's three-valued answer (None is NULL) on a parsed document."""

    def visit_Compare(self, node: Compare, doc: Any) -> bool | None:
        return _compare(_operand(node.left, doc), _operand(node.right, doc), node.op)

    def visit_InList(self, node: InList, doc: Any) -> bool | None:
        v = _operand(node.operand, doc)
        r = _or([_compare(v, _operand(i, doc), "=") for i in node.items])
        return _not(r) if node.negated else r

    def visit_Between(self, node: Between, doc: Any) -> bool | None:
        v = _operand(node.operand, doc)
        r = _and([_compare(v, _operand(node.low, doc), ">="), _compare(v, _operand(node.high, doc), "<=")])
        return _not(r) if node.negated else r

    def visit_Like(self, node: Like, doc: Any) -> bool | None:
        v = _operand(node.operand, doc)
        if v.kind in ("z", "o"):
            return None
        r = re.search(node.pattern, v.text or "") is not None
        return (not r) if node.negated else r

    def visit_IsNull(self, node: IsNull, doc: Any) -> bool | None:
        is_null = _operand(node.operand, doc).kind == "z"
        return (not is_null) if node.negated else is_null

    def visit_Not(self, node: Not, doc: Any) -> bool | None:
        return _not(self.visit(node.item, doc))

    def visit_BoolOp(self, node: BoolOp, doc: Any) -> bool | None:
        values = [self.visit(i, doc) for i in node.items]
        return _and(values) if node.op == "AND" else _or(values)

    def visit_Literal(self, node: Literal, doc: Any) -> bool | None:
        return str(node.value).lower() == "true"


_eval = _Evaluator().visit
