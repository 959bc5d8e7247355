"""AMPS content filters: parse once, evaluate in Python or compile to native Spark columns.

The subset is the one replication filters and SOW queries use: ``/field``
paths into JSON (nested ``/a/b``), FIX (``/55`` is tag 55) and NVFIX
(``/Symbol`` is the field named Symbol) bodies, ``= == != <> < <= > >=``,
``AND OR NOT`` (any case), ``[NOT] IN (...)``, ``[NOT] BETWEEN x AND y``,
``[NOT] LIKE 'regex'``, ``IS [NOT] NULL``, numeric and string literals (single
or double quotes), ``TRUE``/``FALSE`` and parentheses.

Semantics follow the AMPS expression chapter:

- Three-valued logic: a comparison involving NULL is NULL (neither true nor
  false), ``NOT NULL`` is NULL, and a filter whose result is NULL does not match.
  A missing field, a JSON ``null`` and an empty string are all NULL.
- Comparing a number with a string converts the string to a number; when that
  is impossible the string is greater than any number (``10 < 'Crank It Up'``).
  Two strings compare as strings (``'2.000' <> '2.0'``), two numbers as numbers.
- ``LIKE`` is a PCRE-style regex *search* (unanchored): ``/sym LIKE '^IB'``.
- JSON booleans compare as the strings ``true``/``false``; objects and arrays
  are not NULL but compare as NULL.
- A FIX or NVFIX field's value is a string (numeric strings compare as
  numbers, as above); when a tag repeats, its first occurrence counts.

The Python evaluator (:func:`evaluate`), its column-wise form over many bodies
(:mod:`replication.expressions.columnar`) and the Spark compiler
(:func:`to_spark_column`) are built on the same value model (kind, text,
number) so that they agree; ``tests/test_expressions.py`` checks them row by row.

The package is one module per role: :mod:`~replication.expressions.syntax`
(the tree and its :class:`~replication.expressions.syntax.Visitor`),
:mod:`~replication.expressions.parser`, :mod:`~replication.expressions.values`
(the value model), :mod:`~replication.expressions.evaluator`,
:mod:`~replication.expressions.python` (the compiled Python form),
:mod:`~replication.expressions.spark` and
:mod:`~replication.expressions.columnar`; this module is their public face.

Example:
    >>> f = parse("/qty > 100 AND /sym IN ('IBM', 'MSFT')")
    >>> evaluate(f, {"qty": 150, "sym": "IBM"})
    True
    >>> str(f)
    "(/qty > 100 AND /sym IN ('IBM', 'MSFT'))"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replication.expressions.evaluator import evaluate
from replication.expressions.parser import FilterSyntaxError, canonical, parse
from replication.expressions.python import compile_python
from replication.expressions.spark import json_path, parse_json_column, to_spark_column
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
    Operand,
    OperandVisitor,
    Visitor,
    fields,
)
from replication.messages import FIELD_TYPES

__all__ = [
    "FIELD_TYPES",
    "Between",
    "BoolOp",
    "Compare",
    "Expr",
    "Field",
    "Filter",
    "FilterSyntaxError",
    "InList",
    "IsNull",
    "Like",
    "Literal",
    "Not",
    "Operand",
    "OperandVisitor",
    "Visitor",
    "canonical",
    "compile_python",
    "evaluate",
    "fields",
    "json_path",
    "parse",
    "parse_json_column",
    "to_spark_column",
]


@dataclass(frozen=True)
class Filter:
    """A content filter as written (``text``) and parsed once (``expr``), as configs carry it.

    Two filters are equal when their texts are. ``str()`` is the canonical form.
    Raises :class:`FilterSyntaxError` when the text does not parse.

    Example:
        >>> Filter("/qty > 100").matches({"qty": 150})
        True
    """

    text: str
    expr: Expr = field(init=False, compare=False, repr=False)
    _compiled: dict = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "expr", parse(self.text))
        object.__setattr__(self, "_compiled", {})

    def matches(self, message: Any, message_type: str = "json") -> bool:
        """Does ``message`` match? The same answer as :func:`evaluate`, through :func:`compile_python`."""
        test = self._compiled.get(message_type)
        if test is None:
            test = self._compiled[message_type] = compile_python(self.expr, message_type)
        return test(message)

    def __str__(self) -> str:
        return str(self.expr)
