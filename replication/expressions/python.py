"""The Python compiler: a filter built once into closures, for filters run over many messages."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from replication.expressions.evaluator import _and, _not, _or, evaluate
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
from replication.expressions.values import _NULL, _compare, _literal_value, _loads, _string_value, _Value
from replication.messages import TAG_VALUE_TYPES

__all__ = ["compile_python"]

# The same value model as :func:`evaluate`, compiled once into closures over a
# body parsed with orjson: ~10x faster, for filters run over many messages (a
# sow_delete by filter over a whole SOW topic, SOW queries). A JSON number's
# text (how Spark prints it) only matters to LIKE; orjson does not keep the
# source token, so a filter with LIKE on a JSON body takes :func:`evaluate`.
# The visitors below run once, at compile time: the closures they return call
# one another directly, with no dispatch per message.


def compile_python(expr: Expr, message_type: str = "json") -> Callable[[Any], bool]:
    """``message -> bool``: :func:`evaluate` of ``expr`` on bodies of ``message_type``, compiled once.

    Example:
        >>> test = compile_python(parse("/qty > 100 AND /side = 'buy'"))
        >>> test(b'{"qty": 150, "side": "buy"}'), test(b'{"qty": 50}')
        (True, False)
    """
    if message_type == "json" and _has_like(expr):
        return lambda message: evaluate(expr, message, message_type)
    if message_type in TAG_VALUE_TYPES:
        load: Callable[[Any], Any] = lambda message: _loads(message, message_type)  # noqa: E731
    elif message_type == "json":
        load = _fast_json
    else:
        return lambda message: False  # bodies without fields never match
    test = _compiled(expr)

    def run(message: Any) -> bool:
        return test(message if isinstance(message, dict) else load(message)) is True

    return run


def _fast_json(message: Any) -> Any:
    if not isinstance(message, (bytes, bytearray, memoryview, str)):
        return message
    try:
        return orjson.loads(message)
    except orjson.JSONDecodeError:
        return None


class _HasLike(Visitor[bool]):
    """Does the filter use LIKE anywhere?"""

    def visit_Like(self, node: Like) -> bool:
        return True

    def visit_Not(self, node: Not) -> bool:
        return self.visit(node.item)

    def visit_BoolOp(self, node: BoolOp) -> bool:
        return any(self.visit(i) for i in node.items)

    def visit_Compare(self, node: Compare) -> bool:
        return False

    visit_InList = visit_Between = visit_IsNull = visit_Literal = visit_Compare


_has_like = _HasLike().visit


def _fast_value(node: Any) -> _Value:
    """A field's value in the value model, from orjson's types (a number's text is not needed without LIKE)."""
    if node is None:
        return _NULL
    kind = type(node)
    if kind is str:
        return _string_value(node)
    if kind is bool:
        return _Value("s", "true" if node else "false", None)
    if kind is int or kind is float:
        return _Value("n", None, float(node))
    return _Value("o")


class _CompiledOperand(OperandVisitor[Callable[[Any], _Value]]):
    """``doc -> value`` of an operand."""

    def visit_Literal(self, node: Literal) -> Callable[[Any], _Value]:
        value = _literal_value(node)
        return lambda doc: value

    def visit_Field(self, node: Field) -> Callable[[Any], _Value]:
        path = node.path
        if len(path) == 1:
            (name,) = path

            def one(doc: Any) -> _Value:
                return _fast_value(doc.get(name)) if type(doc) is dict else _NULL

            return one

        def nested(doc: Any) -> _Value:
            for part in path:
                if type(doc) is not dict:
                    return _NULL
                doc = doc.get(part)
            return _fast_value(doc)

        return nested


_compiled_operand = _CompiledOperand().visit


class _Compiler(Visitor[Callable[[Any], "bool | None"]]):
    """``doc -> bool | None`` of a node: its three-valued answer on an orjson-parsed (or tag=value) document."""

    def visit_Compare(self, node: Compare) -> Callable[[Any], bool | None]:
        left, right, op = _compiled_operand(node.left), _compiled_operand(node.right), node.op
        return lambda doc: _compare(left(doc), right(doc), op)

    def visit_InList(self, node: InList) -> Callable[[Any], bool | None]:
        value, negated = _compiled_operand(node.operand), node.negated
        items = [_compiled_operand(i) for i in node.items]

        def in_list(doc: Any) -> bool | None:
            v = value(doc)
            r = _or([_compare(v, item(doc), "=") for item in items])
            return _not(r) if negated else r

        return in_list

    def visit_Between(self, node: Between) -> Callable[[Any], bool | None]:
        value, low, high, negated = (_compiled_operand(node.operand), _compiled_operand(node.low),
                                     _compiled_operand(node.high), node.negated)

        def between(doc: Any) -> bool | None:
            v = value(doc)
            r = _and([_compare(v, low(doc), ">="), _compare(v, high(doc), "<=")])
            return _not(r) if negated else r

        return between

    def visit_IsNull(self, node: IsNull) -> Callable[[Any], bool | None]:
        value, negated = _compiled_operand(node.operand), node.negated
        return lambda doc: (value(doc).kind == "z") is not negated

    def visit_Not(self, node: Not) -> Callable[[Any], bool | None]:
        item = self.visit(node.item)
        return lambda doc: _not(item(doc))

    def visit_BoolOp(self, node: BoolOp) -> Callable[[Any], bool | None]:
        items = [self.visit(i) for i in node.items]
        if node.op == "AND":
            def all_of(doc: Any) -> bool | None:
                unknown = False
                for item in items:
                    r = item(doc)
                    if r is False:
                        return False
                    unknown = unknown or r is None
                return None if unknown else True

            return all_of

        def any_of(doc: Any) -> bool | None:
            unknown = False
            for item in items:
                r = item(doc)
                if r is True:
                    return True
                unknown = unknown or r is None
            return None if unknown else False

        return any_of

    def visit_Like(self, node: Like) -> Callable[[Any], bool | None]:
        # only on tag=value bodies here: their values are strings
        value, pattern, negated = _compiled_operand(node.operand), re.compile(node.pattern), node.negated

        def like(doc: Any) -> bool | None:
            v = value(doc)
            if v.kind in ("z", "o"):
                return None
            r = pattern.search(v.text or "") is not None
            return (not r) if negated else r

        return like

    def visit_Literal(self, node: Literal) -> Callable[[Any], bool | None]:
        result = str(node.value).lower() == "true"
        return lambda doc: result


_compiled = _Compiler().visit
